#include "obs/http.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sodium.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string_view>
#include <utility>
#include <vector>

#include "base/error.hpp"

namespace numastream {
namespace {

std::string response(int code, const char* reason, const std::string& type, const std::string& body,
                     const std::string& extra_headers = "") {
  return "HTTP/1.0 " + std::to_string(code) + " " + reason + "\r\nContent-Type: " + type +
         "\r\nCache-Control: no-store\r\nContent-Length: " + std::to_string(body.size()) + "\r\n" +
         extra_headers + "Connection: close\r\n\r\n" + body;
}

bool starts_with_nocase(const std::string& s, std::size_t at, std::string_view prefix) {
  if (s.size() - at < prefix.size()) return false;
  for (std::size_t i = 0; i < prefix.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(s[at + i])) != prefix[i]) return false;
  }
  return true;
}

// The token of the request's `Authorization: Bearer` header, or "" when it has none.
std::string bearer_token(const std::string& req) {
  for (std::size_t line = req.find('\n'); line != std::string::npos; line = req.find('\n', line)) {
    ++line;
    if (!starts_with_nocase(req, line, "authorization:")) continue;
    std::size_t at = req.find_first_not_of(" \t", line + 14);
    if (at == std::string::npos || !starts_with_nocase(req, at, "bearer ")) return "";
    at = req.find_first_not_of(" \t", at + 7);
    if (at == std::string::npos) return "";
    std::size_t end = req.find_first_of(" \t\r\n", at);
    return req.substr(at, end == std::string::npos ? std::string::npos : end - at);
  }
  return "";
}

bool is_loopback(const sockaddr_storage& peer) {
  if (peer.ss_family == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in&>(peer).sin_addr.s_addr) >> 24) == 127;
  }
  if (peer.ss_family == AF_INET6) {
    const in6_addr& a = reinterpret_cast<const sockaddr_in6&>(peer).sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&a)) return true;
    return IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127;
  }
  return false;
}

struct SslFree {
  void operator()(SSL* s) const { SSL_free(s); }
};
using SslPtr = std::unique_ptr<SSL, SslFree>;

std::string openssl_error(const std::string& what) {
  char buf[256] = "unknown error";
  if (unsigned long e = ERR_get_error()) ERR_error_string_n(e, buf, sizeof(buf));
  ERR_clear_error();
  return "metrics server: " + what + ": " + buf;
}

}  // namespace

// A server context with a key and certificate of its own: an ephemeral P-256 key, a self-signed
// certificate for "numastream-agent" valid from an hour ago for a year (the process's life), TLS
// 1.2 at least.
struct MetricsServer::Tls {
  struct CtxFree {
    void operator()(SSL_CTX* c) const { SSL_CTX_free(c); }
  };
  std::unique_ptr<SSL_CTX, CtxFree> ctx;

  Tls() {
    std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(EVP_EC_gen("P-256"), EVP_PKEY_free);
    if (!key) throw std::runtime_error(openssl_error("cannot make a key"));
    std::unique_ptr<X509, decltype(&X509_free)> cert(X509_new(), X509_free);
    unsigned char serial[16];
    randombytes_buf(serial, sizeof(serial));
    serial[0] &= 0x7f;  // a positive serial number
    std::unique_ptr<BIGNUM, decltype(&BN_free)> bn(BN_bin2bn(serial, sizeof(serial), nullptr),
                                                   BN_free);
    X509_NAME* name = cert ? X509_get_subject_name(cert.get()) : nullptr;
    if (!cert || !bn || !X509_set_version(cert.get(), 2) ||
        !BN_to_ASN1_INTEGER(bn.get(), X509_get_serialNumber(cert.get())) ||
        !X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600) ||
        !X509_gmtime_adj(X509_getm_notAfter(cert.get()), 365L * 24 * 3600) ||
        !X509_set_pubkey(cert.get(), key.get()) ||
        !X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                                    reinterpret_cast<const unsigned char*>("numastream-agent"), -1,
                                    -1, 0) ||
        !X509_set_issuer_name(cert.get(), name) ||
        X509_sign(cert.get(), key.get(), EVP_sha256()) == 0) {
      throw std::runtime_error(openssl_error("cannot make a certificate"));
    }
    ctx.reset(SSL_CTX_new(TLS_server_method()));
    if (!ctx || !SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION) ||
        SSL_CTX_use_certificate(ctx.get(), cert.get()) != 1 ||
        SSL_CTX_use_PrivateKey(ctx.get(), key.get()) != 1) {
      throw std::runtime_error(openssl_error("cannot make a TLS context"));
    }
    SSL_CTX_set_mode(ctx.get(),
                     SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    SSL_CTX_set_session_cache_mode(ctx.get(), SSL_SESS_CACHE_OFF);
  }
};

MetricsServer::MetricsServer(const std::string& listen, std::function<std::string()> metrics,
                             std::function<bool()> healthy, Limits limits, Route more)
    : metrics_(std::move(metrics)),
      healthy_(std::move(healthy)),
      limits_(std::move(limits)),
      more_(std::move(more)) {
  if ((!limits_.bearer_sha256.empty() || limits_.tls) && sodium_init() < 0) {
    throw std::runtime_error("metrics server: libsodium cannot start");
  }
  if (limits_.tls) tls_ = std::make_unique<Tls>();
  auto colon = listen.rfind(':');
  if (colon == std::string::npos) {
    throw ConfigError("metrics.listen", "must be host:port (got \"" + listen + "\")");
  }
  std::string host = listen.substr(0, colon);
  std::string port = listen.substr(colon + 1);
  if (host.empty() || host == "*") host = "0.0.0.0";
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    throw ConfigError("metrics.listen", "cannot resolve \"" + listen + "\": " + gai_strerror(rc));
  }
  fd_ = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd_ < 0) {
    freeaddrinfo(res);
    throw_errno("metrics socket");
  }
  int one = 1;
  setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd_, res->ai_addr, res->ai_addrlen) != 0 || ::listen(fd_, 128) != 0) {
    int err = errno;
    freeaddrinfo(res);
    ::close(fd_);
    errno = err;
    throw_errno("metrics server cannot listen on " + listen);
  }
  freeaddrinfo(res);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                      : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  thread_ = std::jthread([this](const std::stop_token& st) { serve(st); });
}

MetricsServer::~MetricsServer() {
  thread_.request_stop();
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) ::close(fd_);
}

bool MetricsServer::admits(const std::string& req) const {
  if (limits_.bearer_sha256.empty()) return true;
  const std::string token = bearer_token(req);
  unsigned char digest[crypto_hash_sha256_BYTES];
  crypto_hash_sha256(digest, reinterpret_cast<const unsigned char*>(token.data()), token.size());
  return !token.empty() && limits_.bearer_sha256.size() == sizeof(digest) &&
         sodium_memcmp(digest, limits_.bearer_sha256.data(), sizeof(digest)) == 0;
}

std::string MetricsServer::answer(const std::string& req, bool local, bool secure) const {
  std::string path;
  if (req.rfind("GET ", 0) == 0) {
    auto end = req.find(' ', 4);
    path = req.substr(4, end == std::string::npos ? std::string::npos : end - 4);
  }
  if (path != "/healthz" && !local && tls_ && !secure) {
    return response(403, "Forbidden", "text/plain",
                    "this port serves only /healthz over plain HTTP off the pod: use https\n");
  }
  if (path != "/healthz" && !local && !admits(req)) {
    return response(401, "Unauthorized", "text/plain",
                    "a bearer token is required (the operator's metrics token)\n",
                    "WWW-Authenticate: Bearer realm=\"numastream\"\r\n");
  }
  if (path == "/metrics" && metrics_)
    return response(200, "OK", "text/plain; version=0.0.4", metrics_());
  if (path == "/healthz" && healthy_) {
    return healthy_() ? response(200, "OK", "text/plain", "ok\n")
                      : response(503, "Service Unavailable", "text/plain", "failing\n");
  }
  if (path.empty()) return response(400, "Bad Request", "text/plain", "only GET is served\n");
  if (more_) {
    if (auto r = more_(path.substr(0, path.find('?')))) {
      return response(r->code,
                      r->code == 200   ? "OK"
                      : r->code == 404 ? "Not Found"
                                       : "Service Unavailable",
                      r->type, r->body);
    }
  }
  return response(404, "Not Found", "text/plain",
                  metrics_ ? "try /metrics or /healthz\n" : "not served here\n");
}

namespace {

using Clock = std::chrono::steady_clock;

struct Client {
  int fd = -1;
  Clock::time_point deadline;
  std::string in, out;
  std::size_t sent = 0;
  bool answering = false;
  bool local = false;    // on the loopback interface
  bool sniffed = false;  // its first byte seen: TLS or plain
  SslPtr ssl;            // a TLS connection; null: plain
  bool want_write = false;
};

// A TLS call's result as a recv/send's: bytes, 0 at the peer's close, or -1 with errno EAGAIN
// (it waits for the socket; want_write says which way) or EPIPE (the connection failed).
ssize_t tls_result(Client& c, int r) {
  if (r > 0) return r;
  const int e = SSL_get_error(c.ssl.get(), r);
  ERR_clear_error();
  if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
    c.want_write = e == SSL_ERROR_WANT_WRITE;
    errno = EAGAIN;
    return -1;
  }
  if (e == SSL_ERROR_ZERO_RETURN) return 0;
  errno = EPIPE;
  return -1;
}

// On a port that speaks TLS too: a connection whose first byte starts a TLS handshake record is
// served through OpenSSL from now on. False: the connection is gone.
bool sniff(Client& c, SSL_CTX* ctx) {
  unsigned char first = 0;
  const ssize_t n = ::recv(c.fd, &first, 1, MSG_PEEK);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return false;
  if (n < 1) return true;
  c.sniffed = true;
  if (first != 0x16) return true;
  c.ssl.reset(SSL_new(ctx));
  if (!c.ssl || SSL_set_fd(c.ssl.get(), c.fd) != 1) {
    ERR_clear_error();
    return false;
  }
  SSL_set_accept_state(c.ssl.get());
  return true;
}

// Reads what there is of the request (TLS may hold decrypted bytes the socket no longer shows);
// once it is whole (a blank line, the peer's close, or max_bytes), `c.out` is `answer`'s. False:
// the connection failed, or closed having sent nothing.
bool read_request(Client& c, std::size_t max_bytes,
                  const std::function<std::string(const Client&)>& answer) {
  ssize_t n = 0;
  do {
    char buf[1024];
    n = c.ssl ? tls_result(c, SSL_read(c.ssl.get(), buf, sizeof(buf)))
              : ::recv(c.fd, buf, sizeof(buf), 0);
    if (n > 0) c.in.append(buf, static_cast<std::size_t>(n));
  } while (n > 0 && c.in.size() < max_bytes);
  const bool whole =
      c.in.find("\r\n\r\n") != std::string::npos || c.in.find("\n\n") != std::string::npos;
  if (whole || n == 0 || c.in.size() >= max_bytes) {
    if (c.in.empty()) return false;
    c.out = answer(c);
    c.answering = true;
    return true;
  }
  return !(n < 0 && errno != EAGAIN && errno != EINTR);
}

// Sends what is left of the answer. False: all sent (TLS: our close_notify too, best effort), or
// the connection failed (a SIGPIPE its write raised on this thread, blocked, is taken back).
bool write_answer(Client& c, const sigset_t& pipe_signal) {
  const ssize_t n = c.ssl
                        ? tls_result(c, SSL_write(c.ssl.get(), c.out.data() + c.sent,
                                                  static_cast<int>(c.out.size() - c.sent)))
                        : ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
  if (n > 0) c.sent += static_cast<std::size_t>(n);
  if (c.sent == c.out.size() && c.ssl) {
    SSL_shutdown(c.ssl.get());
    ERR_clear_error();
  }
  const bool failed = n < 0 && errno != EAGAIN && errno != EINTR;
  if (failed && c.ssl) {
    const timespec now_only{0, 0};
    sigtimedwait(&pipe_signal, nullptr, &now_only);  // none, or ours
  }
  return c.sent != c.out.size() && !failed;
}

}  // namespace

// One thread polls the listening socket and every connection. A connection reads its request
// (until a blank line, at most max_request_bytes), then is answered and closed; past its deadline
// it is closed unanswered. With TLS on, a connection whose first byte starts a TLS handshake is
// served through OpenSSL on the same non-blocking socket (its reads and writes may each wait for
// the socket to be readable or writable: `want_write`).
void MetricsServer::serve(const std::stop_token& stop) {
  // OpenSSL writes to the socket with write(2): a peer gone would raise SIGPIPE. Blocked on this
  // thread, the write fails with EPIPE instead (write_answer takes the signal back).
  sigset_t pipe_signal;
  sigemptyset(&pipe_signal);
  sigaddset(&pipe_signal, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_signal, nullptr);
  std::vector<Client> clients;
  auto drop = [&](std::size_t i) {
    ::close(clients[i].fd);
    clients.erase(clients.begin() + static_cast<std::ptrdiff_t>(i));
  };
  const std::function<std::string(const Client&)> answer_for = [this](const Client& c) {
    return answer(c.in, c.local, c.ssl != nullptr);
  };
  while (!stop.stop_requested()) {
    std::vector<pollfd> fds;
    fds.push_back({fd_, POLLIN, 0});
    for (const auto& c : clients) {
      const bool out = c.ssl ? c.want_write : c.answering;
      fds.push_back({c.fd, static_cast<short>(out ? POLLOUT : POLLIN), 0});
    }
    if (::poll(fds.data(), fds.size(), 100) < 0 && errno != EINTR) continue;
    const auto now = Clock::now();
    // Existing connections first (their indices match fds[1..]).
    for (std::size_t i = clients.size(); i-- > 0;) {
      Client& c = clients[i];
      const short ev = fds[i + 1].revents;
      if ((ev & (POLLERR | POLLNVAL)) ||
          (tls_ && !c.sniffed && (ev & (POLLIN | POLLHUP)) && !sniff(c, tls_->ctx.get()))) {
        drop(i);
        continue;
      }
      const bool ready = c.ssl ? ev != 0 : (ev & (POLLIN | POLLHUP)) != 0;
      if (!c.answering && ready && (c.sniffed || !tls_)) {
        if (!read_request(c, limits_.max_request_bytes, answer_for)) {
          drop(i);
          continue;
        }
        if (c.answering) c.deadline = now + limits_.response_timeout;
      }
      if (c.answering && (ev & POLLOUT || (c.ssl && ev) || c.sent == 0) &&
          !write_answer(c, pipe_signal)) {
        drop(i);
        continue;
      }
      if (now > c.deadline) drop(i);
    }
    if (!(fds[0].revents & POLLIN)) continue;
    while (true) {
      sockaddr_storage peer{};
      socklen_t peer_len = sizeof(peer);
      int fd = ::accept4(fd_, reinterpret_cast<sockaddr*>(&peer), &peer_len,
                         SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) break;
      if (clients.size() >= limits_.max_clients) {
        // Full: the oldest connection still sending its request makes room; else the one being
        // answered longest (a client that asks and never reads must not lock the probe out).
        auto out = std::find_if(clients.begin(), clients.end(),
                                [](const Client& c) { return !c.answering; });
        if (out == clients.end()) {
          out = std::min_element(
              clients.begin(), clients.end(),
              [](const Client& a, const Client& b) { return a.deadline < b.deadline; });
        }
        drop(static_cast<std::size_t>(out - clients.begin()));
      }
      Client c;
      c.fd = fd;
      c.deadline = Clock::now() + limits_.request_timeout;
      c.local = is_loopback(peer);
      clients.push_back(std::move(c));
    }
  }
  for (auto& c : clients) ::close(c.fd);
}

}  // namespace numastream
