// A host-side gate for starting work on several streams together: a host function enqueued on
// one stream blocks it until release(), and the others wait on an event recorded behind it.
#pragma once

#include <cuda_runtime_api.h>

#include <condition_variable>
#include <mutex>

namespace swiftqk::testing {

struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  static void CUDART_CB wait(void* self) {
    Gate* g = static_cast<Gate*>(self);
    std::unique_lock<std::mutex> lock(g->mu);
    g->cv.wait(lock, [g] { return g->open; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu);
    open = true;
    cv.notify_all();
  }
};

}  // namespace swiftqk::testing
