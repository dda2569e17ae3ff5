// The `detector-sim` subcommand (detector_sim.cpp): a DECTRIS Stream V2 detector for tests,
// demos and benchmarks.
#pragma once

#include <string>
#include <vector>

namespace numastream {

int run_detector_sim(const std::vector<std::string>& args);

}  // namespace numastream
