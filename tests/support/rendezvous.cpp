#include "rendezvous.hpp"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <thread>

#include "swiftqk/error.hpp"

namespace swiftqk::testing {

Rendezvous::Rendezvous(std::string dir, int rank, int world, double timeout_s)
    : dir_(std::move(dir)), rank_(rank), world_(world), timeout_s_(timeout_s) {}

std::string Rendezvous::path(const std::string& name, int r) const {
  return dir_ + "/" + name + "." + std::to_string(r);
}

void Rendezvous::publish(const std::string& name, const std::vector<uint8_t>& bytes) const {
  const std::string final_path = path(name, rank_), tmp = final_path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
    SWIFTQK_EXPECTS(f.good(), "rendezvous: cannot write " + tmp);
  }
  SWIFTQK_EXPECTS(std::rename(tmp.c_str(), final_path.c_str()) == 0,
                  "rendezvous: cannot rename " + tmp);
}

std::vector<uint8_t> Rendezvous::fetch(const std::string& name, int r) const {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
  const std::string p = path(name, r);
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream f(p, std::ios::binary);
    if (f) return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  SWIFTQK_FAIL("rendezvous: rank " + std::to_string(rank_) + " timed out waiting for " + p);
}

std::vector<std::vector<uint8_t>> Rendezvous::all_gather(const std::string& name,
                                                         const std::vector<uint8_t>& mine) const {
  publish(name, mine);
  std::vector<std::vector<uint8_t>> all;
  for (int r = 0; r < world_; ++r) all.push_back(fetch(name, r));
  return all;
}

void Rendezvous::barrier(const std::string& name) const { all_gather(name, {1}); }

}  // namespace swiftqk::testing
