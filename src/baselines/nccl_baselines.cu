// All-Gather and Comm-Overlap (nccl_baselines.hpp): the shards all-gathered into full rows,
// normalised by the fused kernel alone (world 1, weights of one), and this rank's slice scaled
// with its own weights.
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "baselines/nccl_baselines.hpp"
#include "comm_state.hpp"
#include "cuda_check.hpp"
#include "kernels/eager_kernels.cuh"
#include "nccl_allreduce_fallback.hpp"

namespace swiftqk::detail {

namespace {

constexpr int kOverlapChunks = 4;  // Comm-Overlap: token chunks pipelined over two streams

void interleave(const uint8_t* gathered, uint8_t* full, int world, int64_t T, int64_t w_bytes,
                cudaStream_t s) {
  const int grid = 1024;
  if (w_bytes % 16 == 0) {
    interleave_kernel<uint4><<<grid, 256, 0, s>>>(gathered, full, world, T, w_bytes);
  } else {
    interleave_kernel<uint8_t><<<grid, 256, 0, s>>>(gathered, full, world, T, w_bytes);
  }
  SWIFTQK_CUDA_TRY(cudaGetLastError());
}

std::size_t align256(std::size_t b) { return (b + 255) / 256 * 256; }

// Scratch of one chunk of `cap` tokens: where each piece lives.
struct Scratch {
  uint8_t *send_q, *send_k, *recv_q, *recv_k, *full_q, *full_k, *out_q, *out_k, *ones;
  float2* stat;
  std::size_t bytes;
};

Scratch carve(uint8_t* base, int world, int64_t cap, int64_t wq, int64_t wk, std::size_t is,
              std::size_t os) {
  Scratch sc{};
  std::size_t off = 0;
  auto take = [&](std::size_t b) {
    uint8_t* p = base == nullptr ? nullptr : base + off;
    off += align256(b);
    return p;
  };
  const int64_t hq = wq * world, hk = wk * world;
  sc.ones = take((hq + hk) * os);  // first, so that its contents survive a change of shape
  sc.send_q = take(cap * wq * is);
  sc.send_k = take(cap * wk * is);
  sc.recv_q = take(cap * hq * is);
  sc.recv_k = take(cap * hk * is);
  sc.full_q = take(cap * hq * is);
  sc.full_k = take(cap * hk * is);
  sc.out_q = take(cap * hq * os);
  sc.out_k = take(cap * hk * os);
  sc.stat = reinterpret_cast<float2*>(take(cap * sizeof(float2)));
  sc.bytes = off;
  return sc;
}

// `n` ones in the output type `out` (f32, f16 or bf16), as the bytes the weights hold.
std::vector<uint8_t> ones_of(DType out, int64_t n) {
  std::vector<uint8_t> host(n * dtype_size(out));
  const float one_f32 = 1.0f;
  const uint16_t one_16 = out == DType::kF16 ? 0x3c00 : 0x3f80;  // binary16 / bfloat16 1.0
  for (int64_t i = 0; i < n; ++i) {
    if (out == DType::kF32) {
      std::memcpy(host.data() + 4 * i, &one_f32, 4);
    } else {
      std::memcpy(host.data() + 2 * i, &one_16, 2);
    }
  }
  return host;
}

const char* const kBaselines = "method all_gather/comm_overlap";

}  // namespace

// The scratch of the full rows, the side stream and the communicator of one rank that normalises
// them. Freed with the communicator's state, its device current.
struct BaselineState {
  RetainedScratch scratch;  // [ones | send | recv | full rows | out | stats] (carve)
  int64_t ones_elems = 0;   // leading elements of the ones weight, in ones_dtype
  DType ones_dtype = DType::kF32;
  cudaStream_t side_stream = nullptr;    // Comm-Overlap's all-gathers
  std::vector<cudaEvent_t> side_events;  // fork/join and per-chunk events
  std::unique_ptr<Communicator> solo;    // world-1 communicator for full-width norms

  ~BaselineState() {
    for (cudaEvent_t e : side_events) cudaEventDestroy(e);
    if (side_stream) cudaStreamDestroy(side_stream);
  }
};

void BaselineStateDeleter::operator()(BaselineState* b) const noexcept { delete b; }

namespace {

BaselineState& baselines_of(CommState& st) {
  if (!st.baselines) st.baselines.reset(new BaselineState);
  return *st.baselines;
}

// Grows the scratch (never under capture: warm up with an eager call first, as engines do
// before capturing graphs) and refreshes the ones weight.
Scratch ensure_scratch(CommState& st, int64_t cap, int64_t wq, int64_t wk, DType in,
                       cudaStream_t s) {
  BaselineState& b = baselines_of(st);
  const DType out = output_dtype_for(in);
  const std::size_t is = dtype_size(in), os = dtype_size(out);
  const Scratch need = carve(nullptr, st.world, cap, wq, wk, is, os);
  const int64_t ones = (wq + wk) * st.world;
  const bool fresh = b.scratch.reserve(need.bytes, s, kBaselines);
  if (fresh || b.ones_elems < ones || b.ones_dtype != out) {
    expect_not_capturing(s, kBaselines);
    const std::vector<uint8_t> host = ones_of(out, ones);
    const Scratch sc =
        carve(static_cast<uint8_t*>(b.scratch.data()), st.world, cap, wq, wk, is, os);
    SWIFTQK_CUDA_TRY(cudaMemcpy(sc.ones, host.data(), host.size(), cudaMemcpyHostToDevice));
    b.ones_elems = ones;
    b.ones_dtype = out;
  }
  return carve(static_cast<uint8_t*>(b.scratch.data()), st.world, cap, wq, wk, is, os);
}

void ensure_side_stream(BaselineState& b) {
  if (b.side_stream != nullptr) return;
  SWIFTQK_CUDA_TRY(cudaStreamCreateWithFlags(&b.side_stream, cudaStreamNonBlocking));
  b.side_events.resize(kOverlapChunks + 2);
  for (auto& e : b.side_events) {
    SWIFTQK_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
}

Communicator& solo_of(CommState& st) {
  BaselineState& b = baselines_of(st);
  if (!b.solo) {
    auto group = Communicator::create_local_group({st.device}, st.config);
    b.solo = std::make_unique<Communicator>(std::move(group[0]));
  }
  return *b.solo;
}

// All-gathers `tokens` rows of this rank's Q and K shards starting at `first` (two calls, as
// vLLM's OLMo2 code makes) into sc.recv_*, on stream s.
void gather_chunk(CommState& st, const QkNormParams& p, const Scratch& sc, int64_t first,
                  int64_t tokens, int64_t off_rows, cudaStream_t s) {
  const std::size_t is = dtype_size(p.in_dtype);
  const int64_t wq = p.q.width, wk = p.k.width;
  uint8_t* send_q = sc.send_q + off_rows * wq * is;
  uint8_t* send_k = sc.send_k + off_rows * wk * is;
  SWIFTQK_CUDA_TRY(cudaMemcpy2DAsync(
      send_q, wq * is, static_cast<const uint8_t*>(p.q.in) + first * p.q.in_stride * is,
      p.q.in_stride * is, wq * is, tokens, cudaMemcpyDeviceToDevice, s));
  SWIFTQK_CUDA_TRY(cudaMemcpy2DAsync(
      send_k, wk * is, static_cast<const uint8_t*>(p.k.in) + first * p.k.in_stride * is,
      p.k.in_stride * is, wk * is, tokens, cudaMemcpyDeviceToDevice, s));
  uint8_t* recv_q = sc.recv_q + off_rows * wq * st.world * is;
  uint8_t* recv_k = sc.recv_k + off_rows * wk * st.world * is;
  if (st.world > 1) {
    SWIFTQK_NCCL_TRY(ncclAllGather(send_q, recv_q, tokens * wq * is, ncclUint8, st.nccl, s));
    SWIFTQK_NCCL_TRY(ncclAllGather(send_k, recv_k, tokens * wk * is, ncclUint8, st.nccl, s));
  } else {
    SWIFTQK_CUDA_TRY(
        cudaMemcpyAsync(recv_q, send_q, tokens * wq * is, cudaMemcpyDeviceToDevice, s));
    SWIFTQK_CUDA_TRY(
        cudaMemcpyAsync(recv_k, send_k, tokens * wk * is, cudaMemcpyDeviceToDevice, s));
  }
}

// Full-width RMSNorm of gathered rows, then the local slice: interleave [N][T][w] into rows,
// normalise full rows (the fused kernel alone, weights of one; its per-token 1/rms kept), and
// write this rank's slice with its own weights.
void norm_chunk(CommState& st, const QkNormParams& p, const Scratch& sc, int64_t first,
                int64_t tokens, int64_t off_rows, cudaStream_t s) {
  const std::size_t is = dtype_size(p.in_dtype), os = dtype_size(output_dtype_for(p.in_dtype));
  const int64_t wq = p.q.width, wk = p.k.width, hq = wq * st.world, hk = wk * st.world;
  uint8_t* full_q = sc.full_q + off_rows * hq * is;
  uint8_t* full_k = sc.full_k + off_rows * hk * is;
  interleave(sc.recv_q + off_rows * hq * is, full_q, st.world, tokens, wq * is, s);
  interleave(sc.recv_k + off_rows * hk * is, full_k, st.world, tokens, wk * is, s);
  QkNormParams f;
  f.tokens = tokens;
  f.q_full_width = hq;
  f.k_full_width = hk;
  f.in_dtype = p.in_dtype;
  f.eps = p.eps;
  f.order = p.order;
  f.q = {full_q, sc.out_q + off_rows * hq * os, sc.ones, hq, hq, hq, p.q.in_scale};
  f.k = {full_k, sc.out_k + off_rows * hk * os, sc.ones + hq * os, hk, hk, hk, p.k.in_scale};
  f.rstd_out = reinterpret_cast<float*>(sc.stat + off_rows);
  launch_qk_norm(solo_of(st), f, s);
  launch_apply_scale(p.in_dtype, rank_args_for(st, p, first), tokens, wq, wk,
                     vector_bytes_for(p) == 16, p.order, sc.stat + off_rows, true, 0.f, 0.f, p.eps,
                     s);
}

}  // namespace

void launch_nccl_baseline(Communicator& comm, const QkNormParams& p, cudaStream_t stream) {
  CommState& st = comm.state();
  SWIFTQK_EXPECTS(st.world == 1 || st.nccl != nullptr,
                  "method " + to_string(p.method) +
                      " needs a communicator made by Communicator::from_nccl (one GPU per "
                      "rank); this group of " +
                      std::to_string(st.world) + " has no NCCL");
  // MiniMax eager's scheme is the library's own exchange without P2P.
  if (p.method == Method::kMiniMaxEager) return launch_nccl_allreduce_fallback(comm, p, stream);
  DeviceGuard guard(st.device);
  const int64_t cap = st.config.token_capacity;
  const Scratch sc =
      ensure_scratch(st, std::min(cap, p.tokens), p.q.width, p.k.width, p.in_dtype, stream);
  for (int64_t first = 0; first < p.tokens; first += cap) {
    const int64_t tokens = std::min(cap, p.tokens - first);
    if (p.method == Method::kAllGather) {
      gather_chunk(st, p, sc, first, tokens, 0, stream);
      norm_chunk(st, p, sc, first, tokens, 0, stream);
    } else {
      // Comm-Overlap: the side stream gathers chunk c+1 while this stream normalises chunk c.
      BaselineState& b = baselines_of(st);
      ensure_side_stream(b);
      const int64_t chunk = std::max<int64_t>(1, (tokens + kOverlapChunks - 1) / kOverlapChunks);
      cudaEvent_t inputs_ready = b.side_events[kOverlapChunks];
      SWIFTQK_CUDA_TRY(cudaEventRecord(inputs_ready, stream));
      SWIFTQK_CUDA_TRY(cudaStreamWaitEvent(b.side_stream, inputs_ready, 0));
      int c = 0;
      for (int64_t off = 0; off < tokens; off += chunk, ++c) {
        const int64_t n = std::min(chunk, tokens - off);
        gather_chunk(st, p, sc, first + off, n, off, b.side_stream);
        SWIFTQK_CUDA_TRY(cudaEventRecord(b.side_events[c], b.side_stream));
      }
      c = 0;
      for (int64_t off = 0; off < tokens; off += chunk, ++c) {
        const int64_t n = std::min(chunk, tokens - off);
        SWIFTQK_CUDA_TRY(cudaStreamWaitEvent(stream, b.side_events[c], 0));
        norm_chunk(st, p, sc, first + off, n, off, stream);
      }
    }
  }
  comm.check_error();
}

}  // namespace swiftqk::detail
