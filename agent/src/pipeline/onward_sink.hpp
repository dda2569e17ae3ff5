// The onward consumer: one of a gateway's several consumers (config `sinks`, kind "numastream")
// that carries the verified chunks on to a numastream receiver elsewhere (an HPC or analysis site:
// another gateway, or a plain `numastream-agent receive`) over an acknowledged, resumable link
// (net/link.hpp), encrypted when keyed. A chunk counts as taken by this consumer only once the far
// receiver acknowledged it (kept, or gave it up: then it is named discarded), so the gateway's own
// acknowledgement to the sender waits for the far site as for a file written here; the link keeps
// every unacknowledged frame and sends it again after the far receiver comes back. The gaps its
// senders declared (chunks a restarted detector sender lost) are declared on, so the far receiver
// names them missing as this one does. Over `connections` links (the far receiver's connections
// 0..n-1, one record of what it acknowledged), each chunk goes on the next one with room in its
// window, so a connection recovering a loss holds back only its own frames. When the input ends,
// each stream is ended on every connection with the totals its sender announced, and the consumer
// waits until the far receiver acknowledged everything.
//
// What the far receiver acknowledged is known to this process only from its own link, so a
// gateway that restarts takes it from its senders instead: a chunk they had acknowledged was
// taken by every lossless consumer, so this one had it delivered (or holds it in its spill, which
// hands it on again). The first resume frame of a stream says so, before its first chunk; a far
// receiver that restarted too then resumes its file instead of starting it again. Internal to
// the agent.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "config/config.hpp"
#include "net/link.hpp"
#include "net/transport.hpp"
#include "pipeline/chunk.hpp"
#include "pipeline/runtime.hpp"
#include "pipeline/sink.hpp"

namespace numastream {

class OnwardSink final : public Sink {
 public:
  // The end-of-stream frame for `stream` on connection `connection` of `connections`, after
  // `count` frames on it; none before its sender ended it.
  using EndFn = std::function<std::optional<zmq::Message>(std::uint32_t stream, std::uint64_t count,
                                                          std::uint16_t connection,
                                                          std::uint16_t connections)>;
  // A stream's metadata frame payload (pixel type, shape) as its sender sent it; empty: none.
  using MetaFn = std::function<std::string(std::uint32_t stream)>;
  // What this consumer has had of a stream (floor and the sequences above it), from what the
  // gateway's senders said was acknowledged; nullopt until the stream's first resume frame came.
  using HadFn = std::function<std::optional<std::pair<std::uint64_t, std::vector<std::uint64_t>>>(
      std::uint32_t stream)>;
  // `gaps`: what the senders declared gone, declared on to the far receiver as it grows.
  OnwardSink(const Config& cfg, zmq::Context& ctx, LinkOptions opts,
             std::optional<CurveSetup> curve, AckFn ack, AckFn discard, EndFn end, MetaFn meta,
             HadFn had, std::shared_ptr<GapBook> gaps, std::function<bool()> aborted)
      : cfg_(cfg),
        ctx_(ctx),
        opts_(std::move(opts)),
        curve_(std::move(curve)),
        ack_(std::move(ack)),
        discard_(std::move(discard)),
        end_(std::move(end)),
        meta_(std::move(meta)),
        had_(std::move(had)),
        gaps_(std::move(gaps)),
        aborted_(std::move(aborted)) {}

  const char* name() const override { return "numastream"; }

  void start() override {
    const int n = cfg_.sink.connections;
    const Endpoint far = parse_endpoint(cfg_.sink.endpoint, "sink.endpoint");
    for (int i = 0; i < n; ++i) {
      LinkOptions o = opts_;
      o.endpoint = far.for_connection(i);
      o.name = n == 1 ? opts_.name : opts_.name + " connection " + std::to_string(i);
      o.connection = static_cast<std::uint16_t>(i);
      o.connections = static_cast<std::uint16_t>(n);
      links_.push_back(std::make_unique<AckedLink>(
          ctx_, o, ledger_, aborted_,
          [this](const wire::Header& h, std::span<const std::uint64_t> seqs) {
            settled(h, seqs);
          }));
      links_.back()->set_gaps(gaps_);
    }
    for (auto& l : links_) l->connect();
    forwarded_.assign(links_.size(), {});
  }

  void put(Chunk c, StageStats& st) override {
    wire::Header& h = c.header;
    const std::size_t size = wire::kHeaderSize + h.payload_size;
    if (announced_.insert(h.stream_id).second) {
      if (!resume_from_upstream(h.stream_id)) return;  // the run ends
      const std::string meta = meta_(h.stream_id);
      for (auto& l : links_) {
        if (!meta.empty()) l->set_metadata(h.stream_id, meta);
        l->announce(h.stream_id);
      }
    }
    waiting_[h.stream_id].emplace(h.sequence, c.via);
    std::size_t at;
    {
      ScopedTimer wait(st.blocked_output_ns);
      at = with_room();
    }
    // The far receiver counts each connection's frames: the header names the one that carries it.
    h.connection = static_cast<std::uint16_t>(at);
    h.connections = static_cast<std::uint16_t>(links_.size());
    links_[at]->send(h.stream_id, h.sequence, c.whole());
    ++forwarded_[at][h.stream_id];
    st.chunks++;
    st.bytes_out += size;
  }

  void idle(StageStats& /*st*/) override {
    for (auto& l : links_) l->serve(0);
  }

  void drain(StageStats& st) override {
    if (links_.empty()) return;
    ScopedTimer wait(st.blocked_output_ns);
    const auto n = static_cast<std::uint16_t>(links_.size());
    for (std::uint32_t stream : announced_) {
      for (std::uint16_t i = 0; i < n; ++i) {
        const auto it = forwarded_[i].find(stream);
        const std::uint64_t count = it == forwarded_[i].end() ? 0 : it->second;
        if (auto end = end_(stream, count, i, n)) links_[i]->send_end(stream, std::move(*end));
      }
    }
    for (auto& l : links_) l->finish();
  }

  void close(bool /*aborted*/) override { links_.clear(); }

  void report(nlohmann::json& summary) const override {
    std::uint64_t forwarded = 0, retransmitted = 0;
    for (const auto& per : forwarded_) {
      for (const auto& [stream, count] : per) forwarded += count;
    }
    for (const auto& l : links_) retransmitted += l->retransmitted();
    summary["onward"] = {{"endpoint", cfg_.sink.endpoint},
                         {"connections", cfg_.sink.connections},
                         {"forwarded", forwarded},
                         {"retransmitted", retransmitted},
                         {"security", !curve_                     ? "plain"
                                      : curve_->authenticate_only ? "authenticate"
                                                                  : "curve"}};
  }

 private:
  // The next connection, from the one after the last used, with room in its window; while none
  // has, every connection's acknowledgements are read (what they settle is settled here).
  std::size_t with_room() {
    const std::size_t n = links_.size();
    for (int round = 0;; ++round) {
      for (std::size_t i = 0; i < n; ++i) {
        const std::size_t at = (next_ + i) % n;
        links_[at]->serve(0);
        if (links_[at]->has_credit()) {
          next_ = at + 1;
          return at;
        }
      }
      links_[(next_ + static_cast<std::size_t>(round)) % n]->serve(n == 1 ? 100 : 2);
    }
  }

  // Before the stream's first resume frame to the far receiver: what this consumer had of it
  // before this process (from the senders' record) counts as acknowledged there.
  bool resume_from_upstream(std::uint32_t stream) {
    for (;;) {
      if (auto had = had_(stream)) {
        ledger_->merge(stream, had->first, had->second);
        if (had->first > 0 || !had->second.empty()) {
          log_line("onward consumer: stream " + std::to_string(stream) + " resumes at the far " +
                   "receiver after " + std::to_string(had->first + had->second.size()) +
                   " chunks its senders had acknowledged");
        }
        return true;
      }
      // An earlier process's spill hands chunks on before the senders are back: wait for them.
      if (aborted_()) return false;
      for (auto& l : links_) l->serve(0);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  // The far receiver acknowledged everything of a stream below the header's sequence and `seqs`
  // (or named `seqs` discarded): those chunks are settled for this consumer.
  void settled(const wire::Header& h, std::span<const std::uint64_t> seqs) {
    auto it = waiting_.find(h.stream_id);
    if (it == waiting_.end()) return;
    auto& w = it->second;
    const bool discarded = (h.raw_size & wire::kAckDiscarded) != 0;
    for (auto low = w.begin(); low != w.end() && low->first < h.sequence;) {
      ack_(low->second, h.stream_id, low->first);
      low = w.erase(low);
    }
    for (std::uint64_t seq : seqs) {
      const auto [first, last] = w.equal_range(seq);
      for (auto at = first; at != last; ++at)
        (discarded ? discard_ : ack_)(at->second, h.stream_id, seq);
      w.erase(first, last);
    }
  }

  const Config& cfg_;
  zmq::Context& ctx_;
  LinkOptions opts_;
  std::optional<CurveSetup> curve_;  // for the summary: what the link used
  AckFn ack_, discard_;
  EndFn end_;
  MetaFn meta_;
  HadFn had_;
  std::shared_ptr<GapBook> gaps_;
  std::function<bool()> aborted_;
  std::shared_ptr<AckLedger> ledger_ = std::make_shared<AckLedger>();
  std::vector<std::unique_ptr<AckedLink>> links_;
  std::size_t next_ = 0;
  std::set<std::uint32_t> announced_;
  // Sent, not yet settled: stream -> seq -> via. A sequence may be waited for twice: a chunk
  // an earlier process spilled (via -2) and the same chunk again from its sender (it was never
  // acknowledged to it), both read out of the spill; the far receiver's acknowledgement settles
  // each (settled once, the other would be owed for ever, and the stream's end with it).
  std::map<std::uint32_t, std::multimap<std::uint64_t, int>> waiting_;
  std::vector<std::map<std::uint32_t, std::uint64_t>>
      forwarded_;  // per connection: stream -> frames sent
};

}  // namespace numastream
