// `bench`: single-core codec speeds on the synthetic projections (next to LZ4's own library calls
// on the same data) and end-to-end loopback runs of the real pipelines.
#pragma once

#include <string>
#include <vector>

namespace numastream {

int run_bench(const std::vector<std::string>& args);

}  // namespace numastream
