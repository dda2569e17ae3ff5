#include <gtest/gtest.h>
#include <poll.h>

#include <set>
#include <thread>
#include <tuple>
#include <vector>

#include "pipeline/fanout.hpp"
#include "pipeline/sink.hpp"

namespace numastream {
namespace {

// What went upstream: (acknowledged or discarded, via, stream, seq).
struct Upstream {
  std::mutex mu;
  std::vector<std::tuple<bool, int, std::uint32_t, std::uint64_t>> sent;
  std::set<std::pair<std::uint32_t, std::uint64_t>> settled;  // as the receiver's ledger
  AckJoin join(int lossless) {
    return AckJoin(
        lossless,
        [this](int via, std::uint32_t s, std::uint64_t q) {
          std::lock_guard lock(mu);
          sent.emplace_back(true, via, s, q);
          settled.insert({s, q});
        },
        [this](int via, std::uint32_t s, std::uint64_t q) {
          std::lock_guard lock(mu);
          sent.emplace_back(false, via, s, q);
          settled.insert({s, q});
        },
        [this](std::uint32_t s, std::uint64_t q) {
          std::lock_guard lock(mu);
          return settled.count({s, q}) > 0;
        });
  }
};

TEST(AckJoin, AChunkGoesUpstreamOnceEveryLosslessConsumerHasIt) {
  Upstream up;
  AckJoin j = up.join(3);
  j.settle(0, 2, 7, 100, true);
  j.settle(2, 2, 7, 100, true);
  EXPECT_TRUE(up.sent.empty()) << "consumer 1 does not have it yet";
  EXPECT_EQ(j.open(), 1u);
  j.settle(1, 2, 7, 100, true);
  ASSERT_EQ(up.sent.size(), 1u);
  EXPECT_EQ(up.sent[0], std::make_tuple(true, 2, 7u, 100ull));
  EXPECT_EQ(j.open(), 0u);
}

TEST(AckJoin, OneConsumerGivingAChunkUpMakesItADiscardOnceAllSettledIt) {
  Upstream up;
  AckJoin j = up.join(2);
  j.settle(0, 0, 1, 5, false);
  EXPECT_TRUE(up.sent.empty());
  j.settle(1, 0, 1, 5, true);
  ASSERT_EQ(up.sent.size(), 1u);
  EXPECT_FALSE(std::get<0>(up.sent[0])) << "named to the sender as discarded";
}

TEST(AckJoin, OneConsumerIsPassedStraightThroughAndASettledChunkIsAcknowledgedAgainAtOnce) {
  Upstream up;
  AckJoin one = up.join(1);
  one.settle(0, 1, 3, 9, true);
  EXPECT_EQ(up.sent.size(), 1u);
  AckJoin two = up.join(2);
  two.settle(1, 1, 3, 9, true);  // (3, 9) was settled upstream already: a retransmission kept again
  EXPECT_EQ(up.sent.size(), 2u);
  EXPECT_EQ(two.open(), 0u);
  // The same consumer settling twice does not stand in for another.
  two.settle(0, 1, 3, 10, true);
  two.settle(0, 1, 3, 10, true);
  EXPECT_EQ(up.sent.size(), 2u);
}

TEST(AckJoin, ConsumersOnTheirOwnThreadsAcknowledgeEachChunkExactlyOnce) {
  Upstream up;
  constexpr int kConsumers = 4, kChunks = 20000;
  AckJoin j = up.join(kConsumers);
  std::vector<std::jthread> threads;
  for (int who = 0; who < kConsumers; ++who) {
    threads.emplace_back([&j, who] {
      auto [ack, discard] = j.of(who);
      for (int i = 0; i < kChunks; ++i) {
        // Each consumer in its own order.
        const std::uint64_t seq =
            who % 2 ? static_cast<std::uint64_t>(i) : static_cast<std::uint64_t>(kChunks - 1 - i);
        ack(who, 0, seq);
      }
    });
  }
  threads.clear();
  ASSERT_EQ(up.sent.size(), static_cast<std::size_t>(kChunks));
  std::set<std::uint64_t> seqs;
  for (const auto& s : up.sent) seqs.insert(std::get<3>(s));
  EXPECT_EQ(seqs.size(), static_cast<std::size_t>(kChunks));
  EXPECT_EQ(j.open(), 0u);
}

// Whether the box's eventfd wakes a poll within `ms`.
bool readable(const AckBox& box, int ms) {
  pollfd p{box.fd(), POLLIN, 0};
  return ::poll(&p, 1, ms) == 1;
}

TEST(AckBox, ManyPostsWakeTheReceivingThreadOnceAndATakeRearmsIt) {
  AckBox box;
  EXPECT_FALSE(readable(box, 0));
  for (std::uint64_t q = 0; q < 1000; ++q) box.post(7, 0, std::span(&q, 1), 0);
  std::uint64_t wakes = 0;
  ASSERT_EQ(::read(box.fd(), &wakes, sizeof wakes), static_cast<ssize_t>(sizeof wakes));
  EXPECT_EQ(wakes, 1u) << "one wake-up for what gathered, not one per post";
  auto taken = box.take();
  ASSERT_EQ(taken.count(7), 1u);
  EXPECT_EQ(taken[7].seqs.size(), 1000u);
  EXPECT_FALSE(readable(box, 0));
  EXPECT_TRUE(box.empty());
  const std::uint64_t q = 1000;
  box.post(7, 0, std::span(&q, 1), 0);
  EXPECT_TRUE(readable(box, 0)) << "a post after a take wakes the thread again";
}

TEST(AckBox, APosterRacingTheTakerNeverLeavesAnAckWithoutAWakeUp) {
  AckBox box;
  constexpr std::uint64_t kAcks = 200000;
  std::jthread poster([&box] {
    for (std::uint64_t q = 0; q < kAcks; ++q) box.post(1, 0, std::span(&q, 1), 0);
  });
  std::vector<bool> seen(kAcks, false);
  std::uint64_t got = 0;
  while (got < kAcks) {
    // A lost wake-up: acks wait in the box and its fd stays quiet.
    ASSERT_TRUE(readable(box, 5000))
        << got << " of " << kAcks << " acks taken, the rest never woke";
    for (auto& [stream, p] : box.take()) {
      for (auto s : p.seqs) {
        ASSERT_FALSE(seen[s]) << "ack " << s << " taken twice";
        seen[s] = true;
        ++got;
      }
    }
  }
}

}  // namespace
}  // namespace numastream
