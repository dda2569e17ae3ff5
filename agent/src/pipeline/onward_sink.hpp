// The onward consumer: one of a gateway's several consumers (config `sinks`, kind "numastream")
// that carries the verified chunks on to a numastream receiver elsewhere (an HPC or analysis
// site: another gateway, or a plain `numastream-agent receive`) over an acknowledged, resumable
// link (net/link.hpp), encrypted when keyed. A chunk counts as taken by this consumer only once
// the far receiver acknowledged it (kept, or gave it up: then it is named discarded), so the
// gateway's own acknowledgement to the sender waits for the far site as for a file written
// here; the link keeps every unacknowledged frame and sends it again after the far receiver
// comes back. When the input ends, each stream is ended downstream with the totals its sender
// announced, and the consumer waits until the far receiver acknowledged everything. Internal
// to the agent.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "config/config.hpp"
#include "net/link.hpp"
#include "net/transport.hpp"
#include "pipeline/chunk.hpp"
#include "pipeline/runtime.hpp"
#include "pipeline/sink.hpp"

namespace numastream {

class OnwardSink final : public Sink {
 public:
  // The end-of-stream frame for `stream` after `count` frames; none before its sender ended it.
  using EndFn = std::function<std::optional<zmq::Message>(std::uint32_t stream, std::uint64_t count)>;
  // A stream's metadata frame payload (pixel type, shape) as its sender sent it; empty: none.
  using MetaFn = std::function<std::string(std::uint32_t stream)>;
  OnwardSink(const Config& cfg, zmq::Context& ctx, LinkOptions opts, std::optional<CurveSetup> curve, AckFn ack,
             AckFn discard, EndFn end, MetaFn meta, std::function<bool()> aborted)
      : cfg_(cfg), ctx_(ctx), opts_(std::move(opts)), curve_(std::move(curve)), ack_(std::move(ack)),
        discard_(std::move(discard)), end_(std::move(end)), meta_(std::move(meta)), aborted_(std::move(aborted)) {}

  const char* name() const override { return "numastream"; }

  void start() override {
    link_ = std::make_unique<AckedLink>(ctx_, opts_, ledger_, aborted_,
                                        [this](const wire::Header& h, std::span<const std::uint64_t> seqs) { settled(h, seqs); });
    link_->connect();
  }

  void put(Chunk c, StageStats& st) override {
    const wire::Header h = c.header;
    const std::size_t size = wire::kHeaderSize + h.payload_size;
    if (announced_.insert(h.stream_id).second) {
      if (std::string meta = meta_(h.stream_id); !meta.empty()) link_->set_metadata(h.stream_id, std::move(meta));
      link_->announce(h.stream_id);
    }
    waiting_[h.stream_id][h.sequence] = c.via;
    link_->serve(0);  // what the far receiver acknowledged so far: settled here, known to a resume
    {
      ScopedTimer wait(st.blocked_output_ns);
      link_->wait_for_credit();
      link_->send(h.stream_id, h.sequence, c.whole());
    }
    ++forwarded_[h.stream_id];
    st.chunks++;
    st.bytes_out += size;
  }

  void idle(StageStats& /*st*/) override {
    if (link_) link_->serve(0);
  }

  void drain(StageStats& st) override {
    if (!link_) return;
    ScopedTimer wait(st.blocked_output_ns);
    for (const auto& [stream, count] : forwarded_) {
      if (auto end = end_(stream, count)) link_->send_end(stream, std::move(*end));
    }
    link_->finish();
  }

  void close(bool /*aborted*/) override { link_.reset(); }

  void report(nlohmann::json& summary) const override {
    std::uint64_t forwarded = 0;
    for (const auto& [stream, n] : forwarded_) forwarded += n;
    summary["onward"] = {{"endpoint", cfg_.sink.endpoint},
                         {"forwarded", forwarded},
                         {"security", !curve_ ? "plain" : curve_->authenticate_only ? "authenticate" : "curve"}};
  }

 private:
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
      auto at = w.find(seq);
      if (at == w.end()) continue;
      (discarded ? discard_ : ack_)(at->second, h.stream_id, seq);
      w.erase(at);
    }
  }

  const Config& cfg_;
  zmq::Context& ctx_;
  LinkOptions opts_;
  std::optional<CurveSetup> curve_;  // for the summary: what the link used
  AckFn ack_, discard_;
  EndFn end_;
  MetaFn meta_;
  std::function<bool()> aborted_;
  std::shared_ptr<AckLedger> ledger_ = std::make_shared<AckLedger>();
  std::unique_ptr<AckedLink> link_;
  std::set<std::uint32_t> announced_;
  std::map<std::uint32_t, std::map<std::uint64_t, int>> waiting_;  // sent, not yet settled: stream -> seq -> via
  std::map<std::uint32_t, std::uint64_t> forwarded_;
};

}  // namespace numastream
