// The `forward` subcommand (forward.cpp): a bare ZeroMQ PULL -> PUSH forwarder, the limit the
// benchmarks hold numastream's Stream V2 pass-through against.
#pragma once

#include <string>
#include <vector>

namespace numastream {

int run_forward(const std::vector<std::string>& args);

}  // namespace numastream
