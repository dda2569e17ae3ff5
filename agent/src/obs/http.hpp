// A minimal HTTP/1.0 server for /metrics (Prometheus text format) and /healthz. One thread, one
// request per connection, bounded request size; enough for a scraper and a kubelet probe.
#pragma once

#include <functional>
#include <string>
#include <thread>

namespace numastream {

class MetricsServer {
 public:
  // `listen` is "host:port" (port 0 picks a free port). Throws std::system_error when it cannot
  // bind.
  MetricsServer(const std::string& listen, std::function<std::string()> metrics,
                std::function<bool()> healthy);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const noexcept { return port_; }

 private:
  void serve(std::stop_token stop);
  int fd_ = -1;
  int port_ = 0;
  std::function<std::string()> metrics_;
  std::function<bool()> healthy_;
  std::jthread thread_;
};

}  // namespace numastream
