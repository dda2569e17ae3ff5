#include "net/transport.hpp"

#include <sodium.h>
#include <sys/stat.h>
#include <zmq.h>

#include <cstring>
#include <stdexcept>
#include <system_error>
#include <vector>

#include "base/log.hpp"
#include "base/tsan.hpp"

namespace numastream::zmq {
namespace {

[[noreturn]] void fail(const std::string& what) {
  int err = zmq_errno();
  throw std::system_error(err, std::generic_category(), what + ": " + zmq_strerror(err));
}

// A reference to a message's bytes let go (closed, or handed to a socket): ZeroMQ's reference
// count orders it before the free function, which says so to ThreadSanitizer (free_message).
void let_go([[maybe_unused]] zmq_msg_t* m) noexcept {
#ifdef NUMASTREAM_TSAN_ANNOTATE
  tsan::release(zmq_msg_data(m));  // only under TSan: every message's close passes here
#endif
}

// A message not sent after all: closed, and left empty for its owner to close again.
void drop(zmq_msg_t* m) noexcept {
  zmq_msg_close(m);
  zmq_msg_init(m);
}

}  // namespace

void free_message(void* data) noexcept { tsan::acquire(data); }

std::string last_error() { return zmq_strerror(zmq_errno()); }

Context::Context(int io_threads, const std::vector<int>& io_cpus) {
  ctx_ = zmq_ctx_new();
  if (!ctx_) fail("zmq_ctx_new");
  if (zmq_ctx_set(ctx_, ZMQ_IO_THREADS, io_threads < 1 ? 1 : io_threads) != 0) {
    fail("zmq_ctx_set(ZMQ_IO_THREADS)");
  }
  // Must precede the first socket: the I/O threads start with it.
  for (int cpu : io_cpus) {
    if (zmq_ctx_set(ctx_, ZMQ_THREAD_AFFINITY_CPU_ADD, cpu) != 0) {
      fail("zmq_ctx_set(ZMQ_THREAD_AFFINITY_CPU_ADD, " + std::to_string(cpu) + ")");
    }
  }
}

Context::~Context() {
  if (ctx_) {
    while (zmq_ctx_term(ctx_) != 0 && zmq_errno() == EINTR) {
    }
  }
}

Socket::Socket(Context& ctx, int type) {
  s_ = zmq_socket(ctx.get(), type);
  if (!s_) fail("zmq_socket");
}

Socket::~Socket() {
  if (s_) zmq_close(s_);
}

void Socket::set_int(int option, int value) {
  if (zmq_setsockopt(s_, option, &value, sizeof(value)) != 0) {
    fail("zmq_setsockopt(" + std::to_string(option) + ")");
  }
}

void Socket::set_int64(int option, std::int64_t value) {
  if (zmq_setsockopt(s_, option, &value, sizeof(value)) != 0) {
    fail("zmq_setsockopt(" + std::to_string(option) + ")");
  }
}

void Socket::bind(const std::string& endpoint) {
  if (zmq_bind(s_, endpoint.c_str()) != 0) fail("cannot listen on " + endpoint);
}

void Socket::connect(const std::string& endpoint) {
  if (zmq_connect(s_, endpoint.c_str()) != 0) fail("cannot connect to " + endpoint);
}

static_assert(sizeof(zmq_msg_t) <= 64, "Message storage too small for zmq_msg_t");

Message::Message() { zmq_msg_init(reinterpret_cast<zmq_msg_t*>(storage_)); }
Message::~Message() {
  auto* m = reinterpret_cast<zmq_msg_t*>(storage_);
  let_go(m);
  zmq_msg_close(m);
}
Message::Message(Message&& o) noexcept {
  zmq_msg_init(reinterpret_cast<zmq_msg_t*>(storage_));
  zmq_msg_move(reinterpret_cast<zmq_msg_t*>(storage_), reinterpret_cast<zmq_msg_t*>(o.storage_));
}
Message& Message::operator=(Message&& o) noexcept {
  if (this != &o) {
    let_go(reinterpret_cast<zmq_msg_t*>(storage_));
    zmq_msg_move(reinterpret_cast<zmq_msg_t*>(storage_), reinterpret_cast<zmq_msg_t*>(o.storage_));
  }
  return *this;
}

Message Message::adopt(void* data, std::size_t size, void (*free_fn)(void*, void*), void* hint) {
  Message m;
  auto* raw = reinterpret_cast<zmq_msg_t*>(m.storage_);
  zmq_msg_close(raw);
  if (zmq_msg_init_data(raw, data, size, free_fn, hint) != 0) fail("zmq_msg_init_data");
  return m;
}

Message Message::sized(std::size_t size) {
  Message m;
  auto* raw = reinterpret_cast<zmq_msg_t*>(m.storage_);
  zmq_msg_close(raw);
  if (zmq_msg_init_size(raw, size) != 0) fail("zmq_msg_init_size");
  return m;
}

Message Message::slice(Message m, std::size_t offset, std::size_t size) {
  if (offset + size > m.bytes().size())
    throw std::logic_error("Message::slice: past the message's end");
  auto* held = new Message(std::move(m));
  return adopt(
      held->mutable_data() + offset, size,
      [](void* data, void* hint) noexcept {
        free_message(data);
        delete static_cast<Message*>(hint);
      },
      held);
}

Message Message::of(std::span<const std::byte> bytes) {
  Message m = sized(bytes.size());
  if (!bytes.empty()) std::memcpy(m.mutable_data(), bytes.data(), bytes.size());
  return m;
}

Message Message::share() {
  Message m;
  if (zmq_msg_copy(reinterpret_cast<zmq_msg_t*>(m.storage_),
                   reinterpret_cast<zmq_msg_t*>(storage_)) != 0) {
    fail("zmq_msg_copy");
  }
  return m;
}

void* Message::raw() noexcept {
  let_go(reinterpret_cast<zmq_msg_t*>(storage_));
  return storage_;
}

bool Message::more() noexcept { return zmq_msg_more(reinterpret_cast<zmq_msg_t*>(storage_)) != 0; }

bool Message::receive(Socket& sock) {
  if (zmq_msg_recv(reinterpret_cast<zmq_msg_t*>(storage_), sock.get(), ZMQ_DONTWAIT) >= 0)
    return true;
  if (zmq_errno() == EAGAIN || zmq_errno() == EINTR) return false;
  fail("receive");
}

std::span<const std::byte> Message::bytes() const noexcept {
  auto* m = const_cast<zmq_msg_t*>(reinterpret_cast<const zmq_msg_t*>(storage_));
  return {static_cast<const std::byte*>(zmq_msg_data(m)), zmq_msg_size(m)};
}

std::byte* Message::mutable_data() noexcept {
  return static_cast<std::byte*>(zmq_msg_data(reinterpret_cast<zmq_msg_t*>(storage_)));
}

Monitor::Monitor(Context& ctx, Socket& watched, const std::string& name) : pair_(ctx, ZMQ_PAIR) {
  std::string addr = "inproc://monitor-" + name;
  if (zmq_socket_monitor(watched.get(), addr.c_str(),
                         ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_ACCEPTED |
                             ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                             ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                             ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) != 0) {
    fail("zmq_socket_monitor");
  }
  pair_.set_int(ZMQ_LINGER, 0);
  pair_.connect(addr);
}

void Monitor::drain() noexcept {
  while (true) {
    zmq_msg_t frame;
    zmq_msg_init(&frame);
    if (zmq_msg_recv(&frame, pair_.get(), ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&frame);
      return;
    }
    std::uint16_t event = 0;
    if (zmq_msg_size(&frame) >= 6) std::memcpy(&event, zmq_msg_data(&frame), sizeof(event));
    bool more = zmq_msg_more(&frame);
    zmq_msg_close(&frame);
    // The second frame carries the endpoint address; it is not needed.
    while (more) {
      zmq_msg_t rest;
      zmq_msg_init(&rest);
      if (zmq_msg_recv(&rest, pair_.get(), 0) < 0) {
        zmq_msg_close(&rest);
        break;
      }
      more = zmq_msg_more(&rest);
      zmq_msg_close(&rest);
    }
    // (libzmq reports the file descriptor with ACCEPTED / CONNECTED / DISCONNECTED, an error
    // code with the handshake events: connections cannot be matched across them.)
    if (event == ZMQ_EVENT_CONNECTED || event == ZMQ_EVENT_ACCEPTED) {
      connected_ = true;
      ever_connected_ = true;
      handshaken_ = false;
      ++peers_;
      if (event == ZMQ_EVENT_ACCEPTED) ++accepted_;
    } else if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
      handshaken_ = true;
      closed_in_handshake_ = 0;
    } else if (event == ZMQ_EVENT_DISCONNECTED) {
      connected_ = false;
      ++disconnects_;
      if (!handshaken_) ++closed_in_handshake_;
      if (peers_ > 0) --peers_;
    } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
      ++auth_failures_;
    } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL ||
               event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
      ++handshake_failures_;
      if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) ++protocol_failures_;
    }
  }
}

void enable_keepalive(Socket& sock) {
  sock.set_int(ZMQ_TCP_KEEPALIVE, 1);
  sock.set_int(ZMQ_TCP_KEEPALIVE_IDLE, 5);
  sock.set_int(ZMQ_TCP_KEEPALIVE_INTVL, 1);
  sock.set_int(ZMQ_TCP_KEEPALIVE_CNT, 5);
}

SendOutcome send_watched_impl(Socket& sock, Monitor& mon, void* m, bool (*aborted)(void*),
                              void* ctx) {
  auto* msg = static_cast<zmq_msg_t*>(m);
  while (true) {
    mon.drain();
    if (mon.disconnects() > 0) {
      drop(msg);
      return SendOutcome::peer_lost;
    }
    if (aborted(ctx)) {
      drop(msg);
      return SendOutcome::aborted;
    }
    zmq_pollitem_t items[] = {{sock.get(), 0, ZMQ_POLLOUT, 0}, {mon.get(), 0, ZMQ_POLLIN, 0}};
    if (zmq_poll(items, 2, 200) < 0 && zmq_errno() != EINTR) {
      drop(msg);
      return SendOutcome::failed;
    }
    if (!(items[0].revents & ZMQ_POLLOUT)) continue;
    if (zmq_msg_send(msg, sock.get(), ZMQ_DONTWAIT) >= 0) return SendOutcome::sent;
    if (zmq_errno() != EAGAIN && zmq_errno() != EINTR) {
      drop(msg);
      return SendOutcome::failed;
    }
  }
}

}  // namespace numastream::zmq

namespace numastream::zmq {

CurveKeys curve_keypair() {
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0) fail("zmq_curve_keypair (is libzmq built with CURVE?)");
  return {pub, sec};
}

bool curve_key_valid(const std::string& z85) {
  std::uint8_t raw[32];
  return z85.size() == 40 && zmq_z85_decode(raw, z85.c_str()) != nullptr;
}

std::string curve_public_of(const std::string& secret) {
  if (!curve_key_valid(secret)) throw std::invalid_argument("not a 40-character Z85 CURVE key");
  char pub[41];
  if (zmq_curve_public(pub, secret.c_str()) != 0)
    throw std::invalid_argument("not a CURVE secret key");
  return pub;
}

void curve_client(Socket& sock, const CurveKeys& mine, const std::string& server_public) {
  if (zmq_setsockopt(sock.get(), ZMQ_CURVE_SERVERKEY, server_public.c_str(), 40) != 0 ||
      zmq_setsockopt(sock.get(), ZMQ_CURVE_PUBLICKEY, mine.public_key.c_str(), 40) != 0 ||
      zmq_setsockopt(sock.get(), ZMQ_CURVE_SECRETKEY, mine.secret_key.c_str(), 40) != 0) {
    fail("CURVE client keys");
  }
}

void curve_server(Socket& sock, const std::string& secret) {
  int one = 1;
  if (zmq_setsockopt(sock.get(), ZMQ_CURVE_SERVER, &one, sizeof(one)) != 0 ||
      zmq_setsockopt(sock.get(), ZMQ_CURVE_SECRETKEY, secret.c_str(), 40) != 0 ||
      zmq_setsockopt(sock.get(), ZMQ_ZAP_DOMAIN, "numastream", 10) != 0) {
    fail("CURVE server key");
  }
}

std::string pair_token(const std::string& my_secret, const std::string& their_public) {
  if (sodium_init() < 0) throw std::runtime_error("libsodium cannot start");
  std::uint8_t sk[32], pk[32], shared[32], digest[32];
  if (!zmq_z85_decode(sk, my_secret.c_str()) || !zmq_z85_decode(pk, their_public.c_str()) ||
      crypto_scalarmult(shared, sk, pk) != 0) {
    throw std::invalid_argument("not a CURVE key pair");
  }
  static const char kContext[] = "numastream authenticate v1";
  crypto_generichash_state st;
  crypto_generichash_init(&st, nullptr, 0, sizeof(digest));
  crypto_generichash_update(&st, shared, sizeof(shared));
  crypto_generichash_update(&st, reinterpret_cast<const std::uint8_t*>(kContext),
                            sizeof(kContext) - 1);
  crypto_generichash_final(&st, digest, sizeof(digest));
  sodium_memzero(shared, sizeof(shared));
  sodium_memzero(sk, sizeof(sk));
  char hex[65];
  sodium_bin2hex(hex, sizeof(hex), digest, sizeof(digest));
  return hex;
}

void plain_client(Socket& sock, const std::string& my_public, const std::string& token) {
  if (zmq_setsockopt(sock.get(), ZMQ_PLAIN_USERNAME, my_public.data(), my_public.size()) != 0 ||
      zmq_setsockopt(sock.get(), ZMQ_PLAIN_PASSWORD, token.data(), token.size()) != 0) {
    fail("PLAIN credentials");
  }
}

void plain_server(Socket& sock) {
  int one = 1;
  if (zmq_setsockopt(sock.get(), ZMQ_PLAIN_SERVER, &one, sizeof(one)) != 0 ||
      zmq_setsockopt(sock.get(), ZMQ_ZAP_DOMAIN, "numastream", 10) != 0) {
    fail("PLAIN server");
  }
}

void address_checked_server(Socket& sock) {
  if (zmq_setsockopt(sock.get(), ZMQ_ZAP_DOMAIN, "numastream", 10) != 0)
    fail("address-checked server");
}

void consumer_checked_server(Socket& sock, const std::string& domain) {
  if (domain.size() > 254 ||
      zmq_setsockopt(sock.get(), ZMQ_ZAP_DOMAIN, domain.data(), domain.size()) != 0)
    fail("consumer-checked server");
}

std::string consumers_domain(const std::string& endpoint) {
  return ("numastream-consumers " + endpoint).substr(0, 254);
}

void ZapAuthenticator::admit(const std::string& domain, AddressBlocks blocks) {
  std::lock_guard lock(domains_mu_);
  domains_[domain] = std::move(blocks);
}

ZapAuthenticator::ZapAuthenticator(Context& ctx, std::set<std::string> allowed,
                                   std::string server_secret, AddressBlocks allow_from,
                                   Refused on_address_refused)
    : rep_(ctx, ZMQ_REP),
      allowed_(std::move(allowed)),
      server_secret_(std::move(server_secret)),
      allow_from_(std::move(allow_from)),
      on_address_refused_(std::move(on_address_refused)) {
  rep_.set_int(ZMQ_LINGER, 0);
  rep_.bind("inproc://zeromq.zap.01");
  thread_ = std::thread([this] { serve(); });
}

ZapAuthenticator::~ZapAuthenticator() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

// Request: version, request id, domain, address, routing id, mechanism, credentials...
ZapAuthenticator::Verdict ZapAuthenticator::judge(const std::vector<std::string>& parts) const {
  if (parts.size() < 6 || parts[0] != "1.0") return Verdict::key;
  if (parts[2] != "numastream") {
    // A re-emit's consumers, by their address; a socket without our check, accepted.
    std::lock_guard lock(domains_mu_);
    auto it = domains_.find(parts[2]);
    if (it == domains_.end()) return Verdict::accepted;
    return it->second.contains(parts[3]) && parts[5] == "NULL" ? Verdict::accepted
                                                               : Verdict::consumer;
  }
  if (!allow_from_.empty() && !allow_from_.contains(parts[3])) return Verdict::address;
  const std::string& mechanism = parts[5];
  if (allowed_.empty() && server_secret_.empty()) {  // no keys: the address was the check
    return mechanism == "NULL" ? Verdict::accepted : Verdict::key;
  }
  if (mechanism == "CURVE" && parts.size() >= 7 && parts[6].size() == 32) {
    char z85[41];
    if (!zmq_z85_encode(z85, reinterpret_cast<const std::uint8_t*>(parts[6].data()), 32))
      return Verdict::key;
    return allowed_.count(z85) > 0 ? Verdict::accepted : Verdict::key;
  }
  if (mechanism == "PLAIN" && parts.size() >= 8 && !server_secret_.empty() &&
      allowed_.count(parts[6]) > 0) {
    // Username: the sender's public key; password: the token only its key pair can derive.
    try {
      const std::string want = pair_token(server_secret_, parts[6]);
      const bool match = parts[7].size() == want.size() &&
                         sodium_memcmp(parts[7].data(), want.data(), want.size()) == 0;
      return match ? Verdict::accepted : Verdict::key;
    } catch (const std::invalid_argument&) {
      return Verdict::key;
    }
  }
  return Verdict::key;
}

namespace {

// What tells a changed file: its modification time, size and inode (a Secret volume's update
// swaps a symlink: a new inode); empty when it cannot be read.
std::string file_identity(const std::string& path) {
  struct stat sb {};
  if (::stat(path.c_str(), &sb) != 0) return "";
  return std::to_string(sb.st_mtim.tv_sec) + "." + std::to_string(sb.st_mtim.tv_nsec) + "/" +
         std::to_string(sb.st_size) + "/" + std::to_string(sb.st_ino);
}

}  // namespace

void ZapAuthenticator::follow_keys(std::string path, KeyReader read) {
  std::lock_guard lock(keys_mu_);  // the serving thread runs already
  keys_seen_ = file_identity(path);
  keys_path_ = std::move(path);
  read_keys_ = std::move(read);
}

void ZapAuthenticator::refresh_keys() {
  std::lock_guard lock(keys_mu_);
  if (!read_keys_) return;
  const std::string now = file_identity(keys_path_);
  if (now == keys_seen_) return;
  keys_seen_ = now;
  try {
    std::set<std::string> keys = read_keys_(keys_path_);
    const std::size_t before = allowed_.size();
    allowed_ = std::move(keys);
    ++key_reloads_;
    keys_unreadable_ = false;
    log_info(keys_path_ + " changed: admitting " + std::to_string(allowed_.size()) +
             " key(s) now (" + std::to_string(before) + " before)");
  } catch (const std::exception& e) {
    if (!keys_unreadable_) {
      log_warn(std::string(e.what()) + ": keeping the " + std::to_string(allowed_.size()) +
               " key(s) admitted until it reads again");
    }
    keys_unreadable_ = true;
  }
}

void ZapAuthenticator::serve() {
  while (!stop_) {
    zmq_pollitem_t item{rep_.get(), 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, 100) <= 0) continue;
    std::vector<std::string> parts;
    while (true) {
      zmq_msg_t m;
      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, rep_.get(), 0) < 0) {
        zmq_msg_close(&m);
        return;
      }
      parts.emplace_back(static_cast<char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
      bool more = zmq_msg_more(&m);
      zmq_msg_close(&m);
      if (!more) break;
    }
    refresh_keys();
    const Verdict v = judge(parts);
    const bool ok = v == Verdict::accepted;
    if (ok) {
      accepted_++;
    } else if (v == Verdict::address) {
      if (refused_address_++ < 3 && on_address_refused_) on_address_refused_(parts[2], parts[3]);
    } else if (v == Verdict::consumer) {
      if (refused_consumers_++ < 3 && on_address_refused_) on_address_refused_(parts[2], parts[3]);
    } else {
      refused_++;
    }
    const std::string id = parts.size() > 1 ? parts[1] : "";
    const std::string reply[] = {"1.0",
                                 id,
                                 ok ? "200" : "400",
                                 ok ? "OK"
                                 : v == Verdict::address || v == Verdict::consumer
                                     ? "address not allowed"
                                     : "key not allowed",
                                 "",
                                 ""};
    for (std::size_t i = 0; i < 6; ++i) {
      zmq_send(rep_.get(), reply[i].data(), reply[i].size(), i + 1 < 6 ? ZMQ_SNDMORE : 0);
    }
  }
}

}  // namespace numastream::zmq
