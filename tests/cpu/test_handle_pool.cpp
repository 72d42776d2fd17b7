// Tests for HandlePool (src/handle_pool.hpp), the NCCL fallback's pool of CUDA events, with fake
// handles: a handle given back is taken again instead of a new one, no handle is ever held by two
// takers, a foreign or doubly given-back handle is refused, everything created is destroyed once
// (handles still out included), and a creation that throws leaves the pool as it was.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "handle_pool.hpp"

namespace swiftqk::detail {
namespace {

// Fake handles: increasing ints from 1; records what was destroyed.
struct Fakes {
  int next = 1;
  std::vector<int> destroyed;
  bool fail_create = false;
  HandlePool<int> pool{[this] {
                         if (fail_create) throw std::runtime_error("create failed");
                         return next++;
                       },
                       [this](int h) { destroyed.push_back(h); }};
};

TEST(HandlePool, AHandleGivenBackIsTakenAgainInsteadOfANewOne) {
  Fakes f;
  const int a = f.pool.take();
  const int b = f.pool.take();
  EXPECT_NE(a, b);
  EXPECT_EQ(f.pool.created(), 2u);
  EXPECT_TRUE(f.pool.give_back(a));
  EXPECT_EQ(f.pool.free(), 1u);
  EXPECT_EQ(f.pool.take(), a);
  EXPECT_EQ(f.pool.created(), 2u);
  EXPECT_EQ(f.pool.free(), 0u);
  EXPECT_TRUE(f.destroyed.empty());
}

TEST(HandlePool, AForeignOrDoublyGivenBackHandleIsRefused) {
  Fakes f;
  const int a = f.pool.take();
  EXPECT_FALSE(f.pool.give_back(a + 100));  // never created here
  EXPECT_TRUE(f.pool.give_back(a));
  EXPECT_FALSE(f.pool.give_back(a));  // already free: two takers would share it
  EXPECT_EQ(f.pool.free(), 1u);
  const int b = f.pool.take();
  const int c = f.pool.take();
  EXPECT_EQ(b, a);
  EXPECT_NE(c, a);
}

TEST(HandlePool, ClearDestroysEveryHandleOnceTakenOrFreeAndThePoolStaysUsable) {
  Fakes f;
  const int a = f.pool.take();
  const int b = f.pool.take();
  const int c = f.pool.take();
  f.pool.give_back(b);  // a and c stay out, as a dropped watch's events do
  f.pool.clear();
  std::vector<int> d = f.destroyed;
  std::sort(d.begin(), d.end());
  EXPECT_EQ(d, (std::vector<int>{a, b, c}));
  EXPECT_EQ(f.pool.created(), 0u);
  EXPECT_EQ(f.pool.free(), 0u);
  EXPECT_FALSE(f.pool.give_back(a));  // destroyed: no longer the pool's
  const int e = f.pool.take();
  EXPECT_EQ(e, 4);  // a new one
  EXPECT_EQ(f.destroyed.size(), 3u);
}

TEST(HandlePool, DestructionDestroysWhatIsStillOut) {
  std::vector<int> destroyed;
  {
    int next = 1;
    HandlePool<int> pool([&] { return next++; }, [&](int h) { destroyed.push_back(h); });
    pool.take();
    pool.give_back(pool.take());
  }
  std::sort(destroyed.begin(), destroyed.end());
  EXPECT_EQ(destroyed, (std::vector<int>{1, 2}));
}

TEST(HandlePool, ACreationThatThrowsLeavesThePoolAsItWas) {
  Fakes f;
  const int a = f.pool.take();
  f.fail_create = true;
  EXPECT_THROW(f.pool.take(), std::runtime_error);
  EXPECT_EQ(f.pool.created(), 1u);
  f.pool.give_back(a);
  EXPECT_EQ(f.pool.take(), a);  // a free handle needs no creation
  f.fail_create = false;
  EXPECT_EQ(f.pool.take(), 2);
}

// One thread takes, another gives back (the launching thread and the watchdog's): no handle is
// ever out twice at once, and the pool creates only as many as were out together.
TEST(HandlePool, TakingAndGivingBackFromTwoThreadsNeverSharesAHandle) {
  std::atomic<int> next{1};
  HandlePool<int> pool([&] { return next++; }, [](int) {});
  constexpr int kRounds = 20000;
  constexpr int kWindow = 8;  // handles out at most (the watchdog's backlog)
  std::vector<std::atomic<int>> out(kRounds * 2 + 2);
  for (auto& o : out) o = 0;
  std::atomic<int> taken{0}, returned{0};
  std::vector<int> ring(kRounds);
  std::atomic<bool> shared{false};
  std::thread giver([&] {
    for (int i = 0; i < kRounds; ++i) {
      while (taken.load() <= i) std::this_thread::yield();
      const int h = ring[i];
      if (--out[h] != 0) shared = true;
      if (!pool.give_back(h)) shared = true;
      ++returned;
    }
  });
  for (int i = 0; i < kRounds; ++i) {
    while (i - returned.load() >= kWindow) std::this_thread::yield();
    const int h = pool.take();
    if (++out[h] != 1) shared = true;
    ring[i] = h;
    ++taken;
  }
  giver.join();
  EXPECT_FALSE(shared.load());
  EXPECT_LE(pool.created(), static_cast<std::size_t>(kWindow));
  EXPECT_EQ(pool.free(), pool.created());
}

}  // namespace
}  // namespace swiftqk::detail
