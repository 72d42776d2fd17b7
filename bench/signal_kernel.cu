// Ping-pong between two GPUs through peer memory: the NVLink signal round trip that bounds how
// fast a per-token exchange can complete (issue 6's floor: local time + one round trip).
#include "cuda_check.hpp"
#include "signal_kernel.hpp"
#include "swiftqk/error.hpp"

namespace swiftqk::bench {

namespace {

__device__ __forceinline__ uint32_t load_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// result[0]: nanoseconds of the timed rounds (initiator), result[1]: 1 if a wait timed out.
__global__ void ping_pong_kernel(uint32_t* mine, uint32_t* peer, int initiator, int warmup,
                                 int rounds, uint64_t timeout_ns, uint64_t* result) {
  uint64_t start = 0;
  const int total = warmup + rounds;
  for (int i = 1; i <= total; ++i) {
    if (i == warmup + 1) start = now_ns();
    if (initiator) store_sys(peer, static_cast<uint32_t>(i));
    const uint64_t t0 = now_ns();
    while (load_sys(mine) != static_cast<uint32_t>(i)) {
      if (now_ns() - t0 > timeout_ns) {
        result[1] = 1;
        return;
      }
    }
    if (!initiator) store_sys(peer, static_cast<uint32_t>(i));
  }
  result[0] = now_ns() - start;
  result[1] = 0;
}

}  // namespace

double ping_pong_us(uint32_t* mine, uint32_t* peer, bool initiator, int warmup, int rounds,
                    double timeout_s, cudaStream_t stream) {
  SWIFTQK_EXPECTS(rounds > 0 && warmup >= 0, "ping_pong_us: rounds must be positive");
  uint64_t* result = nullptr;
  SWIFTQK_CUDA_TRY(cudaMalloc(&result, 2 * sizeof(uint64_t)));
  ping_pong_kernel<<<1, 1, 0, stream>>>(mine, peer, initiator ? 1 : 0, warmup, rounds,
                                        static_cast<uint64_t>(timeout_s * 1e9), result);
  SWIFTQK_CUDA_TRY(cudaGetLastError());
  uint64_t host[2] = {0, 0};
  SWIFTQK_CUDA_TRY(cudaMemcpyAsync(host, result, sizeof host, cudaMemcpyDeviceToHost, stream));
  SWIFTQK_CUDA_TRY(cudaStreamSynchronize(stream));
  SWIFTQK_CUDA_TRY(cudaFree(result));
  SWIFTQK_EXPECTS(host[1] == 0, "ping-pong: the partner GPU never answered within the timeout");
  return initiator ? static_cast<double>(host[0]) / rounds / 1e3 : 0.0;
}

}  // namespace swiftqk::bench
