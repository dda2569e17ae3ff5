// The stream2 sink: the gateway plays the detector for consumers written for it (the DECTRIS
// example client, a filewriter). It binds a PUSH socket, as a DECTRIS detector does, and
// re-emits the Stream V2 messages its stream carries byte for byte, in the order the detector
// sent them (start, images, end), whatever order the decompressing threads finish in. Stream V2
// has no acknowledgements: a message counts as taken (and is acknowledged to the sender) once the
// PUSH socket accepted it; with no consumer connected, it waits. Internal to the agent.
#pragma once

#include <zmq.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>

#include "config/config.hpp"
#include "net/transport.hpp"
#include "pipeline/chunk.hpp"
#include "pipeline/sink.hpp"
#include "data/seqset.hpp"
#include "wire/tracker.hpp"

namespace numastream {

class Stream2Sink final : public Sink {
 public:
  // `floor(stream)`: the chunks below it an earlier gateway already emitted (a resumed stream).
  using FloorFn = std::function<std::uint64_t(std::uint32_t stream)>;
  Stream2Sink(const Config& cfg, zmq::Context& ctx, StreamTracker& tracker, std::size_t window, AckFn ack,
              FloorFn floor, std::function<bool()> aborted)
      : cfg_(cfg), ctx_(ctx), tracker_(tracker), window_(window), ack_(std::move(ack)), floor_(std::move(floor)),
        aborted_(std::move(aborted)) {}

  const char* name() const override { return "stream2"; }

  void start() override {
    sock_.emplace(ctx_, ZMQ_PUSH);
    sock_->set_int(ZMQ_SNDHWM, cfg_.hwm);
    sock_->set_int(ZMQ_LINGER, static_cast<int>(cfg_.connect_timeout_s * 1000));
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
      throw std::runtime_error("stream2 sink: a second stream (id " + std::to_string(stream) +
                               ") arrived; a stream2 sink re-emits the series of one detector (stream " +
                               std::to_string(*stream_) + ")");
    }
    if (seq < next_ || pending_.count(seq)) {
      // Emitted already (a retransmission), or passed over as missing (reported lost).
      if (seq < next_ && !emitted_.contains(seq)) tracker_.on_unwritten(stream, seq);
      ack_(c.via, stream, seq);
      return;
    }
    pending_.emplace(seq, std::move(c));
    flush(st, false);
    while (pending_.size() > window_) {
      log_line("stream2 sink: stream " + std::to_string(stream) + ": message " + std::to_string(next_) +
               " still missing with " + std::to_string(pending_.size()) + " later messages waiting; emitting on without it");
      next_ = pending_.begin()->first;
      flush(st, false);
    }
  }

  void drain(StageStats& st) override { flush(st, true); }

  void close(bool aborted) override {
    if (sock_ && aborted) sock_->set_int(ZMQ_LINGER, 0);
    pending_.clear();
    sock_.reset();
  }

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
    const std::size_t size = h.payload_size;
    Buffer* buf = c.buffer.release();  // ZeroMQ returns it to its pool once sent
    zmq_msg_t msg;
    zmq_msg_init_data(&msg, buf->data + wire::kHeaderSize, size, return_to_pool, buf);
    ScopedTimer wait(st.blocked_output_ns);
    while (true) {
      if (aborted_()) {
        zmq_msg_close(&msg);
        return false;
      }
      zmq_pollitem_t item{sock_->get(), 0, ZMQ_POLLOUT, 0};
      if (zmq_poll(&item, 1, 200) < 0 && zmq_errno() != EINTR) {
        zmq_msg_close(&msg);
        throw std::runtime_error("stream2 sink: poll: " + zmq::last_error());
      }
      if (!(item.revents & ZMQ_POLLOUT)) continue;  // no consumer yet, or it is behind
      if (zmq_msg_send(&msg, sock_->get(), ZMQ_DONTWAIT) >= 0) break;
      if (zmq_errno() != EAGAIN && zmq_errno() != EINTR) {
        zmq_msg_close(&msg);
        throw std::runtime_error("stream2 sink: send on " + cfg_.sink.endpoint + ": " + zmq::last_error());
      }
    }
    emitted_.insert(h.sequence);
    ack_(c.via, h.stream_id, h.sequence);
    st.chunks++;
    st.bytes_out += size;
    return true;
  }

  const Config& cfg_;
  zmq::Context& ctx_;
  StreamTracker& tracker_;
  std::size_t window_;
  AckFn ack_;
  FloorFn floor_;
  std::function<bool()> aborted_;
  std::optional<zmq::Socket> sock_;
  std::optional<std::uint32_t> stream_;
  std::uint64_t next_ = 0;
  std::map<std::uint64_t, Chunk> pending_;
  SeqSet emitted_;
};

}  // namespace numastream
