#include "pipeline/relay.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>

namespace numastream {

using Clock = std::chrono::steady_clock;

namespace {

// One relay thread's state: the link downstream and, per stream, the frames held for order.
class Relay {
 public:
  Relay(const RelayWiring& w, StageStats& st)
      : w_(w),
        st_(st),
        // Downstream acknowledgements go to every upstream connection of the stream.
        link_(
            w.ctx, w.link, w.ledger, [&w] { return w.rt.aborted(); },
            [&w](const wire::Header& h, std::span<const std::uint64_t> seqs) {
              // Discarded downstream: named upstream as discarded.
              const bool discarded = (h.raw_size & wire::kAckDiscarded) != 0;
              for (auto& box : w.upstream) {
                box->post(h.stream_id, h.sequence, seqs, h.raw_size & ~wire::kAckDiscarded,
                          discarded);
              }
            }) {
    link_.set_gaps(w.gaps);
    link_.connect();
  }

  // Until the input ends (true) or the run aborts (false).
  bool run() {
    while (true) {
      link_.serve(0);
      std::optional<Inbound> in;
      bool done = false;
      {
        ScopedTimer wait(st_.blocked_input_ns);
        in = w_.input.pop_for(std::chrono::milliseconds(20), done);
      }
      if (in) {
        ScopedTimer busy(st_.busy_ns);
        take(*in);
      } else if (done) {
        return !w_.rt.aborted();
      }
    }
  }

  // Everything held goes on; each stream is ended downstream with the totals its sender
  // announced (the decompressing side acknowledges it, and that ends the upstream connections).
  void finish() {
    for (auto& [stream, o] : order_) flush(stream, o, true);
    for (const auto& [stream, count] : forwarded_) {
      if (auto end = w_.end(stream, count)) link_.send_end(stream, std::move(*end));
    }
    ScopedTimer wait(st_.blocked_output_ns);
    link_.finish();
  }

 private:
  struct Order {
    std::uint64_t next = 0;
    std::map<std::uint64_t, Inbound> pending;
  };

  void take(Inbound& in) {
    const wire::Header& h = in.header;
    switch (h.type) {
      case wire::FrameType::resume:
        link_.announce(h.stream_id);  // with what the ledger now knows; answered upstream
        // Ended downstream however little comes: a stream resumed with everything already taken
        // (its sender replaced between its last chunk and its end) forwards no chunk, and its
        // end still has to reach the decompressing side, whose acknowledgement ends the sender.
        forwarded_.try_emplace(h.stream_id, 0);
        return;
      case wire::FrameType::gap:
        return take_gaps(in);
      case wire::FrameType::metadata: {
        auto b = in.msg.bytes();
        link_.set_metadata(h.stream_id,
                           std::string(reinterpret_cast<const char*>(b.data()) + wire::kHeaderSize,
                                       h.payload_size));
        return;
      }
      default:
        return take_data(in);
    }
  }

  void take_gaps(Inbound& in) {
    const wire::Header& h = in.header;
    auto gaps = wire::decode_gaps(in.msg.bytes());
    if (!w_.gaps->add(h.stream_id, gaps)) {
      throw std::runtime_error("stream " + std::to_string(h.stream_id) + ": more than " +
                               std::to_string(wire::kMaxDeclaredGaps) + " separate gaps");
    }
    link_.serve(0);  // declared downstream before the chunks after them
    // Frames held for one the gap says will never come go on now: the gap may come after them
    // (a resumed sender's connections), and none may come before they are acknowledged.
    if (auto held = order_.find(h.stream_id); held != order_.end())
      flush(h.stream_id, held->second, false);
  }

  void take_data(Inbound& in) {
    wire::Header& h = in.header;
    if (w_.tracker.on_chunk(h.stream_id, h.sequence, true, h.raw_size) !=
        StreamTracker::Verdict::delivered) {
      // A duplicate: not forwarded; acknowledged at once if downstream has it already.
      if (w_.ledger->contains(h.stream_id, h.sequence)) {
        auto [floor, above] = w_.ledger->snapshot(h.stream_id);
        std::uint64_t seq = h.sequence;
        w_.upstream[static_cast<std::size_t>(in.via)]->post(h.stream_id, floor, {&seq, 1}, 0);
      }
      return;
    }
    h.connection = 0;
    h.connections = 1;
    wire::encode_header(h, in.msg.mutable_data());
    Order& o = order_[h.stream_id];
    if (o.pending.empty() && o.next == 0) o.next = w_.ledger->snapshot(h.stream_id).first;
    o.pending.emplace(h.sequence, std::move(in));
    flush(h.stream_id, o, false);
  }

  void forward(std::uint32_t stream, std::uint64_t seq, Inbound& in) {
    const std::size_t size = wire::kHeaderSize + in.payload().size();
    ScopedTimer wait(st_.blocked_output_ns);
    link_.wait_for_credit();
    if (in.body) {
      link_.send(stream, seq, std::move(in.msg), std::move(*in.body));  // as it came, in two parts
    } else {
      link_.send(stream, seq, std::move(in.msg));
    }
    ++forwarded_[stream];
    st_.chunks++;
    st_.bytes_out += size;
    w_.last_ns = std::max<std::int64_t>(w_.last_ns.load(), (Clock::now() - w_.rt.started).count());
  }

  // Forwards what is next in order; with `all`, everything held (gaps skipped).
  void flush(std::uint32_t stream, Order& o, bool all) {
    o.next = w_.tracker.past_gaps(stream, o.next);  // declared gone: not waited for
    while (!o.pending.empty() &&
           (all || o.pending.begin()->first <= o.next || o.pending.size() > w_.reorder_window)) {
      auto it = o.pending.begin();
      o.next = w_.tracker.past_gaps(stream, std::max(o.next, it->first + 1));
      Inbound m = std::move(it->second);
      std::uint64_t seq = it->first;
      o.pending.erase(it);
      forward(stream, seq, m);
    }
  }

  const RelayWiring& w_;
  StageStats& st_;
  AckedLink link_;
  std::map<std::uint32_t, Order> order_;
  std::map<std::uint32_t, std::uint64_t> forwarded_;
};

}  // namespace

void run_relay(const RelayWiring& w, StageThread& t) {
  Relay relay(w, t.stats);
  if (relay.run()) relay.finish();
}

}  // namespace numastream
