#include "pipeline/consumers.hpp"

#include <algorithm>
#include <exception>
#include <limits>
#include <tuple>
#include <utility>

#include "obs/metric_catalog.hpp"
#include "pipeline/hdf5_sink.hpp"
#include "pipeline/onward_sink.hpp"
#include "pipeline/stream2_sink.hpp"
#include "pipeline/zmq_sink.hpp"

namespace numastream {

namespace {

// A consumer named by what it writes to, as its spill keeps it: "file /data/x.raw",
// "numastream tcp://hpc:6000".
std::string consumer_identity(const SinkConfig& s) {
  switch (s.kind) {
    case SinkConfig::Kind::file:
      return "file " + s.path;
    case SinkConfig::Kind::hdf5:
      return "hdf5 " + s.path;
    case SinkConfig::Kind::zmq:
      return "zmq " + s.endpoint;
    case SinkConfig::Kind::stream2:
      return "stream2 " + s.endpoint;
    case SinkConfig::Kind::numastream:
      return "numastream " + s.endpoint;
    case SinkConfig::Kind::null:
      break;
  }
  return "null";
}

// Whether a consumer takes a chunk compressed with `codec` as it came rather than decoded: an
// onward hop does, whatever the codec (the far receiver decodes and verifies it again, and the
// path to it carries the compressed bytes, a ratio fewer than decoded ones); the HDF5 sink does
// bslz4 (it stores it so, HDF5 filter 32008). The gateway verifies every chunk either way.
bool takes_as_arrived(const SinkConfig& sink, Codec codec) {
  if (codec == Codec::none) return false;
  return sink.kind == SinkConfig::Kind::numastream ||
         (sink.kind == SinkConfig::Kind::hdf5 && codec == Codec::bslz4);
}

// The consumers the configuration names: `sinks`, or the one `sink` (a decoding receiver's: a
// relay has none, its role forwards to its sink).
std::vector<ConsumerConfig> wanted(const Config& cfg) {
  std::vector<ConsumerConfig> out = cfg.consumers;
  if (out.empty() && cfg.sink.kind != SinkConfig::Kind::null) out.push_back({cfg.sink, {}, {}});
  return out;
}

}  // namespace

// One consumer of the verified chunks: its sink, run by a thread of its own from its own queue,
// with its own copy of the configuration (its sink), and what it did. A file sink's chunks on
// their way to it are `in_flight` (it waits for those).
struct ConsumerSet::Consumer {
  Config cfg;
  ConsumerConfig::Guarantee guarantee = ConsumerConfig::Guarantee::lossless;
  std::unique_ptr<Sink> sink;
  std::unique_ptr<BoundedQueue<Chunk>> q;
  std::unique_ptr<InFlight> in_flight;
  std::atomic<std::uint64_t> taken{0};        // handed to its sink
  std::atomic<std::uint64_t> passed_over{0};  // latest-only: no room in its queue
  std::string failed;                         // latest-only: why it stopped taking (its thread's)
  // A lossless consumer's spill (sinks[].spill): its chunks go there and its queue is not used.
  std::unique_ptr<ConsumerSpill> spill;
  bool lossless() const noexcept { return guarantee == ConsumerConfig::Guarantee::lossless; }
};

ConsumerSet::ConsumerSet(ConsumerWiring w) : w_(std::move(w)) {
  const std::vector<ConsumerConfig> all = wanted(w_.cfg);
  const int lossless =
      static_cast<int>(std::count_if(all.begin(), all.end(), [](const ConsumerConfig& k) {
        return k.guarantee == ConsumerConfig::Guarantee::lossless;
      }));
  if (lossless > 0) {
    join_ = std::make_unique<AckJoin>(lossless, w_.ack, w_.discard,
                                      [this](std::uint32_t stream, std::uint64_t seq) {
                                        return w_.ledger.contains(stream, seq);
                                      });
  }
  for (const ConsumerConfig& want : all) make(want);
  lossless_running_ = lossless;
}

ConsumerSet::~ConsumerSet() = default;

void ConsumerSet::make(const ConsumerConfig& want) {
  auto k = std::make_unique<Consumer>();
  k->cfg = w_.cfg;
  k->cfg.sink = want.sink;
  k->guarantee = want.guarantee;
  k->q = std::make_unique<BoundedQueue<Chunk>>(static_cast<std::size_t>(w_.cfg.queue_depth));
  AckFn k_ack = [](int, std::uint32_t, std::uint64_t) {},
        k_discard = k_ack;  // latest-only: not waited for
  if (k->lossless()) std::tie(k_ack, k_discard) = join_->of(joined_++);
  if (want.spill.enabled()) add_spill(*k, want, k_ack, k_discard);
  // A latest-only consumer stops waiting for its reader once the lossless ones are done.
  std::function<bool()> aborted = w_.aborted;
  if (!k->lossless()) aborted = [this] { return w_.aborted() || lossless_running_.load() == 0; };
  const Config& kc = k->cfg;
  switch (want.sink.kind) {
    case SinkConfig::Kind::null:
      return;
    case SinkConfig::Kind::file:
      k->in_flight = std::make_unique<InFlight>();
      k->sink = std::make_unique<FileSink>(kc, w_.tracker, *k->in_flight, w_.reorder_window,
                                           w_.slack, k_ack, k_discard,
                                           [this] { return w_.aborted() || w_.drain_requested(); });
      track_in_flight_ = true;
      break;
    case SinkConfig::Kind::hdf5:
      k->sink = std::make_unique<Hdf5Sink>(kc, w_.tracker, k_ack, w_.metadata);
      break;
    case SinkConfig::Kind::stream2:
      k->sink = std::make_unique<Stream2Sink>(
          kc, w_.ctx, w_.tracker, w_.reorder_window, k_ack, k_discard,
          [this](std::uint32_t stream) { return w_.ledger.snapshot(stream).first; }, aborted);
      break;
    case SinkConfig::Kind::numastream:
      k->sink = onward_sink(*k, want, k_ack, k_discard, aborted);
      onward_ = true;
      break;
    case SinkConfig::Kind::zmq:
      k->sink = std::make_unique<ZmqSink>(
          kc, w_.ctx, k_ack,
          [this](std::uint32_t stream, std::uint64_t count) {
            return w_.downstream_end(stream, count, 0, 1);
          },
          aborted);
      break;
  }
  consumers_.push_back(std::move(k));
}

// A consumer's spill (config `sinks[].spill`): its acknowledgements become the spill's.
void ConsumerSet::add_spill(Consumer& k, const ConsumerConfig& want, AckFn& k_ack,
                            AckFn& k_discard) {
  // What an earlier process spilled was taken for this consumer (acknowledged upstream): it
  // is handed to the sink first. A chunk read back from the spill (via -1) was settled when
  // it was written there.
  k.spill = std::make_unique<ConsumerSpill>(
      want.spill, static_cast<std::uint32_t>(consumers_.size()), consumer_identity(want.sink),
      k_ack, [&tracker = w_.tracker](std::uint32_t stream, std::uint64_t seq) {
        tracker.on_unwritten(stream, seq);  // lost to the consumer
      });
  // Live chunks join the acknowledgement; those read back from the spill release it.
  auto spill_aware = [spill = k.spill.get()](AckFn fn) {
    return [spill, fn = std::move(fn)](int via, std::uint32_t stream, std::uint64_t seq) {
      if (via >= 0) {
        fn(via, stream, seq);
      } else {
        spill->taken(via, stream, seq);
      }
    };
  };
  k_ack = spill_aware(k_ack);
  k_discard = spill_aware(k_discard);
}

// An onward hop to another numastream receiver.
std::unique_ptr<Sink> ConsumerSet::onward_sink(Consumer& k, const ConsumerConfig& want,
                                               const AckFn& k_ack, const AckFn& k_discard,
                                               const std::function<bool()>& aborted) {
  const Config& kc = k.cfg;
  std::optional<CurveSetup> curve =
      load_onward_curve(want.sink.curve, "sinks[" + std::to_string(consumers_.size()) + "].curve");
  log_line("onward consumer to " + want.sink.endpoint + ": " +
           (!curve                     ? std::string("plain")
            : curve->authenticate_only ? "authenticating"
                                       : "CURVE: encrypting"));
  // Whatever the upstream connections have unacknowledged may wait for the far receiver.
  LinkOptions opts = link_options(kc, want.sink.endpoint, "onward", w_.onward_window, curve);
  if (want.spill.enabled()) {
    // A far site that is down (or not up yet) rides on the spill: the consumer waits for it
    // however long, the others go on, and the spill's limit is what holds them back.
    opts.connect_timeout_s = opts.reconnect_timeout_s = std::numeric_limits<double>::infinity();
  }
  return std::make_unique<OnwardSink>(
      kc, w_.ctx, std::move(opts), curve, k_ack, k_discard, w_.downstream_end, w_.metadata,
      [this, spill = k.spill.get()](std::uint32_t stream)
          -> std::optional<std::pair<std::uint64_t, std::vector<std::uint64_t>>> {
        // The senders' record, merged from their resume frames and grown by what this
        // process acknowledged (which the consumer had, or holds in its spill).
        if (!w_.ledger.knows(stream)) return std::nullopt;
        auto [floor, above] = w_.ledger.snapshot(stream);
        if (spill) return spill->had(stream, floor, above);
        return std::pair{floor, std::move(above)};
      },
      onward_gaps_, aborted);
}

void ConsumerSet::declare_onward(std::uint32_t stream, const std::vector<wire::Gap>& missing) {
  if (!onward_ || missing.empty() || onward_gaps_->add(stream, missing)) return;
  throw std::runtime_error("stream " + std::to_string(stream) + ": more than " +
                           std::to_string(wire::kMaxDeclaredGaps) +
                           " separate gaps to declare onward");
}

std::pair<bool, bool> ConsumerSet::forms(Codec codec) const {
  bool as_came = false, decoded = consumers_.empty();
  for (const auto& k : consumers_)
    (takes_as_arrived(k->cfg.sink, codec) ? as_came : decoded) = true;
  return {as_came, decoded};
}

void ConsumerSet::in_flight(bool add, std::uint32_t stream, std::uint64_t seq) {
  for (auto& k : consumers_) {
    if (!k->in_flight) continue;
    if (add) {
      k->in_flight->add(stream, seq);
    } else {
      k->in_flight->remove(stream, seq);
    }
  }
}

bool ConsumerSet::spills_owe(std::uint32_t stream) {
  return std::any_of(consumers_.begin(), consumers_.end(),
                     [stream](const auto& k) { return k->spill && k->spill->owes(stream); });
}

std::optional<std::size_t> ConsumerSet::depth_of_one() const {
  if (consumers_.size() != 1) return std::nullopt;
  return consumers_.front()->q->depth();
}

std::string ConsumerSet::what(int index) const {
  if (consumers_.size() == 1) return {};
  return "consumer " + std::to_string(index) + " (" +
         consumers_[static_cast<std::size_t>(index)]->sink->name() + "): ";
}

void ConsumerSet::close() {
  for (auto& k : consumers_) k->q->close();
}

bool ConsumerSet::deliver(Chunk& out, std::optional<Chunk>& as_came, StageStats& st) {
  ScopedTimer wait(st.blocked_output_ns);
  if (consumers_.size() == 1) return consumers_.front()->q->push(out);
  // Several consumers share the payload (ZeroMQ counts the references; a pooled buffer returns
  // to its pool when the last lets it go): nothing is copied. A lossless consumer's queue is
  // waited for; a latest-only one's is not: no room, and the chunk passes it by. A consumer
  // that takes it as it came shares that payload instead.
  zmq::Message shared = out.take_payload();
  std::optional<zmq::Message> shared_as_came =
      as_came ? std::optional<zmq::Message>(as_came->take_payload()) : std::nullopt;
  for (std::size_t i = 0; i < consumers_.size(); ++i) {
    Consumer& k = *consumers_[i];
    const bool came = as_came && takes_as_arrived(k.cfg.sink, as_came->header.codec);
    Chunk c;
    c.header = came ? as_came->header : out.header;
    c.via = out.via;
    c.body = came ? shared_as_came->share() : shared.share();
    if (k.spill) {
      if (!k.spill->put(c, [this, &k] { return w_.aborted() || k.q->closed(); })) return false;
    } else if (k.lossless()) {
      if (!k.q->push(c)) return false;
    } else if (!k.q->try_push(c)) {
      ++k.passed_over;
    }
  }
  return true;
}

void ConsumerSet::run(int index, StageStats& st) {
  Consumer& k = *consumers_[static_cast<std::size_t>(index)];
  // However it ends: a lossless consumer's end lets the latest-only ones stop waiting for their
  // readers; on failure its queue is drained, so that decompressors blocked on it can finish;
  // what its sink opened is closed.
  struct End {
    ConsumerSet& r;
    Consumer& k;
    ~End() {
      const bool failed = r.w_.aborted() || std::uncaught_exceptions() > 0;
      if (k.lossless()) --r.lossless_running_;
      if (failed) {
        k.q->close();  // what is queued goes back to its pool; whoever waits to push is let go
        while (k.q->pop()) {
        }
      }
      // A latest-only consumer's last messages are not waited for (its reader may never read).
      k.sink->close(failed || !k.lossless());
    }
  } end{*this, k};
  k.sink->start();
  while (true) {
    bool done = false;
    std::optional<Chunk> c;
    {
      ScopedTimer wait(st.blocked_input_ns);
      if (k.spill) {
        // Closed once every chunk was written to the spill: it ends when the spill is read out.
        done = k.q->closed();
        c = k.spill->take(std::chrono::milliseconds(20), w_.cfg.chunk_bytes);
      } else {
        c = k.q->pop_for(std::chrono::milliseconds(20), done);
      }
    }
    if (!c) {
      if (done) break;
      if (k.failed.empty()) k.sink->idle(st);
      continue;
    }
    // A latest-only consumer that failed, or outlived the lossless ones: what is left passes it by.
    if (!k.lossless() && (!k.failed.empty() || lossless_running_.load() == 0)) {
      ++k.passed_over;
      continue;
    }
    if (k.lossless()) {
      k.sink->put(std::move(*c), st);
      ++k.taken;
      continue;
    }
    // A latest-only consumer never ends the run: its failure (its reader gone) is its own.
    try {
      k.sink->put(std::move(*c), st);
      ++k.taken;
    } catch (const std::exception& e) {
      k.failed = e.what();
      log_warn(std::string("consumer ") + std::to_string(index) + " (latest-only " +
               k.sink->name() + "): " + k.failed + "; the others go on, it takes nothing more");
    }
  }
  if (w_.aborted() || !k.failed.empty()) return;
  if (k.lossless()) {
    k.sink->drain(st);
    return;
  }
  try {
    k.sink->drain(st);
  } catch (const std::exception& e) {
    k.failed = e.what();
    log_warn(std::string("consumer ") + std::to_string(index) + " (latest-only " + k.sink->name() +
             "): " + k.failed);
  }
}

void ConsumerSet::declare_metrics(MetricRegistry& m) {
  if (!consumers_.empty()) consumers_.front()->sink->declare_metrics(m);
  if (per_consumer_figures()) {
    auto each = [this](MetricSamples& s, auto value) {
      for (std::size_t i = 0; i < consumers_.size(); ++i) {
        const Consumer& k = *consumers_[i];
        s.add({{"consumer", std::to_string(i)},
               {"kind", k.sink->name()},
               {"guarantee", k.lossless() ? "lossless" : "latest"}},
              value(k));
      }
    };
    m.add(metric::consumer_chunks, [each](MetricSamples& s) {
      each(s, [](const Consumer& k) { return static_cast<double>(k.taken.load()); });
    });
    m.add(metric::consumer_passed_over, [each](MetricSamples& s) {
      each(s, [](const Consumer& k) { return static_cast<double>(k.passed_over.load()); });
    });
    m.add(metric::consumer_behind, [each](MetricSamples& s) {
      each(s, [](const Consumer& k) { return static_cast<double>(k.q->depth()); });
    });
    m.add(metric::consumer_spill_bytes, [each](MetricSamples& s) {
      each(s, [](const Consumer& k) {
        return k.spill ? static_cast<double>(k.spill->pending_bytes()) : 0.0;
      });
    });
  }
}

std::vector<std::string> ConsumerSet::finish(const std::function<void(const std::string&)>& fail) {
  std::vector<std::string> files;
  for (auto& k : consumers_) {
    std::vector<std::string> incomplete;
    try {
      incomplete = k->sink->finish();
    } catch (const std::exception& e) {
      fail(e.what());
    }
    for (const auto& f : incomplete) {
      log_warn(std::string(k->sink->name()) + " sink: " + f +
               " is incomplete: it misses chunks or the stream did not end");
      files.push_back(f);
    }
  }
  return files;
}

bool ConsumerSet::per_consumer_figures() const {
  return consumers_.size() > 1 || (consumers_.size() == 1 && consumers_.front()->spill);
}

void ConsumerSet::report(nlohmann::json& out) const {
  if (!consumers_.empty()) consumers_.front()->sink->report(out);
  if (per_consumer_figures()) out["consumers"] = each_json();
}

nlohmann::json ConsumerSet::each_json() const {
  nlohmann::json each = nlohmann::json::array();
  for (std::size_t i = 0; i < consumers_.size(); ++i) {
    const Consumer& k = *consumers_[i];
    nlohmann::json o = {
        {"consumer", i},
        {"kind", k.sink->name()},
        {"guarantee", k.lossless() ? "lossless" : "latest"},
        {"chunks", k.taken.load()},
        {"passed_over", k.passed_over.load()},
        {"behind", k.q->depth()},
        {"error", k.failed.empty() ? nlohmann::json(nullptr) : nlohmann::json(k.failed)}};
    if (k.spill) o["spill"] = k.spill->report();
    k.sink->report(o);
    each.push_back(std::move(o));
  }
  return each;
}

}  // namespace numastream
