// The stream2 sink: the gateway plays the detector for consumers written for it (the DECTRIS
// example client, a filewriter). It binds a PUSH socket, as a DECTRIS detector does, and
// re-emits the Stream V2 messages its stream carries byte for byte, in the order the detector
// sent them (start, images, end), whatever order the decompressing threads finish in. Stream V2
// has no acknowledgements: a message counts as taken (and is acknowledged to the sender) once the
// PUSH socket accepted it; with no consumer connected, it waits.
//
// A consumer that goes away (killed, restarted) loses what ZeroMQ had queued towards it and what it
// had read but not processed, and Stream V2 gives no way to know how much that was. The sink keeps
// copies of the last `sink.redeliver` messages it handed over (and of the open series' start
// message); when a consumer disconnects, the next message any consumer gets is that start message,
// then those copies, then what comes next. A consumer restarted mid-series thus learns the series
// again and gets again what its predecessor may not have processed; it may see an image twice
// (same series_unique_id and image_id) and can drop it. Internal to the agent.
#pragma once

#include <zmq.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>

#include "config/config.hpp"
#include "data/seqset.hpp"
#include "detector/stream2.hpp"
#include "net/transport.hpp"
#include "pipeline/chunk.hpp"
#include "pipeline/sink.hpp"
#include "wire/tracker.hpp"

namespace numastream {

class Stream2Sink final : public Sink {
 public:
  // `floor(stream)`: the chunks below it an earlier gateway already emitted (a resumed stream).
  using FloorFn = std::function<std::uint64_t(std::uint32_t stream)>;
  Stream2Sink(const Config& cfg, zmq::Context& ctx, StreamTracker& tracker, std::size_t window,
              AckFn ack, AckFn discard, FloorFn floor, std::function<bool()> aborted)
      : cfg_(cfg),
        ctx_(ctx),
        tracker_(tracker),
        window_(window),
        ack_(std::move(ack)),
        discard_(std::move(discard)),
        floor_(std::move(floor)),
        aborted_(std::move(aborted)) {}

  const char* name() const override { return "stream2"; }

  void start() override {
    sock_.emplace(ctx_, ZMQ_PUSH);
    sock_->set_int(ZMQ_SNDHWM, cfg_.hwm);
    sock_->set_int(ZMQ_LINGER, static_cast<int>(cfg_.connect_timeout_s * 1000));
    mon_.emplace(ctx_, *sock_, "stream2-sink");
    // Only the consumers the configuration names (the receiver's ZAP handler admits them).
    if (!cfg_.sink.allow_from.empty())
      zmq::consumer_checked_server(*sock_, zmq::consumers_domain(cfg_.sink.endpoint));
    sock_->bind(cfg_.sink.endpoint);
  }

  void put(Chunk c, StageStats& st) override {
    const std::uint32_t stream = c.header.stream_id;
    const std::uint64_t seq = c.header.sequence;
    if (!stream_) {
      stream_ = stream;
      next_ = floor_(stream);
      emitted_.merge(next_, {});
    } else if (*stream_ != stream) {
      throw std::runtime_error(
          "stream2 sink: a second stream (id " + std::to_string(stream) +
          ") arrived; a stream2 sink re-emits the series of one detector (stream " +
          std::to_string(*stream_) + ")");
    }
    if (seq < next_ || pending_.count(seq)) {
      // Emitted already (a retransmission), or passed over as missing (reported lost).
      if (seq < next_ && !emitted_.contains(seq)) {
        tracker_.on_unwritten(stream, seq);
        discard_(c.via, stream, seq);
      } else {
        ack_(c.via, stream, seq);
      }
      return;
    }
    pending_.emplace(seq, std::move(c));
    flush(st, false);
    while (pending_.size() > window_) {
      log_warn("stream2 sink: stream " + std::to_string(stream) + ": message " +
               std::to_string(next_) + " still missing with " + std::to_string(pending_.size()) +
               " later messages waiting; emitting on without it");
      next_ = pending_.begin()->first;
      flush(st, false);
    }
  }

  void drain(StageStats& st) override { flush(st, true); }

  void close(bool aborted) override {
    if (sock_ && aborted) sock_->set_int(ZMQ_LINGER, 0);
    pending_.clear();
    mon_.reset();
    sock_.reset();
  }

  void report(nlohmann::json& summary) const override {
    summary["stream2_sink"] = {{"consumers_gone", consumers_gone_},
                               {"redelivered", redelivered_},
                               {"redeliver", cfg_.sink.redeliver}};
    outcomes_.report(summary);
  }
  void declare_metrics(MetricRegistry& m) const override { outcomes_.declare_metrics(m); }

 private:
  // Emits what is next in order; with `all`, everything held (gaps skipped).
  void flush(StageStats& st, bool all) {
    while (!pending_.empty() && (all || pending_.begin()->first == next_)) {
      auto it = pending_.begin();
      Chunk c = std::move(it->second);
      next_ = it->first + 1;
      pending_.erase(it);
      if (!emit(c, st)) return;
    }
  }

  // The detector's message (the chunk's payload, without numastream's header), zero-copy.
  bool emit(Chunk& c, StageStats& st) {
    const wire::Header h = c.header;
    const std::span<const std::byte> bytes = c.payload();
    std::string error;
    const auto m = stream2::parse(bytes, error);  // the sender parsed it: it parses
    if (m && m->type == stream2::Type::end && !m->incomplete.empty()) {
      outcomes_.add(m->series_id, m->series_unique_id, m->incomplete);
      log_warn("stream2 sink: series " + std::to_string(m->series_id) +
               " is INCOMPLETE: " + m->incomplete);
    } else if (m && m->type == stream2::Type::end) {
      outcomes_.completed();
    }
    // What is kept for a consumer that goes away: the message it came in, shared (ZeroMQ counts
    // references); a pooled buffer is copied instead, for the pool must not run dry.
    std::optional<zmq::Message> kept;
    if (cfg_.sink.redeliver > 0 && !c.body) kept = zmq::Message::of(bytes);
    const bool shared = c.body.has_value();
    zmq::Message msg = c.take_payload();
    if (cfg_.sink.redeliver > 0 && shared) kept = msg.share();
    {
      ScopedTimer wait(st.blocked_output_ns);
      if (!send(msg)) return false;
    }
    emitted_.insert(h.sequence);
    ack_(c.via, h.stream_id, h.sequence);
    st.chunks++;
    st.bytes_out += h.payload_size;
    if (kept) keep(std::move(*kept), m ? std::optional(m->type) : std::nullopt);
    return true;
  }

  // What was handed over, for a consumer that goes away; a start message stays as long as its
  // series.
  void keep(zmq::Message kept, std::optional<stream2::Type> type) {
    if (type == stream2::Type::start) {
      series_start_ = kept.share();
      recent_.clear();  // what came before belongs to an earlier series
    } else if (type == stream2::Type::end) {
      series_start_.reset();
    }
    recent_.push_back({type == stream2::Type::start, std::move(kept)});
    while (recent_.size() > static_cast<std::size_t>(cfg_.sink.redeliver)) recent_.pop_front();
  }

  // Sends `m` (empty once sent), waiting for a consumer; first, when a consumer went away, what
  // was kept for it.
  bool send(zmq::Message& m) {
    auto* msg = static_cast<zmq_msg_t*>(m.raw());
    while (true) {
      if (aborted_()) return false;
      zmq_pollitem_t items[2] = {{sock_->get(), 0, ZMQ_POLLOUT, 0},
                                 {mon_->get(), 0, ZMQ_POLLIN, 0}};
      if (zmq_poll(items, 2, 200) < 0 && zmq_errno() != EINTR) {
        throw std::runtime_error("stream2 sink: poll: " + zmq::last_error());
      }
      if (items[1].revents & ZMQ_POLLIN) watch();
      if (!(items[0].revents & ZMQ_POLLOUT)) continue;  // no consumer yet, or it is behind
      if (redeliver_) {
        redeliver_ = false;
        if (!redeliver()) return false;
        continue;
      }
      if (zmq_msg_send(msg, sock_->get(), ZMQ_DONTWAIT) >= 0) return true;
      if (zmq_errno() != EAGAIN && zmq_errno() != EINTR) {
        throw std::runtime_error("stream2 sink: send on " + cfg_.sink.endpoint + ": " +
                                 zmq::last_error());
      }
    }
  }

  // A consumer that went away: what it may not have processed goes to the next one. A connection
  // the sink refused (a consumer allow_from does not name) never took anything: not one.
  void watch() {
    const int before = mon_->departures();
    mon_->drain();
    if (mon_->departures() == before || cfg_.sink.redeliver == 0) return;
    consumers_gone_ += static_cast<std::uint64_t>(mon_->departures() - before);
    redeliver_ = !recent_.empty();
    log_warn("stream2 sink: a consumer went away; what it may not have processed (the last " +
             std::to_string(recent_.size()) + " messages handed over" +
             (!series_start_ ? "" : ", after the series' start message") +
             ") goes to the next consumer");
  }

  bool redeliver() {
    // The series' start first, unless it is the first of the recent ones anyway.
    const bool start_kept = series_start_ && (recent_.empty() || !recent_.front().first);
    std::vector<zmq::Message*> out;
    if (start_kept) out.push_back(&*series_start_);
    for (auto& [is_start, m] : recent_) out.push_back(&m);
    for (auto* m : out) {
      zmq::Message again = m->share();
      if (!send(again)) return false;
      ++redelivered_;
    }
    return true;
  }

  const Config& cfg_;
  zmq::Context& ctx_;
  StreamTracker& tracker_;
  std::size_t window_;
  AckFn ack_;
  AckFn discard_;  // settled without being emitted: the sender declares it gone to later gateways
  FloorFn floor_;
  std::function<bool()> aborted_;
  std::optional<zmq::Socket> sock_;
  std::optional<zmq::Monitor> mon_;                   // declared after sock_: closed before it
  std::deque<std::pair<bool, zmq::Message>> recent_;  // (a start message?, the message)
  std::optional<zmq::Message> series_start_;
  bool redeliver_ = false;
  std::uint64_t consumers_gone_ = 0, redelivered_ = 0;
  SeriesOutcomes outcomes_;
  std::optional<std::uint32_t> stream_;
  std::uint64_t next_ = 0;
  std::map<std::uint64_t, Chunk> pending_;
  SeqSet emitted_;
};

}  // namespace numastream
