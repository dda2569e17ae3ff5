// Command-line parsing for `send` and `receive`: flags become overrides of the JSON config, so
// the file and the flags share one validation path and one set of field names.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "numastream/config.hpp"

namespace numastream {

// Builds the config document from --config FILE plus every other flag (applied in order, after
// the file). Throws ConfigError naming the flag or field.
nlohmann::json config_from_args(const std::vector<std::string>& args);

std::string run_usage();

}  // namespace numastream
