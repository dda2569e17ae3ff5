// A gateway's receiving threads: each reads the senders' frames off its data socket, checks them
// against the streams' records, answers resume and end frames, queues data frames for the
// decompressing threads and sends the acknowledgements the consumers settle back to the senders.
#include <zmq.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "pipeline/receiver.hpp"

namespace numastream {

void Receiver::acknowledge(int via, std::uint32_t stream, std::uint64_t seq) {
  const std::uint64_t floor = acks_.ledger.insert(stream, seq);
  acks_.boxes[static_cast<std::size_t>(via)]->post(stream, floor, {&seq, 1}, 0);
}

void Receiver::discard(int via, std::uint32_t stream, std::uint64_t seq) {
  const std::uint64_t floor = acks_.ledger.insert(stream, seq);
  acks_.boxes[static_cast<std::size_t>(via)]->post(stream, floor, {&seq, 1}, 0, true);
}

void Receiver::end_of_stream(std::uint32_t stream, int via, zmq::Socket& sock,
                             const zmq::Message& peer, std::uint16_t connections) {
  if (!processing_done_ && role_->owes_end(stream)) {
    auto& owed = acks_.ends_owed[static_cast<std::size_t>(via)];
    std::erase_if(owed, [stream](const EndOwed& e) { return e.stream == stream; });  // sent again
    owed.push_back({stream, connections, const_cast<zmq::Message&>(peer).share()});
    return;
  }
  answer(sock, peer,
         welcome(stream, static_cast<std::uint16_t>(via), connections, wire::kAckEndOfStream));
}

void Receiver::answer_owed_ends(zmq::Socket& sock, int via) {
  auto& owed = acks_.ends_owed[static_cast<std::size_t>(via)];
  if (owed.empty()) return;
  std::erase_if(owed, [&](const EndOwed& e) {
    // Once the consumers are done (processing_done_), nothing more comes from their spills.
    if (!processing_done_ && role_->owes_end(e.stream)) return false;
    answer(
        sock, e.peer,
        welcome(e.stream, static_cast<std::uint16_t>(via), e.connections, wire::kAckEndOfStream));
    return true;
  });
}

// The answer to a resume frame: everything the sink has taken of the stream.
std::vector<std::vector<std::byte>> Receiver::welcome(std::uint32_t stream,
                                                      std::uint16_t connection,
                                                      std::uint16_t connections,
                                                      std::uint32_t flags) {
  const auto [floor, above] = role_->record().snapshot(stream);
  return wire::encode_acks(wire::FrameType::ack, stream, connection, connections, floor, flags,
                           above);
}

void Receiver::answer(zmq::Socket& sock, const zmq::Message& peer,
                      const std::vector<std::vector<std::byte>>& frames) {
  for (const auto& f : frames) answer(sock, peer, f);
}

void Receiver::answer(zmq::Socket& sock, const zmq::Message& peer,
                      const std::vector<std::byte>& frame) {
  zmq::Message id = const_cast<zmq::Message&>(peer).share();
  zmq::Message body = zmq::Message::of(frame);
  // The sender knows its stream by its own id, which may not be the local one (stream_names.hpp).
  const std::uint32_t local = wire::stream_of(body.bytes().data());
  if (const std::uint32_t sent_as = tracker_.names().of(local).stream; sent_as != local)
    wire::restamp_stream(body.mutable_data(), sent_as);
  // ROUTER_MANDATORY: a peer that has gone fails with EHOSTUNREACH; it resumes when it returns.
  if (zmq_msg_send(static_cast<zmq_msg_t*>(id.raw()), sock.get(), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
    return;
  if (zmq_msg_send(static_cast<zmq_msg_t*>(body.raw()), sock.get(), ZMQ_DONTWAIT) >= 0)
    ++counts_.acks_sent;
}

void Receiver::send_acks(zmq::Socket& sock, int index,
                         std::map<std::uint32_t, zmq::Message>& peers) {
  auto pending = acks_.boxes[static_cast<std::size_t>(index)]->take();
  for (auto& [stream, p] : pending) {
    auto it = peers.find(stream);
    if (it == peers.end()) continue;  // no sender of that stream on this connection
    std::sort(p.seqs.begin(), p.seqs.end());
    p.seqs.erase(std::remove_if(p.seqs.begin(), p.seqs.end(),
                                [floor = p.floor](auto s) { return s < floor; }),
                 p.seqs.end());
    p.seqs.erase(std::unique(p.seqs.begin(), p.seqs.end()), p.seqs.end());
    answer(sock, it->second,
           wire::encode_acks(wire::FrameType::ack, stream, static_cast<std::uint16_t>(index),
                             static_cast<std::uint16_t>(acks_.boxes.size()), p.floor, p.flags,
                             p.seqs));
    if (!p.discarded.empty()) {
      answer(sock, it->second,
             wire::encode_acks(wire::FrameType::ack, stream, static_cast<std::uint16_t>(index),
                               static_cast<std::uint16_t>(acks_.boxes.size()), p.floor,
                               wire::kAckDiscarded, p.discarded));
    }
  }
}

zmq::Socket Receiver::data_socket() {
  zmq::Socket sock(*ctx_, ZMQ_ROUTER);
  sock.set_int(ZMQ_RCVHWM, cfg_.hwm);
  sock.set_int(ZMQ_SNDHWM, 100000);  // acknowledgements: small, never dropped for want of room
  sock.set_int(ZMQ_ROUTER_MANDATORY, 1);
  sock.set_int(ZMQ_LINGER, 2000);
  if (endpoint_.ipc_path.empty()) zmq::enable_keepalive(sock);
  guard_.secure(sock);
  // A peer that sends a message larger than any valid frame is disconnected by ZeroMQ itself.
  sock.set_int64(ZMQ_MAXMSGSIZE,
                 static_cast<std::int64_t>(wire::kHeaderSize + max_encoded_size(cfg_.chunk_bytes)));
  return sock;
}

void Receiver::count_peers(zmq::Monitor& mon, int index) {
  const int before_handshake = mon.handshake_failures(), before_auth = mon.auth_failures();
  const int before_accepted = mon.accepted();
  mon.drain();
  counts_.accepted += static_cast<std::uint64_t>(mon.accepted() - before_accepted);
  if (mon.handshake_failures() > before_handshake &&
      counts_.rejected_handshake.fetch_add(
          static_cast<std::uint64_t>(mon.handshake_failures() - before_handshake)) < 3) {
    log_warn("connection " + std::to_string(index) +
             ": dropped a peer that failed the ZeroMQ handshake");
  }
  if (mon.auth_failures() > before_auth &&
      counts_.rejected_auth.fetch_add(
          static_cast<std::uint64_t>(mon.auth_failures() - before_auth)) < 3) {
    log_warn("connection " + std::to_string(index) +
             ": refused a peer whose key or address is not allowed");
  }
}

// One receiving thread's data socket: the peers that opened with a resume frame, and which peer
// carries each stream here (its acknowledgements go there).
struct Receiver::Port {
  int index;
  std::uint16_t connections;
  zmq::Socket& sock;
  std::map<std::uint32_t, zmq::Message> streams;
  std::set<std::string> announced;
  std::map<std::string, std::string> origins;  // the origin each peer's origin frame named
};

namespace {
// The origin of a peer whose origin frame was refused: no stream of it is taken.
const std::string kRefusedOrigin = "/";
}  // namespace

// A message off a data socket: who sent it, its parts, and what decoding them said.
struct Receiver::Incoming {
  zmq::Message peer, msg;
  std::optional<zmq::Message> body;  // a data frame's payload, sent as a part of its own
  std::size_t parts = 1;
  std::size_t frame_size = 0;
  wire::Header h;
  wire::DecodeError err = wire::DecodeError::ok;
  std::string peer_id() const {
    return {reinterpret_cast<const char*>(peer.bytes().data()), peer.bytes().size()};
  }
};

std::optional<Receiver::Incoming> Receiver::read_frame(zmq::Socket& sock) {
  Incoming f;
  if (!f.peer.receive(sock) || !f.peer.more()) return std::nullopt;
  if (!f.msg.receive(sock)) return std::nullopt;
  // A frame is one part, or a data frame two: its header, then its payload (wire::kAckTwoPart).
  if (f.msg.more()) {
    f.body.emplace();
    if (!f.body->receive(sock)) return std::nullopt;
    f.parts = 2;
    for (bool more = f.body->more(); more; ++f.parts) {  // more than two: not a frame of ours
      zmq::Message extra;
      if (!extra.receive(sock)) break;
      more = extra.more();
    }
  }
  auto bytes = f.msg.bytes();
  f.frame_size = bytes.size() + (f.body ? f.body->bytes().size() : 0);
  if (f.parts > 2) {
    f.err = wire::DecodeError::size_mismatch;
  } else if (f.body) {
    // Only a data frame comes in two parts, and its first part is the header alone.
    f.err = bytes.size() != wire::kHeaderSize
                ? wire::DecodeError::size_mismatch
                : wire::decode_data_header(bytes, f.frame_size, cfg_.chunk_bytes, f.h);
  } else {
    f.err = wire::decode(bytes, cfg_.chunk_bytes, f.h);
  }
  if (f.err == wire::DecodeError::ok && f.h.type == wire::FrameType::ack)
    f.err = wire::DecodeError::bad_type;
  return f;
}

// Refused: a malformed frame, or a well-formed one that the stream's record cannot take.
void Receiver::refuse(const Incoming& f, int index, wire::DecodeError why,
                      const std::string& detail) {
  if (counts_.malformed[static_cast<std::size_t>(why)]++ >= 3) return;
  log_warn(
      "connection " + std::to_string(index) + ": dropped a " +
      (static_cast<int>(why) >= static_cast<int>(wire::DecodeError::out_of_window) ? "refused"
                                                                                   : "malformed") +
      " frame (" + std::string(wire::decode_error_name(why)) + ", " + std::to_string(f.frame_size) +
      " bytes" + (f.parts > 1 ? " in " + std::to_string(f.parts) + " parts" : std::string()) +
      (f.err == wire::DecodeError::ok ? ", stream " + std::to_string(f.h.stream_id) +
                                            ", sequence " + std::to_string(f.h.sequence)
                                      : std::string()) +
      ")" + (detail.empty() ? std::string() : ": " + detail));
}

void Receiver::receive_loop(StageThread& t) {
  const int index = t.index;
  StageStats& st = t.stats;
  AckBox& box = *acks_.boxes[static_cast<std::size_t>(index)];
  zmq::Socket sock = data_socket();
  zmq::Monitor mon(*ctx_, sock, "receive-" + std::to_string(index));
  sock.bind(endpoint_.for_connection(index));
  struct PeerCount {  // this thread's connected senders, in the receiver's total
    std::atomic<int>& total;
    int mine = 0;
    void publish(int n) { total += n - std::exchange(mine, n); }
    ~PeerCount() { total -= mine; }
  } peers{counts_.connected_peers};
  Port port{index, static_cast<std::uint16_t>(acks_.boxes.size()), sock, {}, {}, {}};
  std::optional<Clock::time_point> closing;
  while (!rt_.aborted()) {
    answer_owed_ends(sock, index);
    if (processing_done_) {
      // Everything taken was acknowledged; stay until the senders have read it and left.
      if (!closing) closing = Clock::now();
      mon.drain();
      if (box.empty() && (mon.peers() == 0 || Clock::now() - *closing > std::chrono::seconds(5)))
        break;
    }
    zmq_pollitem_t items[] = {{sock.get(), 0, ZMQ_POLLIN, 0},
                              {nullptr, box.fd(), ZMQ_POLLIN, 0},
                              {mon.get(), 0, ZMQ_POLLIN, 0}};
    {
      ScopedTimer wait(st.blocked_input_ns);
      if (zmq_poll(items, 3, 100) < 0 && zmq_errno() != EINTR) {
        throw std::runtime_error("poll: " + zmq::last_error());
      }
    }
    if (items[1].revents & ZMQ_POLLIN) send_acks(sock, index, port.streams);
    if (items[2].revents & ZMQ_POLLIN) {
      count_peers(mon, index);
      peers.publish(mon.peers());
    }
    if (!(items[0].revents & ZMQ_POLLIN)) continue;
    std::optional<Incoming> f = read_frame(sock);
    if (!f) continue;
    ScopedTimer busy(st.busy_ns);
    if (f->err != wire::DecodeError::ok) {
      refuse(*f, index, f->err);
      continue;
    }
    if (!take(port, *f, t)) break;
  }
}

bool Receiver::take(Port& port, Incoming& f, StageThread& t) {
  const wire::Header& h = f.h;
  if (h.type == wire::FrameType::metadata) {
    if (auto origin = origin_of_metadata(f.msg.bytes().subspan(wire::kHeaderSize)))
      return take_origin(port, f, *origin);
  }
  if (h.type != wire::FrameType::resume && !port.announced.count(f.peer_id())) {
    // Sent before this connection's resume frame (a race at reconnection): the sender
    // retransmits it after the resume, so it is neither taken nor acknowledged now.
    ++counts_.unannounced;
    return true;
  }
  if (!name_stream(port, f)) return true;
  if (h.type == wire::FrameType::resume) return take_resume(port, f);
  // Any frame names a stream: held only while there is room for its record.
  if (auto why = tracker_.admit_stream(h.stream_id); why != wire::DecodeError::ok) {
    refuse(f, port.index, why);
    return true;
  }
  port.streams[h.stream_id] = f.peer.share();
  switch (h.type) {
    case wire::FrameType::metadata: {
      meta_.set(h.stream_id, f.msg.bytes().subspan(wire::kHeaderSize, h.payload_size));
      Inbound in{h, std::move(f.msg), std::nullopt, port.index};
      return role_->metadata(in);
    }
    case wire::FrameType::gap:
      return take_gaps(port, f);
    case wire::FrameType::end_of_stream:
      if (auto why = tracker_.on_end_of_stream(h, wire::decode_end_of_stream(f.msg.bytes()));
          why != wire::DecodeError::ok) {
        refuse(f, port.index, why);
        return true;
      }
      role_->ended(h, port.index, port.sock, f.peer, port.connections);
      return true;
    default:
      take_data(port, f, t);
      return true;
  }
}

// An origin frame: the pipeline whose streams this connection carries (stream_names.hpp). A
// name that is not allowed, or a second origin on one connection, refuses the connection's streams.
bool Receiver::take_origin(Port& port, Incoming& f, const std::string& origin) {
  auto [held, fresh] =
      port.origins.try_emplace(f.peer_id(), origin.empty() ? kRefusedOrigin : origin);
  if (origin.empty() || held->second != origin) {
    held->second = kRefusedOrigin;
    refuse(f, port.index, wire::DecodeError::bad_origin);
  }
  return true;
}

// The frame's stream as this receiver holds it: its origin's stream id to the local id.
bool Receiver::name_stream(Port& port, Incoming& f) {
  static const std::string none;
  auto it = port.origins.find(f.peer_id());
  const std::string& origin = it == port.origins.end() ? none : it->second;
  if (origin == kRefusedOrigin) {
    refuse(f, port.index, wire::DecodeError::bad_origin);
    return false;
  }
  auto bound = tracker_.names().local(origin, f.h.stream_id);
  if (bound.why != wire::DecodeError::ok) {
    refuse(f, port.index, bound.why,
           "stream " + std::to_string(f.h.stream_id) + (origin.empty() ? "" : " of " + origin) +
               ": " + tracker_.names().last_refusal());
    return false;
  }
  f.h.stream_id = bound.id;
  return true;
}

bool Receiver::take_resume(Port& port, Incoming& f) {
  const wire::Header& h = f.h;
  auto seqs = wire::decode_ack_list(f.msg.bytes());
  if (auto why = tracker_.on_resume(h.stream_id, h.sequence, seqs); why != wire::DecodeError::ok) {
    refuse(f, port.index, why);
    return true;
  }
  ++counts_.resumes;
  if (port.announced.insert(f.peer_id()).second) ++counts_.opened;
  port.streams[h.stream_id] = f.peer.share();
  // First, that data frames may come in two parts (a sender that does not know it ignores this).
  answer(port.sock, f.peer,
         wire::encode_ack(wire::FrameType::ack, h.stream_id, static_cast<std::uint16_t>(port.index),
                          port.connections, 0, wire::kAckTwoPart, {}));
  role_->record().merge(h.stream_id, h.sequence, seqs);
  Inbound in{h, std::move(f.msg), std::nullopt, port.index};
  return role_->resumed(in, port.sock, f.peer, port.connections);
}

bool Receiver::take_gaps(Port& port, Incoming& f) {
  const wire::Header& h = f.h;
  auto gaps = wire::decode_gaps(f.msg.bytes());
  std::vector<wire::Gap> missing;
  if (auto why = tracker_.on_gaps(h.stream_id, gaps, &missing); why != wire::DecodeError::ok) {
    refuse(f, port.index, why);
    return true;
  }
  counts_.gap_frames++;
  role_->record().settle(h.stream_id, gaps);
  // Declared on only what this gateway never had: a chunk of the gap it delivered before the
  // declaration goes on to the far site as any other.
  Inbound in{h, std::move(f.msg), std::nullopt, port.index};
  return role_->gaps(in, missing);
}

void Receiver::take_data(Port& port, Incoming& f, StageThread& t) {
  const wire::Header& h = f.h;
  StageStats& st = t.stats;
  if (processing_done_ || stop_taking_) return;  // too late to take it: not acknowledged
  if (auto why = tracker_.admit(h.stream_id, h.sequence); why != wire::DecodeError::ok) {
    refuse(f, port.index, why);
    return;
  }
  tracker_.on_frame(h.stream_id, f.frame_size);
  if (role_->tracks_in_flight()) role_->in_flight(true, h.stream_id, h.sequence);
  auto now_ns = (Clock::now() - rt_.started).count();
  std::int64_t unset = -1;
  counts_.first_ns.compare_exchange_strong(unset, now_ns);
  st.chunks++;
  st.bytes_in += f.frame_size;
  if (f.body) ++counts_.two_part;
  t.observe();
  std::optional<Inbound> in(Inbound{h, std::move(f.msg), std::move(f.body), port.index});
  if (role_->take_inline(in)) return;
  bool pushed;
  {
    ScopedTimer wait(st.blocked_output_ns);
    pushed = wire_q_->push(*in);
  }
  if (!pushed && role_->tracks_in_flight()) role_->in_flight(false, h.stream_id, h.sequence);
}

}  // namespace numastream
