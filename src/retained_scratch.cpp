// Growth and release of the NCCL paths' scratch (retained_scratch.hpp).
#include "retained_scratch.hpp"

#include "comm_state.hpp"
#include "cuda_check.hpp"

namespace swiftqk::detail {

void expect_not_capturing(cudaStream_t stream, const std::string& who) {
  SWIFTQK_EXPECTS(!stream_capturing(stream),
                  who +
                      ": its scratch must be sized by an eager call of the same or larger "
                      "shape before CUDA-graph capture");
}

bool RetainedScratch::reserve(std::size_t bytes, cudaStream_t stream, const std::string& who) {
  if (bytes <= bytes_) return false;
  expect_not_capturing(stream, who);
  SWIFTQK_CUDA_TRY(cudaStreamSynchronize(stream));
  if (data_ != nullptr) retired_.push_back(data_);
  data_ = nullptr;
  bytes_ = 0;
  SWIFTQK_CUDA_TRY(cudaMalloc(&data_, bytes));
  bytes_ = bytes;
  return true;
}

void RetainedScratch::release() noexcept {
  if (data_ != nullptr) cudaFree(data_);
  data_ = nullptr;
  bytes_ = 0;
  for (void* p : retired_) cudaFree(p);
  retired_.clear();
}

}  // namespace swiftqk::detail
