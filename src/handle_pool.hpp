// A pool of handles (the NCCL fallback's CUDA events) that one thread takes and another may give
// back. Plain C++ (no CUDA): CPU-tested with fake handles.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

namespace swiftqk::detail {

/// @brief Reuses handles instead of creating and destroying two per call: the NCCL fallback takes
/// a begin and an end event for each eager all-reduce on the launching thread, and its watchdog
/// thread gives them back once the stream has passed them. The pool owns every handle it created
/// and destroys them all at clear() or destruction, those still out included: a watch the
/// watchdog drops at teardown never gives its events back.
template <typename Handle>
class HandlePool {
 public:
  using Create = std::function<Handle()>;
  using Destroy = std::function<void(Handle)>;

  HandlePool(Create create, Destroy destroy)
      : create_(std::move(create)), destroy_(std::move(destroy)) {}
  HandlePool(const HandlePool&) = delete;
  HandlePool& operator=(const HandlePool&) = delete;
  ~HandlePool() { clear(); }

  /// @brief A free handle, else a new one. If creating throws, the pool is as it was.
  Handle take() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_.empty()) {
      Handle h = free_.back();
      free_.pop_back();
      return h;
    }
    all_.reserve(all_.size() + 1);  // so that the push below cannot throw after creating
    Handle h = create_();
    all_.push_back(h);
    return h;
  }

  /// @brief Returns h for reuse. False, and nothing changes, for a handle this pool did not
  /// create or that is free already (a caller's bug, which must not make two takers share one).
  bool give_back(Handle h) {
    std::lock_guard<std::mutex> lock(mu_);
    if (std::find(all_.begin(), all_.end(), h) == all_.end()) return false;
    if (std::find(free_.begin(), free_.end(), h) != free_.end()) return false;
    free_.push_back(h);
    return true;
  }

  /// @brief Destroys every handle the pool created, taken or free; it stays usable.
  void clear() noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    for (Handle h : all_) destroy_(h);
    all_.clear();
    free_.clear();
  }

  /// Handles created and not yet destroyed.
  std::size_t created() const {
    std::lock_guard<std::mutex> lock(mu_);
    return all_.size();
  }
  /// Of those, the ones free to take.
  std::size_t free() const {
    std::lock_guard<std::mutex> lock(mu_);
    return free_.size();
  }

 private:
  Create create_;
  Destroy destroy_;
  mutable std::mutex mu_;
  std::vector<Handle> all_;
  std::vector<Handle> free_;
};

}  // namespace swiftqk::detail
