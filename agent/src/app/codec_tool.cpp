// `numastream-agent codec` and `numastream-agent synth`: the agent's codecs and synthetic frames
// on files, for people checking a file by hand and for the tests that hold our bslz4 against the
// reference library.
#include "app/codec_tool.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "codec/bitshuffle.hpp"
#include "codec/codec.hpp"
#include "codec/synth.hpp"
#include "pipeline/pipeline.hpp"

namespace numastream {
namespace {

std::vector<std::byte> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path, "cannot open for reading");
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(bytes.size());
  if (!bytes.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

void write_file(const std::string& path, std::span<const std::byte> data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

std::size_t number(const std::string& flag, const std::string& text) {
  std::size_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) {
    throw ConfigError(flag, "must be a number (got \"" + text + "\")");
  }
  return v;
}

// A positive finite number of a flag (e.g. a mean photon count).
double positive(const std::string& flag, const std::string& text) {
  double v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || !(v > 0) || !std::isfinite(v)) {
    throw ConfigError(flag, "must be a positive number (got \"" + text + "\")");
  }
  return v;
}

constexpr const char* kCodecUsage =
    "usage: numastream-agent codec encode|decode --codec bslz4|lz4|shuffle-lz4 [--element-size N]\n"
    "                              [--raw-bytes N] IN OUT\n"
    "  encode: IN raw bytes -> OUT encoded (bslz4: the HDF5 filter 32008 framing)\n"
    "  decode: IN encoded -> OUT raw; exits 3 when IN does not decode (bslz4 reads the raw\n"
    "          size from its header; the other codecs need --raw-bytes)\n";

}  // namespace

int run_codec_tool(const std::vector<std::string>& args) {
  if (args.empty() || (args[0] != "encode" && args[0] != "decode")) {
    std::fprintf(stderr, "%s", kCodecUsage);
    return kExitUsage;
  }
  const bool encode = args[0] == "encode";
  std::optional<Codec> codec;
  std::size_t element_size = 2, raw_bytes = 0;
  std::vector<std::string> files;
  for (std::size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) throw ConfigError(a, "needs a value");
      return args[++i];
    };
    if (a == "--codec") {
      std::string name = value();
      codec = parse_codec(name);
      if (!codec || *codec == Codec::none) {
        throw ConfigError("--codec", "must be bslz4, lz4 or shuffle-lz4 (got \"" + name + "\")");
      }
    } else if (a == "--element-size") {
      element_size = number(a, value());
      if (!valid_element_size(element_size)) throw ConfigError(a, "must be 1, 2, 4 or 8");
    } else if (a == "--raw-bytes") {
      raw_bytes = number(a, value());
    } else if (!a.empty() && a[0] == '-') {
      throw ConfigError(a, "unknown flag");
    } else {
      files.push_back(a);
    }
  }
  if (!codec) throw ConfigError("--codec", "is required");
  if (files.size() != 2) {
    std::fprintf(stderr, "%s", kCodecUsage);
    return kExitUsage;
  }
  auto in = read_file(files[0]);
  if (encode) {
    if (*codec == Codec::bslz4 && in.size() % element_size) {
      throw ConfigError(files[0], std::to_string(in.size()) + " bytes are not a whole number of " +
                                      std::to_string(element_size) + "-byte samples");
    }
    Compressor comp(*codec, 1, in.size(), element_size);
    std::vector<std::byte> out(max_encoded_size(in.size()));
    auto r = comp.compress(in, out);
    if (r.codec != *codec) {
      // Incompressible: the file would be raw bytes, which a decoder of the codec cannot read.
      std::fprintf(stderr, "numastream-agent codec: %s does not shrink %s\n",
                   std::string(codec_name(*codec)).c_str(), files[0].c_str());
      return kExitFailure;
    }
    write_file(files[1], {out.data(), r.size});
    return kExitOk;
  }
  if (*codec == Codec::bslz4) {
    if (in.size() < bslz4::kHeaderBytes)
      throw std::runtime_error(files[0] + " is shorter than a bslz4 header");
    raw_bytes = 0;
    for (int i = 0; i < 8; ++i)
      raw_bytes = (raw_bytes << 8) | std::to_integer<std::size_t>(in[static_cast<std::size_t>(i)]);
  } else if (raw_bytes == 0) {
    throw ConfigError("--raw-bytes", "is required to decode " + std::string(codec_name(*codec)));
  }
  if (raw_bytes > (1ULL << 31)) throw std::runtime_error(files[0] + " claims more than 2 GiB");
  std::vector<std::byte> out(raw_bytes);
  Decompressor dec(raw_bytes);
  if (!dec.decompress(*codec, in, out, element_size)) {
    std::fprintf(
        stderr, "numastream-agent codec: %s is not valid %s data of %zu bytes (element size %zu)\n",
        files[0].c_str(), std::string(codec_name(*codec)).c_str(), raw_bytes, element_size);
    return kExitIntegrity;
  }
  write_file(files[1], out);
  return kExitOk;
}

int run_synth_tool(const std::vector<std::string>& args) {
  SynthParams p;
  std::string out;
  std::size_t frames = 1;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (i + 1 >= args.size()) throw ConfigError(a, "needs a value");
    const std::string& v = args[++i];
    if (a == "--out") {
      out = v;
    } else if (a == "--chunk-bytes") {
      p.chunk_bytes = number(a, v);
    } else if (a == "--width") {
      p.width = number(a, v);
    } else if (a == "--frames") {
      frames = number(a, v);
    } else if (a == "--seed") {
      p.seed = number(a, v);
    } else if (a == "--flat-field") {
      p.flat_field = positive(a, v);
      // The Poisson sampler's tables grow with the mean (and exp(-mean) underflows near 745).
      if (p.flat_field > 500) throw ConfigError(a, "must be at most 500 counts");
    } else if (a == "--attenuation") {
      p.attenuation = positive(a, v);
    } else {
      throw ConfigError(a,
                        "unknown flag (--out, --chunk-bytes, --width, --frames, --seed, "
                        "--flat-field, --attenuation)");
    }
  }
  if (out.empty()) throw ConfigError("--out", "is required");
  if (p.width == 0 || p.chunk_bytes % 2) {
    throw ConfigError("--chunk-bytes",
                      "must be a whole number of 16-bit pixels (and --width positive)");
  }
  p.frames = static_cast<int>(frames);
  std::vector<std::byte> all(p.chunk_bytes * frames);
  for (std::size_t f = 0; f < frames; ++f) {
    generate_projection(p, static_cast<int>(f), {all.data() + f * p.chunk_bytes, p.chunk_bytes});
  }
  write_file(out, all);
  return kExitOk;
}

}  // namespace numastream
