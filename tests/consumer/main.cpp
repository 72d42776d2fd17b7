// Calls SwiftQK's host-side API through the installed package: a bad QkNormParams and a bad
// LaunchTuning must throw swiftqk::Error, and the library's internal headers must not be
// installed. Built against swiftqk::swiftqk, it includes the umbrella header instead.
#include <cstdio>
#include <string>

#ifdef SWIFTQK_CONSUMER_CUDA
#include "swiftqk/swiftqk.hpp"
#else
#include "swiftqk/error.hpp"
#include "swiftqk/launch_tuning.hpp"
#include "swiftqk/qk_norm_params.hpp"
#endif

// The library's own headers (src/) and the test support's stay out of the install.
#if __has_include("swiftqk/plan.hpp") || __has_include("swiftqk/cuda_check.hpp")
#error "the install holds an internal SwiftQK header"
#endif
#if __has_include("swiftqk/reference.hpp") || __has_include("swiftqk/launch_plan.hpp")
#error "the install holds an internal SwiftQK header"
#endif

namespace {

// Runs f, which must throw swiftqk::Error; prints what it said.
template <typename F>
bool refuses(const char* what, F f) {
  try {
    f();
  } catch (const swiftqk::Error& e) {
    std::printf("%s refused: %s\n", what, e.what());
    return true;
  }
  std::fprintf(stderr, "FAILED: %s was accepted\n", what);
  return false;
}

}  // namespace

int main() {
  swiftqk::QkNormParams p;
  p.tokens = 4;
  p.q_full_width = 5120;
  p.k_full_width = 1024;
  p.q.width = 5120 / 3;  // widths that do not split over 3 ranks: must be refused
  p.k.width = 1024 / 3;
  if (!refuses("widths that do not split over 3 ranks", [&] { swiftqk::validate_params(p, 3); })) {
    return 1;
  }
  // A tuning an engine might set: a valid one passes, stages past kMaxStages do not.
  swiftqk::LaunchTuning t;
  t.stages = 3;
  t.defer = 2;
  t.block_order = swiftqk::LaunchTuning::BlockOrder::kInterleaved;
  t.validate();
  t.stages = swiftqk::kMaxStages + 1;
  if (!refuses("LaunchTuning.stages past kMaxStages", [&] { t.validate(); })) return 1;
  std::printf("swiftqk consumer: ok\n");
  return 0;
}
