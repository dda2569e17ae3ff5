// The gateway's receiving side as one class: receiving threads take the senders' frames (ingress,
// receiver_ingress.cpp), decompressing threads verify and decode them, the consumers
// (consumers.hpp) take the verified chunks, and acknowledgements go back the way the frames came
// (receiver.cpp runs it). A relay forwards the frames undecoded instead (relay.hpp). Internal to
// the agent: run_receiver (pipeline.hpp) is its interface.
#pragma once
#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/error.hpp"
#include "base/files.hpp"
#include "codec/bitshuffle.hpp"
#include "codec/codec.hpp"
#include "data/buffer_pool.hpp"
#include "data/queue.hpp"
#include "data/seqset.hpp"
#include "data/spill.hpp"
#include "net/link.hpp"
#include "net/transport.hpp"
#include "obs/http.hpp"
#include "pipeline/chunk.hpp"
#include "pipeline/consumers.hpp"
#include "pipeline/governor.hpp"
#include "pipeline/graph.hpp"
#include "pipeline/inbound.hpp"
#include "pipeline/pipeline.hpp"
#include "pipeline/pools.hpp"
#include "pipeline/port_guard.hpp"
#include "pipeline/preview.hpp"
#include "pipeline/relay.hpp"
#include "pipeline/runtime.hpp"
#include "pipeline/sink.hpp"
#include "wire/tracker.hpp"
#include "wire/wire.hpp"

namespace numastream {

// What a gateway's data ports saw, for the metrics and the summary.
struct PortCounts {
  std::array<std::atomic<std::uint64_t>, wire::kDecodeErrorCount> malformed{};  // by reason
  std::atomic<std::uint64_t> acks_sent{0};
  std::atomic<std::uint64_t> resumes{0};
  std::atomic<std::uint64_t> gap_frames{0};
  std::atomic<std::uint64_t> unannounced{0};  // data from a connection that sent no resume
  std::atomic<std::uint64_t> two_part{0};     // data frames taken in two parts (payload uncopied)
  std::atomic<std::uint64_t> rejected_handshake{0};  // connections that were not ZeroMQ peers
  std::atomic<std::uint64_t> rejected_auth{0};  // peers refused by authentication (key or address)
  std::atomic<std::uint64_t> accepted{0};       // connections accepted on the data ports
  std::atomic<std::uint64_t> opened{0};         // of them, those that opened a stream
  // Sender connections up now, over every receiving thread: their TCP keepalive (probes after
  // 5 s idle) is the heartbeat of a quiet stream.
  std::atomic<int> connected_peers{0};
  // The run's span: its first data frame taken, its last chunk delivered (ns from the start).
  std::atomic<std::int64_t> first_ns{-1};
  std::atomic<std::int64_t> last_ns{0};
};

// Each stream's metadata frame (pixel type, frame shape), as its sender sent it.
class StreamMetadata {
 public:
  void set(std::uint32_t stream, std::span<const std::byte> bytes) {
    std::lock_guard lock(mu_);
    by_stream_[stream].assign(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  std::string of(std::uint32_t stream) const {
    std::lock_guard lock(mu_);
    auto it = by_stream_.find(stream);
    return it == by_stream_.end() ? std::string() : it->second;
  }

 private:
  mutable std::mutex mu_;
  std::map<std::uint32_t, std::string> by_stream_;
};

class Receiver {
 public:
  using Clock = std::chrono::steady_clock;
  Receiver(const Config& cfg, std::stop_token stop)
      : cfg_(cfg),
        rt_(cfg, std::move(stop)),
        endpoint_(parse_endpoint(cfg.endpoint, "endpoint")),
        tracker_(static_cast<std::size_t>(cfg.max_streams)) {}
  RunResult run(const RunHooks& hooks);

 private:
  void build(int receivers, int decompressors);
  void declare_graph(StageGraph& graph, int receivers);
  RunResult conclude(const std::vector<std::string>& incomplete_files);
  // The stage threads' bodies (run by Runtime::run_stage).
  void receive_loop(StageThread& t);
  // What a receiving thread does with each message: read and decode it, then take it by type
  // (take: false once the run ends and nothing more is taken).
  struct Port;
  struct Incoming;
  std::optional<Incoming> read_frame(zmq::Socket& sock);
  void refuse(const Incoming& f, int index, wire::DecodeError why, const std::string& detail = {});
  bool take(Port& port, Incoming& f, StageThread& t);
  bool take_origin(Port& port, Incoming& f, const std::string& origin);
  bool name_stream(Port& port, Incoming& f);
  bool take_resume(Port& port, Incoming& f);
  bool take_gaps(Port& port, Incoming& f);
  void take_data(Port& port, Incoming& f, StageThread& t);
  void answer(zmq::Socket& sock, const zmq::Message& peer, const std::vector<std::byte>& frame);
  void answer(zmq::Socket& sock, const zmq::Message& peer,
              const std::vector<std::vector<std::byte>>& frames);
  void send_acks(zmq::Socket& sock, int index, std::map<std::uint32_t, zmq::Message>& peers);
  // A receiving thread's ROUTER socket (limits, keepalive, security), not bound yet.
  zmq::Socket data_socket();
  // Reads a data socket's connection events: accepted peers, refused handshakes and keys.
  void count_peers(zmq::Monitor& mon, int index);
  void acknowledge(int via, std::uint32_t stream, std::uint64_t seq);
  // Settled without being kept (corrupt, or past the sink): acknowledged, and named to the sender
  // as discarded, which declares it gone to every later gateway of the stream.
  void discard(int via, std::uint32_t stream, std::uint64_t seq);
  std::vector<std::vector<std::byte>> welcome(std::uint32_t stream, std::uint16_t connection,
                                              std::uint16_t connections, std::uint32_t flags);
  // The end-of-stream frame for a stream forwarded downstream (`count` frames, one connection),
  // with the totals its sender announced; none before the sender ended the stream.
  // A stream's end frame for the next hop: `count` frames on its connection `connection` of
  // `connections`, the totals its sender announced.
  std::optional<zmq::Message> downstream_end(std::uint32_t stream, std::uint64_t count,
                                             std::uint16_t connection = 0,
                                             std::uint16_t connections = 1);
  void declare_metrics();
  struct Servers {
    std::unique_ptr<MetricsServer> metrics, preview;
  };
  Servers serve_http(const RunHooks& hooks);
  void declare_stream_metrics(MetricRegistry& m);
  void declare_connection_metrics(MetricRegistry& m);
  void supervise();
  nlohmann::json summary(const StreamTracker::Totals& t,
                         const std::vector<std::string>& incomplete_files) const;
  void mark_uncounted_losses(nlohmann::json& out) const;

  // What the receiving side does with what its receiving threads took, by role: a gateway
  // decodes it for its consumers (Decoding, receiver_decode.cpp), a relay forwards it undecoded
  // (Relaying, receiver_relay.cpp). A role declares its stages ahead of the receiving threads,
  // answers a stream's control frames or passes them on, and reports; the receiving stage, the
  // acknowledgements, the ports' security and the run are the same for both.
  class Role {
   public:
    virtual ~Role() = default;
    // The summary's role, and whether chunks are verified here.
    virtual const char* name() const = 0;
    virtual bool verifies() const = 0;
    // Its pools, consumers and spares, once the receiver's queue, boxes and context exist.
    virtual void build(const ReceiverPools& pools) = 0;
    // Its stages; `joined` once they have all ended.
    virtual void declare(StageGraph& graph, std::function<void()> joined) = 0;
    // No more input (stopping: parked workers leave) or an abort (close: every queue and pool).
    virtual void stopping() {}
    virtual void close() {}
    // After the graph: what it holds is finished; the files left incomplete.
    virtual std::vector<std::string> finish() { return {}; }
    virtual void declare_metrics(MetricRegistry& m) = 0;
    // Chunks waiting in its one sink's queue (none: several, or no such queue).
    virtual std::optional<std::size_t> sink_depth() const { return std::nullopt; }
    virtual void report(nlohmann::json& summary) const = 0;
    virtual Preview* preview() { return nullptr; }

    // A stream's control frames, once a receiving thread checked them. The record a resume
    // frame is answered from, merged into, and declared gaps settle in; after a resume frame
    // (merged into record()), a stream's metadata, its declared gaps (false once the run ends:
    // nothing more is taken); a stream's end frame, checked against what its sender announced.
    virtual AckLedger& record() = 0;
    virtual bool resumed(Inbound& in, zmq::Socket& sock, const zmq::Message& peer,
                         std::uint16_t connections) = 0;
    virtual bool metadata(Inbound& in) = 0;
    virtual bool gaps(Inbound& in, const std::vector<wire::Gap>& missing) = 0;
    virtual void ended(const wire::Header& h, int via, zmq::Socket& sock, const zmq::Message& peer,
                       std::uint16_t connections) = 0;
    // What the receiving threads ask of it: whether a stream's end must wait (a consumer's
    // spill still owes it chunks), and the chunks on their way to it (a file sink waits for
    // them).
    virtual bool owes_end(std::uint32_t /*stream*/) { return false; }
    // Verifies and hands on a data frame on the receiving thread that took it, when that is
    // cheaper than queueing it (true: `in` is taken care of); false: it goes to the queue.
    virtual bool take_inline(std::optional<Inbound>& /*in*/) { return false; }
    virtual bool tracks_in_flight() const { return false; }
    virtual void in_flight(bool /*add*/, std::uint32_t /*stream*/, std::uint64_t /*seq*/) {}
  };
  class Decoding;
  class Relaying;
  static std::unique_ptr<Role> decoding(Receiver& r);
  static std::unique_ptr<Role> relaying(Receiver& r);

  const Config& cfg_;
  Runtime rt_;
  Endpoint endpoint_;
  StreamTracker tracker_;
  PortCounts counts_;

  std::unique_ptr<BoundedQueue<Inbound>> wire_q_;
  std::size_t reorder_window_ = 16;
  void end_of_stream(std::uint32_t stream, int via, zmq::Socket& sock, const zmq::Message& peer,
                     std::uint16_t connections);
  void answer_owed_ends(zmq::Socket& sock, int via);
  // Acknowledged delivery: what the sinks have taken, per stream (answers a resume frame); the
  // acknowledgements waiting for each receiving thread; and the stream ends each owes. A stream's
  // end is acknowledged to its sender only once every chunk a consumer spilled has reached that
  // consumer: the sender then stays (keeping its end frame) until the stream is whole at every
  // consumer, so a gateway process that dies before sends it again to the next, which hands the
  // spill on and ends the stream.
  struct EndOwed {
    std::uint32_t stream;
    std::uint16_t connections;
    zmq::Message peer;
  };
  struct Acknowledgements {
    AckLedger ledger;
    std::vector<std::unique_ptr<AckBox>> boxes;
    std::vector<std::vector<EndOwed>> ends_owed;  // by connection (each its thread's)
  } acks_;
  // Its consumers (a gateway) or its onward link (a relay): before ctx_, which they use.
  std::unique_ptr<Role> role_;
  StreamMetadata meta_;
  std::unique_ptr<zmq::Context> ctx_;
  PortGuard guard_{cfg_};  // goes before ctx_
  // The window of an onward link: whatever the upstream connections have unacknowledged.
  int onward_window() const {
    return rt_.threads(Stage::receive) * cfg_.window + static_cast<int>(reorder_window_);
  }
  std::atomic<bool> processing_done_{false};  // sink side finished: last acknowledgements out
  std::atomic<bool> stop_taking_{false};      // the run is ending: new data is not taken
};

}  // namespace numastream
