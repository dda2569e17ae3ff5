// A wide-area link between two network namespaces for the tests (fault tests, and the facility
// in a box through the `delay-line` tool): real round trip, loss and bottleneck as TCP sees them,
// on a kernel without sch_netem. Needs root. Internal to the tests.
#pragma once

#include <fcntl.h>
#include <linux/if_tun.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace numastream::testing {

// A wide-area link in a box: IP packets between two namespaces through a TUN device in each,
// held `delay` each way and dropped with probability `loss`, and, with a `rate` (bytes/s), sent
// one after the other at that rate through a queue of 50 ms (dropped when it is full), so the
// TCP connections across it see a real round trip, real loss and a real bottleneck (what netem
// does, for a kernel without sch_netem). Side a is `ip_a`, side b `ip_b` (point to point).
// Packets are moved by one thread per direction.
class DelayLine {
 public:
  DelayLine(const std::string& ns_a, const std::string& ns_b, const std::string& ip_a,
            const std::string& ip_b, std::chrono::microseconds delay, double loss, int n,
            double rate = 0)
      : delay_(delay), loss_(loss), rate_(rate) {
    const std::string dev_a = "dla" + std::to_string(n), dev_b = "dlb" + std::to_string(n);
    a_ = open_tun(ns_a, dev_a);
    b_ = open_tun(ns_b, dev_b);
    if (a_ < 0 || b_ < 0) {
      why = "cannot open a TUN device (/dev/net/tun): " + std::string(std::strerror(errno));
      return;
    }
    for (const auto& [ns, dev, self, peer] :
         {std::tuple{ns_a, dev_a, ip_a, ip_b}, std::tuple{ns_b, dev_b, ip_b, ip_a}}) {
      for (const std::string& step :
           {"ip -n " + ns + " addr add " + self + " peer " + peer + " dev " + dev,
            "ip -n " + ns + " link set " + dev + " up"}) {
        std::string out;
        if (run(step, out) != 0) {
          why = "the host refused: " + step + ": " + out;
          return;
        }
      }
    }
    threads_.emplace_back([this] { carry(a_, b_, 1); });
    threads_.emplace_back([this] { carry(b_, a_, 2); });
    ok = true;
  }
  ~DelayLine() {
    stop_ = true;
    for (auto& t : threads_) t.join();
    if (a_ >= 0) ::close(a_);
    if (b_ >= 0) ::close(b_);
  }
  DelayLine(const DelayLine&) = delete;
  DelayLine& operator=(const DelayLine&) = delete;

  std::uint64_t carried() const { return carried_; }
  std::uint64_t dropped() const { return dropped_; }
  bool ok = false;
  std::string why;

 private:
  // A command's exit status, its output in `out`.
  static int run(const std::string& cmd, std::string& out) {
    FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
    if (!p) return -1;
    char buf[256];
    while (std::fgets(buf, sizeof(buf), p)) out += buf;
    const int rc = ::pclose(p);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  }

  static int open_tun(const std::string& ns, const std::string& dev) {
    int fd = -1;
    std::thread([&] {  // the device belongs to the namespace of the thread that makes it
      const int nsfd = ::open(("/var/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
      if (nsfd < 0) return;
      const bool in = ::setns(nsfd, CLONE_NEWNET) == 0;
      ::close(nsfd);
      if (!in) return;
      fd = ::open("/dev/net/tun", O_RDWR | O_CLOEXEC | O_NONBLOCK);
      if (fd < 0) return;
      ifreq r{};
      r.ifr_flags = IFF_TUN | IFF_NO_PI;
      std::strncpy(r.ifr_name, dev.c_str(), IFNAMSIZ - 1);
      if (::ioctl(fd, TUNSETIFF, &r) != 0) {
        ::close(fd);
        fd = -1;
      }
    })
        .join();
    return fd;
  }

  // Packets read from `from` are written to `to` `delay_` later, in order; a lost one never.
  void carry(int from, int to, std::uint64_t seed) {
    struct Packet {
      std::chrono::steady_clock::time_point due;
      std::vector<char> bytes;
    };
    std::deque<Packet> q;
    auto free_at = std::chrono::steady_clock::now();  // when the bottleneck has sent what it holds
    const auto queue_limit = std::chrono::milliseconds(50);
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> coin(0, 1);
    std::vector<char> buf(65536);
    while (!stop_) {
      const auto now = std::chrono::steady_clock::now();
      timespec wait{0, 20'000'000};
      if (!q.empty()) {
        const auto left = std::max(std::chrono::nanoseconds(0), q.front().due - now);
        wait = {static_cast<time_t>(left.count() / 1'000'000'000),
                static_cast<long>(left.count() % 1'000'000'000)};
      }
      pollfd p{from, POLLIN, 0};
      ::ppoll(&p, 1, &wait, nullptr);
      for (int i = 0; i < 256; ++i) {
        const ssize_t n = ::read(from, buf.data(), buf.size());
        if (n <= 0) break;
        auto at = std::chrono::steady_clock::now();
        if (rate_ > 0) {
          if (free_at - at > queue_limit) {  // the bottleneck's queue is full
            ++dropped_;
            continue;
          }
          free_at = std::max(free_at, at) +
                    std::chrono::nanoseconds(static_cast<std::int64_t>(n * 1e9 / rate_));
          at = free_at;
        }
        if (coin(rng) < loss_ || q.size() >= 100000) {
          ++dropped_;
          continue;
        }
        q.push_back({at + delay_, std::vector<char>(buf.begin(), buf.begin() + n)});
      }
      const auto then = std::chrono::steady_clock::now();
      while (!q.empty() && q.front().due <= then) {
        if (::write(to, q.front().bytes.data(), q.front().bytes.size()) > 0) ++carried_;
        q.pop_front();
      }
    }
  }

  std::chrono::microseconds delay_;
  double loss_;
  double rate_;
  int a_ = -1, b_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> carried_{0}, dropped_{0};
  std::vector<std::thread> threads_;
};

}  // namespace numastream::testing
