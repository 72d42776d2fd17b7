// A thread that bounds waits the host cannot bound itself: each watch polls a completion test
// until it holds or its deadline passes, and then runs the watch's expiry action once. The NCCL
// fallback watches each eager all-reduce with it: a peer that never joins would otherwise leave
// the all-reduce, and every later call on the stream, waiting for ever. Plain C++ (no CUDA):
// CPU-tested with fake completion tests.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace swiftqk::detail {

class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;

  /// @param poll how often the thread tests the pending watches.
  explicit Watchdog(Clock::duration poll = std::chrono::microseconds(500)) : poll_(poll) {
    thread_ = std::thread([this] { run(); });
  }
  /// Stops the thread. Pending watches are dropped without their expiry running: the owner has
  /// either waited for them or is tearing down what they watch.
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  /// Watches until done() returns true; if `timeout` passes first, runs expire() once, on the
  /// watchdog's thread, and drops the watch. The timeout counts from the first test at which
  /// started() holds (a stream's work watched from when the stream reaches it, not from when
  /// the host queued it); without started, from now. done() and started() run on that thread
  /// too, never concurrently with themselves or with expire(). None may call this Watchdog.
  void watch(std::function<bool()> done, Clock::duration timeout, std::function<void()> expire,
             std::function<bool()> started = {}) {
    Watch w{std::move(done), std::move(started), timeout, Clock::time_point::max(),
            std::move(expire)};
    if (!w.started) w.deadline = Clock::now() + timeout;
    {
      std::lock_guard<std::mutex> lock(mu_);
      watches_.push_back(std::move(w));
    }
    cv_.notify_all();
  }

  /// Watches not yet completed or expired.
  std::size_t pending() const {
    std::lock_guard<std::mutex> lock(mu_);
    return watches_.size() + in_hand_;
  }

  /// Expiries run so far.
  std::size_t expired() const {
    std::lock_guard<std::mutex> lock(mu_);
    return expired_;
  }

 private:
  struct Watch {
    std::function<bool()> done;
    std::function<bool()> started;  // empty: started at watch()
    Clock::duration timeout;
    Clock::time_point deadline;  // max() until started
    std::function<void()> expire;
  };

  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      if (watches_.empty()) {
        cv_.wait(lock, [this] { return stop_ || !watches_.empty(); });
        continue;
      }
      // The tests run outside the lock, so watch() and pending() never wait for a slow one.
      std::vector<Watch> mine;
      mine.swap(watches_);
      in_hand_ = mine.size();
      lock.unlock();
      std::vector<Watch> keep, fired;
      for (Watch& w : mine) {
        if (w.done()) continue;
        const Clock::time_point now = Clock::now();
        if (w.deadline == Clock::time_point::max() && w.started()) w.deadline = now + w.timeout;
        (now >= w.deadline ? fired : keep).push_back(std::move(w));
      }
      for (Watch& w : fired) w.expire();
      lock.lock();
      in_hand_ = 0;
      expired_ += fired.size();
      watches_.insert(watches_.begin(), std::make_move_iterator(keep.begin()),
                      std::make_move_iterator(keep.end()));
      cv_.wait_for(lock, poll_, [this] { return stop_; });
    }
  }

  const Clock::duration poll_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Watch> watches_;
  std::size_t in_hand_ = 0;
  std::size_t expired_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace swiftqk::detail
