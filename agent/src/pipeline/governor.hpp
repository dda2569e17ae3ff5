// The adaptive runtime inside one agent (placement.adaptive): the codec stage's threads (compress
// on a sender, decompress on a gateway) grow into the CPUs of the stage they share a node with
// (send, receive) when the codec is the bottleneck and that stage has time to spare, and shrink
// back when the codec waits on the rest of the pipeline. A codec stage is a pool of workers taking
// independent chunks from one queue: a worker parks or resumes between chunks, so a change never
// pauses the stream or touches a chunk. Decisions come from the stages' measured busy and blocked
// times over fixed windows, with hysteresis: a move must be called for in `confirm` windows in a
// row, and none follows another within `cooldown` windows. Internal to the agent.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "host/budget.hpp"
#include "host/stage.hpp"
#include "obs/registry.hpp"

namespace numastream::adaptive {

// One window of measurements: the codec stage's workers (all of them, active ones only ever
// accumulate time) and its neighbour stage's threads, in thread-seconds.
struct Window {
  double seconds = 0;
  int active = 0;                                          // codec workers active in the window
  double busy = 0, blocked_input = 0, blocked_output = 0;  // codec workers
  int neighbour_threads = 0;
  double neighbour_busy = 0;
};

enum class Move { none, grow, shrink };
const char* move_name(Move m) noexcept;

struct Decision {
  Move move = Move::none;
  const char* reason = "";  // a metric label: "codec_busy", "waits_downstream", "waits_upstream"
  std::string why;          // for the log, with the figures
};

struct Limits {
  int min_active = 1, max_active = 1;
  double busy_high = 0.85;        // codec workers this busy are the bottleneck...
  double spare_low = 0.30;        // ...when the neighbour is idle at least this much
  double wait_high = 0.30;        // codec workers waiting on output (or input) this much: too many
  double wait_output_max = 0.10;  // a growing codec stage must not already wait on its output
};

// What the window calls for (no hysteresis: see Governor).
Decision decide(const Window& w, const Limits& limits, const char* codec, const char* neighbour);

// Hysteresis and the active count; thread-safe. Workers call wait_turn() between chunks.
class Governor {
 public:
  Governor(Limits limits, int initial, int confirm = 3, int cooldown = 3);
  // Feeds one window's decision; returns the move made (none while unconfirmed or cooling down).
  Move feed(const Decision& d);
  int active() const;
  Limits limits() const;
  // `n` more workers exist (started on CPUs the budget gained): the most that may be active
  // grows by n.
  void add_workers(int n);
  // Sets the active count (clamped to the limits) outside the hysteresis: the CPU budget
  // changed. Returns the new count.
  int set_active(int n);
  // Blocks worker `index` while index >= active(); false once closed.
  bool wait_turn(int index);
  void close();

 private:
  Limits limits_;
  int confirm_, cooldown_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int active_;
  bool closed_ = false;
  Move pending_ = Move::none;
  int streak_ = 0, cooling_ = 0;
};

}  // namespace numastream::adaptive

namespace numastream {

class Runtime;
struct StageThread;

namespace adaptive {

// The control loop: every `interval`, one window of the codec stage's and its neighbour's
// counters, a decision, the governor; each change logged with its reason and figures, counted in
// the metrics, kept in the summary (the last 20). Each window also reads the process's CPU
// budget (its cgroup's cpuset and quota, under cgroup_root) and uses a change at once:
//  - pinned threads on CPUs the cpuset lost move to the CPUs it kept (Runtime::repin);
//  - when the budget's capacity (CpuBudget::capacity) grows, `start_workers(n, cpus)` starts n
//    more codec workers (on the CPUs no thread uses, first) and they go to work;
//  - when it shrinks, as many codec workers park (never the last).
class Controller {
 public:
  // Starts `n` more codec workers numbered from `first_index`, pinned on `cpus` in turn (empty:
  // unpinned); returns how many it started.
  using StartWorkers = std::function<int(int n, int first_index, const std::vector<int>& cpus)>;
  Controller(Runtime& rt, Stage codec, Stage neighbour, Governor& governor,
             StartWorkers start_workers = {}, double interval_s = 1.0);
  ~Controller();
  Controller(const Controller&) = delete;
  Controller& operator=(const Controller&) = delete;
  void stop();
  void report(nlohmann::json& summary) const;
  // Declares the adaptive runtime's families (the registry adds the role label).
  void declare_metrics(MetricRegistry& m) const;

 private:
  void loop(const std::stop_token& st);
  void watch_budget(std::chrono::steady_clock::time_point now);
  void use_budget(const CpuBudget& from, const CpuBudget& to,
                  std::chrono::steady_clock::time_point now);
  void record(std::chrono::steady_clock::time_point now, Move m, const char* reason, int before,
              int after, const std::string& why);

  Runtime& rt_;
  Stage codec_, neighbour_;
  Governor& governor_;
  StartWorkers start_workers_;
  double interval_s_;
  mutable std::mutex mu_;
  std::map<std::pair<std::string, std::string>, std::uint64_t> changes_;  // (move, reason) -> count
  nlohmann::json log_ = nlohmann::json::array();
  CpuBudget budget_;
  std::uint64_t budget_changes_ = 0;
  nlohmann::json budget_log_ = nlohmann::json::array();
  std::jthread thread_;
};

// Codec workers started while the pipeline runs, on CPUs the budget gained: at most kMax per
// process (the buffer pools hold room for them from the start), joined when this is destroyed.
class ExtraWorkers {
 public:
  static constexpr int kMax = 4;
  struct Stage_ {
    Stage stage;
    std::function<void(StageThread&)> body;  // the codec loop
    std::function<bool(int)>
        admit;                    // counts n more workers in; false (none) once the input is done
    std::function<void()> ended;  // after each worker's body
  };
  explicit ExtraWorkers(Runtime& rt, Stage_ s) : rt_(rt), s_(std::move(s)) {}
  ~ExtraWorkers() { join(); }
  // A Controller::StartWorkers: starts up to n more workers; how many it started.
  int start(int n, int first_index, const std::vector<int>& cpus);
  void join();

 private:
  Runtime& rt_;
  Stage_ s_;
  std::mutex mu_;
  std::vector<std::jthread> threads_;
};

// A codec stage's spare workers (placement.adaptive) as one part of a role: the governor that
// parks and wakes them, the workers started when the CPU budget grows, and the control loop.
// Without spares it holds nothing and every call is a no-op.
class CodecSpares {
 public:
  // `spares` parked workers beside `active` working ones.
  void plan(int spares, int active);
  int count() const noexcept { return spares_; }
  explicit operator bool() const noexcept { return governor_ != nullptr; }
  // Between chunks: false once the worker is to leave (the stage is closing).
  bool wait_turn(int index) { return !governor_ || governor_->wait_turn(index); }
  // Parked workers leave, active ones drain their queue.
  void close() {
    if (governor_) governor_->close();
  }
  // Starts the control loop of the `codec` stage beside `neighbour` (its metrics declared), with
  // `extra` as the workers started when the budget grows.
  void start(Runtime& rt, Stage neighbour, ExtraWorkers::Stage_ extra);
  // Stops the control loop and joins the extra workers.
  void stop();
  void report(nlohmann::json& summary) const;

 private:
  int spares_ = 0;
  std::unique_ptr<Governor> governor_;
  std::unique_ptr<ExtraWorkers> extra_;
  std::unique_ptr<Controller> controller_;
};

}  // namespace adaptive
}  // namespace numastream
