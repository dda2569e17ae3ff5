// The `codec` and `synth` subcommands (codec_tool.cpp).
#pragma once

#include <string>
#include <vector>

namespace numastream {

int run_codec_tool(const std::vector<std::string>& args);
int run_synth_tool(const std::vector<std::string>& args);

}  // namespace numastream
