#include "process.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

namespace numastream::testing {

std::vector<std::string> receiver(int port, int connections, std::vector<std::string> extra) {
  std::vector<std::string> a = {NUMASTREAM_AGENT, "receive",
                                "--endpoint",     ep(port),
                                "--connections",  std::to_string(connections),
                                "--chunk-bytes",  std::to_string(1 << 20),
                                "--idle-timeout", "20"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::vector<std::string> sender(int port, int connections, std::vector<std::string> extra) {
  std::vector<std::string> a = {NUMASTREAM_AGENT,    "send",
                                "--endpoint",        ep(port),
                                "--connections",     std::to_string(connections),
                                "--chunk-bytes",     std::to_string(1 << 20),
                                "--connect-timeout", "10"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

bool require_real() {
  const char* real = std::getenv("NUMASTREAM_REQUIRE_REAL");
  return real != nullptr && std::string(real) == "1";
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Process::Process(const std::vector<std::string>& argv) {
  std::string dir = temp_dir();
  out_path_ = dir + "/stdout";
  err_path_ = dir + "/stderr";
  // posix_spawn, not fork and then exec: the tests start agents while threads of theirs run
  // (consumers, watchers), and a forked child that allocates before its exec waits forever on a
  // lock another thread held at the fork (seen under ASan: a sender that never started, its
  // stderr empty, killed by the SIGINT it could not yet handle).
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t io;
  posix_spawn_file_actions_init(&io);
  posix_spawn_file_actions_addopen(&io, 1, out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&io, 2, err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  // A bare name is looked up in PATH.
  const int rc = posix_spawnp(&pid_, args[0], &io, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&io);
  if (rc != 0) throw std::runtime_error("cannot start " + argv.at(0) + ": " + std::strerror(rc));
}

Process::~Process() {
  if (running()) {
    ::kill(pid_, SIGKILL);
    waitpid(pid_, &status_, 0);
  }
}

bool Process::running() {
  if (status_ != -1) return false;
  int st = 0;
  pid_t r = waitpid(pid_, &st, WNOHANG);
  if (r == pid_) {
    status_ = st;
    return false;
  }
  return true;
}

int Process::wait(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (running()) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid_, SIGKILL);
      waitpid(pid_, &status_, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (WIFEXITED(status_)) return WEXITSTATUS(status_);
  if (WIFSIGNALED(status_)) return 128 + WTERMSIG(status_);
  return -2;
}

void Process::signal(int sig) {
  if (running()) ::kill(pid_, sig);
}

std::string Process::out() const { return read_file(out_path_); }
std::string Process::err() const { return read_file(err_path_); }

namespace {
bool port_free(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

// The first port of the kernel's ephemeral range (32768 when it cannot be read).
int ephemeral_low() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int first = 0;
  return in >> first && first > 0 ? first : 32768;
}
}  // namespace

int free_ports(int count) {
  // Ports a test listens on lie below the kernel's ephemeral range (ip_local_port_range, from
  // which every outgoing connection of the tests beside it takes its source port: a port found
  // free there was taken by a connection before the listener bound it, "Address already in use")
  // and below Kubernetes' NodePort range (30000-32767), above the well-known services' ports.
  // Seeded from the kernel's entropy, the pid and the clock together: pid ^ seconds gave two test
  // processes started a second apart with consecutive pids the same seed, so the same ports (a
  // sender then streamed into another test's receiver).
  static std::mt19937 rng = [] {
    std::random_device rd;
    std::seed_seq seq{
        rd(), rd(), static_cast<unsigned>(getpid()),
        static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count())};
    return std::mt19937(seq);
  }();
  const int low = 15000, high = std::min(30000, ephemeral_low()) - count;
  if (high <= low) throw std::runtime_error("no port range below the ephemeral ports");
  for (int attempt = 0; attempt < 200; ++attempt) {
    int base = low + static_cast<int>(rng() % static_cast<unsigned>(high - low));
    bool ok = true;
    for (int i = 0; i < count && ok; ++i) ok = port_free(base + i);
    if (ok) return base;
  }
  throw std::runtime_error("no free port range");
}

bool eventually(const std::function<bool()>& cond, std::chrono::milliseconds deadline,
                std::chrono::milliseconds every) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(every);
  }
  return true;
}

bool metric_reaches(Process& agent, const std::string& sample, double at_least,
                    std::chrono::milliseconds deadline) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  const std::string announce = "metrics on port ";
  int port = -1;
  while (std::chrono::steady_clock::now() < until && agent.running()) {
    if (port < 0) {
      const std::string err = agent.err();
      const auto at = err.find(announce);
      if (at != std::string::npos) port = std::atoi(err.c_str() + at + announce.size());
    }
    if (port > 0) {
      std::istringstream text(http_get(port, "/metrics"));
      for (std::string line; std::getline(text, line);) {
        if (line.size() > sample.size() && line.compare(0, sample.size(), sample) == 0 &&
            line[sample.size()] == ' ' && std::atof(line.c_str() + sample.size() + 1) >= at_least) {
          return true;
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

std::string http_get(int port, const std::string& path) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return "";
  }
  std::string req = "GET " + path + " HTTP/1.0\r\n\r\n";
  (void)!::write(fd, req.data(), req.size());
  std::string resp;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) resp.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  auto sp = resp.find(' ');
  auto body = resp.find("\r\n\r\n");
  if (sp == std::string::npos || body == std::string::npos) return "";
  return resp.substr(sp + 1, 3) + "\n" + resp.substr(body + 4);
}

nlohmann::json summary(const Process& p) {
  std::string out = p.out();
  auto end = out.find_last_not_of('\n');
  if (end == std::string::npos) return nlohmann::json();
  auto start = out.rfind('\n', end);
  return nlohmann::json::parse(out.substr(start == std::string::npos ? 0 : start + 1, end + 1),
                               nullptr, false);
}

std::string ep(int port) { return "tcp://127.0.0.1:" + std::to_string(port); }

Tmpfs::Tmpfs(std::string dir, const std::string& size) : dir_(std::move(dir)) {
  mounted_ =
      std::system(("mount -t tmpfs -o size=" + size + " numastream-test " + dir_).c_str()) == 0;
}

Tmpfs::~Tmpfs() {
  if (mounted_) std::system(("umount -l " + dir_).c_str());
}

}  // namespace numastream::testing
