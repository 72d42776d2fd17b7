// Tests for the Watchdog (src/watchdog.hpp) that bounds the NCCL fallback's all-reduces: a watch
// whose test holds in time never expires, one whose test never holds expires once, within its
// timeout plus the poll, and watches are independent of each other.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "watchdog.hpp"

namespace swiftqk::detail {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Waits, bounded, until pred() holds.
template <typename P>
bool eventually(P pred, Clock::duration bound = 5s) {
  const auto end = Clock::now() + bound;
  while (Clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return pred();
}

TEST(Watchdog, AWatchThatCompletesInTimeNeverExpires) {
  Watchdog dog(200us);
  std::atomic<bool> done{false};
  std::atomic<int> expired{0};
  dog.watch([&] { return done.load(); }, 2s, [&] { ++expired; });
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(dog.pending(), 1u);
  done = true;
  ASSERT_TRUE(eventually([&] { return dog.pending() == 0; }));
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(expired.load(), 0);
  EXPECT_EQ(dog.expired(), 0u);
}

TEST(Watchdog, AWatchThatNeverCompletesExpiresOnceWithinItsBound) {
  Watchdog dog(200us);
  std::atomic<int> expired{0};
  std::atomic<int64_t> at_us{0};
  const auto start = Clock::now();
  dog.watch(
      [] { return false; }, 30ms,
      [&] {
        at_us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count();
        ++expired;
      });
  ASSERT_TRUE(eventually([&] { return expired.load() == 1; }));
  EXPECT_GE(at_us.load(), 30000);    // never before its timeout
  EXPECT_LT(at_us.load(), 2000000);  // and soon after it (loaded CI machines: generous)
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(expired.load(), 1);  // once: the watch is dropped
  EXPECT_EQ(dog.pending(), 0u);
  EXPECT_EQ(dog.expired(), 1u);
}

TEST(Watchdog, TheTimeoutCountsFromTheStart) {
  Watchdog dog(200us);
  std::atomic<bool> started{false};
  std::atomic<int> expired{0};
  dog.watch([] { return false; }, 20ms, [&] { ++expired; }, [&] { return started.load(); });
  std::this_thread::sleep_for(100ms);  // five timeouts, not started: no expiry
  EXPECT_EQ(expired.load(), 0);
  EXPECT_EQ(dog.pending(), 1u);
  const auto start = Clock::now();
  started = true;
  ASSERT_TRUE(eventually([&] { return expired.load() == 1; }));
  EXPECT_GE(Clock::now() - start, 20ms);
  // Done before it starts: dropped, never expired.
  dog.watch([] { return true; }, 1ms, [&] { ++expired; }, [] { return false; });
  ASSERT_TRUE(eventually([&] { return dog.pending() == 0; }));
  EXPECT_EQ(expired.load(), 1);
}

TEST(Watchdog, WatchesAreIndependent) {
  Watchdog dog(200us);
  std::atomic<bool> a_done{false};
  std::atomic<int> a_expired{0}, b_expired{0}, c_expired{0};
  dog.watch([&] { return a_done.load(); }, 10s, [&] { ++a_expired; });
  dog.watch([] { return false; }, 10ms, [&] { ++b_expired; });
  dog.watch([] { return true; }, 0ms, [&] { ++c_expired; });  // done at its first test
  ASSERT_TRUE(eventually([&] { return b_expired.load() == 1; }));
  EXPECT_EQ(dog.pending(), 1u);  // a, still waiting
  a_done = true;
  ASSERT_TRUE(eventually([&] { return dog.pending() == 0; }));
  EXPECT_EQ(a_expired.load(), 0);
  EXPECT_EQ(c_expired.load(), 0);
  EXPECT_EQ(dog.expired(), 1u);
}

TEST(Watchdog, DestroyingItDropsPendingWatchesWithoutExpiring) {
  std::atomic<int> expired{0};
  {
    Watchdog dog(200us);
    dog.watch([] { return false; }, 10s, [&] { ++expired; });
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(expired.load(), 0);
}

// Control: the expiry comes from the watchdog's polls, not from the test's own waiting. With a
// poll far longer than the timeout, the watch is tested at once (not yet due) and expires only
// at the next poll.
TEST(Watchdog, TheBoundComesFromThePoll) {
  Watchdog slow(600ms);
  std::atomic<int> expired{0};
  const auto start = Clock::now();
  slow.watch([] { return false; }, 100ms, [&] { ++expired; });
  ASSERT_TRUE(eventually([&] { return expired.load() == 1; }));
  EXPECT_GE(Clock::now() - start, 500ms);
}

}  // namespace
}  // namespace swiftqk::detail
