// The agents' metrics and health server under clients that connect and say nothing: the
// kubelet's liveness probe (timeout 1 s) is still answered.
#include "obs/http.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

namespace numastream {
namespace {

int connect_to(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// GET `path` as a kubelet probe does, giving up after `timeout`: the answer, or "" if none came.
std::string probe(int port, const std::string& path, std::chrono::milliseconds timeout) {
  int fd = connect_to(port);
  if (fd < 0) return "";
  timeval tv{static_cast<time_t>(timeout.count() / 1000),
             static_cast<suseconds_t>(timeout.count() % 1000 * 1000)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n";
  (void)!::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  return out;
}

struct Idle {
  std::vector<int> fds;
  ~Idle() {
    for (int fd : fds) ::close(fd);
  }
};

TEST(MetricsServer, AnswersTheProbeWhileFiftyClientsSayNothing) {
  MetricsServer server(
      "127.0.0.1:0", [] { return std::string("numastream_up 1\n"); }, [] { return true; });
  Idle idle;
  for (int i = 0; i < 50; ++i) {
    int fd = connect_to(server.port());
    ASSERT_GE(fd, 0);
    idle.fds.push_back(fd);
  }
  for (int round = 0; round < 3; ++round) {
    const std::string health = probe(server.port(), "/healthz", std::chrono::milliseconds(1000));
    EXPECT_NE(health.find("200 OK"), std::string::npos) << "round " << round << ": " << health;
  }
  EXPECT_NE(
      probe(server.port(), "/metrics", std::chrono::milliseconds(1000)).find("numastream_up 1"),
      std::string::npos);
}

// More silent clients than it serves at once: the oldest silent ones make room, the probe is
// answered.
TEST(MetricsServer, ClientsPastItsLimitDoNotLockTheProbeOut) {
  MetricsServer::Limits limits;
  limits.max_clients = 8;
  MetricsServer server(
      "127.0.0.1:0", [] { return std::string(); }, [] { return false; }, limits);
  Idle idle;
  for (int i = 0; i < 40; ++i) idle.fds.push_back(connect_to(server.port()));
  const std::string health = probe(server.port(), "/healthz", std::chrono::milliseconds(1000));
  EXPECT_NE(health.find("503"), std::string::npos) << "answered, and it says unhealthy: " << health;
}

// Clients that ask for a large answer and never read it hold every slot while it is sent: the
// one answered longest makes room, and the probe is answered (before, it was closed unanswered
// until their deadlines passed, and clients that kept asking locked it out).
TEST(MetricsServer, ClientsThatAskAndNeverReadDoNotLockTheProbeOut) {
  MetricsServer::Limits limits;
  limits.max_clients = 8;
  const std::string large(8u << 20, 'x');  // more than a socket's buffers hold
  MetricsServer server(
      "127.0.0.1:0", [&large] { return large; }, [] { return true; }, limits);
  Idle stuck;
  for (std::size_t i = 0; i < limits.max_clients; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(server.port()));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    const std::string req = "GET /metrics HTTP/1.1\r\n\r\n";
    ASSERT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
    stuck.fds.push_back(fd);
  }
  for (int fd : stuck.fds) {  // each is being answered: the first bytes came
    pollfd p{fd, POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 5000), 1);
  }
  for (int round = 0; round < 3; ++round) {
    const std::string health = probe(server.port(), "/healthz", std::chrono::milliseconds(1000));
    EXPECT_NE(health.find("200 OK"), std::string::npos) << "round " << round << ": " << health;
  }
}

// A silent client is closed at its deadline.
TEST(MetricsServer, ASilentClientIsClosedAtItsDeadline) {
  MetricsServer::Limits limits;
  limits.request_timeout = std::chrono::milliseconds(200);
  MetricsServer server(
      "127.0.0.1:0", [] { return std::string(); }, [] { return true; }, limits);
  int fd = connect_to(server.port());
  ASSERT_GE(fd, 0);
  timeval tv{3, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char c;
  EXPECT_EQ(::recv(fd, &c, 1, 0), 0) << "closed by the server, not by our 3 s timeout";
  ::close(fd);
}

}  // namespace
}  // namespace numastream
