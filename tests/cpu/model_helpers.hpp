// Shared by the CPU models of the exchange protocols (test_protocol_model.cpp and
// test_failure_model.cpp for SwiftQK's tagged slots, test_lamport_model.cpp for the MiniMax-fused
// baseline): deterministic partial sums, float bit casts, tagged slot words and random delays.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <thread>

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

/// Partial sum `which` (0 = q, 1 = k) of a call's data, token and rank.
inline float partial(uint64_t seed, int call_index, int64_t token, int rank, int which) {
  return partial_from_hash(partial_hash(seed, call_index, token, rank, which));
}

/// A SwiftQK slot word: {value bits | tag << 32}.
inline uint64_t pack_word(float value, uint32_t tag) {
  return static_cast<uint64_t>(float_bits(value)) | (static_cast<uint64_t>(tag) << 32);
}
inline uint32_t word_tag(uint64_t w) { return static_cast<uint32_t>(w >> 32); }
inline float word_value(uint64_t w) { return bits_float(static_cast<uint32_t>(w)); }

/// Once in `one_in` draws: a yield or a sleep of up to max_us microseconds, so that ranks and
/// blocks drift apart.
inline void maybe_delay(std::mt19937_64& rng, int one_in, int max_us) {
  const uint64_t x = rng();
  if (x % one_in != 0) return;
  if ((x >> 32) % 4 == 0) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(1 + (x >> 40) % max_us));
  }
}

}  // namespace swiftqk::model
