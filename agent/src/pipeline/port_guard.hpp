// Who may use a gateway's data ports (security.*): the senders' keys (CURVE, or authenticate
// mode's pair token), the address blocks of security.allow_from and the consumers a Stream V2
// re-emit admits, applied by ZeroMQ's authentication handler, which counts what it refused. One
// part of the receiving side (receiver.hpp).
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "config/config.hpp"
#include "net/transport.hpp"
#include "pipeline/runtime.hpp"

namespace numastream {

class PortGuard {
 public:
  explicit PortGuard(const Config& cfg) : cfg_(cfg) {}
  // Reads the keys; a ConfigError names a key that cannot be used.
  void load();
  // Starts the authentication handler on `ctx` when anything is to be checked.
  void start(zmq::Context& ctx);
  // Makes `sock` a server with the data ports' security.
  void secure(zmq::Socket& sock) const;
  // Stops the handler (before its context goes); its counts stay.
  void stop();
  struct Refused {
    std::uint64_t key = 0, address = 0, consumers = 0;
  };
  Refused refused() const;
  // The summary's `curve` and `security`.
  void report(nlohmann::json& summary) const;

 private:
  const Config& cfg_;
  std::optional<CurveSetup> curve_;
  std::unique_ptr<zmq::ZapAuthenticator> zap_;
  Refused refused_;  // the handler's counts, once it has gone
};

}  // namespace numastream
