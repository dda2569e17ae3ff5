// Which pipeline a stream belongs to. A sender may name its pipeline (config `origin`): every
// resume frame it sends is then preceded by an origin frame (a metadata frame whose JSON is
// {"origin": name}), and the receiver binds the connection to that origin. Stream ids are unique
// only within one pipeline, so a receiver that several pipelines send to (a far site) keys each
// stream by (origin, stream id) and works on a local id: the sender's id when no other origin
// holds it, else one counted down from 2^32 - 1. Acknowledgements go out with the sender's id.
// Files are named by origin and the sender's id ({origin} and {stream} in sink.path), never by
// the local id, so a restarted receiver names them the same whatever order pipelines return in.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "wire/wire.hpp"

namespace numastream {

// The longest origin name: a Kubernetes namespace (63) and a name (253) joined by a dot.
inline constexpr std::size_t kMaxOriginName = 317;

// Why `name` cannot be an origin (empty when it can): 1..kMaxOriginName characters of
// [A-Za-z0-9._-], not starting with a dot. It becomes part of file paths, so no '/' and no "..".
std::string origin_name_problem(std::string_view name);

// The origin an origin frame's payload names, or nullopt when the payload is not one (any other
// metadata). An origin frame with a name that is not allowed yields the empty string.
std::optional<std::string> origin_of_metadata(std::span<const std::byte> payload);
std::string origin_metadata(const std::string& origin);

class StreamNames {
 public:
  struct Name {
    std::string origin;  // empty: the sender named no origin
    std::uint32_t stream = 0;
  };
  struct Bound {
    std::uint32_t id = 0;
    wire::DecodeError why = wire::DecodeError::ok;  // else refused, and why
  };
  // `patterns`: the receiver's output paths ({origin}, {stream}); a stream of a second origin
  // whose path under one of them is another origin's is refused (contradicts_stream): never two
  // pipelines in one file. At most `max_names` streams are named (too_many_streams past it).
  explicit StreamNames(std::vector<std::string> patterns = {}, std::size_t max_names = 1024)
      : patterns_(std::move(patterns)), max_names_(max_names) {}
  // The output paths, set before the first stream is named.
  void set_patterns(std::vector<std::string> patterns) { patterns_ = std::move(patterns); }
  // The local id of `origin`'s stream `stream`, bound on first use.
  Bound local(const std::string& origin, std::uint32_t stream);
  // Who the local id belongs to (itself with no origin when it was never bound).
  Name of(std::uint32_t local) const;
  // Whether two local streams would go to one file under `pattern`.
  bool same_path(const std::string& pattern, std::uint32_t a, std::uint32_t b) const;
  // "stream 3" or "stream 3 of beamline.p1", for messages.
  std::string describe(std::uint32_t local) const;
  // Why the last refused stream was refused, for the log.
  std::string last_refusal() const;

 private:
  std::vector<std::string> patterns_;
  std::size_t max_names_;
  mutable std::mutex mu_;
  std::map<std::pair<std::string, std::uint32_t>, std::uint32_t> local_;
  std::map<std::uint32_t, Name> name_;
  std::map<std::string, std::string> path_origin_;  // an output path and the origin it holds
  std::string refusal_;
  std::uint32_t next_ = 0xFFFFFFFFu;  // the next local id to try for a stream whose id is taken
};

// `pattern` with {origin} replaced by the stream's origin ("default" for a sender that named
// none) and {stream} by the sender's stream id.
std::string stream_path(const std::string& pattern, const StreamNames::Name& name);

}  // namespace numastream
