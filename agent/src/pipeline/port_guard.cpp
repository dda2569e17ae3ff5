#include "pipeline/port_guard.hpp"

#include <set>
#include <string>
#include <vector>

#include "base/address.hpp"
#include "base/log.hpp"

namespace numastream {

void PortGuard::load() { curve_ = load_curve(cfg_.security); }

namespace {
std::string joined(const std::vector<std::string>& blocks) {
  std::string out;
  for (const auto& b : blocks) out += (out.empty() ? "" : ", ") + b;
  return out;
}
}  // namespace

void PortGuard::start(zmq::Context& ctx) {
  std::vector<const SinkConfig*> reemits;  // Stream V2 re-emits that name their consumers
  for (const auto& k : cfg_.consumers) {
    if (k.sink.kind == SinkConfig::Kind::stream2 && !k.sink.allow_from.empty())
      reemits.push_back(&k.sink);
  }
  if (!curve_ && cfg_.security.allow_from.empty() && reemits.empty()) return;
  const AddressBlocks allow_from = AddressBlocks::parse(cfg_.security.allow_from);
  zap_ = std::make_unique<zmq::ZapAuthenticator>(
      ctx, curve_ ? curve_->allowed : std::set<std::string>{},
      curve_ && curve_->authenticate_only ? curve_->secret_key : "", allow_from,
      [](const std::string& domain, const std::string& address) {
        log_warn("refused a connection from " +
                 (address.empty() ? std::string("an unknown address") : address) +
                 (domain == "numastream"
                      ? std::string(": not in security.allow_from")
                      : ": not a consumer the sink's allow_from names (" + domain + ")"));
      });
  if (curve_ && !cfg_.security.allowed_keys_file.empty()) {
    zap_->follow_keys(cfg_.security.allowed_keys_file, [](const std::string& path) {
      return read_allowed_keys(path, "security.curve.allowed_keys_file");
    });
  }
  for (const SinkConfig* k : reemits) {
    zap_->admit(zmq::consumers_domain(k->endpoint), AddressBlocks::parse(k->allow_from));
    log_line("stream2 re-emit on " + k->endpoint + ": admitting consumers only from " +
             joined(k->allow_from));
  }
  if (curve_) {
    log_line(std::string(curve_->authenticate_only ? "authenticate mode (frames not encrypted)"
                                                   : "CURVE") +
             ": accepting " + std::to_string(curve_->allowed.size()) + " sender key(s)");
  }
  if (!allow_from.empty())
    log_line("accepting connections only from " + joined(cfg_.security.allow_from));
}

void PortGuard::secure(zmq::Socket& sock) const {
  if (curve_ && curve_->authenticate_only) {
    zmq::plain_server(sock);
  } else if (curve_) {
    zmq::curve_server(sock, curve_->secret_key);
  } else if (!cfg_.security.allow_from.empty()) {
    zmq::address_checked_server(sock);
  }
}

void PortGuard::stop() {
  refused_ = refused();
  zap_.reset();
}

PortGuard::Refused PortGuard::refused() const {
  if (!zap_) return refused_;
  return {zap_->refused(), zap_->refused_address(), zap_->refused_consumers()};
}

void PortGuard::report(nlohmann::json& summary) const {
  summary["curve"] = curve_.has_value();
  summary["security"] = !curve_ ? "none" : curve_->authenticate_only ? "authenticate" : "encrypt";
}

}  // namespace numastream
