#include "obs/http.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "base/error.hpp"

namespace numastream {
namespace {

void write_all(int fd, const std::string& data) {
  std::size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<std::size_t>(n);
  }
}

std::string response(int code, const char* reason, const char* type, const std::string& body) {
  return "HTTP/1.0 " + std::to_string(code) + " " + reason + "\r\nContent-Type: " + type +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" +
         body;
}

}  // namespace

MetricsServer::MetricsServer(const std::string& listen, std::function<std::string()> metrics,
                             std::function<bool()> healthy)
    : metrics_(std::move(metrics)), healthy_(std::move(healthy)) {
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
  fd_ = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) {
    freeaddrinfo(res);
    throw_errno("metrics socket");
  }
  int one = 1;
  setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd_, res->ai_addr, res->ai_addrlen) != 0 || ::listen(fd_, 16) != 0) {
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
  port_ = bound.ss_family == AF_INET6
              ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
              : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  thread_ = std::jthread([this](std::stop_token st) { serve(st); });
}

MetricsServer::~MetricsServer() {
  thread_.request_stop();
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) ::close(fd_);
}

void MetricsServer::serve(std::stop_token stop) {
  while (!stop.stop_requested()) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    timeval tv{2, 0};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    std::string req;
    char buf[1024];
    while (req.find("\r\n\r\n") == std::string::npos && req.find("\n\n") == std::string::npos &&
           req.size() < 8192) {
      ssize_t n = ::recv(c, buf, sizeof(buf), 0);
      if (n <= 0) break;
      req.append(buf, static_cast<std::size_t>(n));
    }
    std::string path;
    if (req.rfind("GET ", 0) == 0) {
      auto end = req.find(' ', 4);
      path = req.substr(4, end == std::string::npos ? std::string::npos : end - 4);
    }
    if (path == "/metrics") {
      write_all(c, response(200, "OK", "text/plain; version=0.0.4", metrics_()));
    } else if (path == "/healthz") {
      bool ok = healthy_();
      write_all(c, ok ? response(200, "OK", "text/plain", "ok\n")
                      : response(503, "Service Unavailable", "text/plain", "failing\n"));
    } else if (path.empty()) {
      write_all(c, response(400, "Bad Request", "text/plain", "only GET is served\n"));
    } else {
      write_all(c, response(404, "Not Found", "text/plain", "try /metrics or /healthz\n"));
    }
    ::close(c);
  }
}

}  // namespace numastream
