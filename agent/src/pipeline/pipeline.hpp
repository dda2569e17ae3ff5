// The two pipelines: send (source -> compress xC -> send xS) and receive (receive xR ->
// decompress xD -> sink), each a set of pinned threads joined by bounded queues and NUMA-local
// buffer pools. Both return a summary (one JSON object) and the process exit code.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <stop_token>

#include "config/config.hpp"

namespace numastream {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;    // runtime failure (peer gone, I/O error)
inline constexpr int kExitUsage = 2;      // bad configuration or flags
inline constexpr int kExitIntegrity = 3;  // stream ended with lost or corrupt chunks
// Stopped by a signal before the stream completed: 128 + the signal (143 for SIGTERM, 130 for
// SIGINT), as a shell reports it. Nothing is lost: the stream is paused and resumes when the
// agent runs again. Kubernetes Jobs retry these without counting a failure (podFailurePolicy).
inline constexpr int kExitInterruptedBase = 128;

// The signal that asked this process to drain (0: none). SIGTERM (an orchestrator: node drain,
// eviction, deletion) pauses every stream; SIGINT (a person at a terminal) ends an endless
// stream and pauses one with an end.
int drain_signal() noexcept;
void set_drain_signal(int sig) noexcept;

struct RunResult {
  nlohmann::json summary;
  int exit_code = kExitOk;
};

// Callbacks for embedding (tests, bench): `on_metrics_port` is told the bound metrics port.
struct RunHooks {
  std::function<void(int)> on_metrics_port;
};

RunResult run_sender(const Config& cfg, std::stop_token stop, const RunHooks& hooks = {});
RunResult run_receiver(const Config& cfg, std::stop_token stop, const RunHooks& hooks = {});

}  // namespace numastream
