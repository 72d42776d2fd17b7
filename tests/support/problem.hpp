// Test and benchmark problems: full (unsharded) random Q and K on the host, their shards on the
// device for N ranks, poisoned outputs, and the check of the gathered result against float64.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda_check.hpp"
#include "reference.hpp"
#include "swiftqk/communicator.hpp"

namespace swiftqk::testing {

inline bool has_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

/// A peer wait bound for tests whose ranks wait on each other: `seconds`, scaled by the
/// environment's SWIFTQK_TEST_WAIT_SCALE (default 1). Under compute-sanitizer's racecheck the
/// kernels run tens of times slower, and a wait sized for the bare GPU expires before the peer
/// block gets there; scaling it lets those tests run to completion there.
inline double wait_s(double seconds) {
  const char* env = std::getenv("SWIFTQK_TEST_WAIT_SCALE");
  const double scale = env != nullptr ? std::atof(env) : 1.0;
  return scale > 0.0 ? seconds * scale : seconds;
}

/// Owning device allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes > 0) SWIFTQK_CUDA_TRY(cudaMalloc(&p_, bytes));
  }
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  template <typename T = uint8_t>
  T* get() const {
    return static_cast<T*>(p_);
  }
  std::size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
};

/// Full-width inputs of one call, as stored (dtype `in`) and as exact values (double).
struct Problem {
  int64_t tokens = 0, q_width = 0, k_width = 0;
  DType in = DType::kBF16;
  NormOrder order = NormOrder::kOlmo2;
  float eps = 1e-6f;
  float q_scale = 1.f, k_scale = 1.f;    // fp8 dequantisation scales
  std::vector<uint8_t> q, k;             // [tokens, width] in dtype `in`
  std::vector<uint8_t> wq, wk;           // [width] in the output dtype
  std::vector<double> qd, kd, wqd, wkd;  // the stored values (fp8: dequantised)
  std::vector<double> qo, ko;            // quantised inputs only: the values before quantisation

  DType out() const { return output_dtype_for(in); }
  /// Whether the inputs are stored with a per-tensor scale (fp8): only then do the stored values
  /// differ from the values drawn by more than the input type's own rounding.
  bool quantised() const { return in == DType::kF8E4M3; }
  /// Normal values with a per-token magnitude spread over ~2 decades (never zeros); weights
  /// uniform in [0.25, 2). fp8 inputs get a per-tensor scale (amax / 448) and a saturating cast,
  /// and keep the values drawn (qo, ko) for the end-to-end gold.
  static Problem random(int64_t tokens, int64_t q_width, int64_t k_width, DType in, NormOrder order,
                        float eps, uint64_t seed);
  /// Refills q and k with fresh random values (weights kept).
  void refill(uint64_t seed);
  /// ref::rms_norm_fp64 of q and k, the rows split across the machine's cores (the same bits:
  /// ref::rms_norm_fp64_rows); at 16384 tokens a serial reference took seconds per check.
  std::vector<double> gold_q() const;
  std::vector<double> gold_k() const;
  /// The same of the values before quantisation (quantised inputs only): the end-to-end gold, the
  /// one an fp8 pipeline is judged by, quantisation error included.
  std::vector<double> gold_q_original() const;
  std::vector<double> gold_k_original() const;
};

/// How a rank's Q and K shards sit in memory.
enum class Layout {
  kSeparate,         // q_in, k_in, q_out, k_out separate dense buffers
  kFusedInPlace,     // column views of one [tokens, q+2k] QKV buffer, normalised in place
  kFusedOutOfPlace,  // views of a fused input buffer into a second fused output buffer
};

/// One rank's device buffers and launch parameters.
struct RankData {
  DeviceBuffer in, out, wq, wk, rstd;
  QkNormParams params;
};

/// Captures what `body` enqueues on s into an instantiated graph (the caller destroys it with
/// cudaGraphExecDestroy).
template <typename Body>
cudaGraphExec_t capture_graph(cudaStream_t s, Body body,
                              cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  SWIFTQK_CUDA_TRY(cudaStreamBeginCapture(s, mode));
  body();
  SWIFTQK_CUDA_TRY(cudaStreamEndCapture(s, &g));
  SWIFTQK_CUDA_TRY(cudaGraphInstantiate(&ge, g, 0));
  SWIFTQK_CUDA_TRY(cudaGraphDestroy(g));
  return ge;
}

/// Uploads rank r's shard of p for a group of `world` (buffers sized for p.tokens).
RankData make_rank(const Problem& p, int world, int rank, Layout layout);
/// Copies p's current q/k values into an existing rank's input buffer (same shape).
void upload_inputs(const Problem& p, int world, int rank, RankData& d, cudaStream_t s);
/// Fills the rank's outputs (and rstd) with 0xFF bytes: NaN in every float type.
void poison(RankData& d, cudaStream_t s);

/// Result of gathering all ranks' outputs and comparing them with the float64 gold output.
struct Check {
  int64_t wrong = 0;  // elements outside the dtype's tolerance (NaN counts)
  ref::ErrorMetrics q, k;
  // Quantised inputs only (has_e2e): the same outputs against the gold of the values before
  // quantisation. q and k measure the kernel; these measure what fp8 costs end to end.
  bool has_e2e = false;
  ref::ErrorMetrics q_e2e, k_e2e;
  bool rstd_identical = true;  // every rank reported bitwise-identical 1/rms (when rstd kept)
  std::string first_error;
};
Check check_ranks(const Problem& p, int world, const std::vector<RankData*>& ranks);

/// Checks one rank's output slice (and nothing else) against the gold output; used where each
/// rank is its own process.
Check check_rank(const Problem& p, int world, int rank, const RankData& d);

/// Throws unless every rank's output buffer still holds the poison (nothing written).
bool outputs_untouched(const Problem& p, int world, const RankData& d);

/// What one rank's outputs hold after a call that may have failed: every element is NaN (what a
/// failed call writes), correct (within the dtype's tolerance of the float64 gold), or wrong
/// (finite and out of tolerance: a silent error, which must never happen).
struct Census {
  int64_t nan = 0, correct = 0, wrong = 0;
  int64_t total() const { return nan + correct + wrong; }
  bool all_nan() const { return nan == total(); }
  bool all_correct() const { return correct == total(); }
};
Census census_rank(const Problem& p, int world, int rank, const RankData& d);

}  // namespace swiftqk::testing
