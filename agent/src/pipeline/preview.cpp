#include "pipeline/preview.hpp"

#include <cmath>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "codec/dtype.hpp"
#include "codec/hdf5_lz4.hpp"
#include "detector/stream2.hpp"
#include "obs/image.hpp"

namespace numastream {
namespace {

using Clock = std::chrono::steady_clock;

// The largest frame drawn (an EIGER2 16M frame of 32-bit pixels is 72 MB): a message claiming more
// is not decoded into memory for a picture.
constexpr std::size_t kMaxFrameBytes = std::size_t{256} << 20;

// The page: one picture per stream with its frame and rates, refreshed every second.
constexpr const char* kPage = R"(<!doctype html>
<html><head><meta charset="utf-8"><title>numastream: live preview</title>
<style>
body { background: #111; color: #ddd; font: 14px sans-serif; margin: 8px; }
figure { display: inline-block; margin: 0 8px 8px 0; vertical-align: top; }
img { display: block; image-rendering: pixelated; }
figcaption { margin-top: 4px; }
.error { color: #f66; }
</style></head>
<body>
<div id="streams">waiting for the first frame</div>
<script>
"use strict";
const seen = {};
async function tick() {
  let streams;
  try {
    streams = await (await fetch("preview/streams.json", {cache: "no-store"})).json();
  } catch (e) {
    return;
  }
  const box = document.getElementById("streams");
  if (streams.length && !box.querySelector("figure")) box.textContent = "";
  for (const s of streams) {
    let fig = document.getElementById("stream-" + s.stream);
    if (!fig) {
      fig = document.createElement("figure");
      fig.id = "stream-" + s.stream;
      fig.innerHTML = "<img alt=''><figcaption></figcaption>";
      box.appendChild(fig);
    }
    const was = seen[s.stream];
    const rate = was && s.seconds > was.seconds ? (s.raw_bytes - was.raw_bytes) / (s.seconds - was.seconds) / 1e6 : 0;
    seen[s.stream] = s;
    if (!was || was.generation !== s.generation) {
      fig.querySelector("img").src = "preview/stream/" + s.stream + ".png?g=" + s.generation;
    }
    const cap = fig.querySelector("figcaption");
    cap.className = s.error ? "error" : "";
    cap.textContent = "stream " + s.stream + " \u00b7 chunk " + s.sequence + " \u00b7 " + s.rows + " x " + s.cols +
        " \u00b7 " + rate.toFixed(1) + " MB/s \u00b7 " + s.frames + " chunks" + (s.error ? " \u00b7 " + s.error : "");
  }
}
tick();
setInterval(tick, 1000);
</script>
</body></html>
)";

// The pixels of a frame: decoded, with its shape and type. Throws naming what is wrong.
struct Pixels {
  std::vector<std::byte> bytes;
  std::string dtype;
  std::size_t rows = 0, cols = 0;
};

void shape_of(const std::vector<std::uint64_t>& dims, std::size_t n, std::size_t elem, Pixels& p) {
  if (dims.size() == 2) {
    p.rows = dims[0], p.cols = dims[1];
  } else {
    // 1-D, or no shape: shown as a square as near as it gets (the last row may be partial:
    // padded as masked by the renderer's caller).
    const std::size_t count = n / elem;
    p.cols = static_cast<std::size_t>(std::ceil(std::sqrt(static_cast<double>(count))));
    p.rows = p.cols ? (count + p.cols - 1) / p.cols : 0;
  }
}

// The image of a Stream V2 message: its threshold_1 channel, else the first channel it has.
Pixels decode_stream2(std::span<const std::byte> message) {
  Pixels p;
  std::string error, found;
  std::vector<std::string> skipped;
  bool done = false;
  const bool ok = stream2::walk(
      message,
      [&](const std::string& path, const stream2::Value& v) {
        if (path.rfind("data/", 0) != 0 || v.kind != stream2::Value::Kind::array) return;
        if (done && (found == "threshold_1" || path != "data/threshold_1")) return;
        done = true;
        found = path.substr(5);
        const stream2::Array& a = v.array;
        const std::size_t elem = dtype_size(a.dtype);
        if (elem == 0)
          throw std::invalid_argument("channel " + found + ": pixels of type '" + a.dtype + "'");
        std::size_t count = 1;
        for (auto d : a.dims) count *= d;  // at most 2^48 (stream2::walk)
        if (count > kMaxFrameBytes / elem) {
          throw std::invalid_argument("channel " + found + ": a frame of " + std::to_string(count) +
                                      " pixels is more than the preview draws");
        }
        p.dtype = a.dtype;
        p.bytes.resize(count * elem);
        if (a.compression == stream2::Compression::none) {
          if (a.bytes.size() != p.bytes.size())
            throw std::invalid_argument("channel " + found + ": size");
          std::copy(a.bytes.begin(), a.bytes.end(), p.bytes.begin());
        } else {
          // In the HDF5 filters' framing: bslz4 is numastream's own; lz4 is filter 32004's.
          Decompressor dec(p.bytes.size());
          const bool decoded = a.compression == stream2::Compression::bslz4
                                   ? dec.decompress(Codec::bslz4, a.bytes, p.bytes, elem)
                                   : hdf5_lz4::decode(a.bytes, p.bytes);
          if (!decoded) {
            throw std::invalid_argument("channel " + found + ": its " +
                                        stream2::compression_name(a.compression) +
                                        " pixels do not decode");
          }
        }
        shape_of(a.dims, p.bytes.size(), elem, p);
      },
      skipped, error);
  if (!ok) throw std::invalid_argument("not a Stream V2 message: " + error);
  if (!done) throw std::invalid_argument("no image in the message");
  return p;
}

}  // namespace

bool Preview::due(std::uint32_t stream, std::uint64_t raw_bytes) {
  std::lock_guard lock(mu_);
  Latest& l = streams_[stream];
  l.raw_bytes += raw_bytes;
  ++l.frames;
  return l.generation == 0 || Clock::now() - l.taken >= interval_;
}

void Preview::offer(std::uint32_t stream, std::uint64_t sequence, Codec codec,
                    std::size_t element_size, std::size_t raw_size,
                    std::span<const std::byte> bytes, const std::string& metadata) {
  if (metadata.find("\"stream2\"") != std::string::npos) {
    // Only images are shown: a start or end message leaves the next message due.
    std::string error;
    auto m = stream2::parse(bytes, error);
    if (m && m->type != stream2::Type::image) return;
  }
  std::vector<std::byte> copy(bytes.begin(), bytes.end());  // outside the lock
  std::lock_guard lock(mu_);
  Latest& l = streams_[stream];
  l.sequence = sequence;
  l.codec = codec;
  l.element_size = element_size;
  l.raw_size = raw_size;
  l.bytes.swap(copy);
  l.metadata = metadata;
  l.taken = Clock::now();
  ++l.generation;
}

void Preview::render(std::uint32_t stream) {
  // The frame is copied under the lock and drawn outside it: a decompressing thread offering the
  // next frame never waits for a picture being made.
  Latest l;
  {
    std::lock_guard lock(mu_);
    auto it = streams_.find(stream);
    if (it == streams_.end() || it->second.png_generation == it->second.generation) return;
    const Latest& from = it->second;
    l.generation = from.generation;
    l.codec = from.codec;
    l.element_size = from.element_size;
    l.raw_size = from.raw_size;
    l.bytes = from.bytes;
    l.metadata = from.metadata;
  }
  try {
    const auto meta = nlohmann::json::parse(l.metadata.empty() ? "{}" : l.metadata, nullptr, false);
    const std::string dtype = meta.is_object() ? meta.value("dtype", "") : "";
    Pixels p;
    if (dtype == "stream2") {
      p = decode_stream2(l.bytes);
    } else {
      const std::size_t elem = dtype_size(dtype);
      if (elem == 0)
        throw std::invalid_argument("the stream's pixel type is unknown ('" + dtype + "')");
      p.dtype = dtype;
      if (l.codec == Codec::none) {
        p.bytes = l.bytes;
      } else {
        p.bytes.resize(l.raw_size);
        Decompressor dec(l.raw_size);
        if (!dec.decompress(l.codec, l.bytes, p.bytes, l.element_size))
          throw std::invalid_argument("the chunk does not decode");
      }
      std::vector<std::uint64_t> dims;
      if (meta.contains("shape") && meta["shape"].is_array())
        dims = meta["shape"].get<std::vector<std::uint64_t>>();
      if (dims.size() == 2 && dims[0] * dims[1] * elem != p.bytes.size()) {
        // A chunk of whole rows (a synthetic stream's), or a last chunk short of a frame.
        dims = {p.bytes.size() / elem / std::max<std::uint64_t>(1, dims[1]), dims[1]};
      }
      shape_of(dims, p.bytes.size(), elem, p);
    }
    const std::size_t elem = dtype_size(p.dtype);
    // Pixels past the last whole one (a partial last row) are shown masked.
    const std::size_t want = p.rows * p.cols * elem;
    const std::size_t have = p.bytes.size() - p.bytes.size() % elem;
    p.bytes.resize(have);
    if (want > have) p.bytes.resize(want, std::byte{0xff});
    if (want < have) p.bytes.resize(want);
    const image::Rgb img = image::render(p.bytes, p.dtype, p.rows, p.cols, max_side_);
    l.png = image::png(img);
    l.width = img.width, l.height = img.height, l.rows = p.rows, l.cols = p.cols;
  } catch (const std::exception& e) {
    l.error = e.what();
  }
  std::lock_guard lock(mu_);
  Latest& to = streams_[stream];
  if (to.png_generation >= l.generation)
    return;  // drawn meanwhile (only the server's thread draws)
  to.png_generation = l.generation;
  to.png = std::move(l.png);
  to.error = std::move(l.error);
  to.width = l.width, to.height = l.height, to.rows = l.rows, to.cols = l.cols;
}

std::string Preview::streams_json() {
  std::vector<std::uint32_t> ids;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, l] : streams_) ids.push_back(id);
  }
  for (auto id : ids) render(id);
  nlohmann::json out = nlohmann::json::array();
  const double now = std::chrono::duration<double>(Clock::now() - started_).count();
  std::lock_guard lock(mu_);
  for (auto& [id, l] : streams_) {
    if (l.generation == 0) continue;
    out.push_back({{"stream", id},
                   {"sequence", l.sequence},
                   {"generation", l.generation},
                   {"rows", l.rows},
                   {"cols", l.cols},
                   {"width", l.width},
                   {"height", l.height},
                   {"raw_bytes", l.raw_bytes},
                   {"frames", l.frames},
                   {"seconds", now},
                   {"error", l.error.empty() ? nlohmann::json(nullptr) : nlohmann::json(l.error)}});
  }
  return out.dump();
}

std::optional<HttpReply> Preview::answer(const std::string& path) {
  if (path == "/preview") return HttpReply{200, "text/html; charset=utf-8", kPage};
  if (path == "/preview/streams.json") return HttpReply{200, "application/json", streams_json()};
  const std::string prefix = "/preview/stream/", suffix = ".png";
  if (path.rfind(prefix, 0) == 0 && path.size() > prefix.size() + suffix.size() &&
      path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0) {
    const std::string id = path.substr(prefix.size(), path.size() - prefix.size() - suffix.size());
    if (id.empty() || id.size() > 10 || id.find_first_not_of("0123456789") != std::string::npos ||
        std::stoull(id) > 0xffffffffULL) {
      return HttpReply{404, "text/plain", "no such stream\n"};
    }
    const auto stream = static_cast<std::uint32_t>(std::stoull(id));
    render(stream);
    std::lock_guard lock(mu_);
    auto it = streams_.find(stream);
    if (it == streams_.end() || it->second.generation == 0)
      return HttpReply{404, "text/plain", "no frame of stream " + id + " yet\n"};
    if (it->second.png.empty())
      return HttpReply{503, "text/plain", "stream " + id + ": " + it->second.error + "\n"};
    return HttpReply{200, "image/png", it->second.png};
  }
  return std::nullopt;
}

}  // namespace numastream
