// Command-line parsing for `send` and `receive`: flags become overrides of the JSON config, so
// the file and the flags share one validation path and one set of field names.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "config/config.hpp"

namespace numastream {

// Builds the config document from --config FILE plus every other flag (applied in order, after
// the file). Throws ConfigError naming the flag or field.
nlohmann::json config_from_args(const std::vector<std::string>& args);

std::string run_usage();

// Takes --summary-file PATH (or --summary-file=PATH) out of args: where the run's summary also
// goes when the agent exits. Empty when absent.
std::string take_summary_file(std::vector<std::string>& args);

// The part of a run's summary that Kubernetes keeps after the container exits (written to the
// pod's terminationMessagePath, which the kubelet cuts at 4096 bytes): role, counts, bytes,
// rates, completeness, NIC locality and the error. Always under 4096 bytes.
std::string termination_summary(const nlohmann::json& summary);

}  // namespace numastream
