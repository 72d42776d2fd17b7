// File-based rendezvous for groups of processes on one host (tests and the benchmark): bytes
// published under a name, bounded waits for peers' files, and barriers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace swiftqk::testing {

class Rendezvous {
 public:
  /// dir must exist and be shared by the rank processes of one run.
  Rendezvous(std::string dir, int rank, int world, double timeout_s = 120.0);
  /// Publishes this rank's bytes under `name` (readers never see a partial file).
  void publish(const std::string& name, const std::vector<uint8_t>& bytes) const;
  /// Waits (bounded) for rank r's bytes under `name`.
  std::vector<uint8_t> fetch(const std::string& name, int r) const;
  /// Publishes, then fetches every rank's bytes, ordered by rank.
  std::vector<std::vector<uint8_t>> all_gather(const std::string& name,
                                               const std::vector<uint8_t>& mine) const;
  /// Every rank waits until all ranks reached the barrier of this name.
  void barrier(const std::string& name) const;
  int rank() const { return rank_; }
  int world() const { return world_; }

 private:
  std::string path(const std::string& name, int r) const;
  std::string dir_;
  int rank_, world_;
  double timeout_s_;
};

}  // namespace swiftqk::testing
