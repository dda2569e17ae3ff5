// What the end-to-end tests of Stream V2 and of fan-out share: the real EIGER2 recordings, the
// series the detector simulator sends from them, and a reader written for the detector (or for
// numastream frames): a PULL socket.
#pragma once

#include <zmq.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include "detector/stream2.hpp"

namespace numastream::testing {

// The recordings (../shared/data/dectris-stream-v2 next to the repository, or
// NUMASTREAM_STREAM2_DATA). Empty when absent.
inline std::string recordings() {
  if (const char* d = std::getenv("NUMASTREAM_STREAM2_DATA"); d && *d) return d;
  return std::filesystem::exists(NUMASTREAM_STREAM2_DATA) ? NUMASTREAM_STREAM2_DATA : "";
}

inline std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A directory's entries in name order.
inline std::vector<std::filesystem::path> files_of(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// What the detector simulator sends for `dir` with --start: its start message, then the files.
inline std::vector<std::string> expected_series(const std::filesystem::path& dir) {
  std::vector<std::string> out;
  std::vector<std::vector<std::byte>> series;
  for (const auto& f : files_of(dir)) {
    out.push_back(read_bytes(f));
    auto bytes = std::as_bytes(std::span(out.back().data(), out.back().size()));
    series.emplace_back(bytes.begin(), bytes.end());
  }
  auto start = stream2::start_for(series);
  out.insert(out.begin(), std::string(reinterpret_cast<const char*>(start.data()), start.size()));
  return out;
}

// A PULL socket connected to (or, with `bind`, bound on) `endpoint`; `hwm` > 0 caps what it
// queues (a reader that stops then holds its sender back at once).
struct Consumer {
  void* ctx = zmq_ctx_new();
  void* pull = zmq_socket(ctx, ZMQ_PULL);
  explicit Consumer(const std::string& endpoint, bool bind = false, int hwm = 0) {
    int zero = 0;
    zmq_setsockopt(pull, ZMQ_LINGER, &zero, sizeof(zero));
    if (hwm > 0) zmq_setsockopt(pull, ZMQ_RCVHWM, &hwm, sizeof(hwm));
    if (bind) {
      zmq_bind(pull, endpoint.c_str());
    } else {
      zmq_connect(pull, endpoint.c_str());
    }
  }
  ~Consumer() {
    zmq_close(pull);
    zmq_ctx_term(ctx);
  }
  Consumer(const Consumer&) = delete;
  Consumer& operator=(const Consumer&) = delete;
  // Up to `count` messages, waiting at most `timeout` in all.
  std::vector<std::string> take(std::size_t count, std::chrono::seconds timeout) {
    std::vector<std::string> got;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (got.size() < count && std::chrono::steady_clock::now() < deadline) {
      zmq_pollitem_t item{pull, 0, ZMQ_POLLIN, 0};
      if (zmq_poll(&item, 1, 200) <= 0) continue;
      zmq_msg_t m;
      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, pull, 0) >= 0)
        got.emplace_back(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
      zmq_msg_close(&m);
    }
    return got;
  }
};

}  // namespace numastream::testing
