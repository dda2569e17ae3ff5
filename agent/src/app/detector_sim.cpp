// numastream-agent detector-sim: a DECTRIS Stream V2 detector for tests, demos and benchmarks.
// It binds a PUSH socket, as the detector's DCU does, and sends series: recorded messages
// replayed from a directory (one message per file, in name order), optionally after a start
// message of its own, as many series as asked, at a fixed image rate or as fast as the
// consumer takes them.
#include "app/detector_sim.hpp"

#include <zmq.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "base/error.hpp"
#include "detector/stream2.hpp"
#include "net/transport.hpp"
#include "pipeline/pipeline.hpp"

namespace numastream {
namespace {

namespace fs = std::filesystem;

constexpr const char* kUsage =
    "usage: numastream-agent detector-sim --endpoint tcp://*:31001 --replay DIR\n"
    "           [--series N] [--start] [--rate-hz R] [--linger-s S]\n"
    "  --replay DIR   send the files of DIR (sorted by name), one Stream V2 message each\n"
    "  --series N     send the series N times (default 1)\n"
    "  --start        begin each series with a start message of our own (series id and unique id\n"
    "                 from the first recorded message that has them)\n"
    "  --rate-hz R    at most R messages per second (default: as fast as the consumer takes them)\n"
    "  --linger-s S   after the last message, wait up to S s for a consumer to take what is queued\n"
    "                 (default 60)\n";

std::vector<std::byte> read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw ConfigError("--replay", "cannot read " + p.string());
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(bytes.size());
  std::transform(bytes.begin(), bytes.end(), out.begin(), [](char c) { return static_cast<std::byte>(c); });
  return out;
}

}  // namespace

int run_detector_sim(const std::vector<std::string>& args) {
  std::string endpoint, replay;
  long series = 1;
  bool start = false;
  double rate_hz = 0, linger_s = 60;
  for (std::size_t i = 0; i < args.size(); ++i) {
    auto value = [&](const char* flag) -> std::string {
      if (i + 1 >= args.size()) throw ConfigError(flag, "needs a value");
      return args[++i];
    };
    if (args[i] == "--endpoint") {
      endpoint = value("--endpoint");
    } else if (args[i] == "--replay") {
      replay = value("--replay");
    } else if (args[i] == "--series") {
      series = std::stol(value("--series"));
    } else if (args[i] == "--start") {
      start = true;
    } else if (args[i] == "--rate-hz") {
      rate_hz = std::stod(value("--rate-hz"));
    } else if (args[i] == "--linger-s") {
      linger_s = std::stod(value("--linger-s"));
    } else {
      std::fprintf(stderr, "numastream-agent detector-sim: unknown flag '%s'\n%s", args[i].c_str(), kUsage);
      return kExitUsage;
    }
  }
  if (endpoint.empty() || replay.empty()) {
    std::fputs(kUsage, stderr);
    return kExitUsage;
  }
  if (series < 1) throw ConfigError("--series", "must be at least 1");
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(replay, ec)) {
    if (e.is_regular_file()) files.push_back(e.path());
  }
  if (ec) throw ConfigError("--replay", replay + ": " + ec.message());
  std::sort(files.begin(), files.end());
  if (files.empty()) throw ConfigError("--replay", "directory " + replay + " holds no files");
  std::vector<std::vector<std::byte>> messages;
  for (const auto& f : files) messages.push_back(read_file(f));
  if (start) messages.insert(messages.begin(), stream2::start_for(messages));

  zmq::Context ctx(1, {});
  zmq::Socket sock(ctx, ZMQ_PUSH);
  sock.set_int(ZMQ_SNDHWM, 1000);
  sock.set_int(ZMQ_LINGER, static_cast<int>(linger_s * 1000));
  sock.bind(endpoint);
  std::fprintf(stderr, "detector-sim: %zu messages per series, %ld series, on %s\n", messages.size(), series,
               endpoint.c_str());
  using Clock = std::chrono::steady_clock;
  // The clock starts when the first message is taken (the first send waits for a consumer).
  Clock::time_point t0;
  std::uint64_t sent = 0;
  for (long s = 0; s < series; ++s) {
    for (const auto& m : messages) {
      if (sent == 1) t0 = Clock::now();
      if (rate_hz > 0 && sent > 0) {
        std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(
                                               std::chrono::duration<double>(static_cast<double>(sent - 1) / rate_hz)));
      }
      // Blocks while no consumer is connected or its queue is full: a detector waits the same way.
      if (zmq_send(sock.get(), m.data(), m.size(), 0) < 0) {
        throw std::runtime_error("detector-sim: send: " + zmq::last_error());
      }
      ++sent;
    }
  }
  // Seconds from the first message taken to the last one sent: `messages - 1` intervals.
  const double secs = sent > 1 ? std::chrono::duration<double>(Clock::now() - t0).count() : 0;
  std::printf("{\"role\":\"detector-sim\",\"messages\":%llu,\"series\":%ld,\"seconds\":%.3f}\n",
              static_cast<unsigned long long>(sent), series, secs);
  std::fflush(stdout);
  return kExitOk;
}

}  // namespace numastream
