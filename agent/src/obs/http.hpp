// A small HTTP/1.0 server for /metrics (Prometheus text format) and /healthz: one thread, one
// request per connection, many connections at once (non-blocking, polled), each with a deadline,
// and a bounded number of them. A client that connects and sends nothing, or reads slowly, holds
// one slot until its deadline and never delays another's answer; when every slot is taken, the
// oldest connection still sending its request is closed to admit the new one, or else the one
// being answered longest. So a kubelet's liveness probe is answered whatever other clients do.
// With a bearer digest set, everything but /healthz asks a client for the token whose SHA-256 it
// is (`Authorization: Bearer <token>`), unless the client is on the loopback interface (the pod's
// own containers, `kubectl port-forward`): a wrong or missing one is answered 401.
// With TLS on, the port speaks HTTPS too (told apart by a connection's first byte), with a key
// and certificate the server makes for itself at start (self-signed: an ephemeral P-256 key);
// a client off the loopback interface is then served only /healthz over plain HTTP (the
// kubelet's probe), so a token never has to cross the network in clear.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

namespace numastream {

struct HttpReply {
  int code = 200;
  std::string type;  // Content-Type
  std::string body;
};

class MetricsServer {
 public:
  // Answers a GET of a path the server does not know itself (the query string cut off), or
  // nullopt (404).
  using Route = std::function<std::optional<HttpReply>(const std::string& path)>;
  struct Limits {
    std::size_t max_clients = 64;                      // connections served at once
    std::chrono::milliseconds request_timeout{2000};   // to send the request
    std::chrono::milliseconds response_timeout{5000};  // to take the answer
    std::size_t max_request_bytes = 8192;
    // The SHA-256 (32 bytes) of the token a client off the loopback interface presents for any
    // path but /healthz; empty: none asked.
    std::string bearer_sha256;
    // HTTPS for clients off the loopback interface (see above).
    bool tls = false;
  };
  // `listen` is "host:port" (port 0 picks a free port). Throws std::system_error when it cannot
  // bind. Without `metrics` and `healthy` (empty functions) it answers only what `more` routes.
  MetricsServer(const std::string& listen, std::function<std::string()> metrics,
                std::function<bool()> healthy, Limits limits, Route more = {});
  MetricsServer(const std::string& listen, std::function<std::string()> metrics,
                std::function<bool()> healthy)
      : MetricsServer(listen, std::move(metrics), std::move(healthy), Limits{}) {}
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const noexcept { return port_; }

 private:
  struct Tls;
  void serve(const std::stop_token& stop);
  std::string answer(const std::string& request, bool local, bool secure) const;
  bool admits(const std::string& request) const;
  int fd_ = -1;
  int port_ = 0;
  std::function<std::string()> metrics_;
  std::function<bool()> healthy_;
  Limits limits_;
  Route more_;
  std::unique_ptr<Tls> tls_;  // the TLS context, with its key and certificate; null: plain only
  std::jthread thread_;
};

}  // namespace numastream
