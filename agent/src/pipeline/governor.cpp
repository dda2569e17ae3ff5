#include "pipeline/governor.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <utility>

#include "host/cpuset.hpp"
#include "obs/metric_catalog.hpp"
#include "pipeline/runtime.hpp"

namespace numastream::adaptive {
namespace {

std::string percent(double f) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%.0f%%", 100 * std::clamp(f, 0.0, 1.0));
  return buf;
}

}  // namespace

const char* move_name(Move m) noexcept {
  switch (m) {
    case Move::none:
      return "none";
    case Move::grow:
      return "grow";
    case Move::shrink:
      return "shrink";
  }
  return "?";
}

Decision decide(const Window& w, const Limits& limits, const char* codec, const char* neighbour) {
  Decision d;
  if (w.seconds <= 0 || w.active <= 0) return d;
  const double capacity = w.active * w.seconds;
  const double busy = w.busy / capacity, in = w.blocked_input / capacity,
               out = w.blocked_output / capacity;
  const double spare =
      w.neighbour_threads > 0 ? 1 - w.neighbour_busy / (w.neighbour_threads * w.seconds) : 0;
  const std::string figures = std::string(codec) + " busy " + percent(busy) +
                              ", waiting on input " + percent(in) + ", on output " + percent(out) +
                              "; " + neighbour + " idle " + percent(spare);
  if (busy >= limits.busy_high && out <= limits.wait_output_max && spare >= limits.spare_low &&
      w.active < limits.max_active) {
    d.move = Move::grow;
    d.reason = "codec_busy";
    d.why = std::string(codec) + " is the bottleneck and " + neighbour + " has CPU to spare (" +
            figures + ")";
  } else if (w.active > limits.min_active && out >= limits.wait_high) {
    d.move = Move::shrink;
    d.reason = "waits_downstream";
    d.why = std::string(codec) + " waits on the stages after it (" + figures + ")";
  } else if (w.active > limits.min_active && in >= limits.wait_high) {
    d.move = Move::shrink;
    d.reason = "waits_upstream";
    d.why = std::string(codec) + " waits on the stages before it (" + figures + ")";
  }
  return d;
}

Governor::Governor(Limits limits, int initial, int confirm, int cooldown)
    : limits_(limits),
      confirm_(std::max(1, confirm)),
      cooldown_(std::max(0, cooldown)),
      active_(std::clamp(initial, limits.min_active, limits.max_active)) {}

Move Governor::feed(const Decision& d) {
  std::lock_guard lock(mu_);
  if (cooling_ > 0) {
    --cooling_;
    pending_ = Move::none;
    streak_ = 0;
    return Move::none;
  }
  if (d.move == Move::none || d.move != pending_) {
    pending_ = d.move;
    streak_ = d.move == Move::none ? 0 : 1;
  } else {
    ++streak_;
  }
  if (pending_ == Move::none || streak_ < confirm_) return Move::none;
  const int next = active_ + (pending_ == Move::grow ? 1 : -1);
  const Move made = pending_;
  pending_ = Move::none;
  streak_ = 0;
  if (next < limits_.min_active || next > limits_.max_active) return Move::none;
  active_ = next;
  cooling_ = cooldown_;
  cv_.notify_all();
  return made;
}

Limits Governor::limits() const {
  std::lock_guard lock(mu_);
  return limits_;
}

void Governor::add_workers(int n) {
  std::lock_guard lock(mu_);
  limits_.max_active += n;
}

int Governor::set_active(int n) {
  {
    std::lock_guard lock(mu_);
    active_ = std::clamp(n, limits_.min_active, limits_.max_active);
    pending_ = Move::none;
    streak_ = 0;
    cooling_ = cooldown_;
  }
  cv_.notify_all();
  return active();
}

int Governor::active() const {
  std::lock_guard lock(mu_);
  return active_;
}

bool Governor::wait_turn(int index) {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return closed_ || index < active_; });
  return !closed_ || index < active_;
}

void Governor::close() {
  std::lock_guard lock(mu_);
  closed_ = true;
  cv_.notify_all();
}

}  // namespace numastream::adaptive

namespace numastream::adaptive {
namespace {

// The budget at start; the process's affinity when the cgroup's files cannot be read.
CpuBudget budget_or_affinity(const std::string& root) {
  try {
    return read_budget(root);
  } catch (const std::exception&) {
    CpuBudget b;
    b.cpus = allowed_cpus();
    return b;
  }
}

}  // namespace

Controller::Controller(Runtime& rt, Stage codec, Stage neighbour, Governor& governor,
                       StartWorkers start_workers, double interval_s)
    : rt_(rt),
      codec_(codec),
      neighbour_(neighbour),
      governor_(governor),
      start_workers_(std::move(start_workers)),
      interval_s_(interval_s),
      budget_(budget_or_affinity(rt.cfg.cgroup_root)),
      thread_([this](const std::stop_token& st) { loop(st); }) {}

Controller::~Controller() { stop(); }

void Controller::stop() {
  if (thread_.joinable()) {
    thread_.request_stop();
    thread_.join();
  }
}

void Controller::loop(const std::stop_token& st) {
  using Clock = std::chrono::steady_clock;
  struct Snap {
    std::uint64_t busy = 0, in = 0, out = 0, nbusy = 0;
  };
  auto snap = [&] {
    const StageStats& c = rt_.stats(codec_);
    return Snap{c.busy_ns.load(), c.blocked_input_ns.load(), c.blocked_output_ns.load(),
                rt_.stats(neighbour_).busy_ns.load()};
  };
  Snap prev = snap();
  auto t0 = Clock::now();
  const auto interval =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(interval_s_));
  std::mutex sleep_mu;
  std::condition_variable_any sleep_cv;
  while (!st.stop_requested()) {
    {
      std::unique_lock lock(sleep_mu);
      sleep_cv.wait_for(lock, st, interval, [] { return false; });
    }
    if (st.stop_requested() || rt_.aborted()) return;
    const auto t1 = Clock::now();
    const Snap cur = snap();
    Window w;
    w.seconds = std::chrono::duration<double>(t1 - t0).count();
    w.active = governor_.active();
    w.busy = static_cast<double>(cur.busy - prev.busy) / 1e9;
    w.blocked_input = static_cast<double>(cur.in - prev.in) / 1e9;
    w.blocked_output = static_cast<double>(cur.out - prev.out) / 1e9;
    w.neighbour_threads = rt_.threads(neighbour_);
    w.neighbour_busy = static_cast<double>(cur.nbusy - prev.nbusy) / 1e9;
    prev = cur;
    t0 = t1;
    watch_budget(t1);
    const int before = governor_.active();
    const Decision d =
        decide(w, governor_.limits(), stage_name(codec_).data(), stage_name(neighbour_).data());
    const Move m = governor_.feed(d);
    if (m == Move::none) continue;
    record(t1, m, d.reason, before, governor_.active(), d.why);
  }
}

void Controller::record(std::chrono::steady_clock::time_point now, Move m, const char* reason,
                        int before, int after, const std::string& why) {
  log_line("adaptive: " + std::string(stage_name(codec_)) + " " + std::to_string(before) + " -> " +
           std::to_string(after) + " active threads: " + why);
  std::lock_guard lock(mu_);
  ++changes_[{move_name(m), reason}];
  log_.push_back({{"at_s", std::chrono::duration<double>(now - rt_.started).count()},
                  {"stage", std::string(stage_name(codec_))},
                  {"from", before},
                  {"to", after},
                  {"reason", reason},
                  {"why", why}});
  if (log_.size() > 20) log_.erase(log_.begin());
}

void Controller::use_budget(const CpuBudget& from, const CpuBudget& to,
                            std::chrono::steady_clock::time_point now) {
  if (rt_.cfg.pin) {
    if (const int moved = rt_.repin(to.cpus); moved > 0) {
      log_line("adaptive: " + std::to_string(moved) +
               " pinned threads moved onto the CPUs the budget kept (" + format_cpulist(to.cpus) +
               ")");
    }
  }
  const int was = from.capacity(), now_cap = to.capacity();
  const int before = governor_.active();
  if (now_cap > was && start_workers_) {
    // Workers on the CPUs nothing runs on yet, then on the budget's CPUs in turn.
    std::vector<int> cpus;
    if (rt_.cfg.pin) {
      cpus = rt_.unused_cpus(to.cpus);
      for (int c : to.cpus) cpus.push_back(c);
    }
    const int started = start_workers_(now_cap - was, governor_.limits().max_active, cpus);
    if (started <= 0) return;
    governor_.add_workers(started);
    const int after = governor_.set_active(before + started);
    record(now, Move::grow, "cpu_budget", before, after,
           "the CPU budget grew from " + std::to_string(was) + " to " + std::to_string(now_cap) +
               " CPUs (" + to.to_string() + "): " + std::to_string(started) + " more " +
               std::string(stage_name(codec_)) + " threads started");
  } else if (now_cap < was && before > 1) {
    const int after = governor_.set_active(before - (was - now_cap));
    if (after == before) return;
    record(now, Move::shrink, "cpu_budget", before, after,
           "the CPU budget shrank from " + std::to_string(was) + " to " + std::to_string(now_cap) +
               " CPUs (" + to.to_string() + ")");
  }
}

void Controller::watch_budget(std::chrono::steady_clock::time_point now) {
  CpuBudget b;
  try {
    b = read_budget(rt_.cfg.cgroup_root);
  } catch (const std::exception&) {
    return;  // a file mid-write; the next window reads it again
  }
  CpuBudget from;
  {
    std::lock_guard lock(mu_);
    if (b == budget_) return;
    log_line("adaptive: the CPU budget changed: " + budget_.to_string() + " -> " + b.to_string());
    ++budget_changes_;
    budget_log_.push_back({{"at_s", std::chrono::duration<double>(now - rt_.started).count()},
                           {"from", budget_.to_string()},
                           {"to", b.to_string()}});
    if (budget_log_.size() > 20) budget_log_.erase(budget_log_.begin());
    from = budget_;
    budget_ = b;
  }
  use_budget(from, b, now);
}

int ExtraWorkers::start(int n, int first_index, const std::vector<int>& cpus) {
  std::lock_guard lock(mu_);
  n = std::min(n, kMax - static_cast<int>(threads_.size()));
  if (n <= 0 || !s_.admit(n)) return 0;
  for (int i = 0; i < n; ++i) {
    const int cpu = cpus.empty() ? -1 : cpus[static_cast<std::size_t>(i) % cpus.size()];
    threads_.emplace_back([this, index = first_index + i, cpu] {
      rt_.run_extra(s_.stage, index, cpu, std::string(stage_name(s_.stage)) + ": ", s_.body);
      s_.ended();
    });
  }
  return n;
}

void ExtraWorkers::join() {
  std::vector<std::jthread> threads;
  {
    std::lock_guard lock(mu_);
    threads.swap(threads_);
  }
  threads.clear();
}

void Controller::report(nlohmann::json& summary) const {
  std::lock_guard lock(mu_);
  std::uint64_t total = 0;
  for (const auto& [k, n] : changes_) total += n;
  summary["adaptive"] = {{"stage", std::string(stage_name(codec_))},
                         {"active", governor_.active()},
                         {"max", governor_.limits().max_active},
                         {"changes", total},
                         {"last_changes", log_},
                         {"cpu_budget", budget_.to_string()},
                         {"cpu_budget_changes", budget_log_}};
}

void Controller::declare_metrics(MetricRegistry& m) const {
  const std::string stage(stage_name(codec_));
  m.add(metric::adaptive_active_threads, [this, stage](MetricSamples& s) {
    std::lock_guard lock(mu_);
    s.add({{"stage", stage}}, governor_.active());
  });
  m.counter(metric::cpu_budget_changes, [this] {
    std::lock_guard lock(mu_);
    return static_cast<double>(budget_changes_);
  });
  m.gauge(metric::cpu_budget_cpus, [this] {
    std::lock_guard lock(mu_);
    return static_cast<double>(budget_.cpus.size());
  });
  m.add(metric::adaptive_changes, [this, stage](MetricSamples& s) {
    std::lock_guard lock(mu_);
    for (const char* move : {"grow", "shrink"}) {
      for (const char* reason :
           {"codec_busy", "waits_downstream", "waits_upstream", "cpu_budget"}) {
        auto it = changes_.find({move, reason});
        s.add({{"stage", stage}, {"move", move}, {"reason", reason}},
              it == changes_.end() ? 0 : static_cast<double>(it->second));
      }
    }
  });
}

void CodecSpares::plan(int spares, int active) {
  spares_ = spares;
  if (spares_ <= 0) return;
  Limits limits;
  limits.min_active = 1;
  limits.max_active = active + spares_;
  governor_ = std::make_unique<Governor>(limits, active);
}

void CodecSpares::start(Runtime& rt, Stage neighbour, ExtraWorkers::Stage_ extra) {
  if (!governor_) return;
  const Stage codec = extra.stage;
  extra_ = std::make_unique<ExtraWorkers>(rt, std::move(extra));
  controller_ = std::make_unique<Controller>(
      rt, codec, neighbour, *governor_, [this](int n, int first, const std::vector<int>& cpus) {
        return extra_->start(n, first, cpus);
      });
  controller_->declare_metrics(rt.metrics());
}

void CodecSpares::stop() {
  if (controller_) controller_->stop();
  if (extra_) extra_->join();
}

void CodecSpares::report(nlohmann::json& summary) const {
  if (controller_) controller_->report(summary);
}

}  // namespace numastream::adaptive
