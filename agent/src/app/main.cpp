// numastream-agent: the data plane. This file only parses the command line.
#include <dirent.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "app/bench.hpp"
#include "app/codec_tool.hpp"
#include "app/detector_sim.hpp"
#include "app/forward.hpp"
#include "base/error.hpp"
#include "base/log.hpp"
#include "config/cli.hpp"
#include "host/cpuset.hpp"
#include "host/topology.hpp"
#include "net/transport.hpp"
#include "pipeline/pipeline.hpp"
#include "pipeline/pools.hpp"
#include "wire/wire.hpp"

namespace {

using namespace numastream;

constexpr const char* kUsage =
    "usage: numastream-agent COMMAND [flags]\n"
    "commands:\n"
    "  send       source -> compress -> send over N TCP connections\n"
    "  receive    receive -> decompress -> verify -> sink\n"
    "  topology   print NUMA nodes, allowed CPUs and NICs as JSON [--sysfs-root DIR]\n"
    "  bench      codec speeds and loopback runs [codec|loopback|all] [--json]\n"
    "  codec      encode|decode a file with one of the agent's codecs (bslz4: HDF5 filter 32008)\n"
    "  synth      synthetic tomography projections into a file: --out F [--chunk-bytes N]\n"
    "             [--width W] [--frames K] [--seed S] [--flat-field COUNTS] [--attenuation MU]\n"
    "  check-config send|receive [flags]   validate a configuration and exit (0 valid, 2 not)\n"
    "  keygen     a CURVE key pair: --out PREFIX writes PREFIX.secret (mode 0600) and "
    "PREFIX.public\n"
    "  detector-sim  a DECTRIS Stream V2 detector: --endpoint tcp://*:31001 --replay DIR\n"
    "             [--series N] [--start] [--rate-hz R] (recorded messages, one per file)\n"
    "  forward    a bare ZeroMQ PULL -> PUSH forwarder, the benchmarks' bound: --from ENDPOINT\n"
    "             [--to ENDPOINT] [--messages N]; or the bare producer: --blast BYTES --to "
    "ENDPOINT\n"
    "             --messages N\n"
    "  version    print the agent and wire-format versions (also --version)\n";

// SIGINT/SIGTERM request a drain: blocked in every thread, taken by one waiting thread.
class SignalDrain {
 public:
  SignalDrain() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
    thread_ = std::jthread([this](const std::stop_token& st) {
      timespec tick{0, 200'000'000};
      while (!st.stop_requested()) {
        int sig = sigtimedwait(&set_, nullptr, &tick);
        if (sig == SIGINT || sig == SIGTERM) {
          log_info("signal " + std::to_string(sig) + ": draining");
          set_drain_signal(sig);
          source_.request_stop();
        }
      }
    });
  }
  std::stop_token token() const { return source_.get_token(); }

 private:
  sigset_t set_{};
  std::stop_source source_;
  std::jthread thread_;
};

int run_pipeline(Role role, const std::vector<std::string>& args) {
  for (const auto& a : args) {
    if (a == "--help" || a == "-h") {
      std::cout << "usage: numastream-agent " << (role == Role::send ? "send" : "receive")
                << " [flags]\n"
                << run_usage();
      return kExitOk;
    }
  }
  Config cfg;
  std::vector<std::string> rest = args;
  std::string summary_file;
  try {
    summary_file = take_summary_file(rest);
    cfg = parse_config(config_from_args(rest), role);
  } catch (const ConfigError& e) {
    log_error(e.what());
    return kExitUsage;
  }
  SignalDrain signals;
  // A start-up failure (a key file, the sink or state directory) propagates to main, which
  // names it and exits 2 for a configuration error, 1 otherwise.
  RunResult r =
      role == Role::send ? run_sender(cfg, signals.token()) : run_receiver(cfg, signals.token());
  std::cout << r.summary.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
            << std::endl;
  if (!summary_file.empty()) {
    // In a pod: /dev/termination-log, so the operator reads the figures after the exit.
    std::ofstream f(summary_file, std::ios::trunc);
    f << termination_summary(r.summary) << '\n';
    if (!f.flush()) {
      log_warn("cannot write the summary to " + summary_file + ": " + errno_text(errno));
    }
  }
  return r.exit_code;
}

int run_topology(const std::vector<std::string>& args) {
  std::string root = "/sys";
  bool pretty = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--sysfs-root" && i + 1 < args.size()) {
      root = args[++i];
    } else if (args[i].rfind("--sysfs-root=", 0) == 0) {
      root = args[i].substr(13);
    } else if (args[i] == "--pretty") {
      pretty = true;
    } else {
      std::fprintf(stderr, "numastream-agent topology: unknown flag '%s'\n", args[i].c_str());
      return kExitUsage;
    }
  }
  auto json = topology_to_json(read_topology(root), allowed_cpus());
  std::cout << json.dump(pretty ? 2 : -1) << std::endl;
  return kExitOk;
}

// Writes a new CURVE key pair. The secret key goes only to a file readable by its owner.
int run_keygen(const std::vector<std::string>& args) {
  if (args.size() != 2 || args[0] != "--out") {
    std::fprintf(stderr, "usage: numastream-agent keygen --out PREFIX\n");
    return kExitUsage;
  }
  auto keys = zmq::curve_keypair();
  const std::string secret = args[1] + ".secret", pub = args[1] + ".public";
  int fd = ::open(secret.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw std::runtime_error("cannot write " + secret + ": " + errno_text(errno));
  std::string line = keys.secret_key + "\n";
  bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  ::close(fd);
  if (!ok) throw std::runtime_error("cannot write " + secret);
  std::ofstream(pub) << keys.public_key << "\n";
  std::cout << keys.public_key << "\n";
  return kExitOk;
}

// `COMMAND --help` (or -h) for the commands without flags of their own to describe: the command's
// lines of the usage text, on stdout. False when kUsage has no such command.
bool print_command_help(const std::string& cmd) {
  std::istringstream in(kUsage);
  std::string line, text;
  bool on = false;
  while (std::getline(in, line)) {
    if (line.rfind("  " + cmd + " ", 0) == 0) {
      on = true;
    } else if (on && line.rfind("             ", 0) != 0) {
      break;  // the next command (its continuation lines are indented further)
    }
    if (on) text += line + "\n";
  }
  if (text.empty()) return false;
  std::cout << "usage: numastream-agent " << cmd << " [flags]\n" << text;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  // Messages of up to megabytes (a detector's images, chunks) are allocated and freed thousands of
  // times a second, by ZeroMQ as they arrive: memory freed stays with the process for the next
  // one, instead of going back to the kernel and being faulted in and cleared again (page faults
  // were a sixth of a gateway's CPU time). What is kept is what the process needed at its peak.
  // NOLINTBEGIN(concurrency-mt-unsafe): first thing in main, before any thread starts
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  // NOLINTEND(concurrency-mt-unsafe)
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::cout << kUsage;
    return args.empty() ? kExitUsage : kExitOk;
  }
  std::string cmd = args[0];
  args.erase(args.begin());
  const bool help = std::find(args.begin(), args.end(), "--help") != args.end() ||
                    std::find(args.begin(), args.end(), "-h") != args.end();
  if (help && cmd != "send" && cmd != "receive" && print_command_help(cmd)) return kExitOk;
  try {
    if (cmd == "send") return run_pipeline(Role::send, args);
    if (cmd == "receive") return run_pipeline(Role::receive, args);
    if (cmd == "topology") return run_topology(args);
    if (cmd == "check-config") {
      if (args.empty() || (args[0] != "send" && args[0] != "receive")) {
        std::fprintf(stderr, "usage: numastream-agent check-config send|receive [flags]\n");
        return kExitUsage;
      }
      Role role = args[0] == "send" ? Role::send : Role::receive;
      args.erase(args.begin());
      const Config c = parse_config(config_from_args(args), role);
      std::cout << "valid " << (role == Role::send ? "send" : "receive") << " configuration\n"
                << "buffer pools: " << planned_pool_bytes(c)
                << " bytes per NUMA node of the codec stage\n";
      return kExitOk;
    }
    if (cmd == "bench") return run_bench(args);
    if (cmd == "codec") return run_codec_tool(args);
    if (cmd == "synth") return run_synth_tool(args);
    if (cmd == "keygen") return run_keygen(args);
    if (cmd == "detector-sim") return run_detector_sim(args);
    if (cmd == "forward") return run_forward(args);
    if (cmd == "version" || cmd == "--version") {
      std::cout << "numastream-agent " NUMASTREAM_VERSION " (wire format "
                << static_cast<int>(wire::kVersion) << ")\n";
      return kExitOk;
    }
  } catch (const ConfigError& e) {
    log_error(e.what());
    return kExitUsage;
  } catch (const std::exception& e) {
    log_error(e.what());
    return kExitFailure;
  }
  std::fprintf(stderr, "numastream-agent: unknown command '%s'\n%s", cmd.c_str(), kUsage);
  return kExitUsage;
}
