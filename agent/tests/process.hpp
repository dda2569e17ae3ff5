// Test helpers: run the real agent binary as a child process, find free ports, fetch a URL.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "temp_dir.hpp"

namespace numastream::testing {

class Process {
 public:
  explicit Process(const std::vector<std::string>& argv);
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  // Exit code; 128 + signal number when killed by a signal; -1 when `timeout` passed first (the
  // process is then killed).
  int wait(std::chrono::milliseconds timeout);
  void signal(int sig);
  bool running();
  std::string out() const;  // everything written to stdout so far
  std::string err() const;

 private:
  pid_t pid_ = -1;
  int status_ = -1;
  std::string out_path_;
  std::string err_path_;
};

// Whether this run must be real (NUMASTREAM_REQUIRE_REAL=1, as .ci/run sets): a test that cannot
// run its real parts here then fails instead of skipping.
bool require_real();
// Skips the current test saying why, or fails it when the run must be real.
#define NUMASTREAM_SKIP_OR_FAIL(why)                                                           \
  do {                                                                                         \
    if (::numastream::testing::require_real()) FAIL() << "NUMASTREAM_REQUIRE_REAL=1: " << why; \
    GTEST_SKIP() << why;                                                                       \
  } while (0)

// The agent's command lines on 127.0.0.1 with 1 MiB chunks: a receiver (idle limit 20 s) and a
// sender (10 s to connect), then `extra` (a flag given again in `extra` wins).
std::vector<std::string> receiver(int port, int connections, std::vector<std::string> extra = {});
std::vector<std::string> sender(int port, int connections, std::vector<std::string> extra = {});

// Polls `cond` every `every` until it holds (true) or `deadline` passes (false): a test waits for
// what it needs, as long as a loaded machine takes, and no longer.
bool eventually(const std::function<bool()>& cond,
                std::chrono::milliseconds deadline = std::chrono::seconds(60),
                std::chrono::milliseconds every = std::chrono::milliseconds(25));

// Waits until an agent started with `--metrics-listen 127.0.0.1:0` reports at least `at_least`
// for the metric sample `sample` (its name and labels as /metrics prints them); false when the
// agent stopped or `deadline` passed first. For a test that acts once a stream is under way.
bool metric_reaches(Process& agent, const std::string& sample, double at_least,
                    std::chrono::milliseconds deadline);
// An endless sender under way: the receiver acknowledged `chunks` of its stream.
inline bool acknowledged(Process& tx, int chunks) {
  return metric_reaches(tx, R"(numastream_chunks_acknowledged{role="send"})", chunks,
                        std::chrono::seconds(60));
}

// A base port with `count` consecutive free TCP ports on 127.0.0.1.
int free_ports(int count);
// GET http://127.0.0.1:port/path; returns "<status code>\n<body>" or "" when unreachable.
std::string http_get(int port, const std::string& path);

// A small filesystem for a disk-full test: a tmpfs of `size` (mount's syntax, e.g. "8m") mounted on
// `dir` (root only) and unmounted, lazily, with this object. mounted() says whether mount worked.
class Tmpfs {
 public:
  Tmpfs(std::string dir, const std::string& size);
  ~Tmpfs();
  Tmpfs(const Tmpfs&) = delete;
  Tmpfs& operator=(const Tmpfs&) = delete;
  bool mounted() const { return mounted_; }

 private:
  std::string dir_;
  bool mounted_ = false;
};
// The run's summary: the last line an agent printed on stdout, as JSON (null when none).
nlohmann::json summary(const Process& p);
// tcp://127.0.0.1:port
std::string ep(int port);
std::string read_file(const std::string& path);

}  // namespace numastream::testing
