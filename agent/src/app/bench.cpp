#include "app/bench.hpp"

#include <lz4.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <sodium.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "app/bench_queue.hpp"
#include "base/error.hpp"
#include "codec/bitshuffle.hpp"
#include "codec/codec.hpp"
#include "codec/synth.hpp"
#include "host/cpuset.hpp"
#include "net/transport.hpp"
#include "pipeline/pipeline.hpp"

namespace numastream {
namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// CPU time of the calling thread: what a core spent on it, not the time other processes held
// that core. A per-core codec speed is MB per second of a core's work; measured against the wall
// clock, a node calibrating while its neighbours run reads half its speed.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

// Runs `fn` over every frame, `rounds` times; returns the median MB per CPU-second of the rounds.
template <typename Fn>
double rate_mbps(std::size_t bytes_per_call, std::size_t calls, int rounds, Fn fn) {
  std::vector<double> rates;
  for (int r = 0; r < rounds; ++r) {
    const double t0 = thread_cpu_seconds();
    for (std::size_t i = 0; i < calls; ++i) fn(i);
    const double s = std::max(1e-9, thread_cpu_seconds() - t0);
    rates.push_back(static_cast<double>(bytes_per_call * calls) / s / 1e6);
  }
  return median(rates);
}

struct CodecFigures {
  double compress_mbps = 0, decompress_mbps = 0, ratio = 0;
  double lz4_compress_mbps = 0, lz4_decompress_mbps = 0;  // LZ4's own calls, same data
  double shuffle_ratio = 0, shuffle_compress_mbps = 0, shuffle_decompress_mbps = 0;
  double bslz4_ratio = 0, bslz4_compress_mbps = 0, bslz4_decompress_mbps = 0;
  // The bit-shuffle alone (16-bit pixels, blocks as bslz4 makes them), per kernel this CPU runs.
  struct Kernel {
    std::string name;
    double shuffle_mbps = 0, unshuffle_mbps = 0;
  };
  std::vector<Kernel> kernels;
};

// The bit-shuffle alone, each kernel this CPU runs, over `raw`'s frames block by block as bslz4
// does it (16-bit pixels): MB per CPU-second each way.
std::vector<CodecFigures::Kernel> bench_kernels(const std::vector<std::vector<std::byte>>& raw,
                                                std::vector<std::vector<std::byte>>& enc,
                                                std::vector<std::byte>& out, std::size_t chunk,
                                                int rounds) {
  const std::size_t n = raw.size();
  std::vector<CodecFigures::Kernel> kernels;
  const std::size_t block = bslz4::default_block_elements(2);
  const std::size_t blocks = chunk / (2 * block);
  for (const bslz4::Kernel k : bslz4::kernels_available()) {
    CodecFigures::Kernel kf{bslz4::kernel_name(k)};
    kf.shuffle_mbps = rate_mbps(blocks * block * 2, n, rounds, [&](std::size_t i) {
      for (std::size_t b = 0; b < blocks; ++b) {
        bslz4::shuffle_bits(raw[i].data() + b * block * 2, enc[i].data() + b * block * 2, block, 2,
                            k);
      }
    });
    kf.unshuffle_mbps = rate_mbps(blocks * block * 2, n, rounds, [&](std::size_t i) {
      for (std::size_t b = 0; b < blocks; ++b) {
        bslz4::unshuffle_bits(enc[i].data() + b * block * 2, out.data() + b * block * 2, block, 2,
                              k);
      }
    });
    kernels.push_back(kf);
  }
  return kernels;
}

using Frames = std::vector<std::vector<std::byte>>;

Frames synthetic_frames(std::size_t chunk, int frames) {
  SynthParams p;
  p.chunk_bytes = chunk;
  p.frames = frames;
  Frames raw(static_cast<std::size_t>(frames), std::vector<std::byte>(chunk));
  for (int f = 0; f < frames; ++f) generate_projection(p, f, raw[static_cast<std::size_t>(f)]);
  return raw;
}

// The first `frames` chunks of a raw file (e.g. `numastream-agent synth`'s, or a detector's
// frames): the codec measured on the data a run sends.
Frames file_frames(const std::string& path, std::size_t chunk, int frames) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("--input", "cannot open " + path);
  Frames raw;
  for (int f = 0; f < frames; ++f) {
    std::vector<std::byte> frame(chunk);
    in.read(reinterpret_cast<char*>(frame.data()), static_cast<std::streamsize>(chunk));
    if (in.gcount() != static_cast<std::streamsize>(chunk)) break;
    raw.push_back(std::move(frame));
  }
  if (raw.empty()) {
    throw ConfigError("--input", path + " holds less than one chunk (" + std::to_string(chunk) +
                                     " bytes, --chunk-bytes)");
  }
  return raw;
}

CodecFigures bench_codec(const Frames& raw, std::size_t chunk, int rounds) {
  // One core: the figures are per-core speeds.
  auto allowed = allowed_cpus();
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(allowed.back(), &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);

  const std::size_t cap = max_encoded_size(chunk);
  std::vector<std::vector<std::byte>> enc(raw.size(), std::vector<std::byte>(cap));
  std::vector<std::size_t> enc_size(raw.size());
  std::vector<std::byte> out(chunk);
  const std::size_t n = raw.size();
  CodecFigures f;

  // Interleave ours and the reference within each round so machine noise hits both alike.
  Compressor lz4(Codec::lz4, 1, chunk);
  std::vector<double> ours_c, ref_c, ours_d, ref_d;
  for (int r = 0; r < rounds; ++r) {
    ours_c.push_back(rate_mbps(
        chunk, n, 1, [&](std::size_t i) { enc_size[i] = lz4.compress(raw[i], enc[i]).size; }));
    ref_c.push_back(rate_mbps(chunk, n, 1, [&](std::size_t i) {
      LZ4_compress_default(reinterpret_cast<const char*>(raw[i].data()),
                           reinterpret_cast<char*>(enc[i].data()), static_cast<int>(chunk),
                           static_cast<int>(cap));
    }));
    Decompressor dec(chunk);
    ours_d.push_back(rate_mbps(chunk, n, 1, [&](std::size_t i) {
      dec.decompress(Codec::lz4, {enc[i].data(), enc_size[i]}, out);
    }));
    ref_d.push_back(rate_mbps(chunk, n, 1, [&](std::size_t i) {
      LZ4_decompress_safe(reinterpret_cast<const char*>(enc[i].data()),
                          reinterpret_cast<char*>(out.data()), static_cast<int>(enc_size[i]),
                          static_cast<int>(chunk));
    }));
  }
  f.compress_mbps = median(ours_c);
  f.lz4_compress_mbps = median(ref_c);
  f.decompress_mbps = median(ours_d);
  f.lz4_decompress_mbps = median(ref_d);
  std::size_t total = 0;
  for (auto s : enc_size) total += s;
  f.ratio = static_cast<double>(chunk * n) / static_cast<double>(total);

  Compressor shuf(Codec::shuffle_lz4, 1, chunk);
  f.shuffle_compress_mbps = rate_mbps(
      chunk, n, rounds, [&](std::size_t i) { enc_size[i] = shuf.compress(raw[i], enc[i]).size; });
  total = 0;
  for (auto s : enc_size) total += s;
  f.shuffle_ratio = static_cast<double>(chunk * n) / static_cast<double>(total);
  Decompressor dec(chunk);
  f.shuffle_decompress_mbps = rate_mbps(chunk, n, rounds, [&](std::size_t i) {
    dec.decompress(Codec::shuffle_lz4, {enc[i].data(), enc_size[i]}, out);
  });

  Compressor bs(Codec::bslz4, 1, chunk, 2);
  f.bslz4_compress_mbps = rate_mbps(
      chunk, n, rounds, [&](std::size_t i) { enc_size[i] = bs.compress(raw[i], enc[i]).size; });
  total = 0;
  for (auto s : enc_size) total += s;
  f.bslz4_ratio = static_cast<double>(chunk * n) / static_cast<double>(total);
  f.bslz4_decompress_mbps = rate_mbps(chunk, n, rounds, [&](std::size_t i) {
    dec.decompress(Codec::bslz4, {enc[i].data(), enc_size[i]}, out, 2);
  });
  f.kernels = bench_kernels(raw, enc, out, chunk, rounds);

  CPU_ZERO(&set);
  for (int c : allowed) CPU_SET(c, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  return f;
}

int free_port_pair() {
  for (int attempt = 0; attempt < 20; ++attempt) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      ::close(fd);
      continue;
    }
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(fd);
    int port = ntohs(a.sin_port);
    if (port > 1024 && port < 60000) return port;
  }
  return 47000;
}

struct LoopbackSetting {
  std::string placement;
  int compress, connections, decompress;
  std::string curve_dir;  // non-empty: CURVE on the data connections, keys in this directory
  std::string curve_mode = "encrypt";
};

// A gateway key pair and a sender key pair, as files, for a CURVE loopback run.
std::string write_bench_keys() {
  char tmpl[] = "/tmp/numastream-bench-keys-XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  auto gw = zmq::curve_keypair(), tx = zmq::curve_keypair();
  std::ofstream(dir + "/gateway.secret") << gw.secret_key;
  std::ofstream(dir + "/gateway.public") << gw.public_key;
  std::ofstream(dir + "/sender.secret") << tx.secret_key;
  std::ofstream(dir + "/allowed") << tx.public_key;
  return dir;
}

nlohmann::json bench_loopback(const LoopbackSetting& s, std::size_t chunk, std::uint64_t chunks) {
  int port = free_port_pair();
  std::string ep = "tcp://127.0.0.1:" + std::to_string(port);
  nlohmann::json base = {{"endpoint", ep},
                         {"connections", s.connections},
                         {"chunk_bytes", chunk},
                         {"placement", {{"mode", s.placement}}}};
  nlohmann::json rx = base;
  rx["placement"]["stages"] = {{"decompress", {{"threads", s.decompress}}}};
  nlohmann::json tx = base;
  tx["source"] = {{"kind", "synthetic"}, {"chunks", chunks}};
  tx["placement"]["stages"] = {{"compress", {{"threads", s.compress}}}};
  if (!s.curve_dir.empty()) {
    rx["security"] = {{"curve",
                       {{"secret_key_file", s.curve_dir + "/gateway.secret"},
                        {"allowed_keys_file", s.curve_dir + "/allowed"},
                        {"mode", s.curve_mode}}}};
    tx["security"] = {{"curve",
                       {{"secret_key_file", s.curve_dir + "/sender.secret"},
                        {"server_key_file", s.curve_dir + "/gateway.public"},
                        {"mode", s.curve_mode}}}};
  }
  Config rcfg = parse_config(rx, Role::receive);
  Config scfg = parse_config(tx, Role::send);
  std::stop_source never;
  RunResult rres;
  std::jthread receiver([&] { rres = run_receiver(rcfg, never.get_token()); });
  RunResult sres = run_sender(scfg, never.get_token());
  receiver.join();
  return {{"placement", s.placement},
          {"compress_threads", s.compress},
          {"connections", s.connections},
          {"decompress_threads", s.decompress},
          {"chunks", rres.summary["chunks"]},
          {"lost", rres.summary["lost"]},
          {"corrupt", rres.summary["corrupt"]},
          {"raw_mbps", rres.summary["raw_gbps"].get<double>() * 1000 / 8},
          {"seconds", rres.summary["seconds"]},
          {"sender_exit", sres.exit_code},
          {"receiver_exit", rres.exit_code}};
}

// The codec's figures (one core): ours against the lz4 library, shuffle-lz4, bslz4 and each
// bit-shuffle kernel; printed for people with `print`.
nlohmann::json codec_report(const CodecFigures& f, const std::string& data, std::size_t chunk,
                            int rounds, bool print) {
  nlohmann::json out = {{"chunk_bytes", chunk},
                        {"data", data},
                        {"compress_mbps", f.compress_mbps},
                        {"decompress_mbps", f.decompress_mbps},
                        {"ratio", f.ratio},
                        {"lz4_library_compress_mbps", f.lz4_compress_mbps},
                        {"lz4_library_decompress_mbps", f.lz4_decompress_mbps},
                        {"compress_vs_library", f.compress_mbps / f.lz4_compress_mbps},
                        {"decompress_vs_library", f.decompress_mbps / f.lz4_decompress_mbps},
                        {"shuffle_lz4_ratio", f.shuffle_ratio},
                        {"shuffle_lz4_compress_mbps", f.shuffle_compress_mbps},
                        {"shuffle_lz4_decompress_mbps", f.shuffle_decompress_mbps},
                        {"bslz4_ratio", f.bslz4_ratio},
                        {"bslz4_compress_mbps", f.bslz4_compress_mbps},
                        {"bslz4_decompress_mbps", f.bslz4_decompress_mbps},
                        {"bslz4_kernel", bslz4::kernel_name(bslz4::kernel_in_use())}};
  for (const auto& k : f.kernels) {
    out["bitshuffle_kernels"][k.name] = {{"shuffle_mbps", k.shuffle_mbps},
                                         {"unshuffle_mbps", k.unshuffle_mbps}};
  }
  if (print) {
    std::printf("codec (one core, MB per CPU-second, %zu-byte %s, median of %d rounds)\n", chunk,
                data.c_str(), rounds);
    std::printf("  lz4          compress %7.0f MB/s  decompress %7.0f MB/s  ratio %.3f\n",
                f.compress_mbps, f.decompress_mbps, f.ratio);
    std::printf(
        "  lz4 library  compress %7.0f MB/s  decompress %7.0f MB/s  (ours/library %.3f, %.3f)\n",
        f.lz4_compress_mbps, f.lz4_decompress_mbps, f.compress_mbps / f.lz4_compress_mbps,
        f.decompress_mbps / f.lz4_decompress_mbps);
    std::printf("  shuffle-lz4  compress %7.0f MB/s  decompress %7.0f MB/s  ratio %.3f\n",
                f.shuffle_compress_mbps, f.shuffle_decompress_mbps, f.shuffle_ratio);
    std::printf(
        "  bslz4        compress %7.0f MB/s  decompress %7.0f MB/s  ratio %.3f  (kernel %s)\n",
        f.bslz4_compress_mbps, f.bslz4_decompress_mbps, f.bslz4_ratio,
        bslz4::kernel_name(bslz4::kernel_in_use()));
    for (const auto& k : f.kernels) {
      std::printf("  bit-shuffle %-8s shuffle %7.0f MB/s  unshuffle %7.0f MB/s\n", k.name.c_str(),
                  k.shuffle_mbps, k.unshuffle_mbps);
    }
    std::fflush(stdout);
  }
  return out;
}

// Sender and receiver on 127.0.0.1 in four settings, each against the CPU-work limit of the
// codec's figures.
nlohmann::json loopback_report(const CodecFigures& f, std::size_t chunk, std::uint64_t chunks,
                               bool print) {
  const double cores = static_cast<double>(allowed_cpus().size());
  const double limit = cores / (1.0 / f.compress_mbps + 1.0 / f.decompress_mbps);
  nlohmann::json out = {
      {"cpu_work_limit_mbps", limit}, {"cores", cores}, {"runs", nlohmann::json::array()}};
  if (print) {
    std::printf(
        "loopback (sender and receiver on 127.0.0.1, %llu chunks; CPU-work limit "
        "cores/(1/c+1/d) = %.0f MB/s)\n",
        static_cast<unsigned long long>(chunks), limit);
  }
  const int n = static_cast<int>(cores);
  std::vector<LoopbackSetting> settings = {{"os", n, 2, std::max(1, n / 2), "", ""},
                                           {"os", n, 2, n, "", ""},
                                           {"numa-aware", n, 2, n, "", ""},
                                           {"numa-aware", n, 4, n, "", ""}};
  for (const auto& s : settings) {
    auto run = bench_loopback(s, chunk, chunks);
    run["fraction_of_limit"] = run["raw_mbps"].get<double>() / limit;
    if (print) {
      std::printf("  %-10s C=%d S=R=%d D=%d  %7.0f MB/s raw  %.2f of limit  lost %s corrupt %s\n",
                  s.placement.c_str(), s.compress, s.connections, s.decompress,
                  run["raw_mbps"].get<double>(), run["fraction_of_limit"].get<double>(),
                  run["lost"].dump().c_str(), run["corrupt"].dump().c_str());
      std::fflush(stdout);
    }
    out["runs"].push_back(run);
  }
  return out;
}

// What CURVE (every frame encrypted and authenticated) costs end to end: the same loopback
// run with and without it, alternating, medians of `rounds`.
nlohmann::json curve_report(std::size_t chunk, std::uint64_t chunks, int rounds, bool print) {
  const int n = static_cast<int>(allowed_cpus().size());
  std::string dir = write_bench_keys();
  std::vector<double> plain, curve, auth;
  for (int r = 0; r < rounds; ++r) {
    plain.push_back(
        bench_loopback({"numa-aware", n, 2, n, "", ""}, chunk, chunks)["raw_mbps"].get<double>());
    curve.push_back(
        bench_loopback({"numa-aware", n, 2, n, dir, "encrypt"}, chunk, chunks)["raw_mbps"]
            .get<double>());
    auth.push_back(
        bench_loopback({"numa-aware", n, 2, n, dir, "authenticate"}, chunk, chunks)["raw_mbps"]
            .get<double>());
  }
  std::filesystem::remove_all(dir);
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  // The cipher alone, on one core: what CurveZMQ does to every byte (XSalsa20-Poly1305).
  std::vector<unsigned char> buf(chunk / 2 + crypto_secretbox_MACBYTES),
      key(crypto_secretbox_KEYBYTES, 7), nonce(crypto_secretbox_NONCEBYTES, 1);
  if (sodium_init() < 0) throw std::runtime_error("libsodium cannot start");
  const double seal_mbps = rate_mbps(chunk / 2, 1, std::max(rounds, 3), [&](std::size_t) {
    crypto_secretbox_easy(buf.data(), buf.data(), chunk / 2, nonce.data(), key.data());
  });
  const double p = median(plain), c = median(curve), a = median(auth);
  nlohmann::json out = {{"cipher_mbps_per_core", seal_mbps},
                        {"plain_raw_mbps", p},
                        {"encrypt_raw_mbps", c},
                        {"authenticate_raw_mbps", a},
                        {"encrypt_ratio", c / p},
                        {"authenticate_ratio", a / p},
                        {"rounds", rounds}};
  if (print) {
    std::printf(
        "curve (loopback numa-aware C=%d S=R=2 D=%d, %d rounds, medians)\n"
        "  plain %7.0f MB/s raw  encrypt %7.0f MB/s (%.2f)  authenticate %7.0f MB/s (%.2f)\n"
        "  cipher alone (XSalsa20-Poly1305, one core) %7.0f MB/s of wire data\n",
        n, n, rounds, p, c, c / p, a, a / p, seal_mbps);
  }
  return out;
}

}  // namespace

int run_bench(const std::vector<std::string>& args) {
  std::string what = "all";
  bool json = false;
  std::uint64_t chunks = 100;
  int rounds = 5;
  std::size_t chunk = std::size_t{2560} * 2160 * 2;
  std::string input;
  int items = 100000;
  std::size_t item_bytes = 16384;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "codec" || a == "loopback" || a == "curve" || a == "queue" || a == "all") {
      what = a;
    } else if (a == "--items" && i + 1 < args.size() && what == "queue") {
      items = std::max(1, std::stoi(args[++i]));
    } else if (a == "--item-bytes" && i + 1 < args.size() && what == "queue") {
      item_bytes = std::max<std::size_t>(1, std::stoull(args[++i]));
    } else if (a == "--json") {
      json = true;
    } else if (a == "--chunks" && i + 1 < args.size()) {
      chunks = std::stoull(args[++i]);
    } else if (a == "--rounds" && i + 1 < args.size()) {
      rounds = std::max(1, std::stoi(args[++i]));
    } else if (a == "--input" && i + 1 < args.size() && what == "codec") {
      input = args[++i];
    } else if (a == "--chunk-bytes" && i + 1 < args.size() && what == "codec") {
      chunk = std::stoull(args[++i]);
    } else {
      std::fprintf(stderr,
                   "numastream-agent bench: unknown argument '%s'\n"
                   "usage: numastream-agent bench [codec|loopback|curve|queue|all] [--json] "
                   "[--rounds N] [--chunks N]\n"
                   "       numastream-agent bench codec [--input RAW-FILE [--chunk-bytes N]]\n"
                   "       numastream-agent bench queue [--items N] [--item-bytes N]\n",
                   a.c_str());
      return 2;
    }
  }
  nlohmann::json report = nlohmann::json::object();
  if (what == "queue") {
    report["queue"] = queue_report(rounds, items, item_bytes, !json);
    if (json) std::cout << report.dump() << std::endl;
    return 0;
  }
  if (chunk < 2 || chunk % 2) {
    std::fprintf(stderr, "numastream-agent bench: --chunk-bytes must be a positive even number\n");
    return 2;
  }
  // Four frames: the synthetic projections, or the first four chunks of --input.
  const Frames raw = input.empty() ? synthetic_frames(chunk, 4) : file_frames(input, chunk, 4);
  const CodecFigures f = bench_codec(raw, chunk, rounds);
  const std::string data = input.empty()
                               ? "synthetic projections"
                               : "chunks of " + input + " (" + std::to_string(raw.size()) + ")";
  report["codec"] = codec_report(f, data, chunk, rounds, !json);
  if (what == "loopback" || what == "all")
    report["loopback"] = loopback_report(f, chunk, chunks, !json);
  if (what == "curve" || what == "all")
    report["curve"] = curve_report(chunk, chunks, rounds, !json);
  if (what == "all") report["queue"] = queue_report(rounds, items, item_bytes, !json);
  if (json) std::cout << report.dump() << std::endl;
  return 0;
}

}  // namespace numastream
