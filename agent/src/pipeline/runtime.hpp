// What the send and receive pipelines share: topology and placement at start-up, per-stage
// statistics, the first error and the abort path that unblocks every stage, thread pinning, and
// the placement / stage parts of the metrics and the summary. Internal to the agent.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <stop_token>
#include <string>
#include <vector>

#include "base/log.hpp"
#include "config/config.hpp"
#include "data/buffer_pool.hpp"
#include "host/placement.hpp"
#include "host/topology.hpp"
#include "net/link.hpp"
#include "obs/http.hpp"
#include "obs/registry.hpp"
#include "obs/stats.hpp"

namespace numastream {

// An INFO line of the agent's log (base/log.hpp: log_warn, log_error for the others).
void log_line(const std::string& msg);

class Runtime;

// What a stage thread knows about itself: which thread of which stage it is, the CPU slot and
// memory node the placement gave it, and the stage's counters.
struct StageThread {
  Runtime& rt;
  Stage stage;
  int index;
  std::size_t slot;
  int numa_node;  // -1: no preference
  StageStats& stats;
  bool spare = false;  // an adaptive worker on another stage's CPU (placement.adaptive)
  // Uses its CPU rather than sleep (Runtime::spins_on_input): spins before it parks on an empty
  // input; a source whose output is full does the next stage's work itself.
  bool spins = false;
  // Records the CPU this thread runs on now (unpinned threads move; called as they work).
  void observe() const noexcept;
  // The spin an input queue's pop() takes from this thread: none (it parks at once) unless it
  // spins, and not once the CPU budget moved threads.
  SpinBudget* input_spin() const noexcept;
  // Whether it works rather than sleep on a full output (spins, and the CPU budget has not moved
  // threads since the start).
  bool helps() const noexcept;
  // The next item of the stage's input queue, the wait counted as blocked on input.
  template <typename Queue>
  auto next(Queue& q) {
    ScopedTimer wait(stats.blocked_input_ns);
    return q.pop(input_spin());
  }
  // Counted in stats.spinning_threads (by input_spin(), once).
  mutable bool spin_counted = false;
  // A buffer for the stage's output, the wait counted as blocked on output (empty once the pool
  // is closed).
  PooledBuffer buffer(BufferPool& pool) {
    ScopedTimer wait(stats.blocked_output_ns);
    return pool.take();
  }
};

class Runtime {
 public:
  Runtime(const Config& cfg, std::stop_token external);

  const Config& cfg;
  Topology topo;
  std::vector<int> allowed;
  std::optional<int> nic_node;
  Placement placement;

  StageStats& stats(Stage stage);
  // Index into placement.threads of (stage, i).
  std::size_t slot(Stage stage, int index) const;
  // Pins the calling thread as placement.threads[slot] says and records where it runs.
  void pin_current(std::size_t slot);
  // Records the CPU the calling thread runs on (for unpinned threads, called as they work).
  void observe_cpu(std::size_t slot) noexcept;

  // Runs the body of thread `index` of `stage` on the calling thread: pins it as the placement
  // says (and names it), hands the body its StageThread, and turns anything it throws into the
  // run's first error, prefixed with `what` ("connection 2: "), which wakes every other stage.
  void run_stage(Stage stage, int index, const std::string& what,
                 const std::function<void(StageThread&)>& body);
  // The same for a spare worker of `stage` (numbered after the planned ones) that the adaptive
  // runtime may set to work: it runs on the CPU and memory node of `host`'s thread `host_index`.
  void run_spare(Stage stage, int index, Stage host, int host_index, const std::string& what,
                 const std::function<void(StageThread&)>& body);

  // A worker of `stage` started while the pipeline runs (the CPU budget grew), on `cpu` (-1:
  // unpinned) and its memory node; numbered `index` after the others.
  void run_extra(Stage stage, int index, int cpu, const std::string& what,
                 const std::function<void(StageThread&)>& body);
  // The CPU budget changed: every pinned thread whose CPU left `cpus` moves to the CPU of `cpus`
  // the fewest pinned threads use. Returns how many moved.
  int repin(const std::vector<int>& cpus);
  // The CPUs of `cpus` no pinned thread runs on.
  std::vector<int> unused_cpus(const std::vector<int>& cpus) const;

  // Whether the planned thread in `slot` uses its CPU rather than sleep (placement.wait): spins
  // before it parks on an empty input queue, and, a source, compresses a chunk itself when the
  // compressing threads' queue is full. Always with spin, never with park; with auto, when it is
  // pinned to a CPU no other thread of this process was given, inside a CPU set smaller than the
  // machine (one of its own, as the kubelet's static CPU manager gives a Guaranteed pod): on a
  // CPU another thread needs, either takes that thread's time. Spare and extra workers never do.
  bool spins_on_input(std::size_t slot) const;
  // False once repin() moved threads (auto): CPUs may be shared since.
  bool spinning_allowed() const noexcept {
    return spinning_allowed_.load(std::memory_order_relaxed);
  }

  // Drain request from outside (SIGTERM): stop taking new work, finish what is in flight.
  bool drain_requested() const noexcept { return external_.stop_requested(); }
  // Abort: the first error wins; every registered closer runs once so blocked stages wake up.
  void fail(const std::string& message);
  bool aborted() const noexcept { return aborted_.load(); }
  std::string error() const;
  void on_abort(std::function<void()> closer);

  // Threads of a stage and the NUMA nodes they use (distinct, sorted; -1 when unpinned).
  int threads(Stage stage) const;
  std::vector<int> stage_nodes(Stage stage) const;

  // The metrics and health service on metrics.listen (none without one): this run's registry,
  // healthy while the run has not failed; `more` answers other paths (a gateway's preview).
  // `on_port` is told the port it listens on.
  std::unique_ptr<MetricsServer> serve_metrics(const std::function<void(int)>& on_port,
                                               MetricsServer::Route more = {});

  nlohmann::json placement_json() const;
  nlohmann::json stages_json() const;
  // The process's metrics (role="send", "receive" or, for a relay, "relay" on every sample); the
  // stage and placement families are declared here, the rest by the pipeline and its parts.
  MetricRegistry& metrics() noexcept { return metrics_; }

  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();

 private:
  void declare_common_metrics();
  void sample_threads(MetricSamples& m) const;
  std::stop_token external_;
  MetricRegistry metrics_;
  std::map<Stage, std::unique_ptr<StageStats>> stats_;
  std::unique_ptr<std::atomic<int>[]> observed_cpu_;
  std::atomic<bool> aborted_{false};
  std::atomic<bool> spinning_allowed_{true};
  mutable std::mutex mu_;
  std::string error_;
  std::vector<std::function<void()>> closers_;
  // Running threads pinned to one CPU, by kernel thread id (repin moves them).
  struct Pinned {
    int tid;
    int cpu;
    Stage stage;
    int index;
    bool adaptive;  // a spare or extra worker of the adaptive runtime, not a slot of the placement
    std::size_t slot;  // its placement slot (planned threads), whose observed CPU repin keeps
  };
  mutable std::mutex pinned_mu_;
  std::vector<Pinned> pinned_;
  // Records the calling thread (`slot`: its placement slot; ignored for an adaptive worker).
  void pinned_here(int cpu, Stage stage, int index, bool adaptive, std::size_t slot = 0);
  void unpinned_here();  // forgets it (the thread is ending)
};

// The CURVE keys an agent uses, read from the files its configuration names (security.curve).
// Throws ConfigError naming the field when a file is unreadable or holds no valid key; the
// messages never contain key material.
struct CurveSetup {
  std::string public_key, secret_key;  // this agent's
  std::string server_key;              // send: the receiver's public key
  std::set<std::string> allowed;       // receive: the senders it accepts
  bool authenticate_only = false;      // PLAIN with pair tokens instead of CURVE encryption
};
// `at` names the fields in errors ("security.curve", "sink.curve").
// The public keys of an allowed-keys file (one per line; blank lines and comments skipped).
// Throws ConfigError naming `field` for a line that is not a key, or a file that lists none.
std::set<std::string> read_allowed_keys(const std::string& path, const std::string& field);
std::optional<CurveSetup> load_curve(const SecurityConfig& sec,
                                     const std::string& at = "security.curve");
// The keys of an onward link (a relay's sink, a numastream consumer): its sink's `curve`; none
// when it has no secret key file. `at` names the fields in errors ("sink.curve", "sinks[1].curve").
std::optional<CurveSetup> load_onward_curve(const SinkConfig::Curve& keys, const std::string& at);

// A link's options from the agent's configuration (high-water mark, timeouts) and its keys.
LinkOptions link_options(const Config& cfg, std::string endpoint, std::string name, int window,
                         const std::optional<CurveSetup>& curve);

// Per-node pools: one per NUMA node a stage's threads use, sized in proportion to its threads.
class NodePools {
 public:
  // One pool per NUMA node the stage's threads use, each with `shared` buffers plus
  // `per_thread` for every thread of the stage on that node. `shared` is per node on purpose:
  // a buffer that may be held anywhere downstream must never leave another node's thread without
  // one (that could deadlock an ordered stage).
  NodePools(Runtime& rt, Stage stage, const std::string& what, std::size_t shared,
            std::size_t per_thread, std::size_t bytes);
  // The pool on `node` (the first pool when no pool is on it).
  BufferPool& for_node(int node);
  void close_all();
  const std::vector<std::unique_ptr<BufferPool>>& all() const { return pools_; }
  // numastream_pool_buffers_in_use, one sample per pool.
  void declare_metrics(MetricRegistry& m) const;

 private:
  std::vector<std::unique_ptr<BufferPool>> pools_;
  std::vector<int> nodes_;
};

std::vector<StageRequest> stage_requests(const Config& cfg, std::size_t allowed_cpus);

// placement.wait for one planned thread (Runtime::spins_on_input): `allowed` CPUs of the
// `machine`'s; an unpinned thread (placement mode os) has no CPU.
bool spins_on_input(Config::Wait wait, const ThreadSlot& thread, std::size_t allowed,
                    std::size_t machine);

// The role label of a process's metrics: a relay reports under its own role, so its counts are
// not mistaken for verified deliveries.
const char* metrics_role(const Config& cfg);
double seconds(std::uint64_t ns);
long max_rss_kb();

}  // namespace numastream
