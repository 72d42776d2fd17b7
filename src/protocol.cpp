// The configuration hash of the k tags (protocol.hpp).
#include "protocol.hpp"

#include <cstring>

namespace swiftqk {

uint32_t config_hash(int64_t q_full_width, int64_t k_full_width, int world, float eps, int order,
                     int64_t tokens) {
  // FNV-1a over the values every rank must agree on.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xffu;
      h *= 1099511628211ull;
    }
  };
  uint32_t eps_bits;
  std::memcpy(&eps_bits, &eps, sizeof eps_bits);
  mix(static_cast<uint64_t>(q_full_width));
  mix(static_cast<uint64_t>(k_full_width));
  mix(static_cast<uint64_t>(world));
  mix(eps_bits);
  mix(static_cast<uint64_t>(order));
  mix(static_cast<uint64_t>(tokens));
  return static_cast<uint32_t>(h ^ (h >> 32)) | 0x80000000u;
}

}  // namespace swiftqk
