// Shared by the CPU models of the two exchange protocols (test_protocol_model.cpp for SwiftQK's
// tagged slots, test_lamport_model.cpp for the MiniMax-fused baseline): deterministic partial
// sums and float bit casts.
#pragma once

#include <cstdint>
#include <cstring>

namespace swiftqk::model {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// The hash behind partial sum `which` (0 = q, 1 = k) of a call, token and rank.
inline uint64_t partial_hash(uint64_t seed, int call_index, int64_t token, int rank, int which) {
  return splitmix64(seed ^
                    splitmix64((static_cast<uint64_t>(call_index) << 24) ^
                               (static_cast<uint64_t>(token) << 5) ^
                               (static_cast<uint64_t>(rank) << 1) ^ static_cast<uint64_t>(which)));
}

/// A nonnegative partial sum of squares with a full mantissa, from its hash.
inline float partial_from_hash(uint64_t h) {
  return static_cast<float>(h >> 40) * (100.0f / 16777216.0f) + 0.001f;
}

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace swiftqk::model
