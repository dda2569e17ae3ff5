// The agents' metrics and health server under clients that connect and say nothing: the
// kubelet's liveness probe (timeout 1 s) is still answered. And with a token: who gets an answer,
// over plain HTTP and over TLS.
#include "obs/http.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <poll.h>
#include <sodium.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace numastream {
namespace {

int connect_to(int port, in_addr_t host = htonl(INADDR_LOOPBACK)) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = host;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// GET `path` as a kubelet probe does (with `headers`, each ending in CRLF), giving up after
// `timeout`: the answer, or "" if none came.
std::string probe(int port, const std::string& path, std::chrono::milliseconds timeout,
                  in_addr_t host = htonl(INADDR_LOOPBACK), const std::string& headers = "") {
  int fd = connect_to(port, host);
  if (fd < 0) return "";
  timeval tv{static_cast<time_t>(timeout.count() / 1000),
             static_cast<suseconds_t>(timeout.count() % 1000 * 1000)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\n" + headers + "\r\n";
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

// This host's first IPv4 address off the loopback interface (network order), or 0.
in_addr_t outside_address() {
  ifaddrs* all = nullptr;
  if (getifaddrs(&all) != 0) return 0;
  in_addr_t found = 0;
  for (ifaddrs* i = all; i && !found; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    const in_addr_t a = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
    if ((ntohl(a) >> 24) != 127) found = a;
  }
  freeifaddrs(all);
  return found;
}

std::string sha256(const std::string& s) {
  std::string d(crypto_hash_sha256_BYTES, '\0');
  crypto_hash_sha256(reinterpret_cast<unsigned char*>(d.data()),
                     reinterpret_cast<const unsigned char*>(s.data()), s.size());
  return d;
}

// outside_address() for a test that needs it; without one a failure under
// NUMASTREAM_REQUIRE_REAL=1 (else the caller skips).
in_addr_t outside_for_test() {
  const in_addr_t outside = outside_address();
  if (const char* r = std::getenv("NUMASTREAM_REQUIRE_REAL");
      !outside && r && std::string(r) == "1") {
    ADD_FAILURE() << "NUMASTREAM_REQUIRE_REAL=1: this host has no IPv4 address off the loopback";
  }
  return outside;
}

const std::string token = "kq3Vt0b9S4m2Yx7LwP1zRfN6cJdHgA8e";

// Limits asking for `token`.
MetricsServer::Limits with_token() {
  if (sodium_init() < 0) ADD_FAILURE() << "libsodium cannot start";
  MetricsServer::Limits limits;
  limits.bearer_sha256 = sha256(token);
  return limits;
}

bool served(const std::string& answer) { return answer.rfind("HTTP/1.0 200 OK", 0) == 0; }
bool refused(const std::string& answer) {
  return answer.rfind("HTTP/1.0 401 Unauthorized", 0) == 0 &&
         answer.find("WWW-Authenticate: Bearer") != std::string::npos &&
         answer.find("numastream_up") == std::string::npos;
}

// With a token's digest set: a client off the loopback interface is served /metrics (and any
// other route) only with that token; near misses of it are refused; /healthz needs none, and
// neither does a client on the loopback interface (the pod's own, kubectl port-forward).
TEST(MetricsServer, AsksAClientOffTheLoopbackForTheToken) {
  const in_addr_t outside = outside_for_test();
  if (!outside) GTEST_SKIP() << "this host has no IPv4 address off the loopback";
  MetricsServer::Limits limits = with_token();
  MetricsServer server(
      "0.0.0.0:0", [] { return std::string("numastream_up 1\n"); }, [] { return true; }, limits,
      [](const std::string& path) -> std::optional<HttpReply> {
        if (path == "/preview") return HttpReply{200, "text/html", "numastream_up picture"};
        return std::nullopt;
      });
  const auto t = std::chrono::milliseconds(2000);
  const int port = server.port();
  auto from_outside = [&](const std::string& path, const std::string& headers) {
    return probe(port, path, t, outside, headers);
  };
  const std::string good = from_outside("/metrics", "Authorization: Bearer " + token + "\r\n");
  EXPECT_TRUE(served(good)) << good;
  EXPECT_NE(good.find("numastream_up 1"), std::string::npos);
  EXPECT_TRUE(served(from_outside("/metrics", "authorization:bearer  " + token + "\r\n")))
      << "header names and the scheme are case-insensitive";
  EXPECT_TRUE(served(from_outside("/preview", "Authorization: Bearer " + token + "\r\n")));
  const std::vector<std::string> near_misses = {
      "",
      "Authorization: Bearer\r\n",
      "Authorization: Bearer " + token.substr(1) + "\r\n",
      "Authorization: Bearer " + token + "x\r\n",
      "Authorization: Basic " + token + "\r\n",
      "Authorization: Bearer " + std::string(7000, 'k') + "\r\n",
      "X-Authorization: Bearer " + token + "\r\n"};
  for (const std::string& headers : near_misses) {
    EXPECT_TRUE(refused(from_outside("/metrics", headers))) << headers.substr(0, 60);
    EXPECT_TRUE(refused(from_outside("/preview", headers))) << headers.substr(0, 60);
  }
  EXPECT_TRUE(served(from_outside("/healthz", ""))) << "the kubelet's probe carries no token";
  EXPECT_TRUE(served(probe(port, "/metrics", t))) << "on the loopback interface";
}

struct TlsAnswer {
  std::string text;     // the answer, or "" if the handshake failed or none came
  std::string subject;  // the server certificate's subject and issuer (one line each)
  std::string issuer;
  int key_type = 0;         // EVP_PKEY_EC, ...
  std::string fingerprint;  // its SHA-256
};

// GET `path` over TLS (verifying nothing: it only looks at the certificate it gets), as a
// Prometheus with insecureSkipVerify does.
TlsAnswer tls_get(int port, const std::string& path, in_addr_t host, const std::string& headers) {
  TlsAnswer a;
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(SSL_CTX_new(TLS_client_method()),
                                                        SSL_CTX_free);
  int fd = connect_to(port, host);
  if (!ctx || fd < 0) return a;
  timeval tv{2, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::unique_ptr<SSL, decltype(&SSL_free)> ssl(SSL_new(ctx.get()), SSL_free);
  SSL_set_fd(ssl.get(), fd);
  if (SSL_connect(ssl.get()) == 1) {
    if (X509* cert = SSL_get1_peer_certificate(ssl.get())) {
      char line[256];
      a.subject = X509_NAME_oneline(X509_get_subject_name(cert), line, sizeof(line));
      a.issuer = X509_NAME_oneline(X509_get_issuer_name(cert), line, sizeof(line));
      a.key_type = EVP_PKEY_get_base_id(X509_get0_pubkey(cert));
      unsigned char md[32];
      unsigned int len = 0;
      X509_digest(cert, EVP_sha256(), md, &len);
      a.fingerprint.assign(reinterpret_cast<char*>(md), len);
      X509_free(cert);
    }
    const std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\n" + headers + "\r\n";
    SSL_write(ssl.get(), req.data(), static_cast<int>(req.size()));
    char buf[4096];
    int n;
    while ((n = SSL_read(ssl.get(), buf, sizeof(buf))) > 0)
      a.text.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return a;
}

// With TLS on: a client off the loopback interface gets its answer (with the token) over TLS, from
// a certificate the server made itself at start (self-signed, a P-256 key, another one for each
// server); over plain HTTP it gets /healthz only, never the metrics even with the token; on the
// loopback interface plain HTTP still serves all. Clients that start a handshake and stall do
// not lock the probe out.
TEST(MetricsServer, ServesClientsOffTheLoopbackOverTlsOnly) {
  const in_addr_t outside = outside_for_test();
  if (!outside) GTEST_SKIP() << "this host has no IPv4 address off the loopback";
  MetricsServer::Limits limits = with_token();
  limits.tls = true;
  limits.max_clients = 8;
  auto metrics = [] { return std::string("numastream_up 1\n"); };
  MetricsServer server(
      "0.0.0.0:0", metrics, [] { return true; }, limits);
  const int port = server.port();
  const std::string bearer = "Authorization: Bearer " + token + "\r\n";

  const TlsAnswer good = tls_get(port, "/metrics", outside, bearer);
  EXPECT_TRUE(served(good.text)) << good.text;
  EXPECT_NE(good.text.find("numastream_up 1"), std::string::npos);
  EXPECT_EQ(good.subject, "/CN=numastream-agent");
  EXPECT_EQ(good.issuer, good.subject) << "self-signed";
  EXPECT_EQ(good.key_type, EVP_PKEY_EC);
  EXPECT_TRUE(refused(tls_get(port, "/metrics", outside, "").text)) << "TLS is no token";
  EXPECT_TRUE(served(tls_get(port, "/healthz", outside, "").text));

  const std::string plain =
      probe(port, "/metrics", std::chrono::milliseconds(2000), outside, bearer);
  EXPECT_EQ(plain.rfind("HTTP/1.0 403 Forbidden", 0), 0U) << plain;
  EXPECT_EQ(plain.find("numastream_up"), std::string::npos);
  EXPECT_TRUE(served(probe(port, "/healthz", std::chrono::milliseconds(1000), outside)))
      << "the kubelet's probe, plain";
  EXPECT_TRUE(served(probe(port, "/metrics", std::chrono::milliseconds(1000))))
      << "on the loopback interface, plain";
  EXPECT_TRUE(served(tls_get(port, "/metrics", htonl(INADDR_LOOPBACK), "").text))
      << "on the loopback interface, TLS";

  // More stalled handshakes than slots (a record header and nothing more), then the probe.
  Idle stalled;
  for (int i = 0; i < 12; ++i) {
    int fd = connect_to(port, outside);
    ASSERT_GE(fd, 0);
    (void)!::send(fd, "\x16\x03\x01", 3, MSG_NOSIGNAL);
    stalled.fds.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_TRUE(served(probe(port, "/healthz", std::chrono::milliseconds(1000), outside)));

  // Another server, with metrics too long for the socket's buffers: TLS clients that ask and go
  // away while it answers make its writes fail, and it serves on. It made a key and certificate
  // of its own.
  MetricsServer another(
      "127.0.0.1:0", [] { return std::string(8 << 20, '#'); }, [] { return true; }, limits);
  for (int i = 0; i < 3; ++i) {
    std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(SSL_CTX_new(TLS_client_method()),
                                                          SSL_CTX_free);
    const int fd = connect_to(another.port());
    ASSERT_GE(fd, 0);
    std::unique_ptr<SSL, decltype(&SSL_free)> ssl(SSL_new(ctx.get()), SSL_free);
    SSL_set_fd(ssl.get(), fd);
    ASSERT_EQ(SSL_connect(ssl.get()), 1);
    const std::string req = "GET /metrics HTTP/1.1\r\n\r\n";
    SSL_write(ssl.get(), req.data(), static_cast<int>(req.size()));
    char some[4096];
    SSL_read(ssl.get(), some, sizeof(some));
    ::close(fd);  // unread data: the client's kernel answers the server's next write with RST
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const TlsAnswer after = tls_get(another.port(), "/healthz", htonl(INADDR_LOOPBACK), "");
  EXPECT_TRUE(served(after.text));
  EXPECT_NE(after.fingerprint, good.fingerprint) << "each server makes its own key and certificate";
}

}  // namespace
}  // namespace numastream
