#include "harness.hpp"

namespace swiftqk::model {

#if defined(__SANITIZE_THREAD__)
#define SWIFTQK_MODEL_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SWIFTQK_MODEL_TSAN 1
#endif
#endif

// ThreadSanitizer does not support std::atomic_thread_fence (GCC rejects it with -Werror=tsan),
// so under TSan a seq_cst read-modify-write of one shared word stands in: it orders all
// boundaries in one total order, which TSan does understand (every shared word of the models is
// an atomic anyway, so TSan checks the harness, not the protocols' orderings).
#ifdef SWIFTQK_MODEL_TSAN
namespace {
std::atomic<uint64_t> g_kernel_boundaries{0};
}
void kernel_boundary() { g_kernel_boundaries.fetch_add(1, std::memory_order_seq_cst); }
#else
void kernel_boundary() { std::atomic_thread_fence(std::memory_order_seq_cst); }
#endif

void maybe_delay(std::mt19937_64& rng, int one_in, int max_us) {
  const uint64_t x = rng();
  if (x % one_in != 0) return;
  if ((x >> 32) % 4 == 0) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(1 + (x >> 40) % max_us));
  }
}

void on_every_rank(int world, const std::function<void(int rank)>& host) {
  std::vector<std::thread> hosts;
  for (int r = 0; r < world; ++r) hosts.emplace_back([&host, r] { host(r); });
  for (std::thread& t : hosts) t.join();
}

void run_blocks(int blocks, std::mt19937_64& seeds,
                const std::function<void(int block, uint64_t seed)>& block) {
  std::vector<std::thread> threads;
  for (int b = 0; b < blocks; ++b) {
    const uint64_t seed = seeds();
    threads.emplace_back([&block, b, seed] { block(b, seed); });
  }
  for (std::thread& t : threads) t.join();
}

// ---------------------------------------------------------------- SimulatedRanks

SimulatedRanks::SimulatedRanks(int world, bool random_delays)
    : world_(world), random_delays_(random_delays), finished_(world) {
  for (std::atomic<int64_t>& f : finished_) f.store(0, std::memory_order_relaxed);
}

Tally SimulatedRanks::Run(const std::function<void(int rank)>& rank_main) {
  on_every_rank(world_, rank_main);
  Tally o;
  o.exchanges = exchanges_.load();
  o.wrong_sums = wrong_sums_.load();
  o.timeouts = timeouts_.load();
  o.run_ahead = run_ahead_.load();
  o.writes_into_lagging = writes_into_lagging_.load();
  o.lag_violations = lag_violations_.load();
  o.first_failure = first_failure_;
  return o;
}

void SimulatedRanks::StartCall(int r, int64_t done) {
  for (int o = 0; o < world_; ++o) {
    if (o == r) continue;
    const int64_t f = finished_[o].load(std::memory_order_relaxed);
    if (f < done) run_ahead_.fetch_add(1, std::memory_order_relaxed);
    if (f < done - 1) lag_violations_.fetch_add(1, std::memory_order_relaxed);
  }
}

void SimulatedRanks::FinishCall(int r, int64_t done) {
  finished_[r].store(done, std::memory_order_relaxed);
}

bool SimulatedRanks::WriteInto(int j, int64_t done) {
  if (finished_[j].load(std::memory_order_relaxed) >= done) return false;
  writes_into_lagging_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void SimulatedRanks::MaybeDelay(std::mt19937_64& rng, int one_in, int max_us) const {
  if (random_delays_) maybe_delay(rng, one_in, max_us);
}

void SimulatedRanks::Fail(std::atomic<int64_t>& counter, const std::string& what) {
  counter.fetch_add(1);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (first_failure_.empty()) first_failure_ = what;
  }
  abort_.store(true);
}

// ---------------------------------------------------------------- checks

int64_t expected_exchanges(int world, int calls, uint64_t seed,
                           const std::function<int64_t(int call, uint64_t draw)>& tokens) {
  std::mt19937_64 host_rng(seed);
  int64_t n = 0;
  for (int i = 0; i < calls; ++i) n += tokens(i, host_rng());
  return n * world;
}

void expect_correct_run(const Tally& o, int64_t expected, bool interleavings) {
  EXPECT_EQ(o.wrong_sums, 0) << o.first_failure;
  EXPECT_EQ(o.timeouts, 0) << o.first_failure;
  EXPECT_EQ(o.lag_violations, 0);
  EXPECT_EQ(o.exchanges, expected);
  if (interleavings) {
    EXPECT_GT(o.run_ahead, 0);
    EXPECT_GT(o.writes_into_lagging, 0);
  }
}

void expect_clean_run(const Tally& o, int64_t expected) {
  EXPECT_EQ(o.wrong_sums + o.timeouts, 0) << o.first_failure;
  EXPECT_EQ(o.exchanges, expected);
}

// ---------------------------------------------------------------- forced schedules

TimeBound::~TimeBound() {
  const Ms took = std::chrono::duration_cast<Ms>(Clock::now() - start_);
  EXPECT_LT(took.count(), limit_.count()) << "the scenario ran past its bound";
}

void Latch::CountDown() {
  std::lock_guard<std::mutex> lock(mu_);
  if (count_ > 0 && --count_ == 0) cv_.notify_all();
}

bool Latch::Wait(Ms timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [this] { return count_ == 0; });
}

bool Turns::WaitFor(int n, Ms timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return turn_ >= n; });
}

void Turns::Next() {
  std::lock_guard<std::mutex> lock(mu_);
  ++turn_;
  cv_.notify_all();
}

void Stamp::Set() {
  std::lock_guard<std::mutex> lock(mu_);
  if (t_ == Clock::time_point{}) t_ = Clock::now();
}

Clock::time_point Stamp::Get() {
  std::lock_guard<std::mutex> lock(mu_);
  return t_;
}

}  // namespace swiftqk::model
