// The receive pipeline: receive xR -> decompress xD -> sink.
#include <fcntl.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "numastream/buffer_pool.hpp"
#include "numastream/codec.hpp"
#include "numastream/http.hpp"
#include "numastream/pipeline.hpp"
#include "numastream/queue.hpp"
#include "numastream/tracker.hpp"
#include "numastream/transport.hpp"
#include "numastream/wire.hpp"
#include "runtime.hpp"

namespace numastream {
namespace {

using Clock = std::chrono::steady_clock;

void free_to_pool(void* /*data*/, void* hint) noexcept {
  auto* b = static_cast<Buffer*>(hint);
  b->pool->release(b);
}

std::string stream_path(const std::string& pattern, std::uint32_t stream) {
  std::string out = pattern;
  auto pos = out.find("{stream}");
  if (pos != std::string::npos) out.replace(pos, 8, std::to_string(stream));
  return out;
}

// Writes each stream back in sequence order. Chunks arrive out of order (parallel decompression,
// several connections); up to `window` are held to restore the order. If the next chunk is still
// missing when the window is full, the sink moves on without it (that chunk is then lost to the
// file and reported). The file is written as <path>.part and renamed to <path> only when the
// stream ended complete and verified.
//
// A chunk the receiver has taken off the network but not yet handed to the sink is "in flight"
// (queued for, or inside, a decompressor). The sink never gives up on an in-flight chunk while it
// can still hold more (`slack` beyond the window): that chunk is certain to come, however the
// decompressing threads are scheduled. It gives up only on chunks that have not arrived at all.
class InFlight {
 public:
  void add(std::uint32_t stream, std::uint64_t seq) {
    std::lock_guard lock(mu_);
    set_.insert({stream, seq});
  }
  void remove(std::uint32_t stream, std::uint64_t seq) {
    std::lock_guard lock(mu_);
    auto it = set_.find({stream, seq});
    if (it != set_.end()) set_.erase(it);
  }
  bool contains(std::uint32_t stream, std::uint64_t seq) const {
    std::lock_guard lock(mu_);
    return set_.count({stream, seq}) > 0;
  }

 private:
  mutable std::mutex mu_;
  std::multiset<std::pair<std::uint32_t, std::uint64_t>> set_;
};

class FileSink {
 public:
  FileSink(const Config& cfg, StreamTracker& tracker, InFlight& in_flight, std::size_t window,
           std::size_t slack)
      : cfg_(cfg), tracker_(tracker), in_flight_(in_flight), window_(window), slack_(slack) {}
  ~FileSink() {
    for (auto& [id, o] : outs_) {
      for (auto& [seq, b] : o.pending) b->pool->release(b);
      if (o.fd >= 0) ::close(o.fd);
    }
  }

  void put(Buffer* b, const wire::Header& h) {
    Out& o = open(h.stream_id);
    if (h.sequence < o.next || o.pending.count(h.sequence)) {
      tracker_.on_unwritten(h.stream_id, h.sequence);
      b->pool->release(b);
      return;
    }
    o.pending.emplace(h.sequence, b);
    in_flight_.remove(h.stream_id, h.sequence);
    flush(h.stream_id, o);
    while (o.pending.size() > window_ &&
           (!in_flight_.contains(h.stream_id, o.next) || o.pending.size() > window_ + slack_)) {
      log_line("file sink: stream " + std::to_string(h.stream_id) + ": chunk " +
               std::to_string(o.next) + " still missing with " + std::to_string(o.pending.size()) +
               " later chunks waiting; writing on without it");
      o.next = o.pending.begin()->first;
      flush(h.stream_id, o);
    }
  }

  // Writes what is left and publishes complete files. Returns the files left incomplete.
  std::vector<std::string> finish() {
    std::vector<std::string> incomplete;
    auto totals = tracker_.streams_json();
    for (auto& [id, o] : outs_) {
      while (!o.pending.empty()) {
        o.next = o.pending.begin()->first;
        flush(id, o);
      }
      ::fsync(o.fd);
      ::close(o.fd);
      o.fd = -1;
      bool good = false;
      for (const auto& s : totals) {
        if (s["stream_id"] == id) {
          good = s["complete"].get<bool>() && s["lost"].get<std::uint64_t>() == 0 &&
                 s["corrupt"].get<std::uint64_t>() == 0;
        }
      }
      std::string final_path = stream_path(cfg_.sink.path, id);
      if (good && ::rename((final_path + ".part").c_str(), final_path.c_str()) == 0) continue;
      incomplete.push_back(final_path + ".part");
    }
    return incomplete;
  }

 private:
  struct Out {
    int fd = -1;
    std::uint64_t next = 0;
    std::map<std::uint64_t, Buffer*> pending;
  };

  Out& open(std::uint32_t stream) {
    auto it = outs_.find(stream);
    if (it != outs_.end()) return it->second;
    if (!outs_.empty() && cfg_.sink.path.find("{stream}") == std::string::npos) {
      throw std::runtime_error("file sink: a second stream (id " + std::to_string(stream) +
                               ") arrived but sink.path has no {stream} placeholder");
    }
    std::string path = stream_path(cfg_.sink.path, stream) + ".part";
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw_errno("file sink: open " + path);
    Out& o = outs_[stream];
    o.fd = fd;
    return o;
  }

  void flush(std::uint32_t stream, Out& o) {
    while (!o.pending.empty() && o.pending.begin()->first == o.next) {
      Buffer* b = o.pending.begin()->second;
      o.pending.erase(o.pending.begin());
      const std::byte* p = b->data + wire::kHeaderSize;
      std::size_t left = b->size - wire::kHeaderSize;
      while (left > 0) {
        ssize_t n = ::write(o.fd, p, left);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
          b->pool->release(b);
          throw_errno("file sink: write " + stream_path(cfg_.sink.path, stream) + ".part");
        }
        p += n;
        left -= static_cast<std::size_t>(n);
      }
      b->pool->release(b);
      ++o.next;
    }
  }

  const Config& cfg_;
  StreamTracker& tracker_;
  InFlight& in_flight_;
  std::size_t window_;
  std::size_t slack_;
  std::map<std::uint32_t, Out> outs_;
};

class Receiver {
 public:
  Receiver(const Config& cfg, std::stop_token stop)
      : cfg_(cfg), rt_(cfg, stop), endpoint_(parse_endpoint(cfg.endpoint, "endpoint")) {}
  RunResult run(const RunHooks& hooks);

 private:
  void receive_thread(int index);
  void decompress_thread(int index);
  void sink_thread();
  void zmq_sink_loop(StageStats& st);
  void relay_thread();
  bool send_end_of_streams(zmq::Socket& sock, zmq::Monitor& mon,
                           const std::map<std::uint32_t, std::uint64_t>& forwarded);
  bool check_sink(zmq::SendOutcome o);
  std::unique_ptr<zmq::Socket> connect_sink(std::unique_ptr<zmq::Monitor>& mon, const char* name);
  std::string metrics_text();

  const Config& cfg_;
  Runtime rt_;
  Endpoint endpoint_;
  StreamTracker tracker_;
  std::array<std::atomic<std::uint64_t>, wire::kDecodeErrorCount> malformed_{};

  std::unique_ptr<NodePools> raw_pools_;
  std::unique_ptr<BoundedQueue<zmq::Message>> wire_q_;
  std::unique_ptr<BoundedQueue<Buffer*>> sink_q_;
  std::unique_ptr<FileSink> file_sink_;
  std::unique_ptr<zmq::Context> ctx_;

  std::size_t reorder_window_ = 16;
  InFlight in_flight_;  // file sink only
  std::atomic<bool> stop_receiving_{false};
  std::atomic<int> receivers_left_{0};
  std::atomic<int> decompressors_left_{0};
  std::atomic<std::int64_t> first_ns_{-1};
  std::atomic<std::int64_t> last_ns_{0};
  std::vector<std::string> incomplete_files_;
};

void Receiver::receive_thread(int index) {
  const std::size_t slot = rt_.slot("receive", index);
  rt_.pin_current(slot);
  StageStats& st = rt_.stats("receive");
  const std::string ep = endpoint_.for_connection(index);
  try {
    zmq::Socket sock(*ctx_, ZMQ_PULL);
    sock.set_int(ZMQ_RCVHWM, cfg_.hwm);
    sock.set_int(ZMQ_LINGER, 0);
    zmq::enable_keepalive(sock);
    // A peer that sends a message larger than any valid frame is disconnected by ZeroMQ itself.
    sock.set_int64(ZMQ_MAXMSGSIZE,
                   static_cast<std::int64_t>(wire::kHeaderSize + max_encoded_size(cfg_.chunk_bytes)));
    sock.bind(ep);
    while (!stop_receiving_ && !rt_.aborted()) {
      zmq_pollitem_t item{sock.get(), 0, ZMQ_POLLIN, 0};
      int ready;
      {
        ScopedTimer wait(st.blocked_input_ns);
        ready = zmq_poll(&item, 1, 100);
      }
      if (ready <= 0) continue;
      zmq::Message msg;
      if (!msg.receive(sock)) continue;
      ScopedTimer busy(st.busy_ns);
      auto bytes = msg.bytes();
      wire::Header h;
      wire::DecodeError err = wire::decode(bytes, cfg_.chunk_bytes, h);
      if (err != wire::DecodeError::ok) {
        if (malformed_[static_cast<std::size_t>(err)]++ < 3) {
          log_line("connection " + std::to_string(index) + ": dropped a malformed frame (" +
                   std::string(wire::decode_error_name(err)) + ", " + std::to_string(bytes.size()) +
                   " bytes)");
        }
        continue;
      }
      if (h.type == wire::FrameType::end_of_stream) {
        tracker_.on_end_of_stream(h, wire::decode_end_of_stream(bytes));
        continue;
      }
      tracker_.on_frame(h.stream_id, bytes.size());
      if (file_sink_) in_flight_.add(h.stream_id, h.sequence);
      auto now_ns = (Clock::now() - rt_.started).count();
      std::int64_t unset = -1;
      first_ns_.compare_exchange_strong(unset, now_ns);
      st.chunks++;
      st.bytes_in += bytes.size();
      if (!cfg_.pin) rt_.observe_cpu(slot);
      bool pushed;
      {
        ScopedTimer wait(st.blocked_output_ns);
        pushed = wire_q_->push(msg);
      }
      if (!pushed) break;
    }
  } catch (const std::exception& e) {
    rt_.fail("connection " + std::to_string(index) + ": " + e.what());
  }
  if (--receivers_left_ == 0) wire_q_->close();
}

void Receiver::decompress_thread(int index) {
  const std::size_t slot = rt_.slot("decompress", index);
  rt_.pin_current(slot);
  const int node = rt_.placement.threads[slot].numa_node;
  StageStats& st = rt_.stats("decompress");
  BufferPool& pool = raw_pools_->for_node(node);
  Decompressor dec(cfg_.chunk_bytes);
  const bool forward = cfg_.sink.kind != SinkConfig::Kind::null;
  while (true) {
    std::optional<zmq::Message> in;
    {
      ScopedTimer wait(st.blocked_input_ns);
      in = wire_q_->pop();
    }
    if (!in) break;
    Buffer* out;
    {
      ScopedTimer wait(st.blocked_output_ns);
      out = pool.acquire();
    }
    if (!out) break;
    wire::Header h;
    StreamTracker::Verdict verdict;
    {
      ScopedTimer busy(st.busy_ns);
      // The receiving thread validated the header; decode again to read it.
      auto frame = in->bytes();
      wire::decode(frame, cfg_.chunk_bytes, h);
      std::span<std::byte> raw(out->data + wire::kHeaderSize, h.raw_size);
      bool ok = dec.decompress(h.codec, frame.subspan(wire::kHeaderSize), raw) &&
                wire::checksum(raw) == h.checksum;
      st.bytes_in += frame.size();
      in.reset();  // frees ZeroMQ's message
      verdict = tracker_.on_chunk(h.stream_id, h.sequence, ok, h.raw_size);
      if (verdict == StreamTracker::Verdict::corrupt) {
        log_line("stream " + std::to_string(h.stream_id) + ": chunk " + std::to_string(h.sequence) +
                 " failed verification (decode or checksum)");
      }
    }
    if (verdict == StreamTracker::Verdict::delivered) {
      st.chunks++;
      st.bytes_out += h.raw_size;
      last_ns_ = std::max<std::int64_t>(last_ns_.load(), (Clock::now() - rt_.started).count());
    }
    if (!cfg_.pin) rt_.observe_cpu(slot);
    if (verdict != StreamTracker::Verdict::delivered || !forward) {
      if (file_sink_) in_flight_.remove(h.stream_id, h.sequence);
      pool.release(out);
      continue;
    }
    // Re-frame as a raw chunk for the sink (the zmq sink forwards it as is).
    h.codec = Codec::none;
    h.payload_size = h.raw_size;
    h.connection = 0;
    h.connections = 1;
    wire::encode_header(h, out->data);
    out->size = wire::kHeaderSize + h.raw_size;
    bool pushed;
    {
      ScopedTimer wait(st.blocked_output_ns);
      pushed = sink_q_->push(out);
    }
    if (!pushed) {
      pool.release(out);
      break;
    }
  }
  if (--decompressors_left_ == 0 && sink_q_) sink_q_->close();
}

bool Receiver::check_sink(zmq::SendOutcome o) {
  if (o == zmq::SendOutcome::peer_lost) {
    rt_.fail("sink: the downstream consumer at " + cfg_.sink.endpoint + " went away");
  } else if (o == zmq::SendOutcome::failed) {
    rt_.fail("sink: send to " + cfg_.sink.endpoint + " failed: " + zmq::last_error());
  }
  return o == zmq::SendOutcome::sent;
}

std::unique_ptr<zmq::Socket> Receiver::connect_sink(std::unique_ptr<zmq::Monitor>& mon,
                                                    const char* name) {
  auto sock = std::make_unique<zmq::Socket>(*ctx_, ZMQ_PUSH);
  sock->set_int(ZMQ_SNDHWM, cfg_.hwm);
  sock->set_int(ZMQ_IMMEDIATE, 1);
  sock->set_int(ZMQ_LINGER, static_cast<int>(cfg_.connect_timeout_s * 1000));
  mon = std::make_unique<zmq::Monitor>(*ctx_, *sock, name);
  sock->connect(cfg_.sink.endpoint);
  return sock;
}

// End each forwarded stream downstream, once, with the totals its sender announced.
bool Receiver::send_end_of_streams(zmq::Socket& sock, zmq::Monitor& mon,
                                   const std::map<std::uint32_t, std::uint64_t>& forwarded) {
  auto aborted = [this] { return rt_.aborted(); };
  for (const auto& [stream, count] : forwarded) {
    auto eos = tracker_.end_of_stream(stream);
    if (!eos) continue;
    wire::Header h;
    h.type = wire::FrameType::end_of_stream;
    h.stream_id = stream;
    h.connections = 1;
    h.sequence = eos->total_chunks;
    h.payload_size = wire::kEndOfStreamPayload;
    std::byte frame[wire::kHeaderSize + wire::kEndOfStreamPayload];
    wire::encode_header(h, frame);
    wire::encode_end_of_stream({eos->total_chunks, eos->total_raw_bytes, count},
                               frame + wire::kHeaderSize);
    zmq_msg_t msg;
    zmq_msg_init_size(&msg, sizeof(frame));
    std::memcpy(zmq_msg_data(&msg), frame, sizeof(frame));
    if (!check_sink(zmq::send_watched(sock, mon, &msg, aborted))) return false;
  }
  return true;
}

void Receiver::zmq_sink_loop(StageStats& st) {
  std::unique_ptr<zmq::Monitor> mon;
  auto sock = connect_sink(mon, "sink");
  auto aborted = [this] { return rt_.aborted(); };
  std::map<std::uint32_t, std::uint64_t> forwarded;
  while (true) {
    std::optional<Buffer*> b;
    {
      ScopedTimer wait(st.blocked_input_ns);
      b = sink_q_->pop();
    }
    if (!b) break;
    wire::Header h;
    wire::decode({(*b)->data, (*b)->size}, cfg_.chunk_bytes, h);
    std::size_t size = (*b)->size;
    zmq_msg_t msg;
    zmq_msg_init_data(&msg, (*b)->data, size, free_to_pool, *b);
    ScopedTimer wait(st.blocked_output_ns);
    if (!check_sink(zmq::send_watched(*sock, *mon, &msg, aborted))) break;
    ++forwarded[h.stream_id];
    st.chunks++;
    st.bytes_out += size;
  }
  if (rt_.aborted()) {
    sock->set_int(ZMQ_LINGER, 0);
    return;
  }
  send_end_of_streams(*sock, *mon, forwarded);
}

// Relay: the gateway's NIC-local container receives and checks frames, and forwards them
// undecoded, zero-copy, as one connection to the decompressing container of the same pod (over
// IPC). It puts each stream back in sequence order first (it knows how many connections feed it;
// the decompressing side sees only one), holding at most the reorder window. Each chunk's
// sequence number is recorded, so the relay too reports what never arrived; the decompressing
// side verifies the data.
void Receiver::relay_thread() {
  const std::size_t slot = rt_.slot("sink", 0);
  rt_.pin_current(slot);
  StageStats& st = rt_.stats("sink");
  auto aborted = [this] { return rt_.aborted(); };
  struct Order {
    std::uint64_t next = 0;
    std::map<std::uint64_t, zmq::Message> pending;
  };
  std::map<std::uint32_t, Order> order;
  std::map<std::uint32_t, std::uint64_t> forwarded;
  try {
    std::unique_ptr<zmq::Monitor> mon;
    auto sock = connect_sink(mon, "relay");
    auto forward = [&](std::uint32_t stream, zmq::Message& msg) {
      std::size_t size = msg.bytes().size();
      ScopedTimer wait(st.blocked_output_ns);
      if (!check_sink(zmq::send_watched(*sock, *mon, msg.raw(), aborted))) return false;
      ++forwarded[stream];
      st.chunks++;
      st.bytes_out += size;
      last_ns_ = std::max<std::int64_t>(last_ns_.load(), (Clock::now() - rt_.started).count());
      return true;
    };
    // Forwards what is next in order; with `all`, everything held (gaps skipped).
    auto flush = [&](std::uint32_t stream, Order& o, bool all) {
      while (!o.pending.empty() &&
             (all || o.pending.begin()->first == o.next || o.pending.size() > reorder_window_)) {
        auto it = o.pending.begin();
        o.next = it->first + 1;
        zmq::Message m = std::move(it->second);
        o.pending.erase(it);
        if (!forward(stream, m)) return false;
      }
      return true;
    };
    bool ok = true;
    while (ok) {
      std::optional<zmq::Message> msg;
      {
        ScopedTimer wait(st.blocked_input_ns);
        msg = wire_q_->pop();
      }
      if (!msg) break;
      wire::Header h;
      {
        ScopedTimer busy(st.busy_ns);
        wire::decode(msg->bytes(), cfg_.chunk_bytes, h);
        if (tracker_.on_chunk(h.stream_id, h.sequence, true, h.raw_size) !=
            StreamTracker::Verdict::delivered) {
          continue;  // a duplicate: counted, not forwarded
        }
        h.connection = 0;
        h.connections = 1;
        wire::encode_header(h, msg->mutable_data());
      }
      Order& o = order[h.stream_id];
      if (h.sequence < o.next) {
        ok = forward(h.stream_id, *msg);  // later than the window allowed: pass it on at once
        continue;
      }
      o.pending.emplace(h.sequence, std::move(*msg));
      ok = flush(h.stream_id, o, false);
    }
    for (auto& [stream, o] : order) {
      if (ok && !rt_.aborted()) ok = flush(stream, o, true);
    }
    if (rt_.aborted() || !ok) {
      sock->set_int(ZMQ_LINGER, 0);
      return;
    }
    send_end_of_streams(*sock, *mon, forwarded);
  } catch (const std::exception& e) {
    rt_.fail(std::string("relay: ") + e.what());
  }
}

void Receiver::sink_thread() {
  rt_.pin_current(rt_.slot("sink", 0));
  StageStats& st = rt_.stats("sink");
  try {
    if (cfg_.sink.kind == SinkConfig::Kind::zmq) {
      zmq_sink_loop(st);
      return;
    }
    while (true) {
      std::optional<Buffer*> b;
      {
        ScopedTimer wait(st.blocked_input_ns);
        b = sink_q_->pop();
      }
      if (!b) break;
      wire::Header h;
      wire::decode({(*b)->data, (*b)->size}, cfg_.chunk_bytes, h);
      std::size_t raw = (*b)->size - wire::kHeaderSize;
      {
        ScopedTimer busy(st.busy_ns);
        file_sink_->put(*b, h);
      }
      st.chunks++;
      st.bytes_out += raw;
    }
  } catch (const std::exception& e) {
    rt_.fail(e.what());
    // Drain so that decompressors blocked on the sink queue can finish.
    while (auto b = sink_q_->pop()) (*b)->pool->release(*b);
  }
}

std::string Receiver::metrics_text() {
  std::string out;
  // A relay reports under its own role, so its counts are not mistaken for verified deliveries.
  const char* role = cfg_.relay ? "relay" : "receive";
  rt_.write_common_metrics(out, role);
  const std::string r = std::string("role=\"") + role + "\"";
  auto t = tracker_.totals();
  out += "# TYPE numastream_raw_bytes_total counter\n";
  metric(out, "numastream_raw_bytes_total", r, static_cast<double>(t.raw_bytes));
  out += "# TYPE numastream_wire_bytes_total counter\n";
  metric(out, "numastream_wire_bytes_total", r, static_cast<double>(t.wire_bytes));
  out += "# HELP numastream_chunks_delivered_total Chunks decompressed, verified and handed to the sink.\n"
         "# TYPE numastream_chunks_delivered_total counter\n";
  metric(out, "numastream_chunks_delivered_total", r, static_cast<double>(t.delivered));
  out += "# HELP numastream_chunks_lost Chunks missing: announced by the sender (or below the "
         "highest sequence seen) and not delivered.\n# TYPE numastream_chunks_lost gauge\n";
  metric(out, "numastream_chunks_lost", r, static_cast<double>(t.lost));
  out += "# TYPE numastream_chunks_corrupt_total counter\n";
  metric(out, "numastream_chunks_corrupt_total", r, static_cast<double>(t.corrupt));
  out += "# TYPE numastream_chunks_duplicate_total counter\n";
  metric(out, "numastream_chunks_duplicate_total", r, static_cast<double>(t.duplicates));
  out += "# HELP numastream_frames_malformed_total Frames rejected before decoding, by reason.\n"
         "# TYPE numastream_frames_malformed_total counter\n";
  for (int i = 1; i < wire::kDecodeErrorCount; ++i) {
    metric(out, "numastream_frames_malformed_total",
           r + ",reason=\"" + std::string(wire::decode_error_name(static_cast<wire::DecodeError>(i))) + "\"",
           static_cast<double>(malformed_[static_cast<std::size_t>(i)].load()));
  }
  out += "# TYPE numastream_streams_complete gauge\n";
  metric(out, "numastream_streams_complete", r, tracker_.complete_streams());
  out += "# TYPE numastream_compression_ratio gauge\n";
  metric(out, "numastream_compression_ratio", r,
         t.wire_bytes > 0 ? static_cast<double>(t.raw_bytes) / static_cast<double>(t.wire_bytes) : 0);
  out += "# TYPE numastream_queue_depth gauge\n";
  metric(out, "numastream_queue_depth", r + ",queue=\"wire\"", static_cast<double>(wire_q_->depth()));
  if (sink_q_) {
    metric(out, "numastream_queue_depth", r + ",queue=\"sink\"", static_cast<double>(sink_q_->depth()));
  }
  out += "# TYPE numastream_pool_buffers_in_use gauge\n";
  for (const auto& p : raw_pools_->all()) {
    metric(out, "numastream_pool_buffers_in_use", r + ",pool=\"" + label(p->name()) + "\"",
           static_cast<double>(p->in_use()));
  }
  out += "# TYPE numastream_up gauge\n";
  metric(out, "numastream_up", r, rt_.aborted() ? 0 : 1);
  return out;
}

RunResult Receiver::run(const RunHooks& hooks) {
  const int receivers = rt_.threads("receive");
  const int decompressors = rt_.threads("decompress");
  // Senders put chunks on the wire in order; what arrives out of order is what several
  // connections had in flight at once (ZeroMQ queues on both ends, socket buffers of ~8 MiB, a
  // frame being decoded) plus the decompressors finishing out of order. Hold at least that much.
  const std::size_t wire_estimate = std::max<std::size_t>(1, cfg_.chunk_bytes / 2);
  const std::size_t per_connection =
      static_cast<std::size_t>(2 * cfg_.hwm + 4) + (8u << 20) / wire_estimate;
  reorder_window_ = std::max<std::size_t>(
      static_cast<std::size_t>(cfg_.reorder_window),
      static_cast<std::size_t>(receivers) * per_connection + static_cast<std::size_t>(decompressors + cfg_.queue_depth));
  const bool has_sink = cfg_.sink.kind != SinkConfig::Kind::null;
  // The file sink holds up to window + slack chunks (slack: what the decompressors and the sink
  // queue can have when it waits for an in-flight chunk), plus the queues around it.
  const std::size_t slack = static_cast<std::size_t>(decompressors + cfg_.queue_depth);
  const std::size_t raw_shared =
      has_sink ? static_cast<std::size_t>(cfg_.queue_depth + cfg_.hwm + 2) + reorder_window_ + slack : 0;
  raw_pools_ = std::make_unique<NodePools>(rt_, "decompress", "raw", raw_shared, 1,
                                           wire::kHeaderSize + cfg_.chunk_bytes);
  // Received frames stay in the message ZeroMQ read them into (one copy fewer than reading into
  // a pool buffer); the queue bounds how many are held.
  wire_q_ = std::make_unique<BoundedQueue<zmq::Message>>(static_cast<std::size_t>(cfg_.queue_depth));
  if (has_sink) sink_q_ = std::make_unique<BoundedQueue<Buffer*>>(static_cast<std::size_t>(cfg_.queue_depth));
  if (cfg_.sink.kind == SinkConfig::Kind::file) {
    file_sink_ = std::make_unique<FileSink>(cfg_, tracker_, in_flight_, reorder_window_, slack);
  }
  ctx_ = std::make_unique<zmq::Context>(rt_.threads("io"), rt_.placement.stage_cpus("io"));
  rt_.on_abort([this] {
    stop_receiving_ = true;
    wire_q_->close();
    if (sink_q_) sink_q_->close();
    raw_pools_->close_all();
  });
  std::unique_ptr<MetricsServer> server;
  if (!cfg_.metrics_listen.empty()) {
    server = std::make_unique<MetricsServer>(cfg_.metrics_listen, [this] { return metrics_text(); },
                                             [this] { return !rt_.aborted(); });
    log_line("metrics on port " + std::to_string(server->port()));
    if (hooks.on_metrics_port) hooks.on_metrics_port(server->port());
  }
  rt_.started = Clock::now();
  receivers_left_ = receivers;
  decompressors_left_ = decompressors;
  {
    std::vector<std::jthread> threads;
    if (cfg_.relay) {
      threads.emplace_back([this] { relay_thread(); });
    } else {
      if (has_sink) threads.emplace_back([this] { sink_thread(); });
      for (int i = 0; i < decompressors; ++i) threads.emplace_back([this, i] { decompress_thread(i); });
    }
    for (int i = 0; i < receivers; ++i) threads.emplace_back([this, i] { receive_thread(i); });
    log_line(std::string(cfg_.relay ? "relaying from " : "receiving on ") + endpoint_.for_connection(0) +
             (receivers > 1 ? " .. " + endpoint_.for_connection(receivers - 1) : ""));
    // Supervise: end when every expected stream has ended, on a drain request, or on failure.
    while (!rt_.aborted() && !rt_.drain_requested()) {
      if (cfg_.streams > 0 && tracker_.complete_streams() >= cfg_.streams) break;
      if (cfg_.idle_timeout_s > 0 && tracker_.started() &&
          Clock::now() - tracker_.last_activity() >
              std::chrono::duration<double>(cfg_.idle_timeout_s)) {
        auto t = tracker_.totals();
        rt_.fail("no data for " + std::to_string(static_cast<int>(cfg_.idle_timeout_s)) +
                 " s while a stream was open (" + std::to_string(t.delivered) +
                 " chunks delivered); the sender stopped or the network failed");
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    stop_receiving_ = true;
  }
  if (file_sink_) {
    try {
      incomplete_files_ = file_sink_->finish();
    } catch (const std::exception& e) {
      rt_.fail(e.what());
    }
    for (const auto& f : incomplete_files_) {
      log_line("file sink: " + f + " is incomplete: it misses chunks or the stream did not end");
    }
  }
  ctx_.reset();

  auto t = tracker_.totals();
  const std::int64_t first = std::max<std::int64_t>(0, first_ns_.load());
  const double secs = std::max(1e-9, static_cast<double>(last_ns_.load() - first) / 1e9);
  const double raw = static_cast<double>(t.raw_bytes);
  const double wire = static_cast<double>(t.wire_bytes);
  std::uint64_t malformed = 0;
  nlohmann::json malformed_by = nlohmann::json::object();
  for (int i = 1; i < wire::kDecodeErrorCount; ++i) {
    auto n = malformed_[static_cast<std::size_t>(i)].load();
    malformed += n;
    if (n) malformed_by[std::string(wire::decode_error_name(static_cast<wire::DecodeError>(i)))] = n;
  }
  RunResult result;
  result.summary = {{"role", cfg_.relay ? "relay" : "receive"},
                    {"verified", !cfg_.relay},
                    {"endpoint", cfg_.endpoint},
                    {"connections", cfg_.connections},
                    {"chunks", t.delivered},
                    {"raw_bytes", t.raw_bytes},
                    {"wire_bytes", t.wire_bytes},
                    {"ratio", wire > 0 ? raw / wire : 0},
                    {"lost", t.lost},
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
  // A drain (SIGTERM) ends a stream on purpose: the summary says what is incomplete, the exit is
  // clean unless something arrived corrupt. Otherwise anything lost or unwritten fails the run.
  const bool drained = rt_.drain_requested();
  if (rt_.aborted()) {
    result.exit_code = kExitFailure;
  } else if (t.corrupt > 0 || (!drained && (t.lost > 0 || !incomplete_files_.empty()))) {
    result.exit_code = kExitIntegrity;
  }
  return result;
}

}  // namespace

RunResult run_receiver(const Config& cfg, std::stop_token stop, const RunHooks& hooks) {
  Receiver r(cfg, stop);
  return r.run(hooks);
}

}  // namespace numastream
