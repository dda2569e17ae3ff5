// A bounded multi-producer / multi-consumer queue between two pipeline stages.
//
// Contract:
//  - capacity is fixed at construction (>= 1); nothing is ever allocated after that;
//  - push() blocks while the queue is full, pop() blocks while it is empty; push() never spins,
//    pop() spins before it parks when handed a spin budget (data/spin.hpp), and parks otherwise;
//  - close() is called once the producers are done (or on shutdown): push() then returns false
//    and hands the item back untouched, pop() drains what is left and then returns nullopt;
//  - the time callers spent blocked is accumulated (nanoseconds) so a stage's wait on a full
//    output or an empty input is visible in the metrics: the blocking statistics that show where
//    the bottleneck is.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <vector>

#include "base/error.hpp"
#include "data/spin.hpp"

namespace numastream {

template <typename T>
class BoundedQueue {
 public:
  explicit BoundedQueue(std::size_t capacity) : slots_(capacity) { NS_ASSERT(capacity >= 1); }
  BoundedQueue(const BoundedQueue&) = delete;
  BoundedQueue& operator=(const BoundedQueue&) = delete;

  // Blocks while full. Returns false (and leaves `item` with the caller) once closed.
  bool push(T& item) {
    std::unique_lock lock(mu_);
    if (count_ == slots_.size() && !closed_) {
      auto start = std::chrono::steady_clock::now();
      not_full_.wait(lock, [&] { return count_ < slots_.size() || closed_; });
      push_wait_ns_ += elapsed_ns(start);
    }
    if (closed_) return false;
    slots_[(head_ + count_) % slots_.size()] = std::move(item);
    ++count_;
    has_item_.store(true, std::memory_order_release);
    lock.unlock();
    not_empty_.notify_one();
    return true;
  }

  // Never blocks: false (and `item` left with the caller) when the queue is full or closed.
  bool try_push(T& item) {
    std::unique_lock lock(mu_);
    if (count_ == slots_.size() || closed_) return false;
    slots_[(head_ + count_) % slots_.size()] = std::move(item);
    ++count_;
    has_item_.store(true, std::memory_order_release);
    lock.unlock();
    not_empty_.notify_one();
    return true;
  }

  // Blocks while empty and open (spinning first with a budget whose bound is not 0). nullopt
  // once closed and drained.
  std::optional<T> pop(SpinBudget* spin = nullptr) {
    std::unique_lock lock(mu_);
    if (count_ == 0 && !closed_) {
      auto start = std::chrono::steady_clock::now();
      detail::wait_ready(lock, not_empty_, has_item_, spin, false, {},
                         [&] { return count_ > 0 || closed_; });
      pop_wait_ns_ += elapsed_ns(start);
    }
    if (count_ == 0) return std::nullopt;
    return take(lock);
  }

  // Like pop(), but waits at most `timeout`; `done` turns true once closed and drained.
  std::optional<T> pop_for(std::chrono::milliseconds timeout, bool& done,
                           SpinBudget* spin = nullptr) {
    std::unique_lock lock(mu_);
    if (count_ == 0 && !closed_) {
      auto start = std::chrono::steady_clock::now();
      detail::wait_ready(lock, not_empty_, has_item_, spin, true, start + timeout,
                         [&] { return count_ > 0 || closed_; });
      pop_wait_ns_ += elapsed_ns(start);
    }
    if (count_ == 0) {
      done = closed_;
      return std::nullopt;
    }
    return take(lock);
  }

  void close() {
    {
      std::lock_guard lock(mu_);
      closed_ = true;
      has_item_.store(true, std::memory_order_release);  // a spinning consumer looks again
    }
    not_full_.notify_all();
    not_empty_.notify_all();
  }

  std::size_t capacity() const noexcept { return slots_.size(); }
  std::size_t depth() const {
    std::lock_guard lock(mu_);
    return count_;
  }
  bool closed() const {
    std::lock_guard lock(mu_);
    return closed_;
  }
  std::uint64_t push_wait_ns() const noexcept { return push_wait_ns_.load(); }
  std::uint64_t pop_wait_ns() const noexcept { return pop_wait_ns_.load(); }

 private:
  // Removes the oldest item (the queue is not empty), then wakes a producer.
  std::optional<T> take(std::unique_lock<std::mutex>& lock) {
    std::optional<T> out(std::move(slots_[head_]));
    head_ = (head_ + 1) % slots_.size();
    --count_;
    has_item_.store(count_ > 0 || closed_, std::memory_order_release);
    lock.unlock();
    not_full_.notify_one();
    return out;
  }

  static std::uint64_t elapsed_ns(std::chrono::steady_clock::time_point start) {
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                          std::chrono::steady_clock::now() - start)
                                          .count());
  }

  mutable std::mutex mu_;
  std::condition_variable not_full_;
  std::condition_variable not_empty_;
  std::vector<std::optional<T>> slots_;
  std::size_t head_ = 0;
  std::size_t count_ = 0;
  bool closed_ = false;
  std::atomic<bool> has_item_{false};  // count_ > 0 || closed_, for a spinning consumer
  std::atomic<std::uint64_t> push_wait_ns_{0};
  std::atomic<std::uint64_t> pop_wait_ns_{0};
};

// A bounded queue that hands items out in sequence order (0, 1, 2, ...), whatever order they
// arrive in: parallel compressors finish out of order, and the sending threads should still put
// chunks on the wire in order so that the receiver's reordering stays small.
//
// Contract:
//  - push(seq, item) blocks while `capacity` items wait, except for the item pop() is waiting
//    for (seq == next), which is always taken: the thread holding it is never the one that
//    blocks, so the queue cannot deadlock (it holds at most capacity + 1 items);
//  - pop() blocks until the next item in order is there; after close() it drains what is left
//    in order (skipping sequence numbers that never came), then returns nullopt.
template <typename T>
class OrderedQueue {
 public:
  explicit OrderedQueue(std::size_t capacity) : capacity_(capacity) { NS_ASSERT(capacity >= 1); }
  OrderedQueue(const OrderedQueue&) = delete;
  OrderedQueue& operator=(const OrderedQueue&) = delete;

  bool push(std::uint64_t seq, T& item) {
    std::unique_lock lock(mu_);
    if (seq != next_ && items_.size() >= capacity_ && !closed_) {
      auto start = std::chrono::steady_clock::now();
      cv_.wait(lock, [&] { return seq == next_ || items_.size() < capacity_ || closed_; });
      push_wait_ns_ +=
          static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                         std::chrono::steady_clock::now() - start)
                                         .count());
    }
    if (closed_) return false;
    items_.emplace(seq, std::move(item));
    note();
    lock.unlock();
    cv_.notify_all();
    return true;
  }

  std::optional<T> pop(SpinBudget* spin = nullptr) {
    bool done = false;
    std::optional<T> out;
    while (!out && !done) out = pop_for(std::chrono::hours(1), done, spin);
    return out;
  }

  // Like pop(), but waits at most `timeout` for the next item; `done` turns true once closed and
  // drained. (A sending thread waits this way so that it can read acknowledgements meanwhile.)
  // With a spin budget whose bound is not 0 it spins before it parks (data/spin.hpp).
  std::optional<T> pop_for(std::chrono::milliseconds timeout, bool& done,
                           SpinBudget* spin = nullptr) {
    std::unique_lock lock(mu_);
    if (!ready()) {
      auto start = std::chrono::steady_clock::now();
      detail::wait_ready(lock, cv_, ready_hint_, spin, true, start + timeout,
                         [&] { return ready(); });
      pop_wait_ns_ +=
          static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                         std::chrono::steady_clock::now() - start)
                                         .count());
      if (!ready()) return std::nullopt;
    }
    if (items_.empty()) {
      done = true;
      return std::nullopt;
    }
    auto it = items_.begin();
    std::optional<T> out(std::move(it->second));
    next_ = it->first + 1;
    items_.erase(it);
    advance();
    note();
    lock.unlock();
    cv_.notify_all();
    return out;
  }

  void close() {
    {
      std::lock_guard lock(mu_);
      closed_ = true;
      note();
    }
    cv_.notify_all();
  }

  // Nothing below `seq` will be pushed (a live source's sender numbers on after what earlier
  // senders took): pop() starts there.
  void start_at(std::uint64_t seq) {
    {
      std::lock_guard lock(mu_);
      if (seq > next_) next_ = seq;
      skipped_.erase(skipped_.begin(), skipped_.lower_bound(next_));
      advance();
      note();
    }
    cv_.notify_all();
  }

  // `seq` will never be pushed (a resumed sender skips what the receiver already has): pop()
  // does not wait for it.
  void skip(std::uint64_t seq) {
    {
      std::lock_guard lock(mu_);
      if (seq >= next_) skipped_.insert(seq);
      advance();
      note();
    }
    cv_.notify_all();
  }

  std::size_t depth() const {
    std::lock_guard lock(mu_);
    return items_.size();
  }
  std::uint64_t push_wait_ns() const noexcept { return push_wait_ns_.load(); }
  std::uint64_t pop_wait_ns() const noexcept { return pop_wait_ns_.load(); }

 private:
  const std::size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  // pop() can go on: the next item in order is there, or the queue is closed (then it drains
  // what is left in order, or ends).
  bool ready() const { return (!items_.empty() && items_.begin()->first == next_) || closed_; }
  // Keeps ready() where a spinning consumer reads it without the lock (under the lock).
  void note() { ready_hint_.store(ready(), std::memory_order_release); }
  void advance() {
    while (!skipped_.empty() && *skipped_.begin() <= next_) {
      if (*skipped_.begin() == next_) ++next_;
      skipped_.erase(skipped_.begin());
    }
  }

  std::map<std::uint64_t, T> items_;  // node-based, but bounded by capacity + 1: no growth
  std::set<std::uint64_t> skipped_;   // only while resuming
  std::uint64_t next_ = 0;
  bool closed_ = false;
  std::atomic<bool> ready_hint_{false};
  std::atomic<std::uint64_t> push_wait_ns_{0};
  std::atomic<std::uint64_t> pop_wait_ns_{0};
};

}  // namespace numastream
