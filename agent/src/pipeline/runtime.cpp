#include "pipeline/runtime.hpp"

#include <numa.h>
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "base/error.hpp"
#include "data/buffer_pool.hpp"
#include "host/cpuset.hpp"
#include "net/transport.hpp"
#include "obs/metric_catalog.hpp"
#include "pipeline/pipeline.hpp"

namespace numastream {

namespace {
std::atomic<int> g_drain_signal{0};
}  // namespace

int drain_signal() noexcept { return g_drain_signal.load(); }
void set_drain_signal(int sig) noexcept { g_drain_signal.store(sig); }

namespace {

std::string read_key_text(const std::string& path, const std::string& field) {
  std::ifstream in(path);
  if (!in) throw ConfigError(field, "cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Surrounding whitespace removed; a line that starts with '#' is a comment ('#' is also a Z85
// character, so only a leading one counts).
std::string trimmed(std::string s) {
  const char* ws = " \t\r\n";
  s.erase(0, s.find_first_not_of(ws));
  auto end = s.find_last_not_of(ws);
  s.erase(end == std::string::npos ? 0 : end + 1);
  return s;
}

}  // namespace

std::optional<CurveSetup> load_onward_curve(const SinkConfig::Curve& keys, const std::string& at) {
  if (keys.secret_key_file.empty()) return std::nullopt;
  SecurityConfig sec;
  sec.secret_key_file = keys.secret_key_file;
  sec.server_key_file = keys.server_key_file;
  sec.mode = keys.mode == SinkConfig::Curve::Mode::authenticate ? SecurityConfig::Mode::authenticate
                                                                : SecurityConfig::Mode::encrypt;
  std::optional<CurveSetup> out = load_curve(sec, at);
  if (!keys.server_key.empty()) {
    if (!zmq::curve_key_valid(keys.server_key)) {
      throw ConfigError(at + ".server_key", "is not a CURVE public key (40 Z85 characters)");
    }
    out->server_key = keys.server_key;
  }
  return out;
}

LinkOptions link_options(const Config& cfg, std::string endpoint, std::string name, int window,
                         const std::optional<CurveSetup>& curve) {
  LinkOptions opts;
  opts.endpoint = std::move(endpoint);
  opts.name = std::move(name);
  opts.hwm = cfg.hwm;
  opts.window = window;
  opts.connect_timeout_s = cfg.connect_timeout_s;
  opts.reconnect_timeout_s = cfg.reconnect_timeout_s;
  opts.ack_timeout_s = cfg.ack_timeout_s;
  opts.origin = cfg.origin;
  if (curve) {
    opts.curve_public = curve->public_key;
    opts.curve_secret = curve->secret_key;
    opts.curve_server = curve->server_key;
    opts.authenticate_only = curve->authenticate_only;
  }
  return opts;
}

std::set<std::string> read_allowed_keys(const std::string& path, const std::string& field) {
  std::set<std::string> keys;
  std::istringstream lines(read_key_text(path, field));
  std::string line;
  for (int n = 1; std::getline(lines, line); ++n) {
    line = trimmed(line);
    if (line.empty() || (line[0] == '#' && line.size() != 40)) continue;
    if (!zmq::curve_key_valid(line)) {
      throw ConfigError(field, path + " line " + std::to_string(n) +
                                   " is not a CURVE public key (40 Z85 characters)");
    }
    keys.insert(line);
  }
  if (keys.empty()) throw ConfigError(field, path + " lists no keys: no sender could connect");
  return keys;
}

std::optional<CurveSetup> load_curve(const SecurityConfig& sec, const std::string& at) {
  if (!sec.curve()) return std::nullopt;
  CurveSetup out;
  out.authenticate_only = sec.mode == SecurityConfig::Mode::authenticate;
  const std::string secret_field = at + ".secret_key_file";
  out.secret_key = trimmed(read_key_text(sec.secret_key_file, secret_field));
  try {
    out.public_key = zmq::curve_public_of(out.secret_key);
  } catch (const std::invalid_argument&) {
    throw ConfigError(secret_field, sec.secret_key_file +
                                        " does not hold a CURVE secret key (40 Z85 characters)");
  }
  if (!sec.server_key_file.empty()) {
    const std::string field = at + ".server_key_file";
    out.server_key = trimmed(read_key_text(sec.server_key_file, field));
    if (!zmq::curve_key_valid(out.server_key)) {
      throw ConfigError(
          field, sec.server_key_file + " does not hold a CURVE public key (40 Z85 characters)");
    }
  }
  if (!sec.allowed_keys_file.empty())
    out.allowed = read_allowed_keys(sec.allowed_keys_file, at + ".allowed_keys_file");
  return out;
}

void log_line(const std::string& msg) { log_info(msg); }

const char* metrics_role(const Config& cfg) {
  if (cfg.role == Role::send) return "send";
  return cfg.relay ? "relay" : "receive";
}

double seconds(std::uint64_t ns) { return static_cast<double>(ns) / 1e9; }

long max_rss_kb() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

std::vector<StageRequest> stage_requests(const Config& cfg, std::size_t allowed_cpus) {
  const int cpus = static_cast<int>(std::max<std::size_t>(1, allowed_cpus));
  auto pick = [&](Stage stage, int def_threads, NumaTarget def_target) {
    StageRequest r{stage, def_threads, def_target};
    if (auto it = cfg.stages.find(stage); it != cfg.stages.end()) {
      if (it->second.threads > 0) r.threads = it->second.threads;
      if (it->second.target != NumaTarget{}) r.target = it->second.target;
    }
    return r;
  };
  std::vector<StageRequest> out;
  if (cfg.role == Role::send) {
    out.push_back(pick(Stage::source, 1, {}));
    out.push_back(pick(Stage::compress, cpus, {}));
    out.push_back(pick(Stage::send, cfg.connections, {}));
    out.push_back(pick(Stage::io, cfg.connections, out.back().target));
  } else {
    NumaTarget near_nic = cfg.nic.empty() && !cfg.nic_numa_node
                              ? NumaTarget{}
                              : NumaTarget{NumaTarget::Kind::nic, -1};
    out.push_back(pick(Stage::receive, cfg.connections, near_nic));
    if (!cfg.relay)
      out.push_back(pick(Stage::decompress, std::max(1, cpus / 2), {NumaTarget::Kind::spread, -1}));
    if (cfg.sink.kind != SinkConfig::Kind::null) {
      out.push_back(pick(Stage::sink, std::max<int>(1, static_cast<int>(cfg.consumers.size())),
                         {}));  // one per consumer
    }
    out.push_back(pick(Stage::io, cfg.connections, out.front().target));
  }
  return out;
}

NodePools::NodePools(Runtime& rt, Stage stage, const std::string& what, std::size_t shared,
                     std::size_t per_thread, std::size_t bytes) {
  for (int node : rt.stage_nodes(stage)) {
    std::size_t on_node = 0;
    for (const auto& t : rt.placement.threads) on_node += t.stage == stage && t.numa_node == node;
    std::size_t count = std::max<std::size_t>(1, shared + per_thread * on_node);
    pools_.push_back(
        std::make_unique<BufferPool>(what + "-node" + std::to_string(node), count, bytes, node));
    nodes_.push_back(node);
  }
}

BufferPool& NodePools::for_node(int node) {
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i] == node) return *pools_[i];
  }
  return *pools_.front();
}

void NodePools::close_all() {
  for (auto& p : pools_) p->close();
}

Runtime::Runtime(const Config& c, std::stop_token external)
    : cfg(c), external_(std::move(external)), metrics_({{"role", metrics_role(c)}}) {
  if (!numa_supported()) {
    log_warn(
        "libnuma reports no NUMA support on this machine: buffers are allocated without a "
        "node binding");
  }
  topo = read_topology(cfg.sysfs_root);
  allowed = allowed_cpus();
  if (cfg.nic_numa_node) {
    nic_node = cfg.nic_numa_node;
  } else if (!cfg.nic.empty()) {
    const Nic* nic = topo.find_nic(cfg.nic);
    if (!nic) {
      log_warn("NIC '" + cfg.nic + "' is not in " + cfg.sysfs_root +
               "/class/net; its NUMA node is unknown");
    } else if (nic->numa_node < 0) {
      log_warn("NIC '" + cfg.nic + "' reports no NUMA node (numa_node = -1)");
    } else {
      nic_node = nic->numa_node;
    }
  }
  auto requests = stage_requests(cfg, allowed.size());
  placement = cfg.pin ? place(topo, allowed, nic_node, requests) : place_os(requests, nic_node);
  for (const auto& w : placement.warnings) log_warn("placement: " + w);
  observed_cpu_ = std::make_unique<std::atomic<int>[]>(placement.threads.size());
  for (std::size_t i = 0; i < placement.threads.size(); ++i) {
    observed_cpu_[i] = placement.threads[i].cpu;
  }
  // ZeroMQ's I/O threads are placed (their CPU set) but not instrumented.
  for (const auto& r : requests) {
    if (r.stage != Stage::io)
      stats_[r.stage] = std::make_unique<StageStats>(std::string(stage_name(r.stage)));
  }
  declare_common_metrics();
}

StageStats& Runtime::stats(Stage stage) {
  auto it = stats_.find(stage);
  NS_ASSERT(it != stats_.end());
  return *it->second;
}

std::size_t Runtime::slot(Stage stage, int index) const {
  for (std::size_t i = 0; i < placement.threads.size(); ++i) {
    if (placement.threads[i].stage == stage && placement.threads[i].index == index) return i;
  }
  NS_ASSERT(false);
  return 0;
}

namespace {

// Names the calling thread "<stage>-<index>" and pins it to `cpu` (none when -1), its memory to
// `node` (none when -1).
void pin_thread(Stage stage, int index, int cpu, int node) {
  const std::string name =
      std::string(stage_name(stage)).substr(0, 10) + "-" + std::to_string(index);
  pthread_setname_np(pthread_self(), name.c_str());
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (int rc = pthread_setaffinity_np(pthread_self(), sizeof(set), &set); rc != 0) {
    log_warn("cannot pin " + std::string(stage_name(stage)) + " thread " + std::to_string(index) +
             " to CPU " + std::to_string(cpu) + ": error " + std::to_string(rc));
  }
  if (node >= 0 && numa_supported()) numa_set_preferred(node);
}

}  // namespace

void Runtime::pin_current(std::size_t s) {
  const ThreadSlot& t = placement.threads[s];
  pin_thread(t.stage, t.index, t.cpu, t.numa_node);
  pinned_here(t.cpu, t.stage, t.index, false, s);
  observe_cpu(s);
}

void Runtime::pinned_here(int cpu, Stage stage, int index, bool adaptive, std::size_t slot) {
  if (cpu < 0) return;
  std::lock_guard lock(pinned_mu_);
  pinned_.push_back({static_cast<int>(::gettid()), cpu, stage, index, adaptive, slot});
}

void Runtime::unpinned_here() {
  const int tid = static_cast<int>(::gettid());
  std::lock_guard lock(pinned_mu_);
  std::erase_if(pinned_, [&](const Pinned& p) { return p.tid == tid; });
}

int Runtime::repin(const std::vector<int>& cpus) {
  if (cpus.empty()) return 0;
  std::lock_guard lock(pinned_mu_);
  if (cfg.wait == Config::Wait::automatic) spinning_allowed_ = false;
  std::map<int, int> load;
  for (int c : cpus) load[c] = 0;
  for (const Pinned& p : pinned_) {
    if (load.count(p.cpu)) ++load[p.cpu];
  }
  int moved = 0;
  for (Pinned& p : pinned_) {
    if (load.count(p.cpu)) continue;
    auto least = std::min_element(load.begin(), load.end(),
                                  [](const auto& a, const auto& b) { return a.second < b.second; });
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(least->first, &set);
    if (::sched_setaffinity(p.tid, sizeof(set), &set) != 0) continue;  // ended meanwhile
    p.cpu = least->first;
    if (!p.adaptive) observed_cpu_[p.slot] = p.cpu;
    ++least->second;
    ++moved;
  }
  return moved;
}

std::vector<int> Runtime::unused_cpus(const std::vector<int>& cpus) const {
  std::lock_guard lock(pinned_mu_);
  std::vector<int> out;
  for (int c : cpus) {
    if (std::none_of(pinned_.begin(), pinned_.end(), [&](const Pinned& p) { return p.cpu == c; }))
      out.push_back(c);
  }
  return out;
}

void Runtime::run_extra(Stage stage, int index, int cpu, const std::string& what,
                        const std::function<void(StageThread&)>& body) {
  const int node = cpu >= 0 ? topo.node_of_cpu(cpu) : -1;
  pin_thread(stage, index, cpu, node);
  pinned_here(cpu, stage, index, true);
  StageThread t{*this, stage, index, slot(stage, 0), node, stats(stage), true};
  try {
    body(t);
  } catch (const std::exception& e) {
    fail(what + e.what());
  }
  unpinned_here();
}

void Runtime::observe_cpu(std::size_t s) noexcept { observed_cpu_[s] = sched_getcpu(); }

void StageThread::observe() const noexcept {
  if (!rt.cfg.pin && !spare) rt.observe_cpu(slot);
}

SpinBudget* StageThread::input_spin() const noexcept {
  if (!spins || !rt.spinning_allowed()) return nullptr;
  if (!spin_counted) {
    spin_counted = true;
    ++stats.spinning_threads;
  }
  return &stats.input_spin;
}

bool StageThread::helps() const noexcept { return spins && rt.spinning_allowed(); }

bool spins_on_input(Config::Wait wait, const ThreadSlot& t, std::size_t allowed,
                    std::size_t machine) {
  if (wait != Config::Wait::automatic) return wait == Config::Wait::spin;
  return allowed < machine && t.cpu >= 0 && !t.shared_cpu;
}

bool Runtime::spins_on_input(std::size_t s) const {
  std::size_t machine = 0;
  for (const auto& n : topo.nodes) machine += n.cpus.size();
  return numastream::spins_on_input(cfg.wait, placement.threads[s], allowed.size(), machine);
}

void Runtime::run_stage(Stage stage, int index, const std::string& what,
                        const std::function<void(StageThread&)>& body) {
  const std::size_t s = slot(stage, index);
  pin_current(s);
  StageThread t{*this, stage, index, s, placement.threads[s].numa_node, stats(stage)};
  t.spins = spins_on_input(s);
  try {
    body(t);
  } catch (const std::exception& e) {
    fail(what + e.what());
  }
  unpinned_here();
}

void Runtime::run_spare(Stage stage, int index, Stage host, int host_index, const std::string& what,
                        const std::function<void(StageThread&)>& body) {
  const std::size_t s = slot(host, host_index);
  const ThreadSlot& h = placement.threads[s];
  pin_thread(stage, index, h.cpu, h.numa_node);
  pinned_here(h.cpu, stage, index, true);
  StageThread t{*this, stage, index, s, h.numa_node, stats(stage), true};
  try {
    body(t);
  } catch (const std::exception& e) {
    fail(what + e.what());
  }
  unpinned_here();
}

void Runtime::fail(const std::string& message) {
  std::vector<std::function<void()>> closers;
  {
    std::lock_guard lock(mu_);
    if (aborted_.exchange(true)) return;
    error_ = message;
    closers.swap(closers_);
  }
  log_error(message);
  for (auto& c : closers) c();
}

std::string Runtime::error() const {
  std::lock_guard lock(mu_);
  return error_;
}

void Runtime::on_abort(std::function<void()> closer) {
  std::lock_guard lock(mu_);
  closers_.push_back(std::move(closer));
}

int Runtime::threads(Stage stage) const {
  int n = 0;
  for (const auto& t : placement.threads) n += t.stage == stage;
  return n;
}

std::vector<int> Runtime::stage_nodes(Stage stage) const {
  std::set<int> nodes;
  for (const auto& t : placement.threads) {
    if (t.stage == stage) nodes.insert(t.numa_node);
  }
  return {nodes.begin(), nodes.end()};
}

std::unique_ptr<MetricsServer> Runtime::serve_metrics(const std::function<void(int)>& on_port,
                                                      MetricsServer::Route more) {
  if (cfg.metrics_listen.empty()) return nullptr;
  MetricsServer::Limits limits;
  limits.bearer_sha256 = cfg.metrics_token_sha256;
  limits.tls = cfg.metrics_tls;
  auto server = std::make_unique<MetricsServer>(
      cfg.metrics_listen, [this] { return metrics().text(); }, [this] { return !aborted(); },
      limits, std::move(more));
  log_line("metrics on port " + std::to_string(server->port()));
  if (on_port) on_port(server->port());
  return server;
}

nlohmann::json Runtime::placement_json() const {
  nlohmann::json threads = nlohmann::json::array();
  for (std::size_t i = 0; i < placement.threads.size(); ++i) {
    const ThreadSlot& t = placement.threads[i];
    int cpu = t.stage == Stage::io ? t.cpu : observed_cpu_[i].load();
    nlohmann::json j = {{"stage", stage_name(t.stage)},
                        {"thread", t.index},
                        {"cpu", cpu},
                        {"numa_node", cpu >= 0 ? topo.node_of_cpu(cpu) : -1},
                        {"pinned", t.cpu >= 0}};
    if (t.stage == Stage::io && t.cpu >= 0) {
      j["affinity"] = format_cpulist(placement.stage_cpus(Stage::io));
    }
    threads.push_back(std::move(j));
  }
  nlohmann::json nic_local = nullptr;
  const Stage stage = cfg.role == Role::receive ? Stage::receive : Stage::send;
  if (auto local = placement.nic_local(stage)) nic_local = *local;
  return {{"mode", cfg.pin ? "numa-aware" : "os"},
          {"nic", cfg.nic},
          {"nic_numa_node", nic_node ? nlohmann::json(*nic_node) : nlohmann::json(nullptr)},
          {"nic_local", nic_local},
          {"allowed_cpus", format_cpulist(allowed)},
          {"threads", threads},
          {"warnings", placement.warnings}};
}

nlohmann::json Runtime::stages_json() const {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, s] : stats_) {
    out[std::string(stage_name(name))] = {
        {"threads", threads(name)},
        {"chunks", s->chunks.load()},
        {"busy_s", seconds(s->busy_ns.load())},
        {"blocked_input_s", seconds(s->blocked_input_ns.load())},
        {"blocked_output_s", seconds(s->blocked_output_ns.load())}};
    if (s->spinning_threads.load() > 0) {
      out[std::string(stage_name(name))]["input_wait"] = {
          {"spinning_threads", s->spinning_threads.load()},
          {"caught_spinning", s->input_spin.caught_count()},
          {"parked", s->input_spin.parked_count()}};
    }
  }
  return out;
}

// numastream_thread_info: the placement's threads where they run, then the adaptive runtime's
// spare and extra workers (pinned, named like stage threads, on CPUs the placement gave other
// threads or the CPU budget grew to).
void Runtime::sample_threads(MetricSamples& m) const {
  auto sample = [&](Stage stage, int index, int cpu, bool pinned, bool adaptive) {
    const int node = cpu >= 0 ? topo.node_of_cpu(cpu) : -1;
    const std::string nic_local =
        !nic_node || node < 0 ? "unknown" : (node == *nic_node ? "true" : "false");
    m.add({{"stage", std::string(stage_name(stage))},
           {"thread", std::to_string(index)},
           {"cpu", std::to_string(cpu)},
           {"numa_node", std::to_string(node)},
           {"pinned", pinned ? "true" : "false"},
           {"nic_local", nic_local},
           {"adaptive", adaptive ? "true" : "false"}},
          1);
  };
  for (std::size_t i = 0; i < placement.threads.size(); ++i) {
    const ThreadSlot& t = placement.threads[i];
    sample(t.stage, t.index, t.stage == Stage::io ? t.cpu : observed_cpu_[i].load(), t.cpu >= 0,
           false);
  }
  std::vector<Pinned> adaptive;
  {
    std::lock_guard lock(pinned_mu_);
    for (const Pinned& p : pinned_) {
      if (p.adaptive) adaptive.push_back(p);
    }
  }
  for (const Pinned& p : adaptive) sample(p.stage, p.index, p.cpu, true, true);
}

void Runtime::declare_common_metrics() {
  metrics_.add(metric::stage_chunks, [this](MetricSamples& m) {
    for (const auto& [name, s] : stats_)
      m.add({{"stage", s->name}}, static_cast<double>(s->chunks.load()));
  });
  metrics_.add(metric::stage_bytes, [this](MetricSamples& m) {
    for (const auto& [name, s] : stats_) {
      m.add({{"stage", s->name}, {"direction", "in"}}, static_cast<double>(s->bytes_in.load()));
      m.add({{"stage", s->name}, {"direction", "out"}}, static_cast<double>(s->bytes_out.load()));
    }
  });
  metrics_.add(metric::stage_busy_seconds, [this](MetricSamples& m) {
    for (const auto& [name, s] : stats_) m.add({{"stage", s->name}}, seconds(s->busy_ns.load()));
  });
  metrics_.add(metric::stage_blocked_seconds, [this](MetricSamples& m) {
    for (const auto& [name, s] : stats_) {
      m.add({{"stage", s->name}, {"cause", "input"}}, seconds(s->blocked_input_ns.load()));
      m.add({{"stage", s->name}, {"cause", "output"}}, seconds(s->blocked_output_ns.load()));
    }
  });
  metrics_.add(metric::stage_input_waits, [this](MetricSamples& m) {
    for (const auto& [name, s] : stats_) {
      if (s->spinning_threads.load() == 0) continue;
      m.add({{"stage", s->name}, {"ended", "spinning"}},
            static_cast<double>(s->input_spin.caught_count()));
      m.add({{"stage", s->name}, {"ended", "parked"}},
            static_cast<double>(s->input_spin.parked_count()));
    }
  });
  metrics_.add(metric::thread_info, [this](MetricSamples& m) { sample_threads(m); });
  metrics_.gauge(metric::up, [this] { return aborted() ? 0 : 1; });
  metrics_.add(metric::nic_local, [this](MetricSamples& m) {
    const Stage stage = cfg.role == Role::receive ? Stage::receive : Stage::send;
    auto local = placement.nic_local(stage);
    m.add({{"stage", std::string(stage_name(stage))}}, local ? (*local ? 1 : 0) : -1);
  });
}

void NodePools::declare_metrics(MetricRegistry& m) const {
  m.add(metric::pool_buffers_in_use, [this](MetricSamples& s) {
    for (const auto& p : pools_) s.add({{"pool", p->name()}}, static_cast<double>(p->in_use()));
  });
}

}  // namespace numastream
