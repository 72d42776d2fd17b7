// Two graphs of one pair of virtual ranks, on different inputs, replayed at once on two streams:
// the "two kernels of one communicator" scenario of the failure tests and swiftqk_fault_report.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "cuda_check.hpp"
#include "failure_helpers.hpp"
#include "problem.hpp"
#include "stream_gate.hpp"
#include "swiftqk/communicator.hpp"

namespace swiftqk::testing {

/// The pair runs within half the SMs (its sm_budget), so that both graphs' kernels fit the GPU
/// at once, with a 1 s timeout; 4096 tokens of 4096:1024 bf16 (OLMo2 order) make each call long
/// enough for the two to overlap. A partial taken from the other graph's inputs makes a row
/// wrong.
struct ConcurrentReplays {
  std::vector<Communicator> comms;
  std::vector<Communicator*> ptrs;
  Problem pa, pb;
  RankData a0, a1, b0, b1;
  cudaStream_t sa = new_stream(), sb = new_stream(), sg = new_stream();
  cudaGraphExec_t ga = nullptr, gb = nullptr;
  cudaEvent_t opened = nullptr;

  ConcurrentReplays(uint64_t seed_a, uint64_t seed_b)
      : comms(Communicator::create_local_group({0, 0}, config())),
        ptrs{&comms[0], &comms[1]},
        pa(Problem::random(4096, 4096, 1024, DType::kBF16, NormOrder::kOlmo2, 1e-6f, seed_a)),
        pb(Problem::random(4096, 4096, 1024, DType::kBF16, NormOrder::kOlmo2, 1e-6f, seed_b)),
        a0(make_rank(pa, 2, 0, Layout::kSeparate)),
        a1(make_rank(pa, 2, 1, Layout::kSeparate)),
        b0(make_rank(pb, 2, 0, Layout::kSeparate)),
        b1(make_rank(pb, 2, 1, Layout::kSeparate)) {
    ga = capture_graph(sa, [&] { launch_qk_norm_group(ptrs, {a0.params, a1.params}, sa); });
    gb = capture_graph(sb, [&] { launch_qk_norm_group(ptrs, {b0.params, b1.params}, sb); });
    SWIFTQK_CUDA_TRY(cudaEventCreateWithFlags(&opened, cudaEventDisableTiming));
  }
  ConcurrentReplays(const ConcurrentReplays&) = delete;
  ConcurrentReplays& operator=(const ConcurrentReplays&) = delete;
  ~ConcurrentReplays() {
    cudaEventDestroy(opened);
    cudaGraphExecDestroy(ga);
    cudaGraphExecDestroy(gb);
    for (cudaStream_t x : {sa, sb, sg}) cudaStreamDestroy(x);
  }

  static CommConfig config() {
    int sms = 0;
    SWIFTQK_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CommConfig cfg;
    cfg.timeout_s = 1.0;
    cfg.sm_budget = sms / 2 - 1;
    return cfg;
  }
  /// Poisons all four ranks' outputs and waits, so that a replay that writes nothing shows.
  void poison_all() {
    for (RankData* d : {&a0, &a1, &b0, &b1}) poison(*d, nullptr);
    SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
  }
  /// Both graphs, started together; waits for both.
  Together replay() { return replay_together(ga, sa, gb, sb, sg, opened); }
};

}  // namespace swiftqk::testing
