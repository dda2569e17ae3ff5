#include "data/queue.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace numastream {
namespace {

using namespace std::chrono_literals;

TEST(BoundedQueue, FifoWithinCapacity) {
  BoundedQueue<int> q(3);
  for (int i : {1, 2, 3}) ASSERT_TRUE(q.push(i));
  EXPECT_EQ(q.depth(), 3u);
  EXPECT_EQ(*q.pop(), 1);
  EXPECT_EQ(*q.pop(), 2);
  EXPECT_EQ(*q.pop(), 3);
}

TEST(BoundedQueue, TryPushNeverBlocks) {
  BoundedQueue<int> q(1);
  int a = 1, b = 2;
  EXPECT_TRUE(q.try_push(a));
  EXPECT_FALSE(q.try_push(b)) << "full";
  EXPECT_EQ(b, 2) << "a refused item stays with the caller";
  EXPECT_EQ(*q.pop(), 1);
  q.close();
  EXPECT_FALSE(q.try_push(b)) << "closed";
}

TEST(BoundedQueue, PushBlocksWhileFullUntilAPop) {
  BoundedQueue<int> q(1);
  int a = 1, b = 2;
  ASSERT_TRUE(q.push(a));
  std::atomic<bool> pushed{false};
  std::thread producer([&] {
    q.push(b);
    pushed = true;
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(pushed.load()) << "push must wait for room";
  EXPECT_EQ(*q.pop(), 1);
  producer.join();
  EXPECT_TRUE(pushed.load());
  EXPECT_EQ(*q.pop(), 2);
  EXPECT_GT(q.push_wait_ns(), 0u) << "the wait is accounted";
}

TEST(BoundedQueue, CloseDrainsThenEnds) {
  BoundedQueue<int> q(4);
  int v = 5;
  q.push(v);
  q.close();
  int w = 6;
  EXPECT_FALSE(q.push(w)) << "closed queue refuses new items";
  EXPECT_EQ(w, 6) << "and leaves the item with the caller";
  EXPECT_EQ(*q.pop(), 5);
  EXPECT_FALSE(q.pop().has_value());
}

TEST(BoundedQueue, CloseWakesBlockedConsumersAndProducers) {
  BoundedQueue<int> empty(1);
  std::thread consumer([&] { EXPECT_FALSE(empty.pop().has_value()); });
  BoundedQueue<int> full(1);
  int x = 1;
  full.push(x);
  std::thread producer([&] {
    int y = 2;
    EXPECT_FALSE(full.push(y));
  });
  std::this_thread::sleep_for(20ms);
  empty.close();
  full.close();
  consumer.join();
  producer.join();
  EXPECT_GT(empty.pop_wait_ns(), 0u);
}

TEST(BoundedQueue, ManyProducersManyConsumersLoseNothing) {
  BoundedQueue<int> q(4);
  constexpr int kPerProducer = 5000;
  std::atomic<long> sum{0};
  std::atomic<int> count{0};
  std::vector<std::thread> consumers;
  for (int c = 0; c < 3; ++c) {
    consumers.emplace_back([&] {
      while (auto v = q.pop()) {
        sum += *v;
        ++count;
      }
    });
  }
  std::vector<std::thread> producers;
  for (int p = 0; p < 3; ++p) {
    producers.emplace_back([&] {
      for (int i = 1; i <= kPerProducer; ++i) {
        int v = i;
        ASSERT_TRUE(q.push(v));
      }
    });
  }
  for (auto& t : producers) t.join();
  q.close();
  for (auto& t : consumers) t.join();
  EXPECT_EQ(count.load(), 3 * kPerProducer);
  EXPECT_EQ(sum.load(), 3L * kPerProducer * (kPerProducer + 1) / 2);
}

}  // namespace
}  // namespace numastream

namespace numastream {
namespace {

TEST(SpinBudget, LearnsItsLengthFromHowWaitsEnd) {
  SpinBudget b;
  EXPECT_EQ(b.bound_ns(), SpinBudget::kFirstNs);
  b.caught();
  EXPECT_EQ(b.bound_ns(), SpinBudget::kFirstNs) << "a wait a spin ended leaves the bound";
  b.parked(SpinBudget::kFirstNs + 1);
  EXPECT_EQ(b.bound_ns(), 2 * SpinBudget::kFirstNs) << "an item a longer spin would have caught";
  for (int i = 0; i < 10; ++i) b.parked(SpinBudget::kMaxNs);
  EXPECT_EQ(b.bound_ns(), SpinBudget::kMaxNs) << "never longer than the most";
  int waits = 0;
  while (b.bound_ns() > 0 && waits < 100) {
    b.parked(SpinBudget::kMaxNs + 1);
    ++waits;
  }
  EXPECT_EQ(b.bound_ns(), 0u) << "input that comes seldom stops the spin";
  EXPECT_LE(waits, 8) << "within a few waits";
  b.parked(SpinBudget::kMaxNs);
  EXPECT_EQ(b.bound_ns(), SpinBudget::kMinNs) << "input that quickens starts it again";
  EXPECT_EQ(b.caught_count(), 1u);
  EXPECT_EQ(b.parked_count(), 11u + static_cast<unsigned>(waits) + 1u);
}

// A consumer that spins loses nothing, keeps the order, and parks when its producer pauses
// longer than any spin.
TEST(BoundedQueue, ASpinningConsumerLosesNothingAndParksThroughLongPauses) {
  BoundedQueue<int> q(4);
  SpinBudget spin;
  constexpr int kItems = 20000, kPauses = 20;
  std::thread producer([&] {
    for (int i = 0; i < kItems; ++i) {
      if (i % (kItems / kPauses) == 0) std::this_thread::sleep_for(2ms);
      ASSERT_TRUE(q.push(i));
    }
    q.close();
  });
  int expect = 0;
  while (auto v = q.pop(&spin)) {
    ASSERT_EQ(*v, expect) << "out of order or lost";
    ++expect;
  }
  producer.join();
  EXPECT_EQ(expect, kItems);
  EXPECT_GE(spin.parked_count(), static_cast<std::uint64_t>(kPauses / 2))
      << "a 2 ms pause outlasts every spin";
}

TEST(BoundedQueue, CloseEndsASpinningWait) {
  BoundedQueue<int> q(4);
  SpinBudget spin;
  for (int i = 0; i < 3; ++i) spin.parked(SpinBudget::kMaxNs);  // the longest spin
  std::thread closer([&] {
    std::this_thread::sleep_for(5ms);
    q.close();
  });
  bool done = false;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(q.pop_for(10s, done, &spin).has_value());
  EXPECT_TRUE(done);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  closer.join();
}

TEST(OrderedQueue, HandsOutInSequenceOrder) {
  OrderedQueue<int> q(8);
  for (std::uint64_t s : {2, 0, 3, 1}) {
    int v = static_cast<int>(s) * 10;
    ASSERT_TRUE(q.push(s, v));
  }
  for (int want : {0, 10, 20, 30}) EXPECT_EQ(*q.pop(), want);
}

TEST(OrderedQueue, PopWaitsForTheNextSequence) {
  OrderedQueue<int> q(8);
  int one = 1;
  q.push(1, one);
  std::atomic<bool> got{false};
  std::thread consumer([&] {
    EXPECT_EQ(*q.pop(), 0);
    got = true;
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(got.load()) << "sequence 0 has not arrived";
  int zero = 0;
  q.push(0, zero);
  consumer.join();
  EXPECT_EQ(*q.pop(), 1);
}

// Full of later items, the queue still takes the one pop() waits for: no deadlock.
TEST(OrderedQueue, TheNextItemIsTakenEvenWhenFull) {
  OrderedQueue<int> q(2);
  int a = 1, b = 2, c = 3;
  q.push(1, a);
  q.push(2, b);
  std::atomic<bool> third_pushed{false};
  std::thread blocked([&] {
    q.push(3, c);
    third_pushed = true;
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(third_pushed.load()) << "a later item waits while the queue is full";
  int zero = 0;
  ASSERT_TRUE(q.push(0, zero));
  for (int want : {0, 1, 2, 3}) EXPECT_EQ(*q.pop(), want);
  blocked.join();
}

// Three compressors finishing out of order into a queue of two, two sending threads taking in
// order: each item is handed out once, each thread sees increasing sequences, and no thread waits
// on a wake-up that never comes (a watchdog closes the queue after 30 s: a lost wake-up then
// shows as items missing, not as a hung test).
TEST(OrderedQueue, ProducersOutOfOrderAndSeveralConsumersLoseNoWakeUp) {
  OrderedQueue<int> q(2);
  constexpr int kItems = 30000;
  constexpr int kProducers = 3;
  std::atomic<int> taken{0};
  std::vector<std::vector<int>> got(2);
  std::vector<std::thread> consumers;
  for (auto& mine : got) {
    consumers.emplace_back([&q, &mine, &taken] {
      bool done = false;
      while (!done) {
        if (auto v = q.pop_for(1h, done)) {
          mine.push_back(*v);
          ++taken;
        }
      }
    });
  }
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&q, p] {
      for (int i = p; i < kItems; i += kProducers) {
        int v = i;
        ASSERT_TRUE(q.push(static_cast<std::uint64_t>(i), v));
      }
    });
  }
  std::thread watchdog([&] {
    for (int i = 0; i < 3000 && taken.load() < kItems; ++i) std::this_thread::sleep_for(10ms);
    q.close();
  });
  for (auto& t : producers) t.join();
  watchdog.join();
  for (auto& t : consumers) t.join();
  std::vector<int> seen(kItems, 0);
  for (const auto& mine : got) {
    for (std::size_t i = 0; i < mine.size(); ++i) {
      ++seen[static_cast<std::size_t>(mine[i])];
      if (i > 0) {
        EXPECT_LT(mine[i - 1], mine[i]) << "a consumer got sequences out of order";
      }
    }
  }
  EXPECT_EQ(taken.load(), kItems) << "items never handed out within 30 s: a lost wake-up";
  for (int i = 0; i < kItems; ++i) ASSERT_EQ(seen[static_cast<std::size_t>(i)], 1) << "item " << i;
}

// A sending thread that spins on the ordered queue still takes items in order from producers
// that finish out of order, steps over skipped sequence numbers, and ends on close.
TEST(OrderedQueue, ASpinningConsumerTakesItemsInOrderAndEndsOnClose) {
  OrderedQueue<int> q(4);
  SpinBudget spin;
  constexpr int kItems = 4000;
  std::thread producers[2];
  for (int p = 0; p < 2; ++p) {
    producers[p] = std::thread([&, p] {
      for (int i = p; i < kItems; i += 2) {
        if (i == 100) {
          q.skip(100);
          continue;
        }
        int v = i;
        ASSERT_TRUE(q.push(static_cast<std::uint64_t>(i), v));
      }
    });
  }
  int expect = 0;
  while (expect < kItems) {
    if (expect == 100) ++expect;
    bool done = false;
    auto v = q.pop_for(10s, done, &spin);
    ASSERT_TRUE(v.has_value()) << "waited 10 s for " << expect;
    ASSERT_EQ(*v, expect);
    ++expect;
  }
  for (auto& t : producers) t.join();
  std::thread closer([&] {
    std::this_thread::sleep_for(5ms);
    q.close();
  });
  bool done = false;
  EXPECT_FALSE(q.pop_for(10s, done, &spin).has_value());
  EXPECT_TRUE(done);
  closer.join();
}

TEST(OrderedQueue, CloseDrainsInOrderSkippingGaps) {
  OrderedQueue<int> q(8);
  int x = 5, y = 7;
  q.push(5, x);
  q.push(7, y);
  q.close();
  EXPECT_EQ(*q.pop(), 5);
  EXPECT_EQ(*q.pop(), 7);
  EXPECT_FALSE(q.pop().has_value());
  int z = 9;
  EXPECT_FALSE(q.push(9, z));
}

}  // namespace
}  // namespace numastream
