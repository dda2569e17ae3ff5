// libFuzzer target: the agent's configuration parser. Any JSON document (and any override
// assignment) is either accepted or refused with a ConfigError naming a field; any other
// exception escaping, a crash, or an out-of-bounds access is a bug.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "base/error.hpp"
#include "config/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace numastream;
  std::string text(reinterpret_cast<const char*>(data), size);
  // The first line, when it contains '=', is also tried as a --set override.
  std::string override_line;
  if (auto nl = text.find('\n');
      nl != std::string::npos && text.substr(0, nl).find('=') != std::string::npos) {
    override_line = text.substr(0, nl);
    text = text.substr(nl + 1);
  }
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return 0;
  for (Role role : {Role::send, Role::receive}) {
    nlohmann::json d = doc;
    try {
      if (!override_line.empty()) apply_override(d, override_line);
      Config c = parse_config(d, role);
      (void)c.stage_names();
    } catch (const ConfigError&) {
      // refused, naming the field: what the agent does
    }
  }
  return 0;
}
