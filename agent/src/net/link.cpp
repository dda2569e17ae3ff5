#include "net/link.hpp"

#include <zmq.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "base/log.hpp"
#include "wire/stream_names.hpp"

namespace numastream {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string seconds(double s) {
  std::string out = std::to_string(s);
  out.erase(out.find_last_not_of('0') + 1);
  if (!out.empty() && out.back() == '.') out.pop_back();
  return out + " s";
}

}  // namespace

bool GapBook::add(std::uint32_t stream, std::span<const wire::Gap> gaps) {
  std::lock_guard lock(mu_);
  std::vector<wire::Gap> all = gaps_[stream];
  all.insert(all.end(), gaps.begin(), gaps.end());
  std::sort(all.begin(), all.end(),
            [](const wire::Gap& a, const wire::Gap& b) { return a.first < b.first; });
  std::vector<wire::Gap> merged;
  for (const auto& g : all) {
    if (!merged.empty() && merged.back().end >= g.first && merged.back().reason == g.reason) {
      merged.back().end = std::max(merged.back().end, g.end);
    } else {
      merged.push_back(g);
    }
  }
  if (merged.size() > wire::kMaxDeclaredGaps) return false;
  gaps_[stream] = std::move(merged);
  ++version_;
  return true;
}

std::vector<wire::Gap> GapBook::of(std::uint32_t stream) const {
  std::lock_guard lock(mu_);
  auto it = gaps_.find(stream);
  return it == gaps_.end() ? std::vector<wire::Gap>{} : it->second;
}

std::uint64_t GapBook::version() const {
  std::lock_guard lock(mu_);
  return version_;
}

std::uint64_t GapBook::chunks(std::uint32_t stream) const {
  std::uint64_t n = 0;
  for (const auto& g : of(stream)) n += g.size();
  return n;
}

void AckLedger::merge(std::uint32_t stream, std::uint64_t floor,
                      std::span<const std::uint64_t> seqs) {
  std::lock_guard lock(mu_);
  streams_[stream].merge(floor, seqs);
}

std::uint64_t AckLedger::insert(std::uint32_t stream, std::uint64_t seq) {
  std::lock_guard lock(mu_);
  SeqSet& s = streams_[stream];
  s.insert(seq);
  return s.floor();
}

bool AckLedger::contains(std::uint32_t stream, std::uint64_t seq) const {
  std::lock_guard lock(mu_);
  auto it = streams_.find(stream);
  return it != streams_.end() && it->second.contains(seq);
}

bool AckLedger::knows(std::uint32_t stream) const {
  std::lock_guard lock(mu_);
  return streams_.count(stream) > 0;
}

std::pair<std::uint64_t, std::vector<std::uint64_t>> AckLedger::snapshot(
    std::uint32_t stream) const {
  std::lock_guard lock(mu_);
  auto it = streams_.find(stream);
  if (it == streams_.end()) return {0, {}};
  return {it->second.floor(), it->second.above()};
}

std::uint64_t AckLedger::acknowledged(std::uint32_t stream) const {
  std::lock_guard lock(mu_);
  auto it = streams_.find(stream);
  return it == streams_.end() ? 0 : it->second.size();
}

void AckLedger::settle(std::uint32_t stream, std::span<const wire::Gap> gaps) {
  std::lock_guard lock(mu_);
  SeqSet& s = streams_[stream];
  for (const auto& g : gaps) {
    if (g.first <= s.floor()) {
      s.raise_floor(g.end);
    } else {
      for (std::uint64_t q = g.first; q < g.end && s.fits(q); ++q) s.insert(q);
    }
  }
}

std::uint64_t AckLedger::end(std::uint32_t stream) const {
  std::lock_guard lock(mu_);
  auto it = streams_.find(stream);
  return it == streams_.end() ? 0 : it->second.end();
}

AckedLink::AckedLink(zmq::Context& ctx, LinkOptions opts, std::shared_ptr<AckLedger> ledger,
                     std::function<bool()> aborted, AckFn on_ack)
    : opts_(std::move(opts)),
      ledger_(std::move(ledger)),
      aborted_(std::move(aborted)),
      on_ack_(std::move(on_ack)),
      sock_(ctx, ZMQ_DEALER) {
  sock_.set_int(ZMQ_SNDHWM, opts_.hwm);
  sock_.set_int(ZMQ_RCVHWM, 100000);  // acknowledgements are small; never make the receiver wait
  sock_.set_int(ZMQ_IMMEDIATE, 1);    // queue only on a live connection
  sock_.set_int(ZMQ_LINGER, 0);       // nothing is lost at close: unacknowledged frames are ours
  sock_.set_int(ZMQ_RECONNECT_IVL, 100);
  sock_.set_int(ZMQ_RECONNECT_IVL_MAX, 1000);
  if (opts_.endpoint.rfind("tcp://", 0) == 0) zmq::enable_keepalive(sock_);
  if (!opts_.curve_secret.empty() && opts_.authenticate_only) {
    zmq::plain_client(sock_, opts_.curve_public,
                      zmq::pair_token(opts_.curve_secret, opts_.curve_server));
  } else if (!opts_.curve_secret.empty()) {
    zmq::curve_client(sock_, {opts_.curve_public, opts_.curve_secret}, opts_.curve_server);
  }
  mon_ = std::make_unique<zmq::Monitor>(ctx, sock_, opts_.name);
  sock_.connect(opts_.endpoint);
  last_progress_ = Clock::now();
}

AckedLink::~AckedLink() = default;

std::string AckedLink::describe() const { return opts_.name + " to " + opts_.endpoint; }

void AckedLink::check_aborted() const {
  if (aborted_()) throw std::runtime_error("stopped");
}

// A receiver that refuses this sender will refuse it again: fail at once, saying why.
void AckedLink::check_handshake() const {
  if (mon_->auth_failures() > 0) {
    if (opts_.curve_public.empty()) {
      throw std::runtime_error(
          describe() +
          ": the receiver refused the address this sender connects from; add it "
          "to the receiver's security.allow_from");
    }
    throw std::runtime_error(
        describe() +
        ": the receiver refused this sender's key (or the address it connects "
        "from); add its public key " +
        opts_.curve_public +
        " to the receiver's allowed keys (or its address to security.allow_from)");
  }
  if (mon_->protocol_failures() > 0) {
    throw std::runtime_error(
        describe() + ": the handshake with the receiver failed: " +
        (opts_.curve_secret.empty()
             ? "it requires authenticated streams (security.curve)"
             : "it uses another security mode (encrypt / authenticate / none), or its public "
               "key is not the one configured"));
  }
}

void AckedLink::connect() {
  const auto start = Clock::now();
  while (!mon_->connected()) {
    check_aborted();
    if (since(start) > opts_.connect_timeout_s) {
      throw std::runtime_error("no receiver accepted a connection at " + opts_.endpoint +
                               " within " + seconds(opts_.connect_timeout_s));
    }
    zmq_pollitem_t item{mon_->get(), 0, ZMQ_POLLIN, 0};
    zmq_poll(&item, 1, 100);
    mon_->drain();
    check_handshake();
  }
  seen_disconnects_ = mon_->disconnects();
}

void AckedLink::announce(std::uint32_t stream) {
  announced_.insert(stream);
  if (need_resend_ || !write_resume(stream) || !write_metadata(stream))
    pump(0);  // a reconnect announces every stream again
}

void AckedLink::set_metadata(std::uint32_t stream, std::string text) {
  metadata_[stream] = std::move(text);
  // Already announced (a relay learns it after the resume): it goes out now, and after every
  // resume.
  if (announced_.count(stream) && !need_resend_ && !write_metadata(stream)) pump(0);
}

bool AckedLink::write_resume(std::uint32_t stream) {
  if (!opts_.origin.empty()) {
    zmq::Message m = zmq::Message::of(wire::encode_metadata(
        stream, opts_.connection, opts_.connections, origin_metadata(opts_.origin)));
    if (!write(m)) return false;
  }
  auto [floor, above] = ledger_->snapshot(stream);
  for (auto& bytes : wire::encode_acks(wire::FrameType::resume, stream, opts_.connection,
                                       opts_.connections, floor, 0, above)) {
    zmq::Message m = zmq::Message::of(bytes);
    if (!write(m)) return false;
  }
  return true;
}

bool AckedLink::write_metadata(std::uint32_t stream) {
  auto it = metadata_.find(stream);
  if (it != metadata_.end()) {
    zmq::Message m = zmq::Message::of(
        wire::encode_metadata(stream, opts_.connection, opts_.connections, it->second));
    if (!write(m)) return false;
  }
  if (!gaps_) return true;
  gaps_sent_ = gaps_->version();
  return write_gaps(stream, gaps_->of(stream));
}

bool AckedLink::write_gaps(std::uint32_t stream, const std::vector<wire::Gap>& gaps) {
  for (std::size_t at = 0; at < gaps.size(); at += wire::kMaxGapRecords) {
    const std::size_t n = std::min(wire::kMaxGapRecords, gaps.size() - at);
    zmq::Message m = zmq::Message::of(wire::encode_gaps(stream, opts_.connection, opts_.connections,
                                                        std::span(gaps).subspan(at, n)));
    if (!write(m)) return false;
  }
  return true;
}

void AckedLink::wait_welcome(double timeout_s) {
  const auto start = Clock::now();
  while (!welcomed_) {
    if (since(start) > timeout_s) {
      if (mon_->closed_in_handshake() > 0) {
        // The refusal check_handshake names, when the receiver closed each connection before
        // its own greeting was out (a loaded receiver that read the whole of ours at once) and
        // so never said why. Retried until now: a receiver restarting closes one or two.
        throw std::runtime_error(
            describe() + ": the receiver closed the last " +
            std::to_string(mon_->closed_in_handshake()) +
            " connections during the handshake, none got through within " + seconds(timeout_s) +
            ": " +
            (opts_.curve_secret.empty()
                 ? "it may require authenticated streams (security.curve)"
                 : "it may use another security mode (encrypt / authenticate / none)") +
            ", or not be a numastream receiver");
      }
      throw std::runtime_error(describe() +
                               ": connected, but the receiver did not answer the stream's "
                               "resume frame within " +
                               seconds(timeout_s) +
                               " (is it a numastream receiver of the same wire version?)");
    }
    pump(100);
  }
}

void AckedLink::wait_for_credit() {
  while (!has_credit()) pump(100);
  if (Clock::now() - last_pump_ > kFreshPump) pump(0);
}

void AckedLink::send(std::uint32_t stream, std::uint64_t seq, zmq::Message frame) {
  send(stream, seq, Held{std::move(frame), std::nullopt});
}

void AckedLink::send(std::uint32_t stream, std::uint64_t seq, zmq::Message head,
                     zmq::Message body) {
  send(stream, seq, Held{std::move(head), std::move(body)});
}

void AckedLink::send(std::uint32_t stream, std::uint64_t seq, Held frame) {
  if (unacked_.empty()) last_progress_ = Clock::now();
  auto [it, inserted] = unacked_.emplace(Key{stream, seq}, std::move(frame));
  if (!inserted) return;  // already held: it goes out with the next retransmission, if needed
  ++unacked_data_;
  unacked_bytes_ += it->second.size();
  if (!need_resend_) {
    if (!write(it->second)) pump(0);  // dropped meanwhile: the retransmission includes it
  }
}

void AckedLink::send_end(std::uint32_t stream, zmq::Message frame) {
  if (unacked_.empty()) last_progress_ = Clock::now();
  auto [it, inserted] =
      unacked_.insert_or_assign(Key{stream, kEnd}, Held{std::move(frame), std::nullopt});
  if (!need_resend_ && !write(it->second)) pump(0);
}

void AckedLink::finish() {
  while (!unacked_.empty()) pump(100);
}

void AckedLink::serve(int timeout_ms) { pump(timeout_ms); }

bool AckedLink::write(zmq::Message& m) { return write_parts(m, nullptr); }

bool AckedLink::write(Held& f) {
  if (f.body && !two_part_) {
    // A receiver that takes frames whole (an older one, or one not yet heard from since the
    // connection was made): header and payload copied into one frame, kept so from now on.
    const auto head = f.head.bytes();
    const auto body = f.body->bytes();
    zmq::Message whole = zmq::Message::sized(head.size() + body.size());
    std::memcpy(whole.mutable_data(), head.data(), head.size());
    if (!body.empty()) std::memcpy(whole.mutable_data() + head.size(), body.data(), body.size());
    f.head = std::move(whole);
    f.body.reset();
    ++counts_.made_whole;
  }
  return write_parts(f.head, f.body ? &*f.body : nullptr);
}

bool AckedLink::write_parts(zmq::Message& m, zmq::Message* body) {
  // References of our own, taken first: reading acknowledgements below may acknowledge the frame
  // and erase it from the unacknowledged frames (a restarted receiver that already has it); sending
  // it then is harmless, the receiver drops duplicates. (Taken inside the loop, the frame could be
  // gone: zmq_msg_copy on a freed message, "Bad address", seen in
  // Fault.ReceiverKilledAndRestarted.)
  zmq::Message copy = m.share();
  std::optional<zmq::Message> rest;
  if (body) rest = body->share();
  // The monitor as pump() left it, when it read it a moment ago (the usual case: the sending
  // loop pumps before each frame); else read it again.
  bool fresh = Clock::now() - last_pump_ <= kFreshPump;
  while (true) {
    check_aborted();
    if (!fresh) {
      mon_->drain();
      check_handshake();
    }
    fresh = false;
    if (mon_->disconnects() != seen_disconnects_) {
      two_part_ = false;  // the next receiver says again what it takes
      return false;
    }
    // Sent at once when the socket has room (the usual case: no poll per frame); else waits for
    // room, reading acknowledgements meanwhile.
    if (zmq_msg_send(static_cast<zmq_msg_t*>(copy.raw()), sock_.get(),
                     ZMQ_DONTWAIT | (rest ? ZMQ_SNDMORE : 0)) >= 0) {
      // The first part taken, the rest of the message is too: ZeroMQ counts a message against the
      // high-water mark once, at its first part, and delivers all of its parts or none.
      if (rest) {
        if (zmq_msg_send(static_cast<zmq_msg_t*>(rest->raw()), sock_.get(), 0) < 0) {
          throw std::runtime_error(describe() + ": send: " + zmq::last_error());
        }
        ++counts_.two_part_writes;
      }
      return true;
    }
    if (zmq_errno() != EAGAIN && zmq_errno() != EINTR) {
      throw std::runtime_error(describe() + ": send: " + zmq::last_error());
    }
    zmq_pollitem_t items[] = {{sock_.get(), 0, ZMQ_POLLOUT | ZMQ_POLLIN, 0},
                              {mon_->get(), 0, ZMQ_POLLIN, 0}};
    if (zmq_poll(items, 2, 100) < 0 && zmq_errno() != EINTR) {
      throw std::runtime_error(describe() + ": poll: " + zmq::last_error());
    }
    if (items[0].revents & ZMQ_POLLIN) read_acks();
    if (!(items[0].revents & ZMQ_POLLOUT)) check_progress();  // a stuck peer
  }
}

void AckedLink::read_acks() {
  while (true) {
    zmq::Message m;
    if (!m.receive(sock_)) return;
    wire::Header h;
    auto bytes = m.bytes();
    if (wire::decode(bytes, 0, h) != wire::DecodeError::ok || h.type != wire::FrameType::ack) {
      continue;  // only acknowledgements flow this way; anything else is ignored
    }
    if (h.raw_size & wire::kAckTwoPart) {  // what the receiver takes, not an acknowledgement
      two_part_ = true;
      continue;
    }
    // Only for a stream this link announced: a receiver's acknowledgements of streams it was
    // never sent would grow the record without bound, and settle nothing.
    if (!announced_.count(h.stream_id)) {
      if (counts_.ignored_acks++ == 0) {
        log_warn(describe() + ": ignored an acknowledgement of stream " +
                 std::to_string(h.stream_id) + ", which this link never announced");
      }
      continue;
    }
    auto seqs = wire::decode_ack_list(bytes);
    ledger_->merge(h.stream_id, h.sequence, seqs);
    welcomed_ = true;
    const std::size_t held = unacked_.size();
    auto drop = [&](std::map<Key, Held>::iterator it) {
      if (it->first.second != kEnd) {
        --unacked_data_;
        unacked_bytes_ -= it->second.size();
      }
      return unacked_.erase(it);
    };
    for (auto it = unacked_.lower_bound({h.stream_id, 0});
         it != unacked_.end() && it->first.first == h.stream_id && it->first.second < h.sequence;) {
      it = drop(it);
    }
    for (auto s : seqs) {
      auto it = unacked_.find({h.stream_id, s});
      if (it != unacked_.end() && s != kEnd) drop(it);
    }
    if (h.raw_size & wire::kAckEndOfStream) {
      auto it = unacked_.find({h.stream_id, kEnd});
      if (it != unacked_.end()) drop(it);
    }
    // Progress is a frame let go: an acknowledgement that settles nothing (an empty one, again
    // and again) does not keep a receiver that takes nothing alive.
    if (unacked_.size() < held || unacked_.empty()) last_progress_ = Clock::now();
    if ((h.raw_size & wire::kAckDiscarded) && on_discarded_ && !seqs.empty())
      on_discarded_(h.stream_id, seqs);
    if (on_ack_) on_ack_(h, seqs);
  }
}

void AckedLink::pump(int timeout_ms) {
  check_aborted();
  zmq_pollitem_t items[] = {{sock_.get(), 0, ZMQ_POLLIN, 0}, {mon_->get(), 0, ZMQ_POLLIN, 0}};
  if (zmq_poll(items, 2, timeout_ms) < 0 && zmq_errno() != EINTR) {
    throw std::runtime_error(describe() + ": poll: " + zmq::last_error());
  }
  if (items[0].revents & ZMQ_POLLIN) read_acks();
  mon_->drain();
  check_handshake();
  last_pump_ = Clock::now();
  if (mon_->disconnects() != seen_disconnects_) {
    two_part_ = false;  // the next receiver says again what it takes
    if (!need_resend_) down_since_ = Clock::now();
    seen_disconnects_ = mon_->disconnects();
    need_resend_ = true;
  }
  if (need_resend_) {
    if (mon_->connected()) {
      resend_all();
    } else if (since(down_since_) > opts_.reconnect_timeout_s) {
      throw std::runtime_error(
          describe() + ": the receiver went away and did not come back within " +
          seconds(opts_.reconnect_timeout_s) + "; " + std::to_string(unacked_data_) +
          " chunks were never acknowledged (the receiver's summary lists them)");
    }
    return;
  }
  // Gaps declared since this connection last sent them (a spill that refused chunks).
  if (gaps_ && gaps_->version() != gaps_sent_) {
    const std::uint64_t version = gaps_->version();
    for (auto stream : announced_) {
      if (!write_gaps(stream, gaps_->of(stream)))
        return;  // dropped: the resume after the reconnect carries them
    }
    gaps_sent_ = version;
  }
  check_progress();
}

void AckedLink::check_progress() const {
  if (!unacked_.empty() && since(last_progress_) > opts_.ack_timeout_s) {
    throw std::runtime_error(describe() +
                             ": the receiver is connected but acknowledged nothing for " +
                             seconds(opts_.ack_timeout_s) + " with " +
                             std::to_string(unacked_data_) + " chunks outstanding");
  }
}

void AckedLink::resend_all() {
  // The new connection may lead to a new receiver: announce first, then everything unacknowledged
  // in (stream, sequence) order. A drop meanwhile starts over.
  while (need_resend_) {
    need_resend_ = false;
    ++counts_.reconnects;
    last_progress_ = Clock::now();
    bool dropped = false;
    for (auto stream : announced_) {
      if (!write_resume(stream) || !write_metadata(stream)) {
        dropped = true;
        break;
      }
    }
    // Acknowledgements read while writing remove entries: walk a copy of the keys.
    std::vector<Key> keys;
    for (const auto& kv : unacked_) keys.push_back(kv.first);
    for (const auto& key : keys) {
      if (dropped) break;
      auto it = unacked_.find(key);
      if (it == unacked_.end()) continue;
      if (!write(it->second)) dropped = true;
      ++counts_.retransmitted;
    }
    mon_->drain();
    if (dropped || mon_->disconnects() != seen_disconnects_) {
      seen_disconnects_ = mon_->disconnects();
      need_resend_ = true;
      if (!mon_->connected()) return;  // pump() waits for the next connection
    }
  }
}

}  // namespace numastream
