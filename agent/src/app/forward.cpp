// numastream-agent forward: what a detector's messages cost when nothing but ZeroMQ touches
// them. A PULL socket connected to --from, each message handed to a PUSH socket bound at --to as
// the same zmq_msg_t (no copy, no parsing, no checksum, no acknowledgement), or dropped when --to
// is absent (a consumer that only takes them). It stops after --messages N, or at SIGINT, and
// prints {"messages", "bytes", "seconds"} (from the first message taken to the last). make
// bench-stream2 runs it beside the sender, on the same messages, as the bound the issue sets.
// With --blast BYTES it is the bare producer instead: a PUSH socket bound at --to sends
// --messages messages of BYTES (each a new message filled from one buffer, as a producer fills
// them), the bound of a sender of raw chunks that size.
#include "app/forward.hpp"

#include <zmq.h>

#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "net/transport.hpp"
#include "pipeline/pipeline.hpp"

namespace numastream {
namespace {

constexpr const char* kUsage =
    "usage: numastream-agent forward --from tcp://HOST:PORT [--to tcp://*:PORT] [--messages N]\n"
    "       numastream-agent forward --blast BYTES --to tcp://*:PORT --messages N\n"
    "  --from      a PUSH endpoint to pull from (a detector's)\n"
    "  --to        bind a PUSH socket there and pass each message on, uncopied; absent: drop it\n"
    "  --messages  stop after N messages (default: at SIGINT)\n"
    "  --blast     send N messages of BYTES each from the PUSH socket at --to (no --from)\n";

volatile std::sig_atomic_t stop_requested = 0;
void on_signal(int) { stop_requested = 1; }

void print_summary(const char* role, std::uint64_t messages, std::uint64_t bytes, double secs) {
  std::printf("{\"role\":\"%s\",\"messages\":%llu,\"bytes\":%llu,\"seconds\":%.3f}\n", role,
              static_cast<unsigned long long>(messages), static_cast<unsigned long long>(bytes),
              secs);
  std::fflush(stdout);
}

// --blast: `count` messages of `size` bytes from a PUSH socket bound at `to`, once a peer takes
// them (ZeroMQ holds the first until one connects).
int blast(zmq::Context& ctx, const std::string& to, std::size_t size, std::uint64_t count) {
  zmq::Socket push(ctx, ZMQ_PUSH);
  push.set_int(ZMQ_SNDHWM, 1000);
  push.set_int(ZMQ_LINGER, 60000);
  push.bind(to);
  std::vector<std::byte> frame(size);
  for (std::size_t i = 0; i < size; ++i) frame[i] = static_cast<std::byte>((i * 131) >> 3);
  using Clock = std::chrono::steady_clock;
  Clock::time_point t0;
  std::uint64_t sent = 0;
  while (!stop_requested && sent < count) {
    zmq_msg_t msg;
    zmq_msg_init_size(&msg, size);
    std::memcpy(zmq_msg_data(&msg), frame.data(), size);
    if (zmq_msg_send(&msg, push.get(), 0) < 0) {
      zmq_msg_close(&msg);
      if (zmq_errno() == EINTR) continue;
      throw std::runtime_error("forward --blast: send to " + to + ": " + zmq::last_error());
    }
    if (sent++ == 0) t0 = Clock::now();
  }
  const double secs = sent > 1 ? std::chrono::duration<double>(Clock::now() - t0).count() : 0;
  print_summary("blast", sent, sent * size, secs);
  return kExitOk;
}

}  // namespace

int run_forward(const std::vector<std::string>& args) {
  std::string from, to;
  std::uint64_t limit = 0;
  std::size_t blast_bytes = 0;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return kExitOk;
    }
    if (i + 1 >= args.size()) throw ConfigError(a, "needs a value\n" + std::string(kUsage));
    const std::string& v = args[++i];
    if (a == "--from") {
      from = v;
    } else if (a == "--to") {
      to = v;
    } else if (a == "--messages" || a == "--blast") {
      std::uint64_t n = 0;
      auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
      if (ec != std::errc() || end != v.data() + v.size()) {
        throw ConfigError(a, "\"" + v + "\" is not a count");
      }
      (a == "--messages" ? limit : blast_bytes) = n;
    } else {
      throw ConfigError(a, "unknown flag (--from, --to, --messages, --blast)");
    }
  }
  if (blast_bytes > 0) {
    if (!from.empty() || to.empty() || limit == 0) {
      throw ConfigError("--blast", "takes --to and --messages, and no --from");
    }
    if (blast_bytes > (std::size_t{1} << 30)) throw ConfigError("--blast", "at most 1 GiB");
  } else if (from.empty()) {
    throw ConfigError("--from", "is required\n" + std::string(kUsage));
  }
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  zmq::Context ctx(1, {});
  if (blast_bytes > 0) return blast(ctx, to, blast_bytes, limit);
  zmq::Socket pull(ctx, ZMQ_PULL);
  pull.set_int(ZMQ_RCVHWM, 1000);
  pull.set_int(ZMQ_LINGER, 0);
  pull.connect(from);
  std::optional<zmq::Socket> push;
  if (!to.empty()) {
    push.emplace(ctx, ZMQ_PUSH);
    push->set_int(ZMQ_SNDHWM, 1000);
    push->set_int(ZMQ_LINGER, 60000);
    push->bind(to);
  }
  using Clock = std::chrono::steady_clock;
  Clock::time_point t0, last;
  std::uint64_t messages = 0, bytes = 0;
  zmq_msg_t msg;
  zmq_msg_init(&msg);
  while (!stop_requested && (limit == 0 || messages < limit)) {
    zmq_pollitem_t item{pull.get(), 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, 100) <= 0) continue;
    if (zmq_msg_recv(&msg, pull.get(), ZMQ_DONTWAIT) < 0) continue;
    if (messages == 0) t0 = Clock::now();
    bytes += zmq_msg_size(&msg);
    ++messages;
    last = Clock::now();
    // zmq_msg_send moves the message to the socket (the message is empty afterwards).
    if (push && zmq_msg_send(&msg, push->get(), 0) < 0 && zmq_errno() != EINTR) {
      zmq_msg_close(&msg);
      throw std::runtime_error("forward: send to " + to + ": " + zmq::last_error());
    }
  }
  zmq_msg_close(&msg);
  const double secs = messages > 1 ? std::chrono::duration<double>(last - t0).count() : 0;
  print_summary("forward", messages, bytes, secs);
  return kExitOk;
}

}  // namespace numastream
