// The receive pipeline: receive xR -> decompress xD -> consumers, or a relay's receive xR ->
// relay. Here: what one run builds and declares, how it is supervised and concluded, and how a
// stream's control frames are answered (a decoding receiver) or passed on (a relay). Its other
// parts: receiver_ingress.cpp (the receiving threads), receiver_decode.cpp (the decompressing
// threads), receiver_report.cpp (metrics and summary), port_guard.cpp (who may connect).
#include "pipeline/receiver.hpp"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "base/error.hpp"
#include "base/files.hpp"
#include "codec/bitshuffle.hpp"
#include "codec/codec.hpp"
#include "data/buffer_pool.hpp"
#include "data/queue.hpp"
#include "data/seqset.hpp"
#include "data/spill.hpp"
#include "net/link.hpp"
#include "net/transport.hpp"
#include "obs/http.hpp"
#include "pipeline/chunk.hpp"
#include "pipeline/consumers.hpp"
#include "pipeline/governor.hpp"
#include "pipeline/graph.hpp"
#include "pipeline/inbound.hpp"
#include "pipeline/pipeline.hpp"
#include "pipeline/pools.hpp"
#include "pipeline/preview.hpp"
#include "pipeline/relay.hpp"
#include "pipeline/runtime.hpp"
#include "pipeline/sink.hpp"
#include "wire/tracker.hpp"
#include "wire/wire.hpp"

namespace numastream {
namespace {

// The sinks that write files (file, hdf5): of `sinks`, or the one sink.
std::vector<SinkConfig> file_sinks(const Config& cfg) {
  std::vector<SinkConfig> out;
  if (cfg.consumers.empty()) {
    if (cfg.sink.kind == SinkConfig::Kind::file || cfg.sink.kind == SinkConfig::Kind::hdf5)
      out.push_back(cfg.sink);
    return out;
  }
  for (const auto& k : cfg.consumers) {
    if (k.sink.kind == SinkConfig::Kind::file || k.sink.kind == SinkConfig::Kind::hdf5)
      out.push_back(k.sink);
  }
  return out;
}

// Refuses at start, not after the first chunk arrived, a file sink that cannot write (it would
// stall its senders until their reconnect timeout); the directories above the files are made now,
// as far as no placeholder names them.
void make_sink_dirs(const Config& cfg) {
  for (const SinkConfig& sink : file_sinks(cfg)) {
    const std::string& path = sink.path;
    std::string dir = path.substr(0, path.find_last_of('/', path.find('{')) + 1);
    if (dir.empty()) dir = "./";
    try {
      make_parent_dirs(dir, sink.mode);
    } catch (const std::system_error& e) {
      throw ConfigError("sink.path",
                        std::string("cannot make the directories of ") + path + ": " + e.what());
    }
    if (::access(dir.c_str(), W_OK | X_OK) != 0) {
      throw ConfigError("sink.path", "cannot write in " + dir + ": " + errno_text(errno));
    }
  }
}

}  // namespace

std::optional<zmq::Message> Receiver::downstream_end(std::uint32_t stream, std::uint64_t count,
                                                     std::uint16_t connection,
                                                     std::uint16_t connections) {
  auto eos = tracker_.end_of_stream(stream);
  if (!eos) return std::nullopt;
  std::byte frame[wire::kHeaderSize + wire::kEndOfStreamPayload];
  wire::Header h;
  h.type = wire::FrameType::end_of_stream;
  h.stream_id = stream;
  h.connection = connection;
  h.connections = connections;
  h.sequence = eos->total_chunks;
  h.payload_size = wire::kEndOfStreamPayload;
  wire::encode_header(h, frame);
  wire::encode_end_of_stream({eos->total_chunks, eos->total_raw_bytes, count},
                             frame + wire::kHeaderSize);
  return zmq::Message::of({frame, sizeof(frame)});
}

// The metrics and health server (metrics.listen), and the preview's: on its own address
// (preview.listen: its own thread, so drawing a picture never delays a probe) or on the metrics
// port. None without an address.
Receiver::Servers Receiver::serve_http(const RunHooks& hooks) {
  Servers out;
  Preview* const shown = role_->preview();
  auto preview = [shown](const std::string& path) -> std::optional<HttpReply> {
    if (shown) return shown->answer(path);
    return std::nullopt;
  };
  const bool apart = shown && !cfg_.preview.listen.empty();
  out.metrics = rt_.serve_metrics(hooks.on_metrics_port,
                                  apart ? MetricsServer::Route{} : MetricsServer::Route{preview});
  if (apart) {
    out.preview = std::make_unique<MetricsServer>(cfg_.preview.listen, nullptr, nullptr,
                                                  MetricsServer::Limits{}, preview);
  }
  if (shown) {
    const MetricsServer& on = apart ? *out.preview : *out.metrics;
    log_line("live preview on port " + std::to_string(on.port()) + " (http://" +
             (apart ? cfg_.preview.listen : cfg_.metrics_listen) + "/preview)");
  }
  return out;
}

RunResult Receiver::run(const RunHooks& hooks) {
  guard_.load();
  make_sink_dirs(cfg_);
  std::vector<std::string> paths;  // where a stream's name decides the file it goes to
  for (const auto& c : cfg_.consumers) {
    if (c.sink.kind == SinkConfig::Kind::file || c.sink.kind == SinkConfig::Kind::hdf5)
      paths.push_back(c.sink.path);
  }
  tracker_.names().set_patterns(std::move(paths));
  const int receivers = rt_.threads(Stage::receive);
  const int decompressors = rt_.threads(Stage::decompress);
  build(receivers, decompressors);
  declare_metrics();
  Servers servers = serve_http(hooks);
  rt_.started = Clock::now();
  StageGraph graph(rt_);
  declare_graph(graph, receivers);
  graph.run([&] {
    log_line(std::string(role_->verifies() ? "receiving on " : "relaying from ") +
             endpoint_.for_connection(0) +
             (receivers > 1 ? " .. " + endpoint_.for_connection(receivers - 1) : ""));
    supervise();
    // No more input: what was taken goes through to the sink (and is acknowledged) first.
    stop_taking_ = true;
    role_->stopping();
    wire_q_->close();
  });
  const std::vector<std::string> incomplete_files = role_->finish();
  servers = {};  // nothing reads the metrics once the authenticator goes
  guard_.stop();
  ctx_.reset();
  return conclude(incomplete_files);
}

// The queue, acknowledgement boxes, ZeroMQ context, authenticator and role of one run, and what an
// abort closes.
void Receiver::build(int receivers, int decompressors) {
  const ReceiverPools pools = plan_receiver_pools(cfg_, receivers, decompressors);
  reorder_window_ = pools.reorder_window;
  // Received frames stay in the message ZeroMQ read them into (one copy fewer than reading into
  // a pool buffer); the queue bounds how many are held.
  wire_q_ = std::make_unique<BoundedQueue<Inbound>>(static_cast<std::size_t>(cfg_.queue_depth));
  for (int i = 0; i < receivers; ++i) acks_.boxes.push_back(std::make_unique<AckBox>());
  acks_.ends_owed.resize(static_cast<std::size_t>(receivers));
  ctx_ =
      std::make_unique<zmq::Context>(rt_.threads(Stage::io), rt_.placement.stage_cpus(Stage::io));
  role_ = cfg_.relay ? relaying(*this) : decoding(*this);
  role_->build(pools);
  guard_.start(*ctx_);
  rt_.on_abort([this] {
    stop_taking_ = true;
    wire_q_->close();
    role_->close();
  });
}

// The graph: the role's stages (a gateway's decompressing threads and consumers, a relay's
// onward link), then the receiving threads that feed them.
void Receiver::declare_graph(StageGraph& graph, int receivers) {
  // The receiving threads send the last acknowledgements once what they fed is written: the
  // role's stages are joined first (declared first), then this is set.
  role_->declare(graph, [this] { processing_done_ = true; });
  graph.add({.stage = Stage::receive,
             .threads = receivers,
             .what = [](int i) { return "connection " + std::to_string(i) + ": "; },
             .body = [this](StageThread& t) { receive_loop(t); }});
}

// The run's result: its summary, and the exit code that says what happened.
RunResult Receiver::conclude(const std::vector<std::string>& incomplete_files) {
  const StreamTracker::Totals t = tracker_.totals();
  RunResult result;
  result.summary = summary(t, incomplete_files);
  // A drain (SIGTERM) ends a stream on purpose: the summary says what is incomplete, the exit is
  // clean unless something arrived corrupt. Otherwise anything lost or unwritten fails the run.
  // A drained receiver whose stream did not complete exits "interrupted": resume me.
  const bool drained = rt_.drain_requested();
  if (rt_.aborted()) {
    result.exit_code = kExitFailure;
  } else if (t.corrupt > 0 || (!drained && (t.lost > 0 || !incomplete_files.empty()))) {
    result.exit_code = kExitIntegrity;
  } else if (drained && !result.summary["complete"].get<bool>()) {
    result.exit_code = kExitInterruptedBase + drain_signal();
  }
  return result;
}

// Until every expected stream has ended, a drain is requested or the run fails.
void Receiver::supervise() {
  // A stream is alive while data arrives or a sender stays connected: a detector pausing
  // between scans keeps its connections (their TCP keepalive answers), a sender that is gone
  // does not. The idle limit counts from the later of the two.
  auto alive = Clock::now();
  while (!rt_.aborted() && !rt_.drain_requested()) {
    if (cfg_.streams > 0 && tracker_.complete_streams() >= cfg_.streams) break;
    if (counts_.connected_peers.load() > 0) alive = Clock::now();
    if (cfg_.idle_timeout_s > 0 && tracker_.started() &&
        Clock::now() - std::max(tracker_.last_activity(), alive) >
            std::chrono::duration<double>(cfg_.idle_timeout_s)) {
      auto t = tracker_.totals();
      rt_.fail("no data for " + std::to_string(static_cast<int>(cfg_.idle_timeout_s)) +
               " s and no sender connected while a stream was open (" +
               std::to_string(t.delivered) +
               " chunks delivered); the sender stopped or the network failed");
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

RunResult run_receiver(const Config& cfg, std::stop_token stop, const RunHooks& hooks) {
  // Every file a sink creates (data, index, HDF5) gets its sink.mode, whoever creates it (every
  // file consumer of one receiver has the same mode: parse_config).
  if (const auto files = file_sinks(cfg); !files.empty()) ::umask(0777u & ~files.front().mode);
  Receiver r(cfg, std::move(stop));
  return r.run(hooks);
}

}  // namespace numastream
