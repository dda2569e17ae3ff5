// The stages of the two pipelines. Send: source -> compress -> send; receive: receive ->
// decompress -> sink; `io` names ZeroMQ's I/O threads, placed like a stage. Names are what the
// configuration (placement.stages.<name>), the metrics (stage="...") and the logs say.
#pragma once

#include <array>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>

namespace numastream {

enum class Stage { source, compress, send, receive, decompress, sink, io };

inline constexpr std::array<Stage, 7> kStages = {Stage::source,  Stage::compress,   Stage::send,
                                                 Stage::receive, Stage::decompress, Stage::sink,
                                                 Stage::io};

constexpr std::string_view stage_name(Stage s) noexcept {
  switch (s) {
    case Stage::source:
      return "source";
    case Stage::compress:
      return "compress";
    case Stage::send:
      return "send";
    case Stage::receive:
      return "receive";
    case Stage::decompress:
      return "decompress";
    case Stage::sink:
      return "sink";
    case Stage::io:
      return "io";
  }
  return "?";
}

inline std::optional<Stage> stage_from_name(std::string_view name) noexcept {
  for (Stage s : kStages) {
    if (stage_name(s) == name) return s;
  }
  return std::nullopt;
}

inline std::string operator+(const std::string& a, Stage s) {
  return a + std::string(stage_name(s));
}
inline std::string operator+(const char* a, Stage s) { return a + std::string(stage_name(s)); }
inline std::ostream& operator<<(std::ostream& os, Stage s) { return os << stage_name(s); }

}  // namespace numastream
