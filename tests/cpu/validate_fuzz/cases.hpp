// The cases of the validator fuzz test (test_validate_fuzz.cpp): random QkNormParams laid out over
// a host arena and recorded as arena offsets, so that the oracle (oracle.hpp) never reads through
// a pointer, and the deterministic generator that makes them.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>

namespace swiftqk::validate_fuzz {

constexpr int64_t kArenaBytes = 4 << 20;
constexpr int64_t kMargin = 64 << 10;  // room below the first region for negative shifts

constexpr float kFltMax = std::numeric_limits<float>::max();

// ---------------------------------------------------------------- the oracle's own tables

// Element sizes by DType value, written out independently of dtype_size / output_dtype_for.
// Index: 0 f32, 1 f16, 2 bf16, 3 fp8 e4m3 (whose output and weight are bf16).
constexpr int64_t kInSize[4] = {4, 2, 2, 1};
constexpr int64_t kOutSize[4] = {4, 2, 2, 2};
bool DTypeInRange(int dt);
int64_t InSizeOr2(int dt);
int64_t OutSizeOr2(int dt);

// Methods are a growing list; a value is a Method when the enum has a name for it (to_string
// throws for any other value). Valid values are 0 .. NumMethods() - 1.
int NumMethods();
bool MethodInRange(int m);

// ---------------------------------------------------------------- a case, in arena offsets

struct Ptr {
  bool null = true;
  int64_t off = 0;  // byte offset from the (256-byte aligned) arena base
};

inline Ptr At(int64_t off) { return {false, off}; }

struct Shard {
  Ptr in, out, weight;
  int64_t width = 0, in_stride = 0, out_stride = 0;
  float in_scale = 1.0f;
};

struct Case {
  int world = 1;
  int dtype = 2;
  int order = 0;
  int method = 0;
  int64_t tokens = 0, q_full = 0, k_full = 0;
  float eps = 1e-6f;
  Shard q, k;
  Ptr rstd;
  std::string layout;         // how the generator placed the tensors
  std::string perturbations;  // what it broke afterwards
};

// A case in one paragraph: its scalars, its pointers as arena offsets, how it was made.
std::string Describe(const Case& c);

// ---------------------------------------------------------------- deterministic generator

// Maps mt19937_64's raw output to ranges itself (not through std::uniform_*_distribution, whose
// output differs between standard libraries), so a seed gives the same cases everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) : mt_(seed) {}
  uint64_t Next() { return mt_(); }
  int64_t Range(int64_t lo, int64_t hi) {  // inclusive
    return lo + static_cast<int64_t>(Next() % static_cast<uint64_t>(hi - lo + 1));
  }
  bool Chance(double p) { return static_cast<double>(Next() >> 11) * 0x1.0p-53 < p; }
  double Uniform(double lo, double hi) {
    return lo + (hi - lo) * static_cast<double>(Next() >> 11) * 0x1.0p-53;
  }
  template <typename T>
  T Pick(std::initializer_list<T> xs) {
    return *(xs.begin() + Range(0, static_cast<int64_t>(xs.size()) - 1));
  }

 private:
  std::mt19937_64 mt_;
};

// A case: a clean one (consistent scalars, a realistic layout), perturbed or not, regenerated
// until it lies inside the arena; each regeneration counts in *retries.
Case Generate(Rng& g, int* retries);

}  // namespace swiftqk::validate_fuzz
