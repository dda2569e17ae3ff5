// The receive pipeline: receive xR -> decompress xD -> sink.
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
#include "obs/metric_catalog.hpp"
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
  AckLedger& record() override { return r_.ledger_; }
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
// the far side's answers come back as what it acknowledged (relay_ledger_), and a stream's end is
// acknowledged upstream once the far side acknowledged its own.
class Receiver::PassDownstream final : public ControlFrames {
 public:
  explicit PassDownstream(Receiver& r) : r_(r) {}
  AckLedger& record() override { return *r_.relay_ledger_; }
  bool resumed(Inbound& in, zmq::Socket&, const zmq::Message&, std::uint16_t) override {
    return r_.wire_q_->push(in);
  }
  bool metadata(Inbound& in) override { return r_.wire_q_->push(in); }
  bool gaps(Inbound& in) override { return r_.wire_q_->push(in); }
  void ended(const wire::Header&, int, zmq::Socket&, const zmq::Message&, std::uint16_t) override {}

 private:
  Receiver& r_;
};

namespace {
// Hands the frame's payload to `out` in the message it arrived in.
void pass_on(Inbound& in, Chunk& out) {
  if (in.body) {
    out.body = std::move(in.body);
    out.body_offset = 0;
  } else {
    out.body = std::move(in.msg);
    out.body_offset = wire::kHeaderSize;
  }
}

// How a chunk is checked and where its payload goes: kept compressed as it came (decoded into
// scratch to check it, unless its checksum covers the compressed bytes and verify is not
// `decode`), as it is (not compressed), or decoded into `out`'s buffer.
enum class Checked { kept, as_is, decoded };

// Verifies a chunk (checksum, bslz4 framing, decoding) and, when it is good, hands its payload to
// `out` (or, decoded, the payload as it came to `as_came`). False: corrupt.
bool verify(Inbound& in, Checked how, Config::Verify mode, Decompressor& dec,
            std::vector<std::byte>& scratch, Chunk& out, std::optional<Chunk>& as_came) {
  const wire::Header& h = in.header;
  const auto payload = in.payload();
  bool ok = true;
  if (h.payload_checksum) {
    // Arrived compressed: the checksum covers the bytes as sent, the framing its sizes.
    ok = wire::checksum(payload) == h.checksum &&
         (h.codec != Codec::bslz4 || bslz4::check_framing(payload, h.element_size, h.raw_size)) &&
         (h.codec != Codec::none || payload.size() == h.raw_size);
  }
  switch (how) {
    case Checked::kept:
      if (ok && (!h.payload_checksum || mode == Config::Verify::decode)) {
        scratch.resize(h.raw_size);
        ok = dec.decompress(h.codec, payload, scratch, h.element_size) &&
             (h.payload_checksum || wire::checksum(scratch) == h.checksum);
      }
      if (ok) pass_on(in, out);
      break;
    case Checked::as_is:
      // Not compressed: the payload is the raw bytes, checked where they are.
      ok = ok && (h.payload_checksum || wire::checksum(payload) == h.checksum);
      if (ok) pass_on(in, out);
      break;
    case Checked::decoded: {
      std::span<std::byte> raw = out.payload_room().first(h.raw_size);
      ok = ok && dec.decompress(h.codec, payload, raw, h.element_size) &&
           (h.payload_checksum || wire::checksum(raw) == h.checksum);
      if (ok && as_came) pass_on(in, *as_came);
      break;
    }
  }
  return ok;
}
}  // namespace

// A chunk that goes to no consumer: taken (null sink), reported corrupt, or a duplicate of one the
// sink already took: the sender may let it go. A duplicate of one still on its way to the sink
// is acknowledged when the sink takes the original. (The buffer goes back to its pool with `out`.)
void Receiver::settle_here(const Chunk& out, StreamTracker::Verdict verdict, bool forward) {
  const wire::Header& h = out.header;
  if (consumers_->tracks_in_flight()) consumers_->in_flight(false, h.stream_id, h.sequence);
  bool taken = true;
  if (verdict == StreamTracker::Verdict::duplicate && forward) {
    taken = ledger_.contains(h.stream_id, h.sequence);
  }
  if (taken && verdict == StreamTracker::Verdict::corrupt) {
    discard(out.via, h.stream_id, h.sequence);
  } else if (taken) {
    acknowledge(out.via, h.stream_id, h.sequence);
  }
}

namespace {

// Re-framed for the consumers: a raw chunk (the zmq sink forwards it as is), or the frame as it
// came (`keep`: the bslz4 frame the HDF5 sink stores); each a stream of one connection. A sink
// encodes the header if it sends the frame on.
void reframe(Chunk& out, std::optional<Chunk>& as_came, bool keep) {
  wire::Header& h = out.header;
  if (!keep) {
    // A checksum over a compressed payload is over the raw bytes once decoded; over one that
    // was not compressed it is over the raw bytes already (and was checked).
    const bool recompute = h.payload_checksum && h.codec != Codec::none;
    h.codec = Codec::none;
    h.element_size = 0;
    h.payload_size = h.raw_size;
    if (recompute) h.checksum = wire::checksum(out.payload());
    h.payload_checksum = false;
  }
  h.connection = 0;
  h.connections = 1;
  if (out.buffer) out.buffer->size = wire::kHeaderSize + h.payload_size;
  if (as_came) as_came->header.connection = 0, as_came->header.connections = 1;
}

}  // namespace

void Receiver::decompress_loop(StageThread& t) {
  StageStats& st = t.stats;
  BufferPool& pool = raw_pools_->for_node(t.numa_node);
  Decompressor dec(cfg_.chunk_bytes);
  const bool forward = !consumers_->empty();
  std::vector<std::byte> scratch;
  while (true) {
    // Between chunks: a parked thread (placement.adaptive) waits here for its turn.
    if (!spares_.wait_turn(t.index)) break;
    std::optional<Inbound> in = t.next(*wire_q_);
    if (!in) break;
    Chunk out;
    out.via = in->via;
    wire::Header& h = out.header;
    h = in->header;
    // Who takes the chunk compressed as it came, who takes it decoded: with both, `out` is the
    // decoded chunk and `as_came` the one that came; with one, `out` is it.
    const auto [to_kept, to_decoded] = consumers_->forms(h.codec);
    const bool keep = to_kept && !to_decoded;
    std::optional<Chunk> as_came;
    if (to_kept && to_decoded) {
      as_came.emplace();
      as_came->header = h;
      as_came->via = in->via;
    }
    // A payload that goes to the sink as it came stays in the message it came in (its own, for
    // a frame in two parts, or the frame's): nothing is copied into a buffer.
    const bool pass = keep || h.codec == Codec::none;
    if (!pass) {
      out.buffer = t.buffer(pool);
      if (!out.buffer) break;
    }
    StreamTracker::Verdict verdict;
    {
      ScopedTimer busy(st.busy_ns);
      const std::size_t frame_size = wire::kHeaderSize + in->payload().size();
      const Checked how = keep ? Checked::kept : pass ? Checked::as_is : Checked::decoded;
      const bool ok = verify(*in, how, cfg_.verify, dec, scratch, out, as_came);
      st.bytes_in += frame_size;
      in.reset();  // frees ZeroMQ's message
      verdict = tracker_.on_chunk(h.stream_id, h.sequence, ok, h.raw_size);
      if (verdict == StreamTracker::Verdict::corrupt) {
        log_warn("stream " + std::to_string(h.stream_id) + ": chunk " + std::to_string(h.sequence) +
                 " failed verification (decode or checksum)");
      }
    }
    if (verdict == StreamTracker::Verdict::delivered) {
      st.chunks++;
      st.bytes_out += h.raw_size;
      last_ns_ = std::max<std::int64_t>(last_ns_.load(), (Clock::now() - rt_.started).count());
    }
    t.observe();
    if (preview_ && verdict == StreamTracker::Verdict::delivered &&
        preview_->due(h.stream_id, h.raw_size)) {
      // Decoded, or as it came (not compressed, or kept compressed for every consumer).
      const std::span<const std::byte> bytes =
          pass ? std::span<const std::byte>(out.payload())
               : std::span<const std::byte>(out.buffer->data + wire::kHeaderSize, h.raw_size);
      preview_->offer(h.stream_id, h.sequence, keep ? h.codec : Codec::none, h.element_size,
                      h.raw_size, bytes, metadata_of(h.stream_id));
    }
    if (verdict != StreamTracker::Verdict::delivered || !forward) {
      settle_here(out, verdict, forward);
      continue;
    }
    reframe(out, as_came, keep);
    if (!consumers_->deliver(out, as_came, st)) break;
  }
}

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
      {rt_, *ctx_, link_options(cfg_, cfg_.sink.endpoint, "relay", onward_window(), onward_curve_),
       *wire_q_, tracker_, relay_ledger_, relay_gaps_, boxes_, reorder_window_,
       [this](std::uint32_t stream, std::uint64_t count) { return downstream_end(stream, count); },
       last_ns_},
      t);
}

void Receiver::declare_metrics() {
  MetricRegistry& m = rt_.metrics();
  declare_stream_metrics(m);
  consumers_->declare_metrics(m);
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
    if (const auto depth = consumers_->depth_of_one())
      s.add({{"queue", "sink"}}, static_cast<double>(*depth));
  });
  raw_pools_->declare_metrics(m);
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
            static_cast<double>(malformed_[static_cast<std::size_t>(i)].load()));
    }
  });
  m.gauge(metric::chunks_delivered_before,
          [this] { return static_cast<double>(tracker_.totals().delivered_before); });
}

// The data ports' connections and the acknowledgements sent on them.
void Receiver::declare_connection_metrics(MetricRegistry& m) {
  m.counter(metric::acks_sent, [this] { return static_cast<double>(acks_sent_.load()); });
  m.add(metric::connections_rejected, [this](MetricSamples& s) {
    s.add({{"reason", "handshake"}}, static_cast<double>(rejected_handshake_.load()));
    s.add({{"reason", "auth"}}, static_cast<double>(refused_key()));
    s.add({{"reason", "address"}}, static_cast<double>(refused_address()));
    s.add({{"reason", "consumer"}}, static_cast<double>(refused_consumers()));
  });
  m.counter(metric::connections_accepted, [this] { return static_cast<double>(accepted_.load()); });
  m.counter(metric::connections_opened, [this] { return static_cast<double>(opened_.load()); });
  m.counter(metric::resumes, [this] { return static_cast<double>(resumes_.load()); });
}

// ZeroMQ's authentication handler for the data ports: the senders' keys (CURVE, or authenticate
// mode's pair token) and security.allow_from.
void Receiver::start_authenticator() {
  std::vector<const SinkConfig*> reemits;  // Stream V2 re-emits that name their consumers
  for (const auto& k : cfg_.consumers) {
    if (k.sink.kind == SinkConfig::Kind::stream2 && !k.sink.allow_from.empty())
      reemits.push_back(&k.sink);
  }
  if (!curve_ && cfg_.security.allow_from.empty() && reemits.empty()) return;
  const AddressBlocks allow_from = AddressBlocks::parse(cfg_.security.allow_from);
  zap_ = std::make_unique<zmq::ZapAuthenticator>(
      *ctx_, curve_ ? curve_->allowed : std::set<std::string>{},
      curve_ && curve_->authenticate_only ? curve_->secret_key : "", allow_from,
      [](const std::string& domain, const std::string& address) {
        log_warn("refused a connection from " +
                 (address.empty() ? std::string("an unknown address") : address) +
                 (domain == "numastream"
                      ? std::string(": not in security.allow_from")
                      : ": not a consumer the sink's allow_from names (" + domain + ")"));
      });
  if (curve_ && !cfg_.security.allowed_keys_file.empty()) {
    zap_->follow_keys(cfg_.security.allowed_keys_file, [](const std::string& path) {
      return read_allowed_keys(path, "security.curve.allowed_keys_file");
    });
  }
  for (const SinkConfig* k : reemits) {
    zap_->admit(zmq::consumers_domain(k->endpoint), AddressBlocks::parse(k->allow_from));
    std::string blocks;
    for (const auto& b : k->allow_from) blocks += (blocks.empty() ? "" : ", ") + b;
    log_line("stream2 re-emit on " + k->endpoint + ": admitting consumers only from " + blocks);
  }
  if (curve_) {
    log_line(std::string(curve_->authenticate_only ? "authenticate mode (frames not encrypted)"
                                                   : "CURVE") +
             ": accepting " + std::to_string(curve_->allowed.size()) + " sender key(s)");
  }
  if (!allow_from.empty()) {
    std::string blocks;
    for (const auto& b : cfg_.security.allow_from) blocks += (blocks.empty() ? "" : ", ") + b;
    log_line("accepting connections only from " + blocks);
  }
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
  curve_ = load_curve(cfg_.security);
  if (cfg_.relay && !cfg_.sink.curve.secret_key_file.empty()) {
    onward_curve_ = load_onward_curve(cfg_.sink.curve, "sink.curve");
    log_line(std::string("onward link to ") + cfg_.sink.endpoint + ": " +
             (onward_curve_->authenticate_only ? "authenticating (frames not encrypted)"
                                               : "CURVE: encrypting") +
             " as " + onward_curve_->public_key + " (public key)");
  }
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
  incomplete_files_ = consumers_->finish([this](const std::string& why) { rt_.fail(why); });
  servers = {};  // nothing reads the metrics once the authenticator goes
  if (zap_) {
    zap_refused_key_ = zap_->refused(), zap_refused_address_ = zap_->refused_address();
    zap_refused_consumers_ = zap_->refused_consumers();
  }
  zap_.reset();
  ctx_.reset();
  return conclude();
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
  for (int i = 0; i < receivers; ++i) boxes_.push_back(std::make_unique<AckBox>());
  ends_owed_.resize(static_cast<std::size_t>(receivers));
  ctx_ =
      std::make_unique<zmq::Context>(rt_.threads(Stage::io), rt_.placement.stage_cpus(Stage::io));
  consumers_ = std::make_unique<ConsumerSet>(
      ConsumerWiring{.cfg = cfg_,
                     .tracker = tracker_,
                     .ledger = ledger_,
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
                     .metadata = [this](std::uint32_t stream) { return metadata_of(stream); },
                     .downstream_end =
                         [this](std::uint32_t stream, std::uint64_t count, std::uint16_t connection,
                                std::uint16_t connections) {
                           return downstream_end(stream, count, connection, connections);
                         },
                     .onward_gaps = onward_gaps_});
  start_authenticator();
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
RunResult Receiver::conclude() {
  const StreamTracker::Totals t = tracker_.totals();
  RunResult result;
  result.summary = summary(t);
  spares_.report(result.summary);
  // A drain (SIGTERM) ends a stream on purpose: the summary says what is incomplete, the exit is
  // clean unless something arrived corrupt. Otherwise anything lost or unwritten fails the run.
  // A drained receiver whose stream did not complete exits "interrupted": resume me.
  const bool drained = rt_.drain_requested();
  if (rt_.aborted()) {
    result.exit_code = kExitFailure;
  } else if (t.corrupt > 0 || (!drained && (t.lost > 0 || !incomplete_files_.empty()))) {
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
    if (connected_peers_.load() > 0) alive = Clock::now();
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

// The run's summary (the last line on stdout): what arrived, how, and what is missing.
nlohmann::json Receiver::summary(const StreamTracker::Totals& t) const {
  const std::int64_t first = std::max<std::int64_t>(0, first_ns_.load());
  const double secs = std::max(1e-9, static_cast<double>(last_ns_.load() - first) / 1e9);
  const double raw = static_cast<double>(t.raw_bytes);
  const double wire = static_cast<double>(t.wire_bytes);
  std::uint64_t malformed = 0;
  nlohmann::json malformed_by = nlohmann::json::object();
  for (int i = 1; i < wire::kDecodeErrorCount; ++i) {
    auto n = malformed_[static_cast<std::size_t>(i)].load();
    malformed += n;
    if (n)
      malformed_by[std::string(wire::decode_error_name(static_cast<wire::DecodeError>(i)))] = n;
  }
  nlohmann::json out = {
      {"role", cfg_.relay ? "relay" : "receive"},
      {"verified", !cfg_.relay},
      {"endpoint", cfg_.endpoint},
      {"connections", cfg_.connections},
      {"curve", curve_.has_value()},
      {"security", !curve_                     ? "none"
                   : curve_->authenticate_only ? "authenticate"
                                               : "encrypt"},
      // A relay's onward link (sink.curve); null where there is none.
      {"onward_security",
       !cfg_.relay ? nlohmann::json(nullptr)
       : !onward_curve_
           ? nlohmann::json("none")
           : nlohmann::json(onward_curve_->authenticate_only ? "authenticate" : "encrypt")},
      {"chunks", t.delivered},
      {"delivered_before", t.delivered_before},
      {"acks_sent", acks_sent_.load()},
      {"resumes", resumes_.load()},
      {"dropped_before_resume", unannounced_.load()},
      {"frames_in_two_parts", two_part_.load()},
      {"rejected_connections",
       {{"handshake", rejected_handshake_.load()},
        {"auth", refused_key()},
        {"address", refused_address()},
        {"consumer", refused_consumers()}}},
      // Connections that never opened a stream (no resume frame): noise, scanners,
      // other protocols, refused keys.
      {"connections_accepted", accepted_.load()},
      {"connections_without_stream", accepted_.load() - std::min(accepted_.load(), opened_.load())},
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
      {"incomplete_files", incomplete_files_},
      {"placement", rt_.placement_json()},
      {"stages", rt_.stages_json()},
      {"drained", rt_.drain_requested()},
      {"error", rt_.aborted() ? nlohmann::json(rt_.error()) : nlohmann::json(nullptr)}};
  // The first consumer reports as the one sink always did; with several (or a spill), each also
  // in `consumers`.
  consumers_->report(out);

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
        nlohmann::json::parse(metadata_of(s["stream_id"].get<std::uint32_t>()), nullptr, false);
    const bool uncounted = restarted && meta.is_object() && meta.value("source", "") == "zmq";
    s["lost_at_least"] = uncounted;
    any = any || uncounted;
  }
  out["lost_at_least"] = any;
}

RunResult run_receiver(const Config& cfg, std::stop_token stop, const RunHooks& hooks) {
  // Every file a sink creates (data, index, HDF5) gets its sink.mode, whoever creates it (every
  // file consumer of one receiver has the same mode: parse_config).
  if (const auto files = file_sinks(cfg); !files.empty()) ::umask(0777u & ~files.front().mode);
  Receiver r(cfg, std::move(stop));
  return r.run(hooks);
}

}  // namespace numastream
