// Device scratch of the NCCL paths, which grows and is never freed while its communicator lives.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <vector>

namespace swiftqk::detail {

/// @brief Throws unless `stream` is not being captured: `who`'s scratch must be sized (and filled)
/// by an eager call of the same or larger shape before CUDA-graph capture.
void expect_not_capturing(cudaStream_t stream, const std::string& who);

/// @brief A device buffer that grows outside CUDA-graph capture only. An outgrown buffer is kept,
/// not freed, until release(): a graph captured earlier may still replay on it.
class RetainedScratch {
 public:
  RetainedScratch() = default;
  RetainedScratch(const RetainedScratch&) = delete;
  RetainedScratch& operator=(const RetainedScratch&) = delete;
  ~RetainedScratch() { release(); }

  /// @brief Makes the buffer at least `bytes` long, on the current device; true when it is a new
  /// buffer (whose contents are undefined). Growing synchronises `stream` first, and throws while
  /// it is capturing (expect_not_capturing; engines warm up with eager calls before capturing).
  bool reserve(std::size_t bytes, cudaStream_t stream, const std::string& who);
  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  /// @brief Frees the buffer and every outgrown one, with their device current (CommState::release
  /// sets it). Reports nothing: destruction paths have no caller left to tell.
  void release() noexcept;

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  std::vector<void*> retired_;
};

}  // namespace swiftqk::detail
