// The zmq sink hands raw chunks to an external consumer (an analysis application's PULL socket),
// zero-copy. ZeroMQ does not confirm that the consumer read them: a chunk counts as taken (and is
// acknowledged to the sender) once the sink socket accepted it. When the input ends, each
// forwarded stream is ended downstream, once, with the totals its sender announced. Internal to
// the agent.
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

namespace numastream {

class ZmqSink final : public Sink {
 public:
  // The end-of-stream frame for `stream` after `count` frames; none before its sender ended it.
  using EndFn =
      std::function<std::optional<zmq::Message>(std::uint32_t stream, std::uint64_t count)>;
  ZmqSink(const Config& cfg, zmq::Context& ctx, AckFn ack, EndFn end, std::function<bool()> aborted)
      : cfg_(cfg),
        ctx_(ctx),
        ack_(std::move(ack)),
        end_(std::move(end)),
        aborted_(std::move(aborted)) {}

  const char* name() const override { return "zmq"; }

  // The socket is made by the sink thread, which alone uses it.
  void start() override {
    sock_.emplace(ctx_, ZMQ_PUSH);
    sock_->set_int(ZMQ_SNDHWM, cfg_.hwm);
    sock_->set_int(ZMQ_IMMEDIATE, 1);
    sock_->set_int(ZMQ_LINGER, static_cast<int>(cfg_.connect_timeout_s * 1000));
    mon_.emplace(ctx_, *sock_, "sink");
    sock_->connect(cfg_.sink.endpoint);
  }

  void put(Chunk c, StageStats& st) override {
    const wire::Header h = c.header;
    const std::size_t size = wire::kHeaderSize + h.payload_size;
    zmq::Message msg = c.whole();  // one frame, as the consumer reads it
    {
      ScopedTimer wait(st.blocked_output_ns);
      if (!check(zmq::send_watched(*sock_, *mon_, msg.raw(), aborted_))) return;
    }
    ack_(c.via, h.stream_id, h.sequence);
    ++forwarded_[h.stream_id];
    st.chunks++;
    st.bytes_out += size;
  }

  void drain(StageStats& st) override {
    if (!sock_) return;
    ScopedTimer wait(st.blocked_output_ns);
    for (const auto& [stream, count] : forwarded_) {
      auto end = end_(stream, count);
      if (end && !check(zmq::send_watched(*sock_, *mon_, end->raw(), aborted_))) return;
    }
  }

  void close(bool aborted) override {
    if (sock_ && aborted) sock_->set_int(ZMQ_LINGER, 0);
    mon_.reset();
    sock_.reset();
  }

 private:
  // True when sent; throws when the consumer is gone or the send failed; false on abort.
  bool check(zmq::SendOutcome o) {
    if (o == zmq::SendOutcome::peer_lost) {
      throw std::runtime_error("sink: the downstream consumer at " + cfg_.sink.endpoint +
                               " went away");
    }
    if (o == zmq::SendOutcome::failed) {
      throw std::runtime_error("sink: send to " + cfg_.sink.endpoint +
                               " failed: " + zmq::last_error());
    }
    return o == zmq::SendOutcome::sent;
  }

  const Config& cfg_;
  zmq::Context& ctx_;
  AckFn ack_;
  EndFn end_;
  std::function<bool()> aborted_;
  std::optional<zmq::Socket> sock_;
  std::optional<zmq::Monitor> mon_;  // declared after sock_: closed before it
  std::map<std::uint32_t, std::uint64_t> forwarded_;
};

}  // namespace numastream
