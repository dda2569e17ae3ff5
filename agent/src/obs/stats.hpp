// Per-stage counters, updated by the stage threads and read by the metrics endpoint and the
// final summary. "Blocked" time is split by cause: waiting on an empty input (the stage is
// starved: the bottleneck is upstream) or on a full output / exhausted buffer pool (the stage is
// throttled: the bottleneck is downstream).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "data/spin.hpp"

namespace numastream {

struct StageStats {
  explicit StageStats(std::string n) : name(std::move(n)) {}
  std::string name;
  std::atomic<std::uint64_t> chunks{0};
  std::atomic<std::uint64_t> bytes_in{0};
  std::atomic<std::uint64_t> bytes_out{0};
  std::atomic<std::uint64_t> busy_ns{0};
  std::atomic<std::uint64_t> blocked_input_ns{0};
  std::atomic<std::uint64_t> blocked_output_ns{0};
  // How its threads wait on an empty input (data/spin.hpp): the threads that took from their
  // input spinning first, and the spin they share.
  std::atomic<int> spinning_threads{0};
  SpinBudget input_spin;
};

// Adds the time between construction and destruction to a counter.
class ScopedTimer {
 public:
  explicit ScopedTimer(std::atomic<std::uint64_t>& sink)
      : sink_(sink), start_(std::chrono::steady_clock::now()) {}
  ~ScopedTimer() {
    sink_ += static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                            std::chrono::steady_clock::now() - start_)
                                            .count());
  }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

 private:
  std::atomic<std::uint64_t>& sink_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace numastream
