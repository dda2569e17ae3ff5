// What a gateway reports: its metrics (the registry's families, obs/metric_catalog.hpp) and the
// summary that ends its run.
#include <algorithm>
#include <string>
#include <vector>

#include "obs/metric_catalog.hpp"
#include "pipeline/receiver.hpp"

namespace numastream {

void Receiver::declare_metrics() {
  MetricRegistry& m = rt_.metrics();
  declare_stream_metrics(m);
  role_->declare_metrics(m);
  declare_connection_metrics(m);
  m.gauge(metric::streams_complete,
          [this] { return static_cast<double>(tracker_.complete_streams()); });
  m.gauge(metric::compression_ratio, [this] {
    const auto t = tracker_.totals();
    return t.wire_bytes > 0 ? static_cast<double>(t.raw_bytes) / static_cast<double>(t.wire_bytes)
                            : 0;
  });
  m.add(metric::queue_depth, [this](MetricSamples& s) {
    s.add({{"queue", "wire"}}, static_cast<double>(wire_q_->depth()));
    if (const auto depth = role_->sink_depth())
      s.add({{"queue", "sink"}}, static_cast<double>(*depth));
  });
}

// What arrived of the streams: bytes, chunks, losses, gaps, refused frames.
void Receiver::declare_stream_metrics(MetricRegistry& m) {
  m.counter(metric::raw_bytes, [this] { return static_cast<double>(tracker_.totals().raw_bytes); });
  m.counter(metric::wire_bytes,
            [this] { return static_cast<double>(tracker_.totals().wire_bytes); });
  m.counter(metric::chunks_delivered,
            [this] { return static_cast<double>(tracker_.totals().delivered); });
  m.gauge(metric::chunks_lost, [this] { return static_cast<double>(tracker_.totals().lost); });
  m.gauge(metric::chunks_declared_missing,
          [this] { return static_cast<double>(tracker_.totals().declared_missing); });
  m.add(metric::gaps_last, [this](MetricSamples& s) {
    const auto gaps = tracker_.last_gaps(5);
    for (std::size_t i = 0; i < gaps.size(); ++i)
      s.add({{"order", std::to_string(i)}, {"gap", gaps[i]}}, 1);
  });
  m.counter(metric::chunks_corrupt,
            [this] { return static_cast<double>(tracker_.totals().corrupt); });
  m.counter(metric::chunks_duplicate,
            [this] { return static_cast<double>(tracker_.totals().duplicates); });
  m.add(metric::frames_malformed, [this](MetricSamples& s) {
    for (int i = 1; i < wire::kDecodeErrorCount; ++i) {
      s.add({{"reason", std::string(wire::decode_error_name(static_cast<wire::DecodeError>(i)))}},
            static_cast<double>(counts_.malformed[static_cast<std::size_t>(i)].load()));
    }
  });
  m.gauge(metric::chunks_delivered_before,
          [this] { return static_cast<double>(tracker_.totals().delivered_before); });
}

// The data ports' connections and the acknowledgements sent on them.
void Receiver::declare_connection_metrics(MetricRegistry& m) {
  m.counter(metric::acks_sent, [this] { return static_cast<double>(counts_.acks_sent.load()); });
  m.add(metric::connections_rejected, [this](MetricSamples& s) {
    s.add({{"reason", "handshake"}}, static_cast<double>(counts_.rejected_handshake.load()));
    const PortGuard::Refused refused = guard_.refused();
    s.add({{"reason", "auth"}}, static_cast<double>(refused.key));
    s.add({{"reason", "address"}}, static_cast<double>(refused.address));
    s.add({{"reason", "consumer"}}, static_cast<double>(refused.consumers));
  });
  m.counter(metric::connections_accepted,
            [this] { return static_cast<double>(counts_.accepted.load()); });
  m.counter(metric::connections_opened,
            [this] { return static_cast<double>(counts_.opened.load()); });
  m.counter(metric::resumes, [this] { return static_cast<double>(counts_.resumes.load()); });
}

// The run's summary (the last line on stdout): what arrived, how, and what is missing.
nlohmann::json Receiver::summary(const StreamTracker::Totals& t,
                                 const std::vector<std::string>& incomplete_files) const {
  const std::int64_t first = std::max<std::int64_t>(0, counts_.first_ns.load());
  const double secs = std::max(1e-9, static_cast<double>(counts_.last_ns.load() - first) / 1e9);
  const double raw = static_cast<double>(t.raw_bytes);
  const double wire = static_cast<double>(t.wire_bytes);
  std::uint64_t malformed = 0;
  nlohmann::json malformed_by = nlohmann::json::object();
  for (int i = 1; i < wire::kDecodeErrorCount; ++i) {
    auto n = counts_.malformed[static_cast<std::size_t>(i)].load();
    malformed += n;
    if (n)
      malformed_by[std::string(wire::decode_error_name(static_cast<wire::DecodeError>(i)))] = n;
  }
  const PortGuard::Refused refused = guard_.refused();
  nlohmann::json out = {
      {"role", role_->name()},
      {"verified", role_->verifies()},
      {"endpoint", cfg_.endpoint},
      {"connections", cfg_.connections},
      {"chunks", t.delivered},
      {"delivered_before", t.delivered_before},
      {"acks_sent", counts_.acks_sent.load()},
      {"resumes", counts_.resumes.load()},
      {"dropped_before_resume", counts_.unannounced.load()},
      {"frames_in_two_parts", counts_.two_part.load()},
      {"rejected_connections",
       {{"handshake", counts_.rejected_handshake.load()},
        {"auth", refused.key},
        {"address", refused.address},
        {"consumer", refused.consumers}}},
      // Connections that never opened a stream (no resume frame): noise, scanners,
      // other protocols, refused keys.
      {"connections_accepted", counts_.accepted.load()},
      {"connections_without_stream",
       counts_.accepted.load() - std::min(counts_.accepted.load(), counts_.opened.load())},
      {"raw_bytes", t.raw_bytes},
      {"wire_bytes", t.wire_bytes},
      {"ratio", wire > 0 ? raw / wire : 0},
      {"lost", t.lost},
      {"declared_missing", t.declared_missing},
      {"unwritten", t.unwritten},
      {"lost_is_bound", t.bounded},
      {"gaps_last", tracker_.last_gaps(5)},
      {"corrupt", t.corrupt},
      {"duplicates", t.duplicates},
      {"malformed", malformed},
      {"malformed_by_reason", malformed_by},
      {"complete", t.complete && tracker_.complete_streams() >= std::max(cfg_.streams, 1)},
      {"seconds", secs},
      {"raw_gbps", raw * 8 / secs / 1e9},
      {"wire_gbps", wire * 8 / secs / 1e9},
      {"max_rss_kb", max_rss_kb()},
      {"streams", tracker_.streams_json()},
      {"incomplete_files", incomplete_files},
      {"placement", rt_.placement_json()},
      {"stages", rt_.stages_json()},
      {"drained", rt_.drain_requested()},
      {"error", rt_.aborted() ? nlohmann::json(rt_.error()) : nlohmann::json(nullptr)}};
  // The first consumer reports as the one sink always did; with several (or a spill), each also
  // in `consumers`.
  role_->report(out);
  guard_.report(out);

  mark_uncounted_losses(out);
  return out;
}

// A raw zmq source's sender that died held frames in ZeroMQ's queues that no one counted: a
// stream whose sender restarted that way lost at least what it names (`lost_at_least`).
void Receiver::mark_uncounted_losses(nlohmann::json& out) const {
  bool any = false;
  if (!out.contains("streams")) return;
  for (auto& s : out["streams"]) {
    bool restarted = false;
    for (const auto& g : s["gaps"])
      restarted = restarted || g["reason"].get<std::string>().rfind("sender_restarted", 0) == 0;
    const auto meta =
        nlohmann::json::parse(meta_.of(s["stream_id"].get<std::uint32_t>()), nullptr, false);
    const bool uncounted = restarted && meta.is_object() && meta.value("source", "") == "zmq";
    s["lost_at_least"] = uncounted;
    any = any || uncounted;
  }
  out["lost_at_least"] = any;
}

}  // namespace numastream
