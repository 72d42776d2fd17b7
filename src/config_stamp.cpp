// The CommConfig fields a group's ranks must agree on (config_stamp.hpp).
#include "config_stamp.hpp"

#include <iomanip>
#include <sstream>

#include "swiftqk/error.hpp"

namespace swiftqk::detail {

ConfigStamp stamp_of(const CommConfig& c) {
  ConfigStamp s;
  s.token_capacity = c.token_capacity;
  s.timeout_s = c.timeout_s;
  s.chunk_oversize = c.chunk_oversize ? 1u : 0u;
  s.use_p2p = c.use_p2p ? 1u : 0u;
  return s;
}

namespace {

template <typename V>
void agree(const std::string& who, int rank, int my_rank, const char* field, V theirs, V mine) {
  if (theirs == mine) return;
  std::ostringstream m;
  m << std::boolalpha << std::setprecision(12) << who << ": rank " << rank << " has CommConfig."
    << field << " = " << theirs << ", rank " << my_rank << " has " << mine
    << "; every rank of a group must give the same";
  SWIFTQK_FAIL(m.str());
}

}  // namespace

void check_stamps_agree(const std::vector<ConfigStamp>& stamps, const ConfigStamp& mine,
                        int my_rank, const std::string& who) {
  for (std::size_t r = 0; r < stamps.size(); ++r) {
    const ConfigStamp& s = stamps[r];
    const int rank = static_cast<int>(r);
    agree(who, rank, my_rank, "token_capacity", s.token_capacity, mine.token_capacity);
    agree(who, rank, my_rank, "chunk_oversize", s.chunk_oversize != 0u, mine.chunk_oversize != 0u);
    agree(who, rank, my_rank, "timeout_s", s.timeout_s, mine.timeout_s);
    agree(who, rank, my_rank, "use_p2p", s.use_p2p != 0u, mine.use_p2p != 0u);
  }
}

}  // namespace swiftqk::detail
