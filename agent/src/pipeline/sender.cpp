// The send pipeline: source -> compress xC -> send xS; a detector message sent as it came goes
// from the source straight to the sending threads (sender_source.cpp, hand_on) (sender.hpp).
#include "pipeline/sender.hpp"

#include "obs/metric_catalog.hpp"

namespace numastream {

// A data frame's header for chunk `c` whose bytes (as read) are `raw`: its checksum over them
// (unless `sum` is false: the compressing thread takes it as it compresses); a chunk sent as it
// came keeps its stored codec and raw size, any other is the compressing thread's to fill in
// (codec, element size, payload size).
wire::Header Sender::data_header(const RawChunk& c, std::span<const std::byte> raw,
                                 bool sum) const {
  wire::Header h;
  h.type = wire::FrameType::data;
  h.stream_id = cfg_.stream_id;
  h.sequence = c.seq;
  // connection is stamped, and the header encoded, by the sending thread.
  h.connections = static_cast<std::uint16_t>(cfg_.connections);
  if (sum) h.checksum = wire::checksum(raw);
  if (c.as_is) {
    // Never decoded here: the checksum covers the bytes as they came.
    h.codec = c.stored;
    h.payload_checksum = true;
    h.raw_size = static_cast<std::uint32_t>(c.raw_size);
    h.element_size = h.codec == Codec::bslz4 ? static_cast<std::uint8_t>(stream_.element_size) : 0;
    h.payload_size = static_cast<std::uint32_t>(raw.size());
  } else {
    h.raw_size = static_cast<std::uint32_t>(raw.size());
  }
  return h;
}

void Sender::compress_loop(StageThread& t) {
  const int node = t.numa_node;
  StageStats& st = t.stats;
  Compressor comp(cfg_.codec, cfg_.acceleration, cfg_.chunk_bytes, stream_.element_size);
  wire::ChecksumStream sum;  // the raw bytes' checksum, taken as the codec reads them
  BufferPool& pool = wire_pools_->for_node(node);
  while (true) {
    // Between chunks: a parked thread (placement.adaptive) waits here for its turn.
    if (!spares_.wait_turn(t.index)) break;
    std::optional<RawChunk> c = t.next(*raw_q_);
    if (!c) break;
    // (A detector's message sent as it came never comes here: the source frames it, hand_on.)
    Chunk out;
    out.buffer = t.buffer(pool);
    if (!out.buffer) break;
    {
      ScopedTimer busy(st.busy_ns);
      compress_into(*c, out, comp, sum, node);
    }
    c.reset();  // the raw buffer goes back to its pool
    t.observe();
    bool pushed;
    {
      ScopedTimer wait(st.blocked_output_ns);
      pushed = wire_q_->push(out.header.sequence, out);
    }
    if (!pushed) break;
  }
}

void Sender::compress_into(const RawChunk& c, Chunk& out, Compressor& comp,
                           wire::ChecksumStream& sum, int node) {
  const std::span<const std::byte> raw = source_->bytes(c, node);
  wire::Header& h = out.header;
  h = data_header(c, raw, c.as_is);
  if (c.as_is) {
    // Stored compressed (an HDF5 chunk): copied as it is, never decoded here.
    std::memcpy(out.payload_room().data(), raw.data(), raw.size());
  } else {
    // The checksum of the raw bytes is taken as the codec reads them (bslz4: block by block,
    // each still in the cache), not in a pass of its own.
    sum.reset();
    auto res = comp.compress(raw, out.payload_room(), &sum);
    h.checksum = sum.digest();
    h.codec = res.codec;
    h.element_size = h.codec == Codec::bslz4 ? static_cast<std::uint8_t>(stream_.element_size) : 0;
    h.payload_size = static_cast<std::uint32_t>(res.size);
  }
  // A mapped file cut short under the codec read zeros past its new end: never sent as its bytes.
  if (const MappedFile* f = c.mapped.file(); f && f->cut_short())
    throw std::runtime_error(cut_short_message(f->path(), f->bytes().size()));
  StageStats& st = rt_.stats(Stage::compress);
  st.chunks++;
  st.bytes_in += c.as_is ? c.raw_size : raw.size();
  st.bytes_out += wire::kHeaderSize + h.payload_size;
}

// Connection `index`'s link options.
LinkOptions Sender::send_link_options(int index) const {
  LinkOptions opts = link_options(cfg_, endpoint_.for_connection(index),
                                  "connection " + std::to_string(index), cfg_.window, curve_);
  opts.connection = static_cast<std::uint16_t>(index);
  opts.connections = static_cast<std::uint16_t>(cfg_.connections);
  if (cfg_.source.kind == SourceConfig::Kind::stream2 && cfg_.connections == 1) {
    // A detector's messages, held as they came (no pool buffers): more than `window` of them
    // while they hold less than `window` x 256 KiB, so that small ones keep the connection
    // busy. Not more bytes than that: at 0.5 MB messages, 8 times as many held cost the gateway
    // 14% more CPU per GB for no gain in rate. On one connection only: there they arrive in
    // order, where over several the receiver's reorder window is sized by chunks.
    constexpr std::size_t kBytesPerWindowSlot = 256 << 10;
    opts.window_bytes = static_cast<std::size_t>(cfg_.window) * kBytesPerWindowSlot;
  }
  if (spill_.store) {
    // A source that cannot wait, and a spill for exactly that: a gateway that is down (not up
    // yet, restarting, its node rebooting) is waited for however long, the chunks going to the
    // spill meanwhile; the spill's limit is what ends it, each chunk it refuses declared lost.
    opts.connect_timeout_s = opts.reconnect_timeout_s = opts.ack_timeout_s =
        std::numeric_limits<double>::infinity();
  }
  return opts;
}

// What the gateway settled without keeping it: declared gone to every later gateway (and kept
// in the state record), so a loss survives the gateway pod however it ends.
void Sender::declare_discarded(std::uint32_t stream, std::span<const std::uint64_t> seqs) {
  std::vector<wire::Gap> gaps;
  for (auto s : seqs) gaps.push_back({s, s + 1, wire::GapReason::gateway_discarded});
  if (!gap_book_->add(stream, gaps)) {
    throw std::runtime_error("more than " + std::to_string(wire::kMaxDeclaredGaps) +
                             " separate gaps in stream " + std::to_string(stream));
  }
  if (counts_.discarded++ == 0) {
    log_warn("the gateway discarded chunk " + std::to_string(seqs.front()) +
             " (corrupt on arrival, or past its sink): declared gone to every later gateway");
  }
}

// The end of the stream on connection `index`: the stream's totals and this connection's count
// (`on_connection` frames), then every frame acknowledged.
void Sender::end_stream(AckedLink& link, int index, std::uint64_t on_connection, StageStats& st) {
  NS_ASSERT(end_.source_done.load());
  std::byte frame[wire::kHeaderSize + wire::kEndOfStreamPayload];
  wire::Header h;
  h.type = wire::FrameType::end_of_stream;
  h.stream_id = cfg_.stream_id;
  h.connection = static_cast<std::uint16_t>(index);
  h.connections = static_cast<std::uint16_t>(cfg_.connections);
  h.sequence = counts_.produced_chunks.load();
  h.payload_size = wire::kEndOfStreamPayload;
  wire::encode_header(h, frame);
  wire::encode_end_of_stream(
      {counts_.produced_chunks.load(), counts_.produced_bytes.load(), on_connection},
      frame + wire::kHeaderSize);
  link.send_end(cfg_.stream_id, zmq::Message::of({frame, sizeof(frame)}));
  ScopedTimer wait(st.blocked_output_ns);
  link.finish();
}

// Connects, announces the stream and waits for a receiver's welcome (it answers at once).
void Sender::greet(AckedLink& link) {
  link.connect();
  link.set_metadata(cfg_.stream_id, stream_.metadata);
  link.announce(cfg_.stream_id);
  link.wait_welcome(cfg_.connect_timeout_s);
  welcome_.open();
}

// One chunk onto connection t.index; the header is encoded once, here, on its way out.
void Sender::send_chunk(AckedLink& link, Chunk& c, StageThread& t) {
  StageStats& st = t.stats;
  c.header.connection = static_cast<std::uint16_t>(t.index);
  const std::size_t size = wire::kHeaderSize + c.header.payload_size;
  {
    ScopedTimer wait(st.blocked_output_ns);
    if (c.body) {
      // Header and payload as two parts of one message (copied into one frame for a receiver
      // that does not take them so).
      link.send(c.header.stream_id, c.header.sequence, c.head(), c.take_payload());
    } else {
      link.send(c.header.stream_id, c.header.sequence, c.whole());
    }
  }
  st.chunks++;
  st.bytes_out += size;
  counts_.wire_bytes += size;
  auto now_ns = (Clock::now() - rt_.started).count();
  std::int64_t expected = -1;
  counts_.first_chunk_ns.compare_exchange_strong(expected, now_ns);
  counts_.last_send_ns = std::max<std::int64_t>(counts_.last_send_ns.load(), now_ns);
  ++counts_.sent_chunks;
  t.observe();
}

void Sender::send_loop(StageThread& t) {
  const int index = t.index;
  StageStats& st = t.stats;
  AckedLink link(*ctx_, send_link_options(index), ledger_, [this] { return rt_.aborted(); });
  link.set_gaps(gap_book_);
  link.on_discarded([this](std::uint32_t stream, std::span<const std::uint64_t> seqs) {
    declare_discarded(stream, seqs);
  });
  std::uint64_t gaps_seen = gap_book_->version();
  struct Count {  // the link's counters into the sender's, however the thread ends
    AckedLink& l;
    Sender& s;
    ~Count() {
      s.counts_.retransmitted += l.retransmitted();
      s.counts_.two_part += l.written_in_two_parts();
      s.counts_.made_whole += l.made_whole();
      s.counts_.reconnects += l.reconnects() > 0 ? l.reconnects() : 0;
    }
  } count{link, *this};
  greet(link);
  std::uint64_t on_connection = 0;
  while (true) {
    {
      ScopedTimer wait(st.blocked_output_ns);
      link.wait_for_credit();
    }
    // While nothing is ready to send, the receiver's acknowledgements are still read: the
    // acknowledged count, the state record and the window stay current when a source pauses.
    std::optional<Chunk> c;
    bool done = false;
    while (!c && !done) {
      {
        ScopedTimer wait(st.blocked_input_ns);
        c = next_to_send(std::chrono::milliseconds(50), done, t.input_spin());
      }
      if (!c && !done) link.serve(0);
    }
    if (!c) break;
    if (gap_book_->version() != gaps_seen) {
      gaps_seen = gap_book_->version();
      link.serve(0);  // a gap declared meanwhile goes out before the chunks after it
    }
    send_chunk(link, *c, t);
    ++on_connection;
  }
  if (rt_.aborted()) return;
  if (drain_pauses()) {
    // Paused, not ended: everything sent is acknowledged, the stream stays open, and a
    // restarted sender resumes it after what the receiver has.
    ScopedTimer wait(st.blocked_output_ns);
    link.finish();
    return;
  }
  end_stream(link, index, on_connection, st);
}

void Sender::declare_metrics() {
  MetricRegistry& m = rt_.metrics();
  m.counter(metric::raw_bytes,
            [this] { return static_cast<double>(rt_.stats(Stage::compress).bytes_in.load()); });
  m.counter(metric::wire_bytes, [this] { return static_cast<double>(counts_.wire_bytes.load()); });
  m.counter(metric::chunks_sent,
            [this] { return static_cast<double>(counts_.sent_chunks.load()); });
  m.gauge(metric::chunks_acknowledged,
          [this] { return static_cast<double>(ledger_->acknowledged(cfg_.stream_id)); });
  m.add(metric::queue_depth, [this](MetricSamples& s) {
    s.add({{"queue", "raw"}}, static_cast<double>(raw_q_->depth()));
    s.add({{"queue", "wire"}}, static_cast<double>(wire_q_->depth()));
  });
  wire_pools_->declare_metrics(m);
  m.gauge(metric::compression_ratio, [this] {
    const double raw = static_cast<double>(rt_.stats(Stage::compress).bytes_in.load());
    const double wire = static_cast<double>(rt_.stats(Stage::compress).bytes_out.load());
    return wire > 0 ? raw / wire : 0;
  });
  if (spill_.store) {
    m.gauge(metric::spill_bytes, [this] { return static_cast<double>(spill_.disk_bytes.load()); });
    m.gauge(metric::spill_max_bytes, [this] { return static_cast<double>(cfg_.spill.max_bytes); });
    m.gauge(metric::spill_chunks, [this] { return static_cast<double>(spill_.frames.load()); });
    m.counter(metric::spilled_chunks, [this] { return static_cast<double>(spill_.chunks.load()); });
    m.counter(metric::spill_lost_chunks,
              [this] { return static_cast<double>(spill_.lost.load()); });
  }
  source_->declare_metrics(m);
}

void Sender::save_state() {
  auto [floor, above] = ledger_->snapshot(cfg_.stream_id);
  records_.state->save(floor, above, gap_book_->of(cfg_.stream_id));
}

RunResult Sender::run(const RunHooks& hooks) {
  load_state();
  curve_ = load_curve(cfg_.security);
  if (curve_) {
    log_line(std::string(curve_->authenticate_only ? "authenticating (frames not encrypted)"
                                                   : "CURVE: encrypting") +
             " as " + curve_->public_key + " (public key)");
  }
  ctx_ =
      std::make_unique<zmq::Context>(rt_.threads(Stage::io), rt_.placement.stage_cpus(Stage::io));
  prepare_source();
  if (records_.state && !source_->replays()) {
    records_.taken = std::make_unique<TakenRecord>(cfg_.state_dir, cfg_.stream_id);
    if (auto e = records_.taken->earlier()) {
      log_line("state " + records_.taken->path() + ": earlier senders took " +
               (e->exact ? std::to_string(e->taken) : "at most " + std::to_string(e->at_most)) +
               " chunks from the live source");
    }
  }
  const int compressors = rt_.threads(Stage::compress);
  const int senders = rt_.threads(Stage::send);
  build(compressors, senders);
  declare_metrics();
  const std::unique_ptr<MetricsServer> server = rt_.serve_metrics(hooks.on_metrics_port);
  rt_.started = Clock::now();
  StageGraph graph(rt_);
  declare_graph(graph, compressors, senders);
  std::jthread recorder = start_recorder();
  graph.run();
  spares_.stop();
  // Every frame was acknowledged (or the run failed): nothing queued is worth waiting for.
  ctx_.reset();
  if (records_.state) {
    recorder.request_stop();
    recorder.join();
    try {
      save_state();  // the final record, before the lock goes with this process
    } catch (const std::exception& e) {
      rt_.fail(e.what());
    }
  }

  RunResult result;
  result.summary = summary();
  spares_.report(result.summary);
  if (spill_.store) {
    result.summary["spill"] = {{"path", cfg_.spill.path},
                               {"max_bytes", cfg_.spill.max_bytes},
                               {"spilled_chunks", spill_.chunks.load()},
                               {"spilled_bytes", spill_.bytes.load()},
                               {"peak_bytes", spill_.peak_bytes.load()},
                               {"left_chunks", spill_.store->frames()},
                               {"recovered_chunks", spill_.store->recovered().frames},
                               {"lost", spill_.lost.load()},
                               {"lost_disk_full", spill_.disk_full}};
    if (spill_.lost > 0) {
      log_error(
          "spill: " + std::to_string(spill_.lost.load()) + " chunks lost: the spill (" +
          std::to_string(cfg_.spill.max_bytes) + " bytes) was full and the source cannot wait" +
          (spill_.disk_full > 0 ? " (" + std::to_string(spill_.disk_full) +
                                      " for want of space on the device of " + cfg_.spill.path + ")"
                                : std::string()));
    }
  }
  source_->report(result.summary);
  if (rt_.aborted()) {
    result.exit_code = kExitFailure;
  } else if (drain_pauses()) {
    result.exit_code = kExitInterruptedBase + drain_signal();
  }
  return result;
}

// Waits for a previous sender of this stream still writing its final record (a replaced pod that
// is draining), then starts from what it recorded: acknowledged chunks and declared gaps.
void Sender::load_state() {
  if (!cfg_.state_dir.empty()) {
    records_.state =
        std::make_unique<StreamState>(cfg_.state_dir, cfg_.stream_id, cfg_.reconnect_timeout_s);
    if (auto rec = records_.state->load()) {
      ledger_->merge(cfg_.stream_id, rec->first, rec->second);
      records_.floor = rec->first;
      // Gaps earlier senders declared go to the receiver again: one that restarted learns them.
      const auto gaps = records_.state->gaps();
      if (!gaps.empty()) {
        if (!gap_book_->add(cfg_.stream_id, gaps)) {
          throw std::runtime_error(
              "state " + records_.state->path() + ": more than " +
              std::to_string(wire::kMaxDeclaredGaps) + " separate gaps recorded for stream " +
              std::to_string(cfg_.stream_id) + ", more than a receiver keeps: not resumed");
        }
        ledger_->settle(cfg_.stream_id, gaps);
      }
      log_line("state " + records_.state->path() + ": an earlier sender recorded " +
               std::to_string(ledger_->acknowledged(cfg_.stream_id)) + " acknowledged chunks");
    }
  }
}

// The pools and queues of one run, the spill, the governor, and what an abort closes.
void Sender::build(int compressors, int senders) {
  const SenderPools pools = plan_sender_pools(cfg_, senders);
  wire_capacity_ = pools.wire_capacity;
  wire_pools_ = std::make_unique<NodePools>(rt_, Stage::compress, "wire", pools.wire_buffers, 1,
                                            wire_capacity_);
  raw_q_ = std::make_unique<BoundedQueue<RawChunk>>(static_cast<std::size_t>(cfg_.queue_depth));
  // In sequence order onto the wire, so the receiver's reordering stays within what is in flight.
  wire_q_ = std::make_unique<OrderedQueue<Chunk>>(static_cast<std::size_t>(cfg_.queue_depth));
  open_spill();
  spares_.plan(pools.spares, compressors);
  rt_.on_abort([this] {
    spares_.close();
    raw_q_->close();
    wire_q_->close();
    if (spill_.queue) spill_.queue->close();
    wire_pools_->close_all();
    source_->close();
  });
}

// The graph: source -> raw_q_ -> compress (+ spares on the sending threads' CPUs) -> wire_q_
// [-> spill -> spill_.queue] -> send; with spares, the adaptive runtime that sets them to work.
void Sender::declare_graph(StageGraph& graph, int compressors, int senders) {
  graph.add({.stage = Stage::send,
             .threads = senders,
             .what = [](int i) { return "connection " + std::to_string(i) + ": "; },
             .body = [this](StageThread& t) { send_loop(t); }});
  StageGraph::Stage_& compress = graph.add({.stage = Stage::compress,
                                            .threads = compressors,
                                            .what = [](int) { return std::string("compress: "); },
                                            .body = [this](StageThread& t) { compress_loop(t); },
                                            .spares = spares_.count(),
                                            .host = Stage::send,
                                            .done = [this] { wire_q_->close(); }});
  if (spill_.store) {
    // On the source's CPU: a paced source sleeps most of the time, and this thread mostly waits.
    graph.add({.stage = Stage::source,
               .threads = 0,
               .what = [](int) { return std::string("spill: "); },
               .body = [this](StageThread&) { spill_loop(); },
               .spares = 1,
               .host = Stage::source,
               .spare_index = 1});
  }
  graph.add({.stage = Stage::source,
             .threads = 1,
             .what = [](int) { return std::string("source: "); },
             .body = [this](StageThread& t) { source_loop(t); },
             .after_each = [this] { source_->end(); },
             .done =
                 [this] {
                   end_.source_done = true;
                   raw_q_->close();
                   spares_.close();  // parked compressors leave; active ones drain the queue
                 }});
  spares_.start(rt_, Stage::send,
                {Stage::compress, [this](StageThread& t) { compress_loop(t); },
                 [this, &compress](int n) { return !raw_q_->closed() && compress.admit(n); },
                 [&compress] { compress.ended(); }});
}

// Records what the receiver acknowledged every half second while the stream runs (with a state
// directory); none without one.
std::jthread Sender::start_recorder() {
  if (!records_.state) return {};
  return std::jthread([this](const std::stop_token& st) {
    std::uint64_t saved = ledger_->acknowledged(cfg_.stream_id);
    while (!st.stop_requested()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      std::uint64_t now = ledger_->acknowledged(cfg_.stream_id);
      if (now == saved) continue;
      try {
        save_state();
        saved = now;
      } catch (const std::exception& e) {
        rt_.fail(e.what());
        return;
      }
    }
  });
}

// The run's summary (the last line on stdout).
nlohmann::json Sender::summary() {
  const double secs =
      std::max(1e-9, static_cast<double>(counts_.last_send_ns.load() -
                                         std::max<std::int64_t>(0, counts_.first_chunk_ns.load())) /
                         1e9);
  const double raw = static_cast<double>(rt_.stats(Stage::compress).bytes_in.load());
  const double wire = static_cast<double>(counts_.wire_bytes.load());
  return {{"role", "send"},
          {"stream_id", cfg_.stream_id},
          {"endpoint", cfg_.endpoint},
          {"connections", cfg_.connections},
          {"codec", codec_name(cfg_.codec)},
          {"curve", curve_.has_value()},
          {"chunks", counts_.sent_chunks.load()},
          // Settled = acknowledged or declared missing; the declared ones are not acknowledged.
          {"acknowledged",
           ledger_->acknowledged(cfg_.stream_id) -
               std::min(ledger_->acknowledged(cfg_.stream_id), gap_book_->chunks(cfg_.stream_id))},
          {"declared_missing", gap_book_->chunks(cfg_.stream_id)},
          {"declared_missing_from_earlier_senders", records_.declared_at_start},
          {"skipped_acknowledged", counts_.skipped_chunks},
          {"state_floor", records_.floor},
          {"retransmitted", counts_.retransmitted.load()},
          {"frames_in_two_parts", counts_.two_part.load()},
          {"frames_made_whole", counts_.made_whole.load()},
          {"compressed_by_source", counts_.compressed_by_source.load()},
          {"reconnects", counts_.reconnects.load()},
          {"raw_bytes", rt_.stats(Stage::compress).bytes_in.load()},
          {"wire_bytes", counts_.wire_bytes.load()},
          {"ratio", wire > 0 ? raw / wire : 0},
          {"lost", spill_.store ? nlohmann::json(spill_.lost.load()) : nlohmann::json(nullptr)},
          {"corrupt", nullptr},
          {"duplicates", nullptr},
          {"seconds", secs},
          {"raw_gbps", raw * 8 / secs / 1e9},
          {"wire_gbps", wire * 8 / secs / 1e9},
          {"max_rss_kb", max_rss_kb()},
          {"placement", rt_.placement_json()},
          {"stages", rt_.stages_json()},
          {"drained", rt_.drain_requested()},
          {"paused", drain_pauses() && !rt_.aborted()},
          {"error", rt_.aborted() ? nlohmann::json(rt_.error()) : nlohmann::json(nullptr)}};
}

RunResult run_sender(const Config& cfg, std::stop_token stop, const RunHooks& hooks) {
  Sender s(cfg, std::move(stop));
  return s.run(hooks);
}

}  // namespace numastream
