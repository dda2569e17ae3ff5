// The stage-graph runner: a stage's output closes once, when its last worker ends (planned,
// spare or added while the graph runs); a worker cannot be added to a stage that has ended;
// stages are joined in the order declared; a worker's failure becomes the run's error and every
// stage still ends.
#include "pipeline/graph.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <stop_token>
#include <thread>
#include <vector>

#include "config/config.hpp"
#include "data/queue.hpp"

namespace numastream {
namespace {

using namespace std::chrono_literals;

Config unpinned() {
  return parse_config(
      {{"endpoint", "tcp://127.0.0.1:5555"},
       {"placement", {{"mode", "os"}, {"stages", {{"compress", {{"threads", 3}}}}}}}},
      Role::send);
}

TEST(StageGraph, EachStageClosesItsOutputOnceAfterItsLastWorkerAndTheNextDrainsIt) {
  const Config cfg = unpinned();
  Runtime rt(cfg, std::stop_token{});
  ASSERT_EQ(rt.threads(Stage::compress), 3);
  BoundedQueue<int> raw(4), out(1000);
  std::atomic<int> raw_closed{0}, out_closed{0};
  std::vector<std::string> joined;
  StageGraph graph(rt);
  graph.add({.stage = Stage::source,
             .threads = 1,
             .what = [](int) { return std::string("source: "); },
             .body =
                 [&](StageThread&) {
                   for (int i = 0; i < 500; ++i) ASSERT_TRUE(raw.push(i));
                 },
             .done =
                 [&] {
                   ++raw_closed;
                   raw.close();
                 },
             .joined = [&] { joined.push_back("source"); }});
  graph.add({.stage = Stage::compress,
             .threads = 3,
             .what = [](int) { return std::string("compress: "); },
             .body =
                 [&](StageThread& t) {
                   while (auto v = t.next(raw)) {
                     int x = *v * 2;
                     ASSERT_TRUE(out.push(x)) << "the output closed under a working compressor";
                   }
                 },
             .done =
                 [&] {
                   ++out_closed;
                   out.close();
                 },
             .joined = [&] { joined.push_back("compress"); }});
  graph.run();
  EXPECT_EQ(raw_closed, 1);
  EXPECT_EQ(out_closed, 1);
  long sum = 0;
  int n = 0;
  while (auto v = out.pop()) sum += *v, ++n;
  EXPECT_EQ(n, 500);
  EXPECT_EQ(sum, 2L * 499 * 500 / 2);
  EXPECT_EQ(joined, (std::vector<std::string>{"source", "compress"}));
  EXPECT_FALSE(rt.aborted());
}

// A worker the adaptive runtime adds while the graph runs holds the stage open until it ends;
// once the stage has ended, no worker can be added.
TEST(StageGraph, AnAddedWorkerHoldsTheStageOpenAndNoneIsAdmittedAfterItEnded) {
  const Config cfg = unpinned();
  Runtime rt(cfg, std::stop_token{});
  std::atomic<bool> extra_done{false}, closed_before_extra{false}, done{false};
  std::jthread extra;
  StageGraph graph(rt);
  StageGraph::Stage_* stage = nullptr;
  stage = &graph.add({.stage = Stage::compress,
                      .threads = 3,
                      .what = [](int) { return std::string("compress: "); },
                      .body =
                          [&](StageThread& t) {
                            if (t.index != 0) return;
                            ASSERT_TRUE(stage->admit(1));
                            extra = std::jthread([&] {
                              std::this_thread::sleep_for(200ms);
                              extra_done = true;
                              stage->ended();
                            });
                          },
                      .done =
                          [&] {
                            closed_before_extra = !extra_done.load();
                            done = true;
                          }});
  graph.run();
  extra.join();
  EXPECT_TRUE(done);
  EXPECT_FALSE(closed_before_extra) << "the stage ended while an added worker still ran";
  EXPECT_FALSE(stage->admit(1)) << "a worker was admitted to a stage that had ended";
}

// One worker fails: the run's error names it (the stage's prefix), the abort closers wake the
// others, and the graph joins every stage.
TEST(StageGraph, AFailingWorkerIsTheRunsErrorAndEveryStageStillEnds) {
  const Config cfg = unpinned();
  Runtime rt(cfg, std::stop_token{});
  BoundedQueue<int> raw(4);
  rt.on_abort([&] { raw.close(); });
  StageGraph graph(rt);
  graph.add({.stage = Stage::source,
             .threads = 1,
             .what = [](int) { return std::string("source: "); },
             .body =
                 [&](StageThread&) {
                   for (int i = 0;; ++i) {
                     if (!raw.push(i)) return;  // closed by the abort
                   }
                 }});
  graph.add({.stage = Stage::compress,
             .threads = 3,
             .what = [](int i) { return "compress " + std::to_string(i) + ": "; },
             .body =
                 [&](StageThread& t) {
                   while (auto v = t.next(raw)) {
                     if (t.index == 1 && *v > 100)
                       throw std::runtime_error("codec refused chunk " + std::to_string(*v));
                   }
                 }});
  graph.run();
  ASSERT_TRUE(rt.aborted());
  EXPECT_EQ(rt.error().rfind("compress 1: codec refused chunk ", 0), 0u) << rt.error();
}

TEST(StageGraph, AStageWithoutWorkersIsOverAtOnce) {
  const Config cfg = unpinned();
  Runtime rt(cfg, std::stop_token{});
  int done = 0;
  StageGraph graph(rt);
  StageGraph::Stage_& none = graph.add({.stage = Stage::compress,
                                        .threads = 0,
                                        .what = [](int) { return std::string(); },
                                        .body = [](StageThread&) {},
                                        .done = [&] { ++done; }});
  graph.run();
  EXPECT_EQ(done, 1);
  EXPECT_FALSE(none.admit(1));
}

// placement.wait: a thread spins on its input by default only on a CPU of its own, inside a CPU
// set smaller than the machine (a Guaranteed pod's); park and spin decide alone.
TEST(StageWait, AThreadSpinsByDefaultOnlyOnACpuOfItsOwnInACpuSetOfItsOwn) {
  ThreadSlot own{.stage = Stage::compress, .index = 0, .cpu = 3};
  ThreadSlot shared = own;
  shared.shared_cpu = true;
  ThreadSlot unpinned = own;
  unpinned.cpu = -1;
  using W = Config::Wait;
  EXPECT_TRUE(spins_on_input(W::automatic, own, 8, 64));
  EXPECT_FALSE(spins_on_input(W::automatic, own, 64, 64)) << "the whole machine: shared with all";
  EXPECT_FALSE(spins_on_input(W::automatic, shared, 8, 64));
  EXPECT_FALSE(spins_on_input(W::automatic, unpinned, 8, 64));
  EXPECT_FALSE(spins_on_input(W::park, own, 8, 64));
  EXPECT_TRUE(spins_on_input(W::spin, shared, 64, 64));
  EXPECT_TRUE(spins_on_input(W::spin, unpinned, 64, 64));
}

TEST(StageWait, PlacementWaitIsParsedAndBadValuesAreNamed) {
  auto parse = [](const nlohmann::json& wait) {
    return parse_config({{"endpoint", "tcp://127.0.0.1:5555"}, {"placement", {{"wait", wait}}}},
                        Role::send)
        .wait;
  };
  EXPECT_EQ(parse("auto"), Config::Wait::automatic);
  EXPECT_EQ(parse("park"), Config::Wait::park);
  EXPECT_EQ(parse("spin"), Config::Wait::spin);
  try {
    parse("poll");
    FAIL() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("placement.wait"), std::string::npos) << e.what();
  }
}

// With placement.wait spin, the stage threads that take from a queue (the compressing ones
// here) spin first, and the summary counts how their waits ended.
TEST(StageWait, SpinningThreadsAreCountedInTheStageSummary) {
  const Config cfg = parse_config(
      {{"endpoint", "tcp://127.0.0.1:5555"},
       {"placement",
        {{"mode", "os"}, {"wait", "spin"}, {"stages", {{"compress", {{"threads", 2}}}}}}}},
      Role::send);
  Runtime rt(cfg, std::stop_token{});
  BoundedQueue<int> raw(4);
  std::atomic<int> sum{0};
  StageGraph graph(rt);
  graph.add({.stage = Stage::source,
             .threads = 1,
             .what = [](int) { return std::string("source: "); },
             .body =
                 [&](StageThread&) {
                   for (int i = 1; i <= 300; ++i) {
                     if (i % 50 == 0) std::this_thread::sleep_for(1ms);
                     ASSERT_TRUE(raw.push(i));
                   }
                 },
             .done = [&] { raw.close(); }});
  graph.add({.stage = Stage::compress,
             .threads = 2,
             .what = [](int) { return std::string("compress: "); },
             .body =
                 [&](StageThread& t) {
                   EXPECT_TRUE(t.spins);
                   while (auto v = t.next(raw)) sum += *v;
                 }});
  graph.run();
  EXPECT_EQ(sum.load(), 300 * 301 / 2);
  const auto stages = rt.stages_json();
  ASSERT_TRUE(stages["compress"].contains("input_wait")) << stages.dump();
  const auto& w = stages["compress"]["input_wait"];
  EXPECT_EQ(w["spinning_threads"], 2);
  EXPECT_GT(w["caught_spinning"].get<std::uint64_t>() + w["parked"].get<std::uint64_t>(), 0u);
  EXPECT_FALSE(stages["source"].contains("input_wait")) << "the source takes from no queue";
}

}  // namespace
}  // namespace numastream
