#include "obs/http.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sodium.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
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

}  // namespace

MetricsServer::MetricsServer(const std::string& listen, std::function<std::string()> metrics,
                             std::function<bool()> healthy, Limits limits, Route more)
    : metrics_(std::move(metrics)),
      healthy_(std::move(healthy)),
      limits_(limits),
      more_(std::move(more)) {
  if (!limits_.bearer_sha256.empty() && sodium_init() < 0) {
    throw std::runtime_error("metrics server: libsodium cannot start");
  }
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

std::string MetricsServer::answer(const std::string& req, bool local) const {
  std::string path;
  if (req.rfind("GET ", 0) == 0) {
    auto end = req.find(' ', 4);
    path = req.substr(4, end == std::string::npos ? std::string::npos : end - 4);
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

// One thread polls the listening socket and every connection. A connection reads its request
// (until a blank line, at most max_request_bytes), then is answered and closed; past its deadline
// it is closed unanswered.
void MetricsServer::serve(const std::stop_token& stop) {
  using Clock = std::chrono::steady_clock;
  struct Client {
    int fd;
    Clock::time_point deadline;
    std::string in, out;
    std::size_t sent = 0;
    bool answering = false;
    bool local = false;  // on the loopback interface
  };
  std::vector<Client> clients;
  auto drop = [&](std::size_t i) {
    ::close(clients[i].fd);
    clients.erase(clients.begin() + static_cast<std::ptrdiff_t>(i));
  };
  while (!stop.stop_requested()) {
    std::vector<pollfd> fds;
    fds.push_back({fd_, POLLIN, 0});
    for (const auto& c : clients)
      fds.push_back({c.fd, static_cast<short>(c.answering ? POLLOUT : POLLIN), 0});
    if (::poll(fds.data(), fds.size(), 100) < 0 && errno != EINTR) continue;
    const auto now = Clock::now();
    // Existing connections first (their indices match fds[1..]).
    for (std::size_t i = clients.size(); i-- > 0;) {
      Client& c = clients[i];
      const short ev = fds[i + 1].revents;
      if (ev & (POLLERR | POLLNVAL)) {
        drop(i);
        continue;
      }
      if (!c.answering && (ev & (POLLIN | POLLHUP))) {
        char buf[1024];
        ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
        if (n > 0) c.in.append(buf, static_cast<std::size_t>(n));
        const bool whole =
            c.in.find("\r\n\r\n") != std::string::npos || c.in.find("\n\n") != std::string::npos;
        if (whole || n == 0 || c.in.size() >= limits_.max_request_bytes) {
          if (c.in.empty()) {
            drop(i);
            continue;
          }
          c.out = answer(c.in, c.local);
          c.answering = true;
          c.deadline = now + limits_.response_timeout;
        } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
          drop(i);
          continue;
        }
      }
      if (c.answering && (ev & POLLOUT || c.sent == 0)) {
        ssize_t n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
        if (n > 0) c.sent += static_cast<std::size_t>(n);
        if (c.sent == c.out.size() || (n < 0 && errno != EAGAIN && errno != EINTR)) {
          drop(i);
          continue;
        }
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
      clients.push_back(
          {fd, Clock::now() + limits_.request_timeout, {}, {}, 0, false, is_loopback(peer)});
    }
  }
  for (auto& c : clients) ::close(c.fd);
}

}  // namespace numastream
