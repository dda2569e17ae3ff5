#include "pipeline/relay.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>

namespace numastream {

using Clock = std::chrono::steady_clock;

void run_relay(const RelayWiring& w, StageThread& t) {
  StageStats& st = t.stats;
  struct Order {
    std::uint64_t next = 0;
    std::map<std::uint64_t, Inbound> pending;
  };
  std::map<std::uint32_t, Order> order;
  std::map<std::uint32_t, std::uint64_t> forwarded;
  // Downstream acknowledgements go to every upstream connection of the stream.
  AckedLink link(
      w.ctx, w.link, w.ledger, [&w] { return w.rt.aborted(); },
      [&w](const wire::Header& h, std::span<const std::uint64_t> seqs) {
        // Discarded downstream: named upstream as discarded.
        const bool discarded = (h.raw_size & wire::kAckDiscarded) != 0;
        for (auto& box : w.upstream) {
          box->post(h.stream_id, h.sequence, seqs, h.raw_size & ~wire::kAckDiscarded, discarded);
        }
      });
  link.set_gaps(w.gaps);
  link.connect();
  auto forward = [&](std::uint32_t stream, std::uint64_t seq, Inbound& in) {
    const std::size_t size = wire::kHeaderSize + in.payload().size();
    ScopedTimer wait(st.blocked_output_ns);
    link.wait_for_credit();
    if (in.body) {
      link.send(stream, seq, std::move(in.msg), std::move(*in.body));  // as it came, in two parts
    } else {
      link.send(stream, seq, std::move(in.msg));
    }
    ++forwarded[stream];
    st.chunks++;
    st.bytes_out += size;
    w.last_ns = std::max<std::int64_t>(w.last_ns.load(), (Clock::now() - w.rt.started).count());
  };
  // Forwards what is next in order; with `all`, everything held (gaps skipped).
  auto flush = [&](std::uint32_t stream, Order& o, bool all) {
    o.next = w.tracker.past_gaps(stream, o.next);  // declared gone: not waited for
    while (!o.pending.empty() &&
           (all || o.pending.begin()->first <= o.next || o.pending.size() > w.reorder_window)) {
      auto it = o.pending.begin();
      o.next = w.tracker.past_gaps(stream, std::max(o.next, it->first + 1));
      Inbound m = std::move(it->second);
      std::uint64_t seq = it->first;
      o.pending.erase(it);
      forward(stream, seq, m);
    }
  };
  while (true) {
    link.serve(0);
    std::optional<Inbound> in;
    bool done = false;
    {
      ScopedTimer wait(st.blocked_input_ns);
      in = w.input.pop_for(std::chrono::milliseconds(20), done);
    }
    if (!in) {
      if (done) break;
      continue;
    }
    wire::Header& h = in->header;
    ScopedTimer busy(st.busy_ns);
    if (h.type == wire::FrameType::resume) {
      link.announce(h.stream_id);  // with what the ledger now knows; answered upstream
      // Ended downstream however little comes: a stream resumed with everything already taken
      // (its sender replaced between its last chunk and its end) forwards no chunk, and its end
      // still has to reach the decompressing side, whose acknowledgement ends the sender.
      forwarded.try_emplace(h.stream_id, 0);
      continue;
    }
    if (h.type == wire::FrameType::gap) {
      auto gaps = wire::decode_gaps(in->msg.bytes());
      if (!w.gaps->add(h.stream_id, gaps)) {
        throw std::runtime_error("stream " + std::to_string(h.stream_id) + ": more than " +
                                 std::to_string(wire::kMaxDeclaredGaps) + " separate gaps");
      }
      link.serve(0);  // declared downstream before the chunks after them
      // Frames held for one the gap says will never come go on now: the gap may come after
      // them (a resumed sender's connections), and none may come before they are acknowledged.
      if (auto held = order.find(h.stream_id); held != order.end())
        flush(h.stream_id, held->second, false);
      continue;
    }
    if (h.type == wire::FrameType::metadata) {
      auto b = in->msg.bytes();
      link.set_metadata(
          h.stream_id,
          std::string(reinterpret_cast<const char*>(b.data()) + wire::kHeaderSize, h.payload_size));
      continue;
    }
    if (w.tracker.on_chunk(h.stream_id, h.sequence, true, h.raw_size) !=
        StreamTracker::Verdict::delivered) {
      // A duplicate: not forwarded; acknowledged at once if downstream has it already.
      if (w.ledger->contains(h.stream_id, h.sequence)) {
        auto [floor, above] = w.ledger->snapshot(h.stream_id);
        std::uint64_t seq = h.sequence;
        w.upstream[static_cast<std::size_t>(in->via)]->post(h.stream_id, floor, {&seq, 1}, 0);
      }
      continue;
    }
    h.connection = 0;
    h.connections = 1;
    wire::encode_header(h, in->msg.mutable_data());
    Order& o = order[h.stream_id];
    if (o.pending.empty() && o.next == 0) o.next = w.ledger->snapshot(h.stream_id).first;
    o.pending.emplace(h.sequence, std::move(*in));
    flush(h.stream_id, o, false);
  }
  if (w.rt.aborted()) return;
  for (auto& [stream, o] : order) flush(stream, o, true);
  // End each stream downstream with the totals its sender announced; the decompressing side
  // acknowledges it, and that acknowledgement ends the upstream connections.
  for (const auto& [stream, count] : forwarded) {
    if (auto end = w.end(stream, count)) link.send_end(stream, std::move(*end));
  }
  ScopedTimer wait(st.blocked_output_ns);
  link.finish();
}

}  // namespace numastream
