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
  if (cfg.relay) return out;
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

// A decoding receiver answers a stream's control frames itself: resume and end frames from the
// record of what its sinks took; metadata and gaps are kept here (meta_, the tracker).
class Receiver::AnswerHere final : public ControlFrames {
 public:
  explicit AnswerHere(Receiver& r) : r_(r) {}
  AckLedger& record() override { return r_.acks_.ledger; }
  bool resumed(Inbound& in, zmq::Socket& sock, const zmq::Message& peer,
               std::uint16_t connections) override {
    r_.answer(sock, peer,
              r_.welcome(in.header.stream_id, static_cast<std::uint16_t>(in.via), connections, 0));
    return true;
  }
  bool metadata(Inbound& /*in*/) override { return true; }
  bool gaps(Inbound& /*in*/) override { return true; }
  void ended(const wire::Header& h, int via, zmq::Socket& sock, const zmq::Message& peer,
             std::uint16_t connections) override {
    r_.end_of_stream(h.stream_id, via, sock, peer, connections);
  }

 private:
  Receiver& r_;
};

// A relay passes a stream's control frames on downstream in order with its data (relay_loop):
// the far side's answers come back as what it acknowledged (relay_.ledger), and a stream's end is
// acknowledged upstream once the far side acknowledged its own.
class Receiver::PassDownstream final : public ControlFrames {
 public:
  explicit PassDownstream(Receiver& r) : r_(r) {}
  AckLedger& record() override { return *r_.relay_.ledger; }
  bool resumed(Inbound& in, zmq::Socket&, const zmq::Message&, std::uint16_t) override {
    return r_.wire_q_->push(in);
  }
  bool metadata(Inbound& in) override { return r_.wire_q_->push(in); }
  bool gaps(Inbound& in) override { return r_.wire_q_->push(in); }
  void ended(const wire::Header&, int, zmq::Socket&, const zmq::Message&, std::uint16_t) override {}

 private:
  Receiver& r_;
};

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

// Relay: the gateway's NIC-local container receives and checks frames, and forwards them
// undecoded, zero-copy, as one acknowledged connection to the decompressing container of the same
// pod (over IPC). It puts each stream back in sequence order first (it knows how many connections
// feed it; the decompressing side sees only one), holding at most the reorder window. It
// acknowledges upstream what the decompressing side acknowledged to it, so a chunk leaves the
// sender's window only once it is in the sink; a restarted relay loses nothing.
void Receiver::relay_loop(StageThread& t) {
  // Whatever the upstream connections have unacknowledged may be there at once.
  run_relay(
      {rt_, *ctx_,
       link_options(cfg_, cfg_.sink.endpoint, "relay", onward_window(), guard_.onward_curve()),
       *wire_q_, tracker_, relay_.ledger, relay_.gaps, acks_.boxes, reorder_window_,
       [this](std::uint32_t stream, std::uint64_t count) { return downstream_end(stream, count); },
       counts_.last_ns},
      t);
}

// The metrics and health server (metrics.listen), and the preview's: on its own address
// (preview.listen: its own thread, so drawing a picture never delays a probe) or on the metrics
// port. None without an address.
Receiver::Servers Receiver::serve_http(const RunHooks& hooks) {
  Servers out;
  if (cfg_.preview.enabled) {
    preview_ = std::make_unique<Preview>(static_cast<std::size_t>(cfg_.preview.max_side),
                                         std::chrono::milliseconds(cfg_.preview.interval_ms));
  }
  auto preview = [this](const std::string& path) -> std::optional<HttpReply> {
    if (preview_) return preview_->answer(path);
    return std::nullopt;
  };
  const bool apart = preview_ && !cfg_.preview.listen.empty();
  if (!cfg_.metrics_listen.empty()) {
    out.metrics = std::make_unique<MetricsServer>(
        cfg_.metrics_listen, [this] { return rt_.metrics().text(); },
        [this] { return !rt_.aborted(); }, MetricsServer::Limits{},
        apart ? MetricsServer::Route{} : MetricsServer::Route{preview});
    log_line("metrics on port " + std::to_string(out.metrics->port()));
    if (hooks.on_metrics_port) hooks.on_metrics_port(out.metrics->port());
  }
  if (apart) {
    out.preview = std::make_unique<MetricsServer>(cfg_.preview.listen, nullptr, nullptr,
                                                  MetricsServer::Limits{}, preview);
  }
  if (preview_) {
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
  declare_graph(graph, receivers, decompressors);
  graph.run([&] {
    log_line(std::string(cfg_.relay ? "relaying from " : "receiving on ") +
             endpoint_.for_connection(0) +
             (receivers > 1 ? " .. " + endpoint_.for_connection(receivers - 1) : ""));
    supervise();
    // No more input: what was taken goes through to the sink (and is acknowledged) first.
    stop_taking_ = true;
    spares_.close();  // parked decompressors leave; active ones drain the queue
    wire_q_->close();
  });
  spares_.stop();
  const std::vector<std::string> incomplete_files =
      consumers_->finish([this](const std::string& why) { rt_.fail(why); });
  servers = {};  // nothing reads the metrics once the authenticator goes
  guard_.stop();
  ctx_.reset();
  return conclude(incomplete_files);
}

// The pools, queues, acknowledgement boxes, ZeroMQ context, consumers, authenticator and
// governor of one run, and what an abort closes.
void Receiver::build(int receivers, int decompressors) {
  const ReceiverPools pools = plan_receiver_pools(cfg_, receivers, decompressors);
  reorder_window_ = pools.reorder_window;
  raw_pools_ = std::make_unique<NodePools>(rt_, Stage::decompress, "raw", pools.raw_buffers, 1,
                                           pools.raw_capacity);
  // Received frames stay in the message ZeroMQ read them into (one copy fewer than reading into
  // a pool buffer); the queue bounds how many are held.
  wire_q_ = std::make_unique<BoundedQueue<Inbound>>(static_cast<std::size_t>(cfg_.queue_depth));
  if (cfg_.relay) {
    control_ = std::make_unique<PassDownstream>(*this);
  } else {
    control_ = std::make_unique<AnswerHere>(*this);
  }
  for (int i = 0; i < receivers; ++i) acks_.boxes.push_back(std::make_unique<AckBox>());
  acks_.ends_owed.resize(static_cast<std::size_t>(receivers));
  ctx_ =
      std::make_unique<zmq::Context>(rt_.threads(Stage::io), rt_.placement.stage_cpus(Stage::io));
  consumers_ = std::make_unique<ConsumerSet>(ConsumerWiring{
      .cfg = cfg_,
      .tracker = tracker_,
      .ledger = acks_.ledger,
      .ctx = *ctx_,
      .reorder_window = reorder_window_,
      .slack = pools.slack,
      .onward_window = onward_window(),
      .ack = [this](int via, std::uint32_t stream,
                    std::uint64_t seq) { acknowledge(via, stream, seq); },
      .discard = [this](int via, std::uint32_t stream,
                        std::uint64_t seq) { discard(via, stream, seq); },
      .aborted = [this] { return rt_.aborted(); },
      .drain_requested = [this] { return rt_.drain_requested(); },
      .metadata = [this](std::uint32_t stream) { return meta_.of(stream); },
      .downstream_end =
          [this](std::uint32_t stream, std::uint64_t count, std::uint16_t connection,
                 std::uint16_t connections) {
            return downstream_end(stream, count, connection, connections);
          },
  });
  guard_.start(*ctx_);
  spares_.plan(pools.spares, decompressors);
  rt_.on_abort([this] {
    stop_taking_ = true;
    spares_.close();
    wire_q_->close();
    consumers_->close();
    raw_pools_->close_all();
  });
}

// The graph: receive -> wire_q_ -> decompress (+ spares on the receiving threads' CPUs) ->
// consumers; a relay: receive -> wire_q_ -> relay, frames forwarded undecoded. With spares, the
// adaptive runtime that sets them to work.
void Receiver::declare_graph(StageGraph& graph, int receivers, int decompressors) {
  // The receiving threads send the last acknowledgements once what they fed is written: the
  // processing stages are joined first (declared first), then this is set.
  auto processing_joined = [this] { processing_done_ = true; };
  StageGraph::Stage_* decompress = nullptr;
  if (cfg_.relay) {
    graph.add({.stage = Stage::sink,
               .threads = 1,
               .what = [](int) { return std::string("relay: "); },
               .body = [this](StageThread& t) { relay_loop(t); },
               .joined = processing_joined});
  } else {
    if (!consumers_->empty()) {
      graph.add({.stage = Stage::sink,
                 .threads = static_cast<int>(consumers_->size()),
                 .what = [this](int i) { return consumers_->what(i); },
                 .body = [this](StageThread& t) { consumers_->run(t.index, t.stats); }});
    }
    decompress = &graph.add({.stage = Stage::decompress,
                             .threads = decompressors,
                             .what = [](int) { return std::string("decompress: "); },
                             .body = [this](StageThread& t) { decompress_loop(t); },
                             .spares = spares_.count(),
                             .host = Stage::receive,
                             .done = [this] { consumers_->close(); },
                             .joined = processing_joined});
  }
  graph.add({.stage = Stage::receive,
             .threads = receivers,
             .what = [](int i) { return "connection " + std::to_string(i) + ": "; },
             .body = [this](StageThread& t) { receive_loop(t); }});
  if (decompress) {
    spares_.start(rt_, Stage::receive,
                  {Stage::decompress, [this](StageThread& t) { decompress_loop(t); },
                   [this, decompress](int n) {
                     return !stop_taking_ && !wire_q_->closed() && decompress->admit(n);
                   },
                   [decompress] { decompress->ended(); }});
  }
}

// The run's result: its summary, and the exit code that says what happened.
RunResult Receiver::conclude(const std::vector<std::string>& incomplete_files) {
  const StreamTracker::Totals t = tracker_.totals();
  RunResult result;
  result.summary = summary(t, incomplete_files);
  spares_.report(result.summary);
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
