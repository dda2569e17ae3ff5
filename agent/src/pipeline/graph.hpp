// A pipeline declared as a graph of stages and run by one runner. A stage is a group of worker
// threads running one body (each pinned as the placement says, through Runtime::run_stage);
// when the last of a stage's workers ends, the stage's `done` runs once — it closes the queue the
// stage feeds, so the next stage drains it and ends in turn. Spare workers (placement.adaptive)
// run the same body on another stage's CPUs and count towards the same end; workers the adaptive
// runtime adds while the graph runs join the count through `admit`, which refuses once the stage
// has ended. The runner starts the stages in the order they were declared, runs `supervise` on
// the calling thread while they work, and joins them in the same order, running each stage's
// `joined` once all its workers are gone (the receiver lets its receiving threads send the last
// acknowledgements only after everything they fed has been written).
//
// Abort (Runtime::fail) stays the runtime's: its closers wake every queue, so the stages end and
// the graph joins whatever the failure.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "host/stage.hpp"
#include "pipeline/runtime.hpp"

namespace numastream {

class StageGraph {
 public:
  struct Workers {
    Stage stage;
    int threads = 1;
    // The log prefix of worker i's errors ("connection 2: ").
    std::function<std::string(int)> what{};
    std::function<void(StageThread&)> body{};
    // Spare workers numbered after the planned ones, on the CPUs of `host`'s workers
    // `host_first`, `host_first` + 1, ...
    int spares = 0;
    Stage host = Stage::io;
    int host_first = 0;
    int spare_index = -1;  // the first spare's number (-1: after the planned workers)
    // Run by each worker after its body (on its thread).
    std::function<void()> after_each{};
    // Run once, by the last worker of the stage to end (planned, spare or added while running).
    std::function<void()> done{};
    // Run by the runner once every worker of the stage has been joined.
    std::function<void()> joined{};
  };

  class Stage_ {
   public:
    // Counts `n` more workers in (started by the adaptive runtime while the graph runs); false,
    // and none counted, once the stage has ended.
    bool admit(int n);
    // A worker admitted with admit() ended: the last one to end runs the stage's `done`.
    void ended();

   private:
    friend class StageGraph;
    explicit Stage_(Workers w) : w_(std::move(w)), left_(w_.threads + w_.spares) {}
    Workers w_;
    std::mutex mu_;
    int left_ = 0;
    bool over_ = false;
  };

  explicit StageGraph(Runtime& rt) : rt_(rt) {}
  StageGraph(const StageGraph&) = delete;
  StageGraph& operator=(const StageGraph&) = delete;

  // Declares a stage, its planned and spare workers counted in at once (so a worker the adaptive
  // runtime adds before the graph runs cannot end the stage early). The reference lives as long
  // as the graph.
  Stage_& add(Workers w);
  // Starts every stage, runs `supervise` (if any) on the calling thread, and joins the stages in
  // the order they were declared.
  void run(const std::function<void()>& supervise = {});

 private:
  Runtime& rt_;
  std::vector<std::unique_ptr<Stage_>> stages_;
};

}  // namespace numastream
