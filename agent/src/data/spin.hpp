// How a stage's thread waits on an empty input queue: BLQ's choice between parking at once (a
// futex wait; the producer then pays a system call to wake it, and the consumer a trip through
// the scheduler) and spinning a while first, which a producer ends for the price of a store.
//
// A spin pays only on a CPU the thread has to itself: on a shared one it takes the time its
// producer needs (docs/performance.md measured both). So a stage spins only where its placement
// says so (Runtime::spins_on_input), and its spin's length is learnt from how its waits end:
//  - a wait that ended while spinning is "caught" and leaves the bound as it is;
//  - a wait that parked, and whose item came within kMaxNs after all, asks for a longer spin
//    (the bound doubles, from kMinNs, up to kMaxNs);
//  - a wait that lasted longer than any spin would halve the bound, down to none (below kMinNs):
//    a stage whose input comes seldom stops spinning, and one whose input quickens starts again.
// The bound and the counts are shared by the stage's threads; a race between two of them only
// blurs the estimate.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

namespace numastream {

// One pause of a spin loop: tells the core that this thread is waiting (a sibling hyperthread
// gets the pipeline meanwhile).
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

class SpinBudget {
 public:
  static constexpr std::uint64_t kMinNs = 500;
  static constexpr std::uint64_t kFirstNs = 5'000;
  static constexpr std::uint64_t kMaxNs = 50'000;

  SpinBudget() = default;
  SpinBudget(const SpinBudget&) = delete;
  SpinBudget& operator=(const SpinBudget&) = delete;

  // How long the next wait spins before it parks (0: it parks at once).
  std::uint64_t bound_ns() const noexcept { return bound_ns_.load(std::memory_order_relaxed); }
  // A wait ended while spinning.
  void caught() noexcept { caught_.fetch_add(1, std::memory_order_relaxed); }
  // A wait parked and ended `waited_ns` after it began (spin included).
  void parked(std::uint64_t waited_ns) noexcept {
    parked_.fetch_add(1, std::memory_order_relaxed);
    const std::uint64_t b = bound_ns();
    const std::uint64_t next = waited_ns <= kMaxNs ? std::min(kMaxNs, std::max(2 * b, kMinNs))
                                                   : (b / 2 < kMinNs ? 0 : b / 2);
    bound_ns_.store(next, std::memory_order_relaxed);
  }
  std::uint64_t caught_count() const noexcept { return caught_.load(std::memory_order_relaxed); }
  std::uint64_t parked_count() const noexcept { return parked_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::uint64_t> bound_ns_{kFirstNs};
  std::atomic<std::uint64_t> caught_{0};
  std::atomic<std::uint64_t> parked_{0};
};

namespace detail {

// Waits on `cv` (`lock` held) until `ready()`, until `deadline` when `timed`. With a spin budget
// whose bound is not 0, first spins with the lock released while `hint` (kept by the queue under
// its lock: whether `ready()` might hold) is false. Returns ready().
template <typename Ready>
bool wait_ready(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                const std::atomic<bool>& hint, SpinBudget* spin, bool timed,
                std::chrono::steady_clock::time_point deadline, Ready ready) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto since = [&] {
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
  };
  if (spin != nullptr && spin->bound_ns() > 0) {
    const std::uint64_t bound = spin->bound_ns();
    lock.unlock();
    bool seen = false;
    for (unsigned i = 1;; ++i) {
      if (hint.load(std::memory_order_acquire)) {
        seen = true;
        break;
      }
      cpu_relax();
      if (i % 64 == 0) {
        if (since() >= bound) break;
        std::this_thread::yield();  // a producer waiting for this CPU gets it
      }
    }
    lock.lock();
    if (seen && ready()) {
      spin->caught();
      return true;
    }
  }
  const bool got = timed ? cv.wait_until(lock, deadline, ready) : (cv.wait(lock, ready), true);
  if (spin != nullptr) spin->parked(since());  // a wait that timed out lasted longer than a spin
  return got;
}

}  // namespace detail
}  // namespace numastream
