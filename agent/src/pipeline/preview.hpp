// The gateway's live preview: the latest frame of each stream as a picture (decoded, binned to
// screen size, log colour scale, masked pixels marked; obs/image.hpp) with the stream's rates, on
// the metrics server's port: /preview (a page that refreshes itself), /preview/streams.json and
// /preview/stream/<id>.png. A latest-only consumer: a decompressing thread copies a delivered
// frame at most every `interval` per stream, and nothing else waits for the preview; the picture
// is made when asked, once per frame, on the server's thread. Served only when the configuration
// asks (preview.enabled): it shows the experiment's data to whoever reaches the port.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "codec/codec.hpp"
#include "obs/http.hpp"

namespace numastream {

class Preview {
 public:
  Preview(std::size_t max_side, std::chrono::milliseconds interval)
      : max_side_(max_side), interval_(interval) {}

  // A chunk of `raw_bytes` of `stream` was delivered (counted for the rates the page shows);
  // whether its frame is wanted now. Called for every delivered chunk.
  bool due(std::uint32_t stream, std::uint64_t raw_bytes);
  // A delivered chunk: `bytes` stored as `codec` (none, or bslz4 as the HDF5 sink keeps it;
  // `element_size` and `raw_size` its header's), described by the stream's metadata frame (JSON:
  // dtype and shape; dtype "stream2": a Stream V2 message whose threshold_1 channel, else its
  // first, is shown; start and end messages are passed over). Copied.
  void offer(std::uint32_t stream, std::uint64_t sequence, Codec codec, std::size_t element_size,
             std::size_t raw_size, std::span<const std::byte> bytes, const std::string& metadata);
  // The answer to a GET of `path` under /preview, or nullopt for any other path.
  std::optional<HttpReply> answer(const std::string& path);

 private:
  struct Latest {
    std::uint64_t sequence = 0;
    Codec codec = Codec::none;
    std::size_t element_size = 0, raw_size = 0;
    std::vector<std::byte> bytes;
    std::string metadata;
    std::chrono::steady_clock::time_point taken{};
    std::uint64_t generation = 0;
    // The picture of generation `png_generation` (made when first asked).
    std::string png, error;
    std::uint64_t png_generation = 0;
    std::size_t width = 0, height = 0, rows = 0, cols = 0;
    std::uint64_t raw_bytes = 0, frames = 0;
  };
  void render(std::uint32_t stream);
  std::string streams_json();
  const std::size_t max_side_;
  const std::chrono::milliseconds interval_;
  std::mutex mu_;
  std::map<std::uint32_t, Latest> streams_;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
};

}  // namespace numastream
