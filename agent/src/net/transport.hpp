// RAII over libzmq: one context per process, sockets, and a connection monitor that tells a
// sender when its receiver goes away.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "base/address.hpp"

namespace numastream::zmq {

class Context {
 public:
  // io_threads: ZeroMQ I/O threads (they do the socket work); io_cpus: CPUs they may run on
  // (ZMQ_THREAD_AFFINITY_CPU_ADD, applied before any socket exists); empty = unpinned.
  Context(int io_threads, const std::vector<int>& io_cpus);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  void* get() const noexcept { return ctx_; }

 private:
  void* ctx_ = nullptr;
};

class Socket {
 public:
  Socket(Context& ctx, int type);
  ~Socket();
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  Socket(Socket&& o) noexcept : s_(o.s_) { o.s_ = nullptr; }
  void* get() const noexcept { return s_; }

  void set_int(int option, int value);
  void set_int64(int option, std::int64_t value);
  void bind(const std::string& endpoint);
  void connect(const std::string& endpoint);

 private:
  void* s_ = nullptr;
};

// A received message, owned: ZeroMQ allocated it (on the NUMA node of the I/O thread that read it
// from the socket); it is freed when this goes away. Move-only.
// For a free function given to Message::adopt, before it reuses or frees the bytes: every
// thread that held a reference to them is done with them (ZeroMQ's reference count says so, and
// this tells ThreadSanitizer, which cannot see it).
void free_message(void* data) noexcept;

class Message {
 public:
  Message();
  ~Message();
  Message(Message&& o) noexcept;
  Message& operator=(Message&& o) noexcept;
  Message(const Message&) = delete;
  Message& operator=(const Message&) = delete;

  // A message over caller-owned bytes (zero-copy): `free_fn(data, hint)` runs once ZeroMQ and
  // every copy are done with them; it calls free_message(data) first.
  static Message adopt(void* data, std::size_t size, void (*free_fn)(void*, void*), void* hint);
  // A message holding a copy of `bytes`.
  static Message of(std::span<const std::byte> bytes);
  // `size` bytes of `m` from `offset` as a message of their own, uncopied: `m` is kept until
  // ZeroMQ and every copy are done with them.
  static Message slice(Message m, std::size_t offset, std::size_t size);
  // A message of `size` bytes for the caller to fill (mutable_data()).
  static Message sized(std::size_t size);
  // Another reference to the same bytes (ZeroMQ counts references; nothing is copied for
  // messages above a few dozen bytes). The content must not change afterwards.
  Message share();

  // Receives without blocking: true when a message was read; false on EAGAIN / EINTR. Throws on
  // other errors.
  bool receive(Socket& sock);
  // True when more parts of the same multi-part message follow this one.
  bool more() noexcept;
  std::span<const std::byte> bytes() const noexcept;
  std::byte* mutable_data() noexcept;
  // The zmq_msg_t, for a send that consumes it (the message is empty afterwards): this thread
  // is done with the bytes.
  void* raw() noexcept;

 private:
  alignas(8) unsigned char storage_[64];  // a zmq_msg_t
};

// Watches one socket's connection events through an inproc PAIR socket.
class Monitor {
 public:
  Monitor(Context& ctx, Socket& watched, const std::string& name);
  void* get() const noexcept { return pair_.get(); }
  // Reads every pending event; updates connected() / disconnects().
  void drain() noexcept;
  bool connected() const noexcept { return connected_; }
  bool ever_connected() const noexcept { return ever_connected_; }
  int disconnects() const noexcept { return disconnects_; }
  // Disconnects of peers whose handshake had not failed: libzmq reports a connection it refused
  // (a peer the ZAP handler turned away, say) disconnected too, just after its failed handshake.
  // Counted at the highest it reached, so a failure reported before its disconnect never makes
  // one peer's departure look like two.
  int departures() noexcept {
    departures_ = std::max(departures_, disconnects_ - handshake_failures_ - auth_failures_);
    return departures_;
  }
  // Peers currently attached (a listening socket counts each accepted connection).
  int peers() const noexcept { return peers_; }
  // Handshakes libzmq reported failed: a peer that is not ZeroMQ or wants another security
  // mechanism; and peers refused by authentication (CURVE, a key that is not allowed).
  int handshake_failures() const noexcept { return handshake_failures_; }
  // Of them, protocol errors (such as a security mechanism mismatch), which a retry does not
  // cure; a connection closed mid-handshake is not one.
  int protocol_failures() const noexcept { return protocol_failures_; }
  int auth_failures() const noexcept { return auth_failures_; }
  int accepted() const noexcept { return accepted_; }  // connections a listening socket accepted
  // A connecting socket's connections in a row that ended before their handshake succeeded: a
  // peer that closes each one while the two still exchange greetings (one that wants another
  // security mechanism and closes before its own greeting is out, or one that is not ZeroMQ).
  int closed_in_handshake() const noexcept { return closed_in_handshake_; }

 private:
  Socket pair_;
  bool connected_ = false;
  bool ever_connected_ = false;
  int disconnects_ = 0;
  int departures_ = 0;
  int peers_ = 0;
  int handshake_failures_ = 0;
  int auth_failures_ = 0;
  int accepted_ = 0;
  int protocol_failures_ = 0;
  bool handshaken_ = false;  // the current connection's handshake succeeded
  int closed_in_handshake_ = 0;
};

std::string last_error();

// CURVE (ZeroMQ's CurveZMQ: Curve25519 key exchange, then every frame encrypted and
// authenticated). Keys are 40-character Z85 strings; secret keys never appear in logs.
struct CurveKeys {
  std::string public_key;
  std::string secret_key;
};
CurveKeys curve_keypair();
// The public key of a secret key; throws std::invalid_argument for a malformed key.
std::string curve_public_of(const std::string& secret_z85);
bool curve_key_valid(const std::string& z85);
// A connecting socket that authenticates as `mine` to a server whose public key is `server`.
void curve_client(Socket& sock, const CurveKeys& mine, const std::string& server_public);
// A listening socket that requires CURVE, with the given secret key.
void curve_server(Socket& sock, const std::string& secret);

// Authenticate-only mode: the token a key pair's owner and its peer both derive from their
// CURVE keys (X25519 of one's secret and the other's public key, hashed): 64 hex characters.
std::string pair_token(const std::string& my_secret, const std::string& their_public);
// A connecting socket that proves its key with ZeroMQ PLAIN (username: its public key,
// password: the pair token); frames are not encrypted.
void plain_client(Socket& sock, const std::string& my_public, const std::string& token);
// A listening socket that requires PLAIN credentials (checked by the ZapAuthenticator).
void plain_server(Socket& sock);

// Decides which clients a context's listening sockets accept (the ZAP protocol, RFC 27): only
// the listed public keys, proven by CURVE or, in authenticate mode, by a PLAIN pair token
// checked against `server_secret`. Runs a thread until destroyed; destroy it before the context.
// A listening socket without keys whose peers' addresses the ZapAuthenticator checks.
void address_checked_server(Socket& sock);
// A listening socket without keys whose peers the ZapAuthenticator admits by the address blocks
// given for `domain` (ZapAuthenticator::admit): a Stream V2 re-emit's consumers.
void consumer_checked_server(Socket& sock, const std::string& domain);
// The ZAP domain of a re-emit bound at `endpoint`.
std::string consumers_domain(const std::string& endpoint);

// Answers ZeroMQ's authentication requests (ZAP) for the sockets above: a peer must connect from
// an address in allow_from (when it is not empty) and, on a CURVE or PLAIN socket, prove one of
// the allowed keys. A socket with no such check (another domain) is not its business.
class ZapAuthenticator {
 public:
  // allowed_public_keys empty and no server_secret: the sockets have no keys (NULL mechanism),
  // only the address is checked. on_address_refused hears each peer refused for its address.
  // on_address_refused hears each of the first peers refused for its address, with the domain
  // ("numastream" for the data sockets).
  using Refused = std::function<void(const std::string& domain, const std::string& address)>;
  ZapAuthenticator(Context& ctx, std::set<std::string> allowed_public_keys,
                   std::string server_secret = "", AddressBlocks allow_from = {},
                   Refused on_address_refused = {});
  ~ZapAuthenticator();
  ZapAuthenticator(const ZapAuthenticator&) = delete;
  ZapAuthenticator& operator=(const ZapAuthenticator&) = delete;
  std::uint64_t accepted() const noexcept { return accepted_.load(); }
  std::uint64_t refused() const noexcept { return refused_.load(); }  // for a key
  std::uint64_t refused_address() const noexcept { return refused_address_.load(); }
  // Sockets of `domain` (consumer_checked_server) admit only peers connecting from `blocks`. Call
  // before they bind.
  void admit(const std::string& domain, AddressBlocks blocks);
  // Peers refused under an admit()ted domain, over all of them.
  std::uint64_t refused_consumers() const noexcept { return refused_consumers_.load(); }
  // The allowed keys come from the file `path`: before each connection is judged, a file that
  // changed (its modification time, size or inode) is read again with `read` and its keys replace
  // the ones admitted, so a key added is admitted and a key taken out refused without a restart.
  // A file that no longer reads (`read` throws) leaves the keys as they were, said once in the
  // log. Call before the sockets bind.
  using KeyReader = std::function<std::set<std::string>(const std::string& path)>;
  void follow_keys(std::string path, KeyReader read);
  std::uint64_t key_reloads() const noexcept { return key_reloads_.load(); }

 private:
  enum class Verdict { accepted, key, address, consumer };
  Verdict judge(const std::vector<std::string>& parts) const;
  void serve();
  void refresh_keys();
  Socket rep_;
  std::set<std::string> allowed_;
  std::string server_secret_;
  AddressBlocks allow_from_;
  Refused on_address_refused_;
  mutable std::mutex domains_mu_;
  std::map<std::string, AddressBlocks> domains_;
  std::atomic<std::uint64_t> refused_consumers_{0};
  std::mutex keys_mu_;     // guards what follows but the counter
  std::string keys_path_;  // follow_keys(): the file, its reader, what it was when last read
  KeyReader read_keys_;
  std::string keys_seen_;
  bool keys_unreadable_ = false;
  std::atomic<std::uint64_t> key_reloads_{0};
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> accepted_{0}, refused_{0}, refused_address_{0};
  std::thread thread_;
};

// Dead-peer detection for data connections: TCP keepalive (idle 5 s, then 5 probes 1 s apart).
// Not ZMTP heartbeats: ZeroMQ stops reading a connection whose pipe is full, so under
// back-pressure a heartbeat goes unanswered and a healthy, merely slow, peer is dropped together
// with the data it had in flight.
void enable_keepalive(Socket& sock);

enum class SendOutcome { sent, aborted, peer_lost, failed };

// Sends `msg` (which the call consumes in every outcome: sent, or closed so that a zero-copy
// buffer goes back to its pool) without blocking forever: it waits for the socket to accept the
// message in short polls, and gives up when `aborted()` turns true or the monitored peer
// disconnects.
template <typename AbortFn>
SendOutcome send_watched(Socket& sock, Monitor& mon, void* msg, AbortFn aborted);
SendOutcome send_watched_impl(Socket& sock, Monitor& mon, void* msg, bool (*aborted)(void*),
                              void* ctx);

template <typename AbortFn>
SendOutcome send_watched(Socket& sock, Monitor& mon, void* msg, AbortFn aborted) {
  return send_watched_impl(
      sock, mon, msg, [](void* c) { return (*static_cast<AbortFn*>(c))(); }, &aborted);
}

}  // namespace numastream::zmq
