// A relay: the gateway's NIC-local container receives and checks frames, and forwards them
// undecoded, zero-copy, as one acknowledged connection to the decompressing container of the same
// pod (over IPC). It puts each stream back in sequence order first (it knows how many connections
// feed it; the decompressing side sees only one), holding at most the reorder window. It
// acknowledges upstream what the decompressing side acknowledged to it, so a chunk leaves the
// sender's window only once it is in the sink; a restarted relay loses nothing (relay.hpp).
#include <memory>
#include <string>
#include <vector>

#include "pipeline/receiver.hpp"

namespace numastream {

// A relay's stage and its control frames: a stream's control frames pass on downstream in order
// with its data; the far side's answers come back as what it acknowledged (ledger_), and a
// stream's end is acknowledged upstream once the far side acknowledged its own.
class Receiver::Relaying final : public Receiver::Role {
 public:
  explicit Relaying(Receiver& r) : r_(r) {}
  const char* name() const override { return "relay"; }
  bool verifies() const override { return false; }
  // Its onward link's keys (sink.curve), when it has them.
  void build(const ReceiverPools& /*pools*/) override {
    const Config& cfg = r_.cfg_;
    if (cfg.sink.curve.secret_key_file.empty()) return;
    curve_ = load_onward_curve(cfg.sink.curve, "sink.curve");
    log_line(std::string("onward link to ") + cfg.sink.endpoint + ": " +
             (curve_->authenticate_only ? "authenticating (frames not encrypted)"
                                        : "CURVE: encrypting") +
             " as " + curve_->public_key + " (public key)");
  }

  void declare(StageGraph& graph, std::function<void()> joined) override {
    graph.add({.stage = Stage::sink,
               .threads = 1,
               .what = [](int) { return std::string("relay: "); },
               .body = [this](StageThread& t) { forward(t); },
               .joined = std::move(joined)});
  }
  void declare_metrics(MetricRegistry& /*m*/) override {}
  void report(nlohmann::json& summary) const override {
    summary["onward_security"] = !curve_                     ? "none"
                                 : curve_->authenticate_only ? "authenticate"
                                                             : "encrypt";
  }

  AckLedger& record() override { return *ledger_; }
  bool resumed(Inbound& in, zmq::Socket&, const zmq::Message&, std::uint16_t) override {
    return r_.wire_q_->push(in);
  }
  bool metadata(Inbound& in) override { return r_.wire_q_->push(in); }
  bool gaps(Inbound& in, const std::vector<wire::Gap>& /*missing*/) override {
    return r_.wire_q_->push(in);
  }
  void ended(const wire::Header&, int, zmq::Socket&, const zmq::Message&, std::uint16_t) override {}

 private:
  // The relay stage's thread: whatever the upstream connections have unacknowledged may be
  // there at once.
  void forward(StageThread& t) {
    run_relay({r_.rt_, *r_.ctx_,
               link_options(r_.cfg_, r_.cfg_.sink.endpoint, "relay", r_.onward_window(), curve_),
               *r_.wire_q_, r_.tracker_, ledger_, gaps_, r_.acks_.boxes, r_.reorder_window_,
               [this](std::uint32_t stream, std::uint64_t count) {
                 return r_.downstream_end(stream, count);
               },
               r_.counts_.last_ns},
              t);
  }

  Receiver& r_;
  std::optional<CurveSetup> curve_;  // the onward link's (sink.curve)
  std::shared_ptr<AckLedger> ledger_ = std::make_shared<AckLedger>();  // what the far side took
  std::shared_ptr<GapBook> gaps_ = std::make_shared<GapBook>();        // declared downstream
};

std::unique_ptr<Receiver::Role> Receiver::relaying(Receiver& r) {
  return std::make_unique<Relaying>(r);
}

}  // namespace numastream
