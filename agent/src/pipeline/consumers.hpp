// A gateway's consumers (config `sinks`; `sink` alone is one): each verified chunk handed to
// every one of them, each run by a thread of its own from its own queue (or its spill), each
// with its guarantee. A chunk goes upstream as acknowledged once every lossless consumer has
// settled it (fanout.hpp, AckJoin); a latest-only one never holds anyone back. Internal to the
// agent.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "data/queue.hpp"
#include "net/link.hpp"
#include "net/transport.hpp"
#include "obs/registry.hpp"
#include "pipeline/chunk.hpp"
#include "pipeline/consumer_spill.hpp"
#include "pipeline/fanout.hpp"
#include "pipeline/runtime.hpp"
#include "pipeline/sink.hpp"
#include "wire/tracker.hpp"

namespace numastream {

// What the consumers share with the rest of the gateway.
struct ConsumerWiring {
  const Config& cfg;
  StreamTracker& tracker;
  // The senders' record: what every lossless consumer settled, merged with what the senders
  // said was acknowledged before (their resume frames).
  AckLedger& ledger;
  zmq::Context& ctx;
  std::size_t reorder_window;  // a file sink's: chunks it holds out of order
  std::size_t slack;           // buffers beyond the window a file sink may hold
  int onward_window;           // an onward link's window
  AckFn ack, discard;          // upstream, once every lossless consumer settled a chunk
  std::function<bool()> aborted, drain_requested;
  std::function<std::string(std::uint32_t stream)> metadata;  // as its sender sent it
  // A stream's end frame for the next hop (`count` frames on its connection of `connections`).
  std::function<std::optional<zmq::Message>(std::uint32_t stream, std::uint64_t count,
                                            std::uint16_t connection, std::uint16_t connections)>
      downstream_end;
};

class ConsumerSet {
 public:
  // Makes every consumer the configuration names; throws ConfigError naming a bad one.
  explicit ConsumerSet(ConsumerWiring w);
  ~ConsumerSet();
  ConsumerSet(const ConsumerSet&) = delete;
  ConsumerSet& operator=(const ConsumerSet&) = delete;

  std::size_t size() const noexcept { return consumers_.size(); }
  bool empty() const noexcept { return consumers_.empty(); }
  // The senders' gaps in `stream` that this gateway never had (`missing`), for the onward hops to
  // declare on; none without one. Throws past wire::kMaxDeclaredGaps separate gaps.
  void declare_onward(std::uint32_t stream, const std::vector<wire::Gap>& missing);
  // Which form of a chunk compressed with `codec` the consumers take: {as it came, decoded}.
  std::pair<bool, bool> forms(Codec codec) const;
  // A file sink waits for chunks on their way to it (queued for, or in, a decompressor).
  bool tracks_in_flight() const noexcept { return track_in_flight_; }
  void in_flight(bool add, std::uint32_t stream, std::uint64_t seq);
  // A consumer's spill still owes its sink chunks of `stream`.
  bool spills_owe(std::uint32_t stream);
  // Chunks waiting in the one consumer's queue (none: several consumers, or none).
  std::optional<std::size_t> depth_of_one() const;
  // "consumer i (kind): ", or nothing with one consumer: for its thread's log lines.
  std::string what(int index) const;

  // Hands a verified chunk to every consumer (decompressing threads). False once the input ends.
  // `as_came`: the chunk compressed as it came, for the consumers that take it so (with others
  // that take `out` decoded); none when every consumer takes `out`.
  bool deliver(Chunk& out, std::optional<Chunk>& as_came, StageStats& st);
  // The body of consumer `index`'s thread: its sink takes its chunks until its input ends.
  void run(int index, StageStats& st);
  // Closes every queue: the consumers end once they have taken what is queued.
  void close();
  // Each sink finishes (renames, flushes); the files left incomplete. `fail` gets what threw.
  std::vector<std::string> finish(const std::function<void(const std::string&)>& fail);

  void declare_metrics(MetricRegistry& m);
  // The first sink's figures into the summary `out`, and each consumer's with several.
  void report(nlohmann::json& out) const;

 private:
  struct Consumer;
  void make(const ConsumerConfig& want);
  void add_spill(Consumer& k, const ConsumerConfig& want, AckFn& k_ack, AckFn& k_discard);
  std::unique_ptr<Sink> onward_sink(Consumer& k, const ConsumerConfig& want, const AckFn& k_ack,
                                    const AckFn& k_discard, const std::function<bool()>& aborted);
  // Each consumer's figures (metrics, summary) are reported with several, or one with a spill.
  bool per_consumer_figures() const;
  nlohmann::json each_json() const;

  ConsumerWiring w_;
  std::vector<std::unique_ptr<Consumer>> consumers_;
  std::unique_ptr<AckJoin> join_;         // the lossless consumers' acknowledgements
  int joined_ = 0;                        // lossless consumers made so far
  std::atomic<int> lossless_running_{0};  // lossless consumers' threads not yet ended
  bool track_in_flight_ = false;
  // The senders' gaps, declared on by the onward hops (none without one).
  std::shared_ptr<GapBook> onward_gaps_ = std::make_shared<GapBook>();
  bool onward_ = false;
};

}  // namespace numastream
