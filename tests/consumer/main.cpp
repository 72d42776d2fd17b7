// Calls SwiftQK's host-side API through the installed package: a bad QkNormParams must throw
// swiftqk::Error, and the launch planner must return a usable thread layout.
#include <cstdio>
#include <string>

#include "swiftqk/error.hpp"
#include "swiftqk/plan.hpp"
#include "swiftqk/qk_norm_params.hpp"

int main() {
  swiftqk::QkNormParams p;
  p.tokens = 4;
  p.q_full_width = 5120;
  p.k_full_width = 1024;
  p.q.width = 5120 / 3;  // widths that do not split over 3 ranks: must be refused
  p.k.width = 1024 / 3;
  bool threw = false;
  try {
    swiftqk::validate_params(p, 3);
  } catch (const swiftqk::Error& e) {
    threw = true;
    std::printf("validate_params refused a bad call: %s\n", e.what());
  }
  if (!threw) {
    std::fprintf(stderr, "FAILED: validate_params accepted widths that do not split over 3\n");
    return 1;
  }
  // OLMo 2 13B at TP 4 in bf16: 1280 elements of Q and of K a rank, 8 per 16-byte vector.
  const swiftqk::KernelShape s = swiftqk::choose_kernel_shape(1280, 1280, 8);
  std::printf(
      "choose_kernel_shape(1280, 1280, 8): %d vectors a thread, %d threads a token, %d "
      "tokens a block\n",
      s.vectors_per_thread, s.group_threads, s.tokens_per_block);
  if (s.group_threads <= 0 || s.tokens_per_block <= 0 || s.block_threads() > 1024) {
    std::fprintf(stderr, "FAILED: choose_kernel_shape returned an unusable layout\n");
    return 1;
  }
  std::printf("swiftqk consumer: ok\n");
  return 0;
}
