// The sending end of one acknowledged connection (docs/wire-format.md, "Acknowledged delivery").
//
// Every data frame stays with the link until the receiver acknowledges it: the receiver does so
// once its sink has taken the chunk. At most `window` data frames are unacknowledged at a time,
// which is also the back-pressure: a slow sink withholds acknowledgements and the sender waits
// for credit. When the connection drops and comes back (a restarted receiver pod, a network
// blip), the link announces its streams again with resume frames (what was acknowledged so far)
// and retransmits everything unacknowledged, in order; the receiver drops duplicates by
// (stream, sequence). Internal to the agent; one thread uses a link.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "data/seqset.hpp"
#include "net/transport.hpp"
#include "wire/wire.hpp"

namespace numastream {

// What was acknowledged, per stream: on a sender, what its receiver took (shared by the
// connections of one sender); on a receiver, what its sink took (answers a resume frame); on a
// relay, what the decompressing side took. Thread-safe.
class AckLedger {
 public:
  void merge(std::uint32_t stream, std::uint64_t floor, std::span<const std::uint64_t> seqs);
  // Records `seq`; returns the stream's floor after it (everything below is acknowledged).
  std::uint64_t insert(std::uint32_t stream, std::uint64_t seq);
  bool contains(std::uint32_t stream, std::uint64_t seq) const;
  // Something was merged or recorded for the stream (a resume frame, even one with nothing in it).
  bool knows(std::uint32_t stream) const;
  // Floor and the acknowledged sequences above it (all of them: at most the set's window).
  std::pair<std::uint64_t, std::vector<std::uint64_t>> snapshot(std::uint32_t stream) const;
  std::uint64_t acknowledged(std::uint32_t stream) const;  // how many
  std::uint64_t end(std::uint32_t stream) const;           // one past the highest acknowledged
  // Declared gaps are settled as acknowledged ones are: no one waits for them or sends them again.
  void settle(std::uint32_t stream, std::span<const wire::Gap> gaps);

 private:
  mutable std::mutex mu_;
  std::map<std::uint32_t, SeqSet> streams_;
};

// The gaps a sender declared, per stream (wire::FrameType::gap), shared by its connections: each
// sends them after every resume frame and whenever new ones are added. Thread-safe.
class GapBook {
 public:
  // Adds gaps (ascending after it, adjacent ones of one reason merged). False when the stream
  // would hold more than wire::kMaxDeclaredGaps: the caller fails rather than declare less.
  bool add(std::uint32_t stream, std::span<const wire::Gap> gaps);
  std::vector<wire::Gap> of(std::uint32_t stream) const;
  std::uint64_t version() const;
  std::uint64_t chunks(std::uint32_t stream) const;  // how many the gaps hold

 private:
  mutable std::mutex mu_;
  std::map<std::uint32_t, std::vector<wire::Gap>> gaps_;
  std::uint64_t version_ = 0;
};

struct LinkOptions {
  std::string endpoint;
  std::string name;              // names the monitor and the link in messages
  std::uint16_t connection = 0;  // stamped on resume frames
  std::uint16_t connections = 1;
  int hwm = 2;
  int window = 16;  // unacknowledged data frames at most, unless:
  // more of them while together they hold fewer bytes than this (0: no more), up to
  // kMaxWindowFrames: small frames (a fast detector's messages) would otherwise leave the
  // connection idle between acknowledgements.
  std::size_t window_bytes = 0;
  double connect_timeout_s = 30;  // first connection
  double reconnect_timeout_s = 60;
  double ack_timeout_s = 60;  // connected, frames outstanding, no acknowledgement
  // CURVE: this agent's keys and the receiver's public key; empty = plain connection.
  std::string curve_public, curve_secret, curve_server;
  bool authenticate_only = false;  // prove the key (PLAIN + pair token), do not encrypt
  // The pipeline the streams belong to: an origin frame precedes every resume frame
  // (wire/stream_names.hpp); empty = none.
  std::string origin;
};

class AckedLink {
 public:
  // Called for every ack frame received (the relay passes them upstream).
  using AckFn = std::function<void(const wire::Header&, std::span<const std::uint64_t>)>;
  AckedLink(zmq::Context& ctx, LinkOptions opts, std::shared_ptr<AckLedger> ledger,
            std::function<bool()> aborted, AckFn on_ack = {});
  ~AckedLink();
  AckedLink(const AckedLink&) = delete;
  AckedLink& operator=(const AckedLink&) = delete;

  // Waits for the connection (connect_timeout_s). Throws naming the endpoint.
  void connect();
  // Sends a resume frame for `stream` (from the ledger), now and after every reconnect, each
  // followed by the stream's metadata frame when set_metadata gave one.
  void announce(std::uint32_t stream);
  void set_metadata(std::uint32_t stream, std::string text);
  // Declared gaps: sent after every resume frame (after the metadata), and when the book grows.
  void set_gaps(std::shared_ptr<GapBook> book) { gaps_ = std::move(book); }
  // Sequences the receiver settled without keeping them (an ack flagged wire::kAckDiscarded).
  void on_discarded(std::function<void(std::uint32_t stream, std::span<const std::uint64_t>)> fn) {
    on_discarded_ = std::move(fn);
  }
  // Waits until the receiver answered with an acknowledgement (its state) or throws.
  void wait_welcome(double timeout_s);
  // Blocks, serving acknowledgements, until the window has room.
  void wait_for_credit();
  // The window has room now (nothing served).
  bool has_credit() const noexcept {
    return unacked_data_ < static_cast<std::size_t>(opts_.window) ||
           (unacked_bytes_ < opts_.window_bytes && unacked_data_ < kMaxWindowFrames);
  }
  // Unacknowledged data frames at most, whatever their size (LinkOptions::window_bytes).
  static constexpr std::size_t kMaxWindowFrames = 1024;
  // Hands a frame to the link, which keeps it until acknowledged.
  void send(std::uint32_t stream, std::uint64_t seq, zmq::Message frame);
  // The same, as its header and its payload (a message received whole from a detector): sent as
  // two parts of one message, neither copied, to a receiver that takes them so (wire::kAckTwoPart);
  // as one frame, copied once, to one that does not.
  void send(std::uint32_t stream, std::uint64_t seq, zmq::Message head, zmq::Message body);
  // The end-of-stream frame, kept until acknowledged (ack flag kAckEndOfStream).
  void send_end(std::uint32_t stream, zmq::Message frame);
  // Blocks until everything sent was acknowledged.
  void finish();
  // Serves acknowledgements for up to `timeout_ms` without sending.
  void serve(int timeout_ms);

  std::size_t unacknowledged() const noexcept { return unacked_.size(); }
  // The receiver said it takes data frames in two parts (since the connection was last made).
  bool two_part() const noexcept { return two_part_; }
  std::uint64_t retransmitted() const noexcept { return counts_.retransmitted; }
  // Data frames written as two parts (payload uncopied), and frames copied whole for a receiver
  // that does not take two parts.
  std::uint64_t written_in_two_parts() const noexcept { return counts_.two_part_writes; }
  std::uint64_t made_whole() const noexcept { return counts_.made_whole; }
  int reconnects() const noexcept { return counts_.reconnects; }

 private:
  using Key = std::pair<std::uint32_t, std::uint64_t>;
  static constexpr std::uint64_t kEnd = ~std::uint64_t{0};

  void pump(int timeout_ms);
  void read_acks();
  void check_aborted() const;
  void check_progress() const;
  void check_handshake() const;
  // A frame kept until acknowledged: whole, or its header and then its payload.
  struct Held {
    zmq::Message head;
    std::optional<zmq::Message> body;
    std::size_t size() const { return head.bytes().size() + (body ? body->bytes().size() : 0); }
  };
  // Writes one message (a shared reference); false when the connection dropped meanwhile.
  bool write(zmq::Message& m);
  // Writes a held frame: in two parts when the receiver takes them so, else made whole first.
  bool write(Held& f);
  bool write_parts(zmq::Message& m, zmq::Message* body);
  void send(std::uint32_t stream, std::uint64_t seq, Held frame);
  void resend_all();
  std::string describe() const;

  LinkOptions opts_;
  std::shared_ptr<AckLedger> ledger_;
  std::function<bool()> aborted_;
  AckFn on_ack_;
  std::function<void(std::uint32_t, std::span<const std::uint64_t>)> on_discarded_;
  zmq::Socket sock_;
  std::unique_ptr<zmq::Monitor> mon_;
  std::map<Key, Held> unacked_;
  std::size_t unacked_data_ = 0;
  std::size_t unacked_bytes_ = 0;  // what those data frames hold
  std::set<std::uint32_t> announced_;
  std::map<std::uint32_t, std::string> metadata_;
  bool write_resume(std::uint32_t stream);    // as many frames as the record needs
  bool write_metadata(std::uint32_t stream);  // and the stream's declared gaps
  // Every declared gap of `stream`, in as many gap frames as they take.
  bool write_gaps(std::uint32_t stream, const std::vector<wire::Gap>& gaps);
  std::shared_ptr<GapBook> gaps_;
  std::uint64_t gaps_sent_ = 0;  // the book's version last sent on this connection
  int seen_disconnects_ = 0;
  bool need_resend_ = false;
  bool welcomed_ = false;
  bool two_part_ = false;
  std::chrono::steady_clock::time_point down_since_;
  std::chrono::steady_clock::time_point last_progress_;
  // When pump() last read the acknowledgements and the monitor: a frame written within
  // kFreshPump of it neither drains the monitor again nor pumps first (each is a poll of
  // ZeroMQ's mailboxes, a system call or two, and at small frames' rates it was several per frame).
  std::chrono::steady_clock::time_point last_pump_;
  static constexpr std::chrono::microseconds kFreshPump{500};
  struct Counts {
    std::uint64_t retransmitted = 0;
    std::uint64_t two_part_writes = 0, made_whole = 0;
    int reconnects = 0;
    std::uint64_t ignored_acks = 0;  // acknowledgements of streams never announced here
  } counts_;
};

}  // namespace numastream
