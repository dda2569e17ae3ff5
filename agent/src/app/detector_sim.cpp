// numastream-agent detector-sim: a DECTRIS Stream V2 detector for tests, demos and benchmarks.
// It binds a PUSH socket, as the detector's DCU does, and sends series: recorded messages
// replayed from a directory (one message per file, in name order), optionally after a start
// message of its own; or synthetic series (a start message with the image size, channels and
// pixel masks, images of synthetic projections compressed bslz4 or lz4 as a detector does, an end
// message); as many series as asked, at a fixed message rate or as fast as the consumer takes them.
#include "app/detector_sim.hpp"

#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/error.hpp"
#include "base/log.hpp"
#include "codec/bitshuffle.hpp"
#include "codec/hdf5_lz4.hpp"
#include "codec/synth.hpp"
#include "detector/stream2.hpp"
#include "net/transport.hpp"
#include "pipeline/pipeline.hpp"

namespace numastream {
namespace {

namespace fs = std::filesystem;

constexpr const char* kUsage =
    "usage: numastream-agent detector-sim --endpoint tcp://*:31001 (--replay DIR [--start] | "
    "--synthetic)\n"
    "           [--series N] [--rate-hz R] [--linger-s S]\n"
    "  --replay DIR   send the files of DIR (sorted by name), one Stream V2 message each\n"
    "  --synthetic    send series of synthetic projections: series ids 1..N, each a start "
    "message,\n"
    "                 --images N (default 10) image messages, an end message; with\n"
    "                 --shape ROWSxCOLS (default 514x1030), --dtype uint8|uint16|uint32 (default\n"
    "                 uint16), --channels a,b,... (default threshold_1), --compression bslz4|lz4\n"
    "                 (default bslz4), --seed S (default 7). Pixels of image i, channel c:\n"
    "                 projection i + 5c of `numastream-agent synth --frames IMAGES+5(CHANNELS-1)`\n"
    "                 with that seed and shape (16-bit counts, capped at 255 for uint8);\n"
    "                 --drop-images A-B never sends those image ids (the series ends normally)\n"
    "  --goniometer AXIS=START,INCREMENT\n"
    "                 (repeatable) the start message's goniometer: axis AXIS (omega, phi, chi, "
    "...)\n"
    "                 at START degrees, turning INCREMENT degrees per image (0: stills)\n"
    "  --spots FILE   (synthetic) diffraction-like images: spots on a Poisson background of mean "
    "2,\n"
    "                 one per line of FILE, \"X Y IMAGE [PEAK]\": a Gaussian of sigma 1 pixel "
    "centred\n"
    "                 on column X, row Y, PEAK counts (default 1000) on image IMAGE and a third "
    "of\n"
    "                 that on the images beside it; every channel the same\n"
    "  --series N     send the series N times (default 1)\n"
    "  --start        begin each series with a start message of our own (series id and unique id\n"
    "                 from the first recorded message that has them)\n"
    "  --rate-hz R    at most R messages per second (default: as fast as the consumer takes them)\n"
    "  --linger-s S   after the last message, wait up to S s for a consumer to take what is "
    "queued\n"
    "                 (default 60)\n";

std::vector<std::byte> read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw ConfigError("--replay", "cannot read " + p.string());
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(bytes.size());
  std::transform(bytes.begin(), bytes.end(), out.begin(),
                 [](char c) { return static_cast<std::byte>(c); });
  return out;
}

struct Synthetic {
  std::uint64_t images = 10, seed = 7;
  // --drop-images A-B: image ids the detector never sends (its own buffer overran, or they were
  // lost in ZeroMQ on the way to a sender that died); the series still ends normally.
  std::uint64_t drop_first = 1, drop_last = 0;
  std::vector<std::uint64_t> dims = {514, 1030};
  std::string dtype = "uint16";
  std::vector<std::string> channels = {"threshold_1"};
  stream2::Compression compression = stream2::Compression::bslz4;
  std::vector<stream2::StartInfo::Axis> goniometer;
  // --spots FILE: diffraction-like images instead of projections: Bragg-like spots on a Poisson
  // background (mean 2 counts), each a Gaussian of 1 pixel's sigma centred on pixel (x, y)
  // (column, row) peaking on `image` with `peak` counts, a third of that on the images beside it.
  struct Spot {
    double x = 0, y = 0;
    std::uint64_t image = 0;
    double peak = 1000;
  };
  std::vector<Spot> spots;
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (true) {
    auto pos = s.find(sep, start);
    out.push_back(s.substr(start, pos - start));
    if (pos == std::string::npos) return out;
    start = pos + 1;
  }
}

// Pixels of synthetic projection `frame` as `dtype` (the 16-bit counts, narrowed or widened).
std::vector<std::byte> pixels(const Synthetic& syn, int frame) {
  const std::size_t n = syn.dims[0] * syn.dims[1];
  SynthParams p;
  p.seed = syn.seed;
  p.chunk_bytes = n * 2;
  p.width = syn.dims[1];
  p.frames =
      static_cast<int>(syn.images + 5 * (syn.channels.size() - 1));  // the series' projections
  std::vector<std::byte> counts(n * 2);
  generate_projection(p, frame, counts);
  if (syn.dtype == "uint16") return counts;
  const std::size_t elem = syn.dtype == "uint8" ? 1 : 4;
  std::vector<std::byte> out(n * elem);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint16_t v;
    std::memcpy(&v, counts.data() + 2 * i, 2);
    if (elem == 1) {
      out[i] = static_cast<std::byte>(std::min<std::uint16_t>(v, 255));
    } else {
      const std::uint32_t w = v;
      std::memcpy(out.data() + 4 * i, &w, 4);
    }
  }
  return out;
}

// Image `image` of a --spots series as `dtype`: the background drawn from a generator seeded by
// the series' seed and the image, then every spot's counts on it.
std::vector<std::byte> spot_pixels(const Synthetic& syn, std::uint64_t image) {
  const std::size_t rows = syn.dims[0], cols = syn.dims[1];
  std::mt19937 rng(static_cast<std::uint32_t>(syn.seed * 1000003u + image));
  std::poisson_distribution<std::uint32_t> background(2.0);
  std::vector<std::uint32_t> counts(rows * cols);
  for (auto& v : counts) v = background(rng);
  for (const auto& spot : syn.spots) {
    const double dz = static_cast<double>(image) - static_cast<double>(spot.image);
    if (dz < -1 || dz > 1) continue;
    const double along = dz == 0 ? 1.0 : 1.0 / 3.0;
    const long cx = std::lround(spot.x), cy = std::lround(spot.y);
    for (long y = std::max(0L, cy - 4); y <= std::min(static_cast<long>(rows) - 1, cy + 4); ++y) {
      for (long x = std::max(0L, cx - 4); x <= std::min(static_cast<long>(cols) - 1, cx + 4); ++x) {
        const double r2 = (x - spot.x) * (x - spot.x) + (y - spot.y) * (y - spot.y);
        counts[static_cast<std::size_t>(y) * cols + static_cast<std::size_t>(x)] +=
            static_cast<std::uint32_t>(std::lround(spot.peak * along * std::exp(-r2 / 2)));
      }
    }
  }
  const std::size_t elem = syn.dtype == "uint8" ? 1 : syn.dtype == "uint16" ? 2 : 4;
  const std::uint32_t top = elem == 1 ? 254 : elem == 2 ? 65534 : 0xfffffffe;  // below "no data"
  std::vector<std::byte> out(counts.size() * elem);
  for (std::size_t i = 0; i < counts.size(); ++i) {
    const std::uint32_t v = std::min(counts[i], top);
    if (elem == 1) out[i] = static_cast<std::byte>(v);
    if (elem == 2) {
      const auto w = static_cast<std::uint16_t>(v);
      std::memcpy(out.data() + 2 * i, &w, 2);
    }
    if (elem == 4) std::memcpy(out.data() + 4 * i, &v, 4);
  }
  return out;
}

std::vector<std::byte> compress(const Synthetic& syn, std::span<const std::byte> raw,
                                bslz4::Workspace& ws) {
  const std::size_t elem = syn.dtype == "uint8" ? 1 : syn.dtype == "uint16" ? 2 : 4;
  if (syn.compression == stream2::Compression::lz4) return hdf5_lz4::encode(raw);
  std::vector<std::byte> out(bslz4::max_encoded_size(raw.size()));
  out.resize(ws.encode(raw, elem, out));
  return out;
}

// One synthetic series: start, images, end.
std::vector<std::vector<std::byte>> synthetic_series(const Synthetic& syn, std::uint64_t series_id,
                                                     const std::string& unique) {
  std::vector<std::vector<std::byte>> out;
  stream2::StartInfo info;
  info.series_id = series_id;
  info.series_unique_id = unique;
  info.number_of_images = syn.images;
  info.dims = syn.dims;
  info.dtype = syn.dtype;
  info.channels = syn.channels;
  info.beam_center_x = static_cast<double>(syn.dims[1]) / 2;
  info.beam_center_y = static_cast<double>(syn.dims[0]) / 2;
  info.arm_date = utc_now();
  info.goniometer = syn.goniometer;
  out.push_back(stream2::build_start(info));
  bslz4::Workspace ws;
  for (std::uint64_t i = 0; i < syn.images; ++i) {
    if (i >= syn.drop_first && i <= syn.drop_last) continue;
    std::vector<std::vector<std::byte>> frames;
    std::vector<stream2::ChannelPixels> channels;
    for (std::size_t c = 0; c < syn.channels.size(); ++c) {
      frames.push_back(compress(
          syn, syn.spots.empty() ? pixels(syn, static_cast<int>(i + 5 * c)) : spot_pixels(syn, i),
          ws));
    }
    for (std::size_t c = 0; c < syn.channels.size(); ++c)
      channels.push_back({syn.channels[c], frames[c]});
    // Images every count_time, each exposed for all of it, on a 10 MHz time base (an EIGER2's).
    stream2::ImageTimes times;
    times.series_date = info.arm_date;
    times.real = static_cast<std::uint64_t>(std::llround(info.count_time * 1e7));
    times.start = i * times.real;
    times.stop = times.start + times.real;
    out.push_back(stream2::build_image(series_id, unique, i, syn.dims, syn.dtype, syn.compression,
                                       channels, &times));
  }
  out.push_back(stream2::build_end(series_id, unique));
  return out;
}

std::vector<std::vector<std::byte>> replayed(
    const std::string& replay, bool start,
    const std::vector<stream2::StartInfo::Axis>& goniometer) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(replay, ec)) {
    if (e.is_regular_file()) files.push_back(e.path());
  }
  if (ec) throw ConfigError("--replay", replay + ": " + ec.message());
  std::sort(files.begin(), files.end());
  if (files.empty()) throw ConfigError("--replay", "directory " + replay + " holds no files");
  std::vector<std::vector<std::byte>> messages;
  messages.reserve(files.size());
  for (const auto& f : files) messages.push_back(read_file(f));
  if (start) messages.insert(messages.begin(), stream2::start_for(messages, goniometer));
  return messages;
}

int send_series(const std::string& endpoint,
                const std::vector<std::vector<std::vector<std::byte>>>& all, double rate_hz,
                double linger_s) {
  std::size_t per_series = all.empty() ? 0 : all[0].size();
  const long series = static_cast<long>(all.size());
  zmq::Context ctx(1, {});
  zmq::Socket sock(ctx, ZMQ_PUSH);
  sock.set_int(ZMQ_SNDHWM, 1000);
  sock.set_int(ZMQ_LINGER, static_cast<int>(linger_s * 1000));
  sock.bind(endpoint);
  std::fprintf(stderr, "detector-sim: %zu messages per series, %ld series, on %s\n", per_series,
               series, endpoint.c_str());
  using Clock = std::chrono::steady_clock;
  // The clock starts when the first message is taken (the first send waits for a consumer).
  Clock::time_point t0;
  std::uint64_t sent = 0;
  for (const auto& messages : all) {
    for (const auto& m : messages) {
      if (sent == 1) t0 = Clock::now();
      if (rate_hz > 0 && sent > 0) {
        std::this_thread::sleep_until(
            t0 + std::chrono::duration_cast<Clock::duration>(
                     std::chrono::duration<double>(static_cast<double>(sent - 1) / rate_hz)));
      }
      // Blocks while no consumer is connected or its queue is full: a detector waits the same way.
      if (zmq_send(sock.get(), m.data(), m.size(), 0) < 0) {
        throw std::runtime_error("detector-sim: send: " + zmq::last_error());
      }
      ++sent;
    }
  }
  // Seconds from the first message taken to the last one sent: `messages - 1` intervals.
  const double secs = sent > 1 ? std::chrono::duration<double>(Clock::now() - t0).count() : 0;
  std::printf("{\"role\":\"detector-sim\",\"messages\":%llu,\"series\":%ld,\"seconds\":%.3f}\n",
              static_cast<unsigned long long>(sent), series, secs);
  std::fflush(stdout);
  return kExitOk;
}

// The spots to plant, one per line of `path`: "X Y IMAGE [PEAK]" ('#' begins a comment).
void read_spots(const std::string& path, std::vector<Synthetic::Spot>& spots) {
  std::ifstream in(path);
  if (!in) throw ConfigError("--spots", "cannot read " + path);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t") == std::string::npos ||
        line[line.find_first_not_of(" \t")] == '#')
      continue;
    std::istringstream fields(line);
    Synthetic::Spot spot;
    if (!(fields >> spot.x >> spot.y >> spot.image)) {
      throw ConfigError(
          "--spots", path + " line " + std::to_string(n) + ": not \"X Y IMAGE [PEAK]\": " + line);
    }
    if (!(fields >> spot.peak)) spot.peak = 1000;
    if (spot.x < 0 || spot.y < 0 || spot.peak <= 0) {
      throw ConfigError("--spots",
                        path + " line " + std::to_string(n) + ": X, Y must be >= 0 and PEAK > 0");
    }
    spots.push_back(spot);
  }
}

// A flag of the synthetic series (--images .. --spots) into `syn`, `value` reading its value;
// false when `flag` is none of them.
bool synthetic_flag(const std::string& flag, const std::function<std::string(const char*)>& value,
                    Synthetic& syn) {
  std::string last;  // the value read last, for the errors
  auto read = [&](const char* f) { return last = value(f); };
  if (flag == "--images") {
    syn.images = std::stoull(read("--images"));
  } else if (flag == "--drop-images") {
    const auto parts = split(read("--drop-images"), '-');
    if (parts.empty() || parts.size() > 2)
      throw ConfigError("--drop-images", "must be ID or FIRST-LAST (got " + last + ")");
    syn.drop_first = std::stoull(parts[0]);
    syn.drop_last = std::stoull(parts.back());
    if (syn.drop_last < syn.drop_first)
      throw ConfigError("--drop-images", "FIRST-LAST with FIRST <= LAST");
  } else if (flag == "--seed") {
    syn.seed = std::stoull(read("--seed"));
  } else if (flag == "--shape") {
    const auto parts = split(read("--shape"), 'x');
    if (parts.size() != 2) throw ConfigError("--shape", "must be ROWSxCOLS (got " + last + ")");
    syn.dims = {std::stoull(parts[0]), std::stoull(parts[1])};
    if (syn.dims[0] == 0 || syn.dims[1] == 0 || syn.dims[0] * syn.dims[1] > (1ull << 28)) {
      throw ConfigError(
          "--shape", "rows and columns must be positive, at most 2^28 pixels (got " + last + ")");
    }
  } else if (flag == "--dtype") {
    syn.dtype = read("--dtype");
    if (syn.dtype != "uint8" && syn.dtype != "uint16" && syn.dtype != "uint32") {
      throw ConfigError("--dtype", "must be uint8, uint16 or uint32 (got " + syn.dtype + ")");
    }
  } else if (flag == "--channels") {
    syn.channels = split(read("--channels"), ',');
    for (const auto& c : syn.channels) {
      if (c.empty() || c.find('/') != std::string::npos)
        throw ConfigError("--channels", "a channel name is empty or has '/'");
    }
  } else if (flag == "--compression") {
    const std::string c = read("--compression");
    if (c == "bslz4") {
      syn.compression = stream2::Compression::bslz4;
    } else if (c == "lz4") {
      syn.compression = stream2::Compression::lz4;
    } else {
      throw ConfigError("--compression", "must be bslz4 or lz4 (got " + c + ")");
    }
  } else if (flag == "--goniometer") {
    const std::string spec = read("--goniometer");
    const auto eq = spec.find('=');
    const auto parts = split(eq == std::string::npos ? "" : spec.substr(eq + 1), ',');
    if (eq == 0 || eq == std::string::npos || parts.size() != 2 ||
        spec.find('/') != std::string::npos) {
      throw ConfigError("--goniometer", "must be AXIS=START,INCREMENT (got " + spec + ")");
    }
    std::size_t used = 0, used2 = 0;
    const double start_deg = std::stod(parts[0], &used), step = std::stod(parts[1], &used2);
    if (used != parts[0].size() || used2 != parts[1].size()) {
      throw ConfigError("--goniometer", "START and INCREMENT must be numbers (got " + spec + ")");
    }
    syn.goniometer.push_back({spec.substr(0, eq), start_deg, step});
  } else if (flag == "--spots") {
    read_spots(read("--spots"), syn.spots);
  } else {
    return false;
  }
  return true;
}

}  // namespace

int run_detector_sim(const std::vector<std::string>& args) {
  std::string endpoint, replay;
  long series = 1;
  bool start = false, synthetic = false;
  Synthetic syn;
  double rate_hz = 0, linger_s = 60;
  for (std::size_t i = 0; i < args.size(); ++i) {
    auto value = [&](const char* flag) -> std::string {
      if (i + 1 >= args.size()) throw ConfigError(flag, "needs a value");
      return args[++i];
    };
    if (args[i] == "--endpoint") {
      endpoint = value("--endpoint");
    } else if (args[i] == "--replay") {
      replay = value("--replay");
    } else if (args[i] == "--series") {
      series = std::stol(value("--series"));
    } else if (args[i] == "--start") {
      start = true;
    } else if (args[i] == "--synthetic") {
      synthetic = true;
    } else if (synthetic_flag(args[i], value, syn)) {
      continue;
    } else if (args[i] == "--rate-hz") {
      rate_hz = std::stod(value("--rate-hz"));
    } else if (args[i] == "--linger-s") {
      linger_s = std::stod(value("--linger-s"));
    } else {
      std::fprintf(stderr, "numastream-agent detector-sim: unknown flag '%s'\n%s", args[i].c_str(),
                   kUsage);
      return kExitUsage;
    }
  }
  if (endpoint.empty() || replay.empty() == !synthetic) {
    std::fputs(kUsage, stderr);
    return kExitUsage;
  }
  if (series < 1) throw ConfigError("--series", "must be at least 1");
  // Series after series: the messages of each, built (synthetic) or read (replay) once.
  std::vector<std::vector<std::vector<std::byte>>> all;
  if (synthetic) {
    // Unique across runs and restarts, as a DCU's series_unique_id is: the start time and process.
    const std::string run = std::to_string(std::time(nullptr)) + "-" + std::to_string(::getpid());
    for (long s = 1; s <= series; ++s) {
      all.push_back(synthetic_series(syn, static_cast<std::uint64_t>(s),
                                     "detector-sim-" + run + "-" + std::to_string(s)));
    }
  } else {
    all.assign(static_cast<std::size_t>(series), replayed(replay, start, syn.goniometer));
  }
  return send_series(endpoint, all, rate_hz, linger_s);
}

}  // namespace numastream
