#include "pipeline/governor.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace numastream::adaptive {
namespace {

Limits limits(int min, int max) {
  Limits l;
  l.min_active = min;
  l.max_active = max;
  return l;
}

// A sender whose one compressing thread is flat out while the sending threads idle.
Window codec_bound() {
  Window w;
  w.seconds = 1;
  w.active = 1;
  w.busy = 0.97;
  w.blocked_input = 0.02;
  w.blocked_output = 0.01;
  w.neighbour_threads = 2;
  w.neighbour_busy = 0.6;  // 70% idle
  return w;
}

TEST(Adaptive, ACodecBottleneckNextToAnIdleStageGrows) {
  Decision d = decide(codec_bound(), limits(1, 3), "compress", "send");
  EXPECT_EQ(d.move, Move::grow);
  EXPECT_STREQ(d.reason, "codec_busy");
  EXPECT_NE(d.why.find("compress busy 97%"), std::string::npos) << d.why;
  EXPECT_NE(d.why.find("send idle 70%"), std::string::npos) << d.why;
}

TEST(Adaptive, NoGrowthWithoutSpareCpuOrRoom) {
  Window busy_neighbour = codec_bound();
  busy_neighbour.neighbour_busy = 1.9;  // 5% idle: growing would only take its CPU
  EXPECT_EQ(decide(busy_neighbour, limits(1, 3), "compress", "send").move, Move::none);
  EXPECT_EQ(decide(codec_bound(), limits(1, 1), "compress", "send").move, Move::none)
      << "at the maximum";
}

TEST(Adaptive, ACodecWaitingOnTheRestShrinks) {
  Window w = codec_bound();
  w.active = 3;
  w.busy = 1.2;
  w.blocked_output = 1.6;  // 53% waiting for the network
  w.blocked_input = 0.2;
  Decision d = decide(w, limits(1, 3), "compress", "send");
  EXPECT_EQ(d.move, Move::shrink);
  EXPECT_STREQ(d.reason, "waits_downstream");
  w.blocked_output = 0.1;
  w.blocked_input = 1.7;  // the source is the limit
  EXPECT_STREQ(decide(w, limits(1, 3), "compress", "send").reason, "waits_upstream");
  w.active = 1;
  w.busy = 0.3;
  w.blocked_input = 0.7;
  EXPECT_EQ(decide(w, limits(1, 3), "compress", "send").move, Move::none)
      << "never below the minimum";
}

TEST(Adaptive, HysteresisConfirmsThenCoolsDown) {
  Governor g(limits(1, 3), 1, /*confirm=*/3, /*cooldown=*/2);
  Decision grow = decide(codec_bound(), limits(1, 3), "compress", "send");
  Decision none;
  EXPECT_EQ(g.feed(grow), Move::none);
  EXPECT_EQ(g.feed(none), Move::none) << "a calm window resets the streak";
  EXPECT_EQ(g.feed(grow), Move::none);
  EXPECT_EQ(g.feed(grow), Move::none);
  EXPECT_EQ(g.active(), 1);
  EXPECT_EQ(g.feed(grow), Move::grow) << "third window in a row";
  EXPECT_EQ(g.active(), 2);
  EXPECT_EQ(g.feed(grow), Move::none) << "cooling down";
  EXPECT_EQ(g.feed(grow), Move::none);
  EXPECT_EQ(g.feed(grow), Move::none);
  EXPECT_EQ(g.feed(grow), Move::none);
  EXPECT_EQ(g.feed(grow), Move::grow);
  EXPECT_EQ(g.active(), 3);
}

TEST(Adaptive, AlternatingCallsNeverMove) {
  Governor g(limits(1, 3), 2, 3, 0);
  Decision grow{Move::grow, "codec_busy", ""}, shrink{Move::shrink, "waits_downstream", ""};
  for (int i = 0; i < 20; ++i) EXPECT_EQ(g.feed(i % 2 ? grow : shrink), Move::none);
  EXPECT_EQ(g.active(), 2);
}

TEST(Adaptive, ParkedWorkersResumeWhenActiveGrowsAndLeaveOnClose) {
  Governor g(limits(1, 2), 1, 1, 0);
  std::atomic<int> resumed{0};
  std::thread worker([&] {
    if (g.wait_turn(1)) resumed = 1;
    resumed = resumed + 10 * !g.wait_turn(5);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(resumed.load(), 0) << "worker 1 is parked while one worker is active";
  g.feed({Move::grow, "codec_busy", ""});
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  g.close();
  worker.join();
  EXPECT_EQ(resumed.load(), 11) << "resumed, then released by close";
}

}  // namespace
}  // namespace numastream::adaptive
