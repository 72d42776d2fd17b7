// The CommConfig fields a group's ranks must agree on: each one that differs is refused by name,
// with the rank and both values, and every rank of a disagreeing group refuses (none goes on to a
// collective step the others never reach).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config_stamp.hpp"
#include "expect_error.hpp"

namespace swiftqk::detail {
namespace {

using swiftqk::testing::expect_error;

TEST(ConfigStamp, AgreeingRanksPass) {
  CommConfig c;
  c.token_capacity = 4096;
  c.timeout_s = 2.5;
  c.sm_budget = 7;  // per rank: not stamped
  const std::vector<ConfigStamp> stamps(4, stamp_of(c));
  for (int r = 0; r < 4; ++r) EXPECT_NO_THROW(check_stamps_agree(stamps, stamp_of(c), r, "test"));
  CommConfig other_budget = c;
  other_budget.sm_budget = 0;
  EXPECT_NO_THROW(check_stamps_agree(stamps, stamp_of(other_budget), 0, "test"));
}

TEST(ConfigStamp, EachFieldThatDiffersIsNamedWithTheRankAndBothValues) {
  const CommConfig base;  // token_capacity 16384, chunk_oversize, timeout_s 5, use_p2p
  struct Case {
    CommConfig c;
    std::string theirs, mine;  // what rank 0 reads of rank 2, and of itself
  };
  std::vector<Case> cases;
  CommConfig c = base;
  c.token_capacity = 8192;
  cases.push_back({c, "rank 2 has CommConfig.token_capacity = 8192", "rank 0 has 16384"});
  c = base;
  c.chunk_oversize = false;
  cases.push_back({c, "rank 2 has CommConfig.chunk_oversize = false", "rank 0 has true"});
  c = base;
  c.timeout_s = 0.25;
  cases.push_back({c, "rank 2 has CommConfig.timeout_s = 0.25", "rank 0 has 5"});
  c = base;
  c.use_p2p = false;
  cases.push_back({c, "rank 2 has CommConfig.use_p2p = false", "rank 0 has true"});
  for (const Case& k : cases) {
    std::vector<ConfigStamp> stamps(4, stamp_of(base));
    stamps[2] = stamp_of(k.c);
    expect_error([&] { check_stamps_agree(stamps, stamp_of(base), 0, "from_nccl"); },
                 {"from_nccl: ", k.theirs, k.mine, "every rank of a group must give the same"});
    // Rank 2 sees rank 0 differ from it: the group fails on every rank.
    expect_error([&] { check_stamps_agree(stamps, stamp_of(k.c), 2, "from_nccl"); },
                 {"from_nccl: rank 0 has CommConfig."});
  }
}

}  // namespace
}  // namespace swiftqk::detail
