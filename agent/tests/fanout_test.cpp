// Fan-out, end to end with the real agent binary: one gateway hands each verified chunk to
// several consumers at once (`sinks`), each with its guarantee.
#include <gtest/gtest.h>
#include <signal.h>
#include <zmq.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <thread>

#include "detector/stream2.hpp"
#include "process.hpp"
#include "store/nxmx_master.hpp"
#include "store/series_file.hpp"
#include "stream2_fixture.hpp"
#include "wire/wire.hpp"

namespace numastream::testing {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

const std::string kAgent = NUMASTREAM_AGENT;

// A source file of `bytes` at `path`: compressible, not trivially (seeded); its contents.
std::string source_file(const std::string& path, std::size_t bytes, std::uint64_t seed) {
  std::string source(bytes, '\0');
  std::mt19937_64 rng(seed);
  for (std::size_t i = 0; i < source.size(); i += 8) {
    const std::uint64_t v = rng() & 0x0F0F0F0F0F0F0F0Full;
    std::memcpy(source.data() + i, &v, 8);
  }
  std::ofstream(path, std::ios::binary) << source;
  return source;
}

// A file's size; 0 while it does not exist.
std::uintmax_t size_of(const std::string& path) {
  std::error_code ec;
  const auto n = fs::file_size(path, ec);
  return ec ? std::uintmax_t{0} : n;
}

// How long a file sink's `.part` validly is: the end its index's last whole record gives (a
// record is 16 bytes: the chunk's sequence and the file's length with it). A receiver killed
// between writing a chunk and recording it leaves bytes past this end, never acknowledged; the
// next receiver cuts them off and they come again.
std::uintmax_t recorded_length(const std::string& part) {
  std::ifstream in(part + ".idx", std::ios::binary);
  std::string idx((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (idx.size() < 16) return 0;
  std::uint64_t end = 0;
  std::memcpy(&end, idx.data() + (idx.size() / 16 - 1) * 16 + 8, 8);
  return end;
}

// A far receiver killed with its gateway resumed its file where the gateway said (what it had
// acknowledged), or, when none of its acknowledgements had reached a sender before the kill,
// kept the file as the same chunks came again.
bool resumed_or_kept(const json& far_summary, Process& far) {
  return far_summary["delivered_before"].get<int>() > 0 ||
         far.err().find("that no sender vouched for") != std::string::npos;
}

// The least size a `.part` file has, sampled every 2 ms from `at_start` bytes until it is renamed
// (complete) or 120 s pass: a copy that is resumed, never started again, never holds less.
std::uintmax_t least_size_until_renamed(const std::string& part, std::uintmax_t at_start) {
  std::uintmax_t least = at_start;
  eventually(
      [&] {
        std::error_code ec;
        const auto n = fs::file_size(part, ec);
        if (ec) return true;  // renamed: complete
        least = std::min<std::uintmax_t>(least, n);
        return false;
      },
      120s, 2ms);
  return least;
}

// One EIGER2 series (recorded from a real detector, replayed by the simulator) into four
// consumers at once: NXmx master and data files, a Stream V2 re-emit, the messages as they came
// in a file, and an onward numastream hop to a far receiver that writes its own file. The
// re-emit's reader stops for 10 s after three messages: the others lose nothing (a lossless
// consumer holds them back, never drops for them), and every copy ends whole: both files byte
// for byte the detector's messages, the reader's messages byte-identical and in order, the master
// and its data files holding every message of the series (test/codec/nxmx_test.py reads such
// files back image by image).
TEST(
    FanOut,
    ADetectorSeriesReachesNxmxFilesAReEmitAFileAndAnOnwardHopAtOnceWithOneReaderStoppedTenSeconds) {
  const std::string data = recordings();
  if (data.empty())
    NUMASTREAM_SKIP_OR_FAIL("the real EIGER2 Stream V2 recordings (" NUMASTREAM_STREAM2_DATA
                            ") are absent");
  const fs::path rec = fs::path(data) / "r500k_bm_bslz4_16bit";
  const auto expected = expected_series(rec);
  const std::string dir = temp_dir();
  const int port = free_ports(4);
  const std::string far_dir = temp_dir();
  Process far(receiver(
      port + 3, 1,
      {"--sink", "file", "--sink-path", far_dir + "/messages.raw", "--idle-timeout", "60"}));
  const json sinks = json::array({
      {{"kind", "hdf5"},
       {"path", dir + "/series-{series}.h5"},
       {"layout", "nxmx"},
       {"frames_per_file", 4}},
      {{"kind", "stream2"}, {"endpoint", ep(port + 1)}},
      {{"kind", "file"}, {"path", dir + "/messages.raw"}},
      {{"kind", "numastream"}, {"endpoint", ep(port + 3)}},
  });
  Process rx({kAgent, "receive", "--endpoint", ep(port), "--chunk-bytes", std::to_string(4 << 20),
              "--set", "sinks=" + sinks.dump(), "--idle-timeout", "60"});
  Consumer reader(ep(port + 1), /*bind=*/false, /*hwm=*/1);
  Process detector({kAgent, "detector-sim", "--endpoint", ep(port + 2), "--replay", rec.string(),
                    "--start", "--rate-hz", "20", "--linger-s", "30"});
  Process tx({kAgent, "send", "--endpoint", ep(port), "--chunk-bytes", std::to_string(4 << 20),
              "--source", "stream2", "--source-endpoint", ep(port + 2), "--connect-timeout", "10"});
  std::vector<std::string> got = reader.take(3, 60s);
  ASSERT_EQ(got.size(), 3u) << rx.err();
  const auto paused = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(10s);  // the reader stops
  auto rest = reader.take(expected.size() - got.size(), 60s);
  got.insert(got.end(), rest.begin(), rest.end());
  const double pause_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - paused).count();
  tx.signal(SIGINT);  // a person ends the detector's endless stream
  ASSERT_EQ(tx.wait(60s), 0) << tx.err();
  ASSERT_EQ(rx.wait(60s), 0) << rx.err();
  EXPECT_EQ(detector.wait(40s), 0) << detector.err();
  ASSERT_EQ(far.wait(60s), 0) << far.err();

  ASSERT_EQ(got.size(), expected.size()) << rx.err();
  EXPECT_TRUE(got == expected)
      << "the re-emitted messages are the detector's, byte for byte and in order";
  std::string all;
  for (const auto& m : expected) all += m;
  EXPECT_TRUE(read_bytes(dir + "/messages.raw") == all)
      << "the file holds every message as it came";
  EXPECT_TRUE(read_bytes(far_dir + "/messages.raw") == all)
      << "the far site's file holds every message as it came";
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  std::string error_text;
  const auto start =
      stream2::parse(std::span(reinterpret_cast<const std::byte*>(expected.front().data()),
                               expected.front().size()),
                     error_text);
  ASSERT_TRUE(start.has_value()) << error_text;
  const std::string series = "series-" + std::to_string(start->series_id);
  EXPECT_EQ(files, (std::vector<std::string>{"messages.raw", series + "_data_000001.h5",
                                             series + "_data_000002.h5", series + "_data_000003.h5",
                                             series + "_master.h5"}))
      << "one master, three whole data files of 4 + 4 + 2 images: " << rx.err();
  const auto master = hdf5::read_master(dir + "/" + series + "_master.h5");
  ASSERT_TRUE(master.has_value());
  EXPECT_FALSE(master->end_time.empty()) << "the series is complete";
  EXPECT_EQ(master->incomplete, "");
  std::set<std::uint64_t> held;
  if (master->start_sequence) held.insert(*master->start_sequence);
  if (master->end_sequence) held.insert(*master->end_sequence);
  for (int k = 1; k <= 3; ++k) {
    const auto id = hdf5::SeriesFile::identify(dir + "/" + hdf5::data_file_name(series, k));
    ASSERT_TRUE(id.has_value()) << k;
    held.insert(id->sequences.begin(), id->sequences.end());
  }
  EXPECT_EQ(held.size(), expected.size())
      << "the master and its data files hold every message of the series";

  const json r = summary(rx);
  EXPECT_EQ(r["lost"], 0);
  EXPECT_EQ(r["complete"], true);
  ASSERT_EQ(r["consumers"].size(), 4u) << r.dump();
  for (const auto& k : r["consumers"]) {
    EXPECT_EQ(k["guarantee"], "lossless");
    EXPECT_EQ(k["chunks"], expected.size()) << k.dump();
    EXPECT_EQ(k["passed_over"], 0);
  }
  EXPECT_EQ(r["consumers"][3]["onward"]["forwarded"], expected.size()) << r.dump();
  const json f = summary(far);
  EXPECT_EQ(f["lost"], 0);
  EXPECT_EQ(f["complete"], true);
  std::printf(
      "%zu messages to 4 consumers, the re-emit's reader stopped %.1f s: each consumer took %zu; "
      "file, "
      "re-emit, NXmx files and the far site's file whole\n",
      expected.size(), pause_s, expected.size());
}

// A latest-only consumer (a live view's zmq socket) whose reader never reads: it takes what it
// has room for, passes the rest by (counted), and holds the lossless file consumer back not at
// all: the file ends byte-identical to the source and the run ends on its own.
TEST(FanOut, ALatestOnlyConsumerThatNeverReadsHoldsNobodyBack) {
  const std::string dir = temp_dir();
  const std::string source = source_file(dir + "/in", 96u << 20, 29);
  const int port = free_ports(4);  // two connections, the live reader, metrics
  Consumer stalled(ep(port + 2), /*bind=*/true,
                   /*hwm=*/1);  // connected, never read: its buffers fill
  const json sinks = json::array({
      {{"kind", "file"}, {"path", dir + "/out.raw"}},
      {{"kind", "zmq"}, {"endpoint", ep(port + 2)}, {"guarantee", "latest"}},
  });
  Process rx(receiver(port, 2,
                      {"--set", "sinks=" + sinks.dump(), "--metrics-listen",
                       "127.0.0.1:" + std::to_string(port + 3)}));
  // Paced (about 4 s) so that the metrics are read while it runs: each consumer's figures,
  // labelled.
  Process tx(
      sender(port, 2, {"--source", "file", "--source-path", dir + "/in", "--rate-gbps", "0.2"}));
  const std::regex family(
      R"(numastream_consumer_chunks_total\{role="receive",consumer="1",kind="zmq",guarantee="latest"\} [0-9]+)");
  std::string metrics;
  for (int i = 0; i < 100 && !std::regex_search(metrics, family); ++i) {
    std::this_thread::sleep_for(50ms);
    metrics = http_get(port + 3, "/metrics");
  }
  EXPECT_TRUE(std::regex_search(metrics, family)) << metrics;
  ASSERT_EQ(tx.wait(120s), 0) << tx.err();
  ASSERT_EQ(rx.wait(60s), 0) << rx.err();
  EXPECT_TRUE(read_bytes(dir + "/out.raw") == source)
      << "the lossless consumer's file is the source, byte for byte";
  const json r = summary(rx);
  ASSERT_EQ(r["consumers"].size(), 2u) << r.dump();
  const json& file = r["consumers"][0];
  const json& live = r["consumers"][1];
  EXPECT_EQ(file["chunks"], 96);
  EXPECT_EQ(file["guarantee"], "lossless");
  EXPECT_EQ(live["guarantee"], "latest");
  EXPECT_GT(live["passed_over"].get<int>(), 0)
      << "a reader that never reads cannot have taken all 96";
  EXPECT_EQ(live["chunks"].get<int>() + live["passed_over"].get<int>(), 96) << live.dump();
  EXPECT_EQ(r["lost"], 0);
  std::printf(
      "latest-only consumer with a stalled reader: took %d, passed over %d; the file consumer took "
      "all 96\n",
      live["chunks"].get<int>(), live["passed_over"].get<int>());
}

// The onward hop as a consumer: one gateway writes its own file and carries the same verified
// chunks on to a numastream receiver at another site (kind "numastream", encrypted to the far
// receiver's key), which is killed mid-stream and restarted. A chunk is acknowledged to the
// sender only once both the file here and the far receiver have it, so nothing is lost: both
// files are the source, byte for byte, and the restarted far receiver resumed its own.
TEST(FanOut, AnOnwardHopBesideAFileLosesNothingWhenTheFarReceiverIsKilledAndRestarted) {
  const std::string dir = temp_dir();
  const std::string source = source_file(dir + "/in", 96u << 20, 31);
  for (const char* name : {"far", "gw"}) {
    Process k({kAgent, "keygen", "--out", dir + "/" + name});
    ASSERT_EQ(k.wait(10s), 0) << k.err();
  }
  std::ofstream(dir + "/allowed") << read_bytes(dir + "/gw.public");
  const int port = free_ports(3);  // two connections, the far receiver
  auto far_receiver = [&] {
    return receiver(port + 2, 1,
                    {"--sink", "file", "--sink-path", dir + "/far.raw", "--idle-timeout", "60",
                     "--set", "security.curve.secret_key_file=" + dir + "/far.secret", "--set",
                     "security.curve.allowed_keys_file=" + dir + "/allowed"});
  };
  std::optional<Process> far;
  far.emplace(far_receiver());
  const json sinks = json::array({
      {{"kind", "file"}, {"path", dir + "/out.raw"}},
      {{"kind", "numastream"},
       {"endpoint", ep(port + 2)},
       // The far receiver's public key as it would sit in a manifest (a file works as well).
       {"curve",
        {{"secret_key_file", dir + "/gw.secret"},
         {"server_key", read_bytes(dir + "/far.public").substr(0, 40)}}}},
  });
  Process rx(receiver(
      port, 2,
      {"--set", "sinks=" + sinks.dump(), "--reconnect-timeout", "60", "--idle-timeout", "60"}));
  // bslz4 (bitshuffle, bytes): the source's four zero bits of each byte compress away.
  Process tx(sender(port, 2,
                    {"--source", "file", "--source-path", dir + "/in", "--rate-gbps", "0.2",
                     "--reconnect-timeout", "60", "--codec", "bslz4", "--dtype", "uint8"}));
  ASSERT_TRUE(eventually([&] { return size_of(dir + "/far.raw.part") >= (12u << 20); }))
      << far->err();
  far->signal(SIGKILL);
  EXPECT_EQ(far->wait(10s), 128 + SIGKILL);
  far.reset();
  std::this_thread::sleep_for(1s);
  far.emplace(far_receiver());
  ASSERT_EQ(tx.wait(120s), 0) << tx.err() << "\n--- gateway:\n"
                              << rx.err() << "\n--- far:\n"
                              << far->err();
  ASSERT_EQ(rx.wait(120s), 0) << rx.err() << "\n--- far:\n" << far->err();
  ASSERT_EQ(far->wait(60s), 0) << far->err();
  EXPECT_TRUE(read_bytes(dir + "/out.raw") == source)
      << "the gateway's own file is the source, byte for byte";
  EXPECT_TRUE(read_bytes(dir + "/far.raw") == source)
      << "the far site's file is the source, byte for byte";
  const json g = summary(rx), f = summary(*far);
  ASSERT_EQ(g["consumers"].size(), 2u) << g.dump();
  const json& onward = g["consumers"][1];
  EXPECT_EQ(onward["kind"], "numastream");
  EXPECT_EQ(onward["chunks"], 96);
  EXPECT_EQ(onward["onward"]["security"], "curve");
  EXPECT_EQ(onward["onward"]["forwarded"].get<int>(), 96) << onward.dump();
  EXPECT_GT(f["delivered_before"].get<int>(), 0) << "the restarted far receiver resumed its file\n"
                                                 << f.dump() << "\n"
                                                 << far->err();
  EXPECT_EQ(f["lost"], 0);
  EXPECT_EQ(f["complete"], true);
  EXPECT_EQ(f["security"], "encrypt");
  // The hop carries the chunks compressed as they came to the gateway (the far receiver decodes
  // them): what the restarted far receiver got, it got at the ratio the gateway saw.
  const double ratio_here = g["ratio"].get<double>(), ratio_there = f["ratio"].get<double>();
  EXPECT_GT(ratio_here, 1.2) << "the source compresses";
  EXPECT_NEAR(ratio_there, ratio_here, 0.05 * ratio_here) << "the far site got compressed chunks\n"
                                                          << f.dump();
  std::printf(
      "onward hop as a consumer: far receiver killed at %s and restarted; it resumed after %d "
      "chunks; both files "
      "whole; compressed %.2fx at the gateway, %.2fx on the hop\n",
      "12 MiB", f["delivered_before"].get<int>(), ratio_here, ratio_there);
}

// A gateway and its far site killed together, mid-stream, and started again at once (a power cut
// of a rack; both pods rescheduled): the next gateway knows nothing the far receiver acknowledged
// and learns it from its sender (what the sender had acknowledged, every lossless consumer of the
// gateway had, the hop included), so the far receiver resumes its file rather than starting it
// again: its `.part` never shrinks below what it recorded (a chunk written but not yet recorded
// when the kill came is cut off and comes again), and both copies end whole. (Before, the next
// gateway said the far receiver had nothing: it started its file again at 0 bytes and waited for
// chunks no one would send again, until the hop gave up.)
TEST(FanOut, AGatewayAndItsFarSiteKilledTogetherResumeTheFarCopyInsteadOfStartingItAgain) {
  const std::string dir = temp_dir();
  const std::string source = source_file(dir + "/in", 64u << 20, 37);
  const int port = free_ports(3);  // two connections, the far receiver
  auto far_receiver = [&] {
    return receiver(port + 2, 1,
                    {"--sink", "file", "--sink-path", dir + "/far.raw", "--idle-timeout", "60"});
  };
  const json sinks = json::array({
      {{"kind", "file"}, {"path", dir + "/out.raw"}},
      {{"kind", "numastream"}, {"endpoint", ep(port + 2)}},
  });
  auto gateway = [&] {
    return receiver(
        port, 2,
        {"--set", "sinks=" + sinks.dump(), "--reconnect-timeout", "60", "--idle-timeout", "60"});
  };
  std::optional<Process> far, gw;
  far.emplace(far_receiver());
  gw.emplace(gateway());
  Process tx(sender(port, 2,
                    {"--source", "file", "--source-path", dir + "/in", "--rate-gbps", "0.1",
                     "--reconnect-timeout", "60"}));
  const std::string far_part = dir + "/far.raw.part";
  ASSERT_TRUE(eventually([&] { return size_of(far_part) >= (16u << 20); })) << far->err();
  gw->signal(SIGKILL);
  far->signal(SIGKILL);
  EXPECT_EQ(gw->wait(10s), 128 + SIGKILL);
  EXPECT_EQ(far->wait(10s), 128 + SIGKILL);
  const std::uintmax_t before = size_of(far_part);
  const std::uintmax_t recorded = recorded_length(far_part);
  far.emplace(far_receiver());
  gw.emplace(gateway());
  const std::uintmax_t least = least_size_until_renamed(far_part, before);
  EXPECT_GE(least, recorded) << "the far copy shrank below what it had recorded: from " << before
                             << " bytes (" << recorded << " recorded) to " << least
                             << " bytes\n--- far:\n"
                             << far->err();
  ASSERT_EQ(tx.wait(120s), 0) << tx.err() << "\n--- gateway:\n"
                              << gw->err() << "\n--- far:\n"
                              << far->err();
  ASSERT_EQ(gw->wait(60s), 0) << gw->err() << "\n--- far:\n" << far->err();
  ASSERT_EQ(far->wait(60s), 0) << far->err();
  EXPECT_TRUE(read_bytes(dir + "/out.raw") == source) << "the gateway's file";
  EXPECT_TRUE(read_bytes(dir + "/far.raw") == source) << "the far site's file";
  const json f = summary(*far);
  EXPECT_TRUE(resumed_or_kept(f, *far)) << f.dump() << "\n" << far->err();
  EXPECT_EQ(f["lost"], 0) << f.dump();
  std::printf(
      "gateway and far receiver killed together with %.1f MiB at the far site: it resumed after "
      "%d chunks, never below what it recorded; both files whole\n",
      static_cast<double>(before) / (1 << 20), f["delivered_before"].get<int>());
}

// The payloads of the data frames a zmq consumer received, in sequence order (each sequence
// once: a second copy fails the test), and how many end-of-stream frames came.
std::string payloads(const std::vector<std::string>& frames, int& ends) {
  std::map<std::uint64_t, std::string> by_seq;
  ends = 0;
  for (const auto& f : frames) {
    wire::Header h;
    const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(f.data()), f.size());
    if (wire::decode(bytes, 64u << 20, h) != wire::DecodeError::ok) {
      ADD_FAILURE() << "a frame the consumer got does not decode";
      continue;
    }
    if (h.type == wire::FrameType::end_of_stream) ++ends;
    if (h.type != wire::FrameType::data) continue;
    if (!by_seq.emplace(h.sequence, f.substr(wire::kHeaderSize, h.payload_size)).second) {
      ADD_FAILURE() << "chunk " << h.sequence << " came twice";
    }
  }
  std::string out;
  std::uint64_t next = 0;
  for (const auto& [seq, payload] : by_seq) {
    if (seq != next++) ADD_FAILURE() << "chunk " << next - 1 << " never came";
    out += payload;
  }
  return out;
}

// One stream into a file and a live analysis (a zmq consumer, lossless, with a spill of its own)
// whose reader stops after three chunks. With room in its spill the slow consumer holds nobody
// back: the file consumer gets the whole stream while the reader still stops; then it reads on
// and gets every chunk from the spill. With a spill too small for the stream it holds the others
// back once that is full (the file stays short while the reader stops), and still loses nothing.
TEST(FanOut, ASlowConsumerWithASpillHoldsNobodyBackUntilItsSpillIsFull) {
  const std::string dir = temp_dir();
  const std::string source = source_file(dir + "/in", 48u << 20, 37);
  for (const std::uint64_t budget : {std::uint64_t{256} << 20, std::uint64_t{8} << 20}) {
    SCOPED_TRACE("spill of " + std::to_string(budget >> 20) + " MiB");
    const bool room = budget > source.size() + (16u << 20);
    const int port = free_ports(4);  // two connections, the slow reader, metrics
    Consumer reader(ep(port + 2), /*bind=*/true, /*hwm=*/1);
    const std::string out = dir + "/out-" + std::to_string(budget) + ".raw";
    const json sinks = json::array({
        {{"kind", "file"}, {"path", out}},
        {{"kind", "zmq"},
         {"endpoint", ep(port + 2)},
         {"spill", {{"path", dir + "/spill-" + std::to_string(budget)}, {"max_bytes", budget}}}},
    });
    Process rx(receiver(port, 2,
                        {"--set", "sinks=" + sinks.dump(), "--idle-timeout", "60",
                         "--metrics-listen", "127.0.0.1:" + std::to_string(port + 3)}));
    Process tx(sender(port, 2, {"--source", "file", "--source-path", dir + "/in"}));
    std::vector<std::string> got = reader.take(3, 30s);
    ASSERT_EQ(got.size(), 3u) << rx.err();
    // The reader stops. The file consumer goes on (with room in the spill: to the end of the
    // stream), or is held back once the spill is full.
    auto file_whole = [&] {
      std::error_code ec;
      return fs::file_size(out + ".part", ec) == source.size() && !ec &&
             read_bytes(out + ".part") == source;
    };
    for (int i = 0; i < (room ? 600 : 60) && !file_whole(); ++i) std::this_thread::sleep_for(50ms);
    if (room) {
      EXPECT_TRUE(file_whole()) << "the file is whole while the slow consumer's reader still stops";
    } else {
      EXPECT_FALSE(file_whole()) << "a full spill holds the others back";
    }
    // What the slow consumer's spill holds meanwhile, as the gateway reports it (the operator
    // shows it as status.observed.consumers[].spillBytes): at least a chunk, at most its budget.
    const std::regex held(
        R"(numastream_consumer_spill_bytes\{role="receive",consumer="1",kind="zmq",guarantee="lossless"\} ([0-9]+))");
    std::smatch m;
    const std::string metrics = http_get(port + 3, "/metrics");
    ASSERT_TRUE(std::regex_search(metrics, m, held)) << metrics;
    EXPECT_GE(std::stoull(m[1]), 1u << 20) << metrics;
    EXPECT_LE(std::stoull(m[1]), budget) << metrics;
    auto rest =
        reader.take(48 + 1 - got.size(), 60s);  // reads on: every chunk, then the end of the stream
    got.insert(got.end(), rest.begin(), rest.end());
    ASSERT_EQ(tx.wait(60s), 0) << tx.err();
    ASSERT_EQ(rx.wait(60s), 0) << rx.err();
    int ends = 0;
    EXPECT_TRUE(payloads(got, ends) == source)
        << "the slow consumer got every chunk once, " << got.size() << " frames";
    EXPECT_EQ(ends, 1);
    EXPECT_TRUE(read_bytes(out) == source);
    const json r = summary(rx);
    ASSERT_EQ(r["consumers"].size(), 2u) << r.dump();
    const json& slow = r["consumers"][1];
    EXPECT_EQ(slow["chunks"], 48) << slow.dump();
    EXPECT_GT(slow["spill"]["spilled"].get<int>(), 0) << slow.dump();
    EXPECT_LE(slow["spill"]["peak_bytes"].get<std::uint64_t>(), budget) << slow.dump();
    EXPECT_EQ(slow["spill"]["pending_bytes"], 0)
        << "every spilled chunk was handed on: " << slow.dump();
    EXPECT_EQ(r["lost"], 0);
    std::printf(
        "spill of %llu MiB: the slow consumer spilled %d of 48 chunks (peak %.1f MiB); %s\n",
        static_cast<unsigned long long>(budget >> 20), slow["spill"]["spilled"].get<int>(),
        slow["spill"]["peak_bytes"].get<double>() / (1 << 20),
        room ? "the file was whole while its reader stopped"
             : "the full spill held the file back until it read on");
  }
}

// An onward hop beside a file, the hop with a spill of its own (256 MiB unless said): the far
// receiver, the gateway's command line, and what the far site and the spill hold.
struct HopWithASpill {
  std::string dir = temp_dir();
  std::string source;
  int port = free_ports(4);  // two connections, a spare, the far receiver
  std::vector<std::string> far_receiver = receiver(
      port + 3, 1, {"--sink", "file", "--sink-path", dir + "/far.raw", "--idle-timeout", "60"});
  std::optional<Process> far;
  std::vector<std::string> gateway;

  HopWithASpill(std::size_t bytes, int seed, std::uint64_t spill_bytes = 256 << 20)
      : source(source_file(dir + "/in", bytes, seed)) {
    far.emplace(far_receiver);
    const json sinks = json::array({
        {{"kind", "file"}, {"path", dir + "/out.raw"}},
        {{"kind", "numastream"},
         {"endpoint", ep(port + 3)},
         {"spill", {{"path", dir + "/spill"}, {"max_bytes", spill_bytes}}}},
    });
    gateway = receiver(
        port, 2,
        {"--set", "sinks=" + sinks.dump(), "--reconnect-timeout", "60", "--idle-timeout", "60"});
  }
  // A sender window wider than the onward link's, so that the stopped far site fills the link and
  // the consumer's queue behind it (with a narrower one the sender is the first to wait).
  std::vector<std::string> sender_args() const {
    return sender(port, 2,
                  {"--source", "file", "--source-path", dir + "/in", "--rate-gbps", "0.2",
                   "--reconnect-timeout", "60", "--set", "window=128"});
  }
  std::uintmax_t spilled() const {
    std::uintmax_t n = 0;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir + "/spill", ec))
      n += size_of(e.path().string());
    return n;
  }
  // The far site stops taking (SIGSTOP) once it holds `bytes`: the hop's chunks go to its spill.
  void stop_far_after(std::uintmax_t bytes) {
    EXPECT_TRUE(eventually([&] { return size_of(dir + "/far.raw.part") >= bytes; }))
        << "the far site never held " << bytes << " bytes";
    far->signal(SIGSTOP);
  }
  // The gateway SIGKILLed and started again, then as both_sites_whole.
  void gateway_killed_then_both_sites_whole(std::unique_ptr<Process>& gw) {
    gw->signal(SIGKILL);
    EXPECT_EQ(gw->wait(10s), 128 + SIGKILL);
    gw = std::make_unique<Process>(gateway);
    both_sites_whole(*gw);
  }
  // The far site runs again and ends; both sites hold the source, byte for byte.
  void both_sites_whole(Process& gw) {
    far->signal(SIGCONT);
    ASSERT_EQ(gw.wait(120s), 0) << gw.err();
    ASSERT_EQ(far->wait(60s), 0) << far->err();
    EXPECT_TRUE(read_bytes(dir + "/out.raw") == source)
        << "the gateway's file: " << read_bytes(dir + "/out.raw").size() << " bytes of "
        << source.size() << "\n"
        << gw.err();
    EXPECT_TRUE(read_bytes(dir + "/far.raw") == source) << "the far site's file";
    EXPECT_NE(gw.err().find("an earlier process spilled go to its sink first"), std::string::npos)
        << gw.err();
    const json f = summary(*far);
    EXPECT_EQ(f["lost"], 0);
    EXPECT_EQ(f["complete"], true);
  }
};

// A far site that is down when the stream starts (and stays down past every timeout of the
// link) rides on the hop's spill: the gateway stays up, its file is whole at once, and once the
// far site comes up the hop catches up and both sites end whole. (Before, the gateway exited 1
// after the connect timeout with the spill made for exactly that, its file left .part.)
TEST(FanOut, AFarSiteThatIsDownRidesOnTheHopsSpillAndCatchesUp) {
  const std::string dir = temp_dir();
  const std::string source = source_file(dir + "/in", 24u << 20, 53);
  const int port = free_ports(4);
  const json sinks = json::array({
      {{"kind", "file"}, {"path", dir + "/out.raw"}},
      {{"kind", "numastream"},
       {"endpoint", ep(port + 3)},
       {"spill", {{"path", dir + "/spill"}, {"max_bytes", 256u << 20}}}},
  });
  const auto start = std::chrono::steady_clock::now();
  Process gw(receiver(port, 2,
                      {"--set", "sinks=" + sinks.dump(), "--set", "timeouts.connect_s=2", "--set",
                       "timeouts.reconnect_s=2", "--idle-timeout", "60"}));
  Process tx(sender(port, 2,
                    {"--source", "file", "--source-path", dir + "/in", "--rate-gbps", "0.4",
                     "--reconnect-timeout", "60"}));
  eventually([&] { return size_of(dir + "/out.raw.part") >= source.size(); });
  EXPECT_EQ(size_of(dir + "/out.raw.part"), source.size())
      << "the local file waits for the far site\n"
      << gw.err();
  std::this_thread::sleep_until(start + 5s);  // past the link's connect timeout (2 s)
  ASSERT_TRUE(gw.running()) << "the gateway gave up on the far site:\n" << gw.err();
  const double down =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  Process far(receiver(port + 3, 1, {"--sink", "file", "--sink-path", dir + "/far.raw"}));
  ASSERT_EQ(tx.wait(60s), 0) << tx.err();
  ASSERT_EQ(gw.wait(60s), 0) << gw.err();
  ASSERT_EQ(far.wait(60s), 0) << far.err();
  EXPECT_TRUE(read_bytes(dir + "/out.raw") == source) << "the gateway's file";
  EXPECT_TRUE(read_bytes(dir + "/far.raw") == source) << "the far site's file";
  const json g = summary(gw);
  EXPECT_EQ(g["complete"], true) << g.dump();
  std::printf(
      "far site down %.1f s from the start: the gateway's file whole at once, %d chunks "
      "spilled for the hop; the far site up, both files whole\n",
      down, g["consumers"][1]["spill"]["spilled"].get<int>());
}

// A gateway killed while a slow consumer's chunks wait in its spill: an onward hop whose far
// receiver is stopped (SIGSTOP), beside a file. The next gateway process hands what the spill
// holds to that consumer first, the sender resends what was never acknowledged, and once the far
// receiver runs again both sites hold the whole stream. (A zmq consumer could not show this:
// what a gateway has handed to ZeroMQ is gone with it; an onward hop is acknowledged.)
TEST(FanOut, WhatASlowConsumerSpilledReachesItAfterTheGatewayIsKilled) {
  HopWithASpill hop(32u << 20, 41);
  auto gw = std::make_unique<Process>(hop.gateway);
  Process tx(hop.sender_args());
  hop.stop_far_after(3u << 20);
  eventually([&] { return hop.spilled() >= (8u << 20); });
  const std::uintmax_t held = hop.spilled();
  ASSERT_GE(held, 8u << 20) << gw->err();
  hop.gateway_killed_then_both_sites_whole(gw);
  ASSERT_EQ(tx.wait(60s), 0) << tx.err();
  const json g = summary(*gw);
  std::printf(
      "gateway killed with %.1f MiB in the onward consumer's spill: the next process recovered %d "
      "chunks; "
      "both files whole\n",
      static_cast<double>(held) / (1 << 20), g["consumers"][1]["spill"]["recovered"].get<int>());
}

// The whole stream acknowledged to its sender because the hop's spill took what the stopped far
// site could not: the sender's end of stream stays unacknowledged until the spill has handed
// every chunk of the stream on, so the sender waits, and a gateway killed then (its node
// rebooted while the HPC site was down) gets the stream's end again from the sender: the next
// process hands the spill on and ends the stream at both sites. (Acknowledged at once, the end
// would let the sender finish, and the next gateway process would wait for a stream that never
// comes back.)
TEST(FanOut,
     AStreamsEndWaitsForWhatItsConsumersSpilledSoAGatewayKilledAfterTheSourceEndedStillEndsIt) {
  HopWithASpill hop(24u << 20, 43);
  auto gw = std::make_unique<Process>(hop.gateway);
  Process tx(hop.sender_args());
  hop.stop_far_after(2u << 20);
  // The file consumer has the whole stream: every chunk was acknowledged to the sender.
  eventually([&] { return size_of(hop.dir + "/out.raw.part") >= hop.source.size(); });
  ASSERT_EQ(size_of(hop.dir + "/out.raw.part"), hop.source.size()) << gw->err();
  std::this_thread::sleep_for(2s);
  EXPECT_TRUE(tx.running())
      << "the sender ended with the stream's end acknowledged while the spill still held "
      << hop.spilled() << " bytes of it:\n"
      << tx.err();
  const std::uintmax_t held = hop.spilled();
  hop.gateway_killed_then_both_sites_whole(gw);
  ASSERT_EQ(tx.wait(60s), 0) << tx.err();
  const json g = summary(*gw);
  EXPECT_EQ(g["complete"], true) << g.dump();
  std::printf(
      "the source ended and was acknowledged with %.1f MiB in the hop's spill; the sender waited "
      "for its end; "
      "the gateway killed then: the next process recovered %d chunks and ended the stream at both "
      "sites\n",
      static_cast<double>(held) / (1 << 20), g["consumers"][1]["spill"]["recovered"].get<int>());
}

// A receiver and its sender killed together and both started again: the new sender (a file
// source, no state record) knows of no acknowledgement, so it resumes the stream from nothing.
// The receiver keeps the file it wrote, chunk by chunk as the same chunks come again: it never
// holds less than its index recorded (before, it started the file again at 0 bytes), and ends
// whole. This is also what a far site sees whose acknowledgements never reached its gateway
// before both were killed.
TEST(FanOut, AReceiverAndItsSenderKilledTogetherKeepTheFileThoughNoAcknowledgementIsRemembered) {
  const std::string dir = temp_dir();
  const std::string source = source_file(dir + "/in", 48u << 20, 53);
  const int port = free_ports(1);
  const auto rx_args = receiver(
      port, 1, {"--sink", "file", "--sink-path", dir + "/out.raw", "--idle-timeout", "60"});
  const auto tx_args = sender(port, 1,
                              {"--source", "file", "--source-path", dir + "/in", "--rate-gbps",
                               "0.2", "--reconnect-timeout", "60"});
  std::optional<Process> rx(std::in_place, rx_args), tx(std::in_place, tx_args);
  const std::string part = dir + "/out.raw.part";
  ASSERT_TRUE(eventually([&] { return recorded_length(part) >= (16u << 20); })) << rx->err();
  tx->signal(SIGKILL);
  rx->signal(SIGKILL);
  EXPECT_EQ(tx->wait(10s), 128 + SIGKILL);
  EXPECT_EQ(rx->wait(10s), 128 + SIGKILL);
  const std::uintmax_t before = size_of(part);
  const std::uintmax_t recorded = recorded_length(part);
  rx.emplace(rx_args);
  tx.emplace(tx_args);
  const std::uintmax_t least = least_size_until_renamed(part, before);
  EXPECT_GE(least, recorded) << "the file shrank below what it had recorded: from " << before
                             << " bytes (" << recorded << " recorded) to " << least << "\n"
                             << rx->err();
  ASSERT_EQ(tx->wait(120s), 0) << tx->err();
  ASSERT_EQ(rx->wait(60s), 0) << rx->err();
  EXPECT_TRUE(read_bytes(dir + "/out.raw") == source);
  EXPECT_NE(rx->err().find("that no sender vouched for"), std::string::npos) << rx->err();
  const json r = summary(*rx);
  EXPECT_EQ(r["delivered_before"], 0) << r.dump();
  std::printf(
      "receiver and sender killed together with %.1f MiB recorded; both started again knowing of "
      "no acknowledgement: the file never held less than %.1f MiB and ended whole\n",
      static_cast<double>(recorded) / (1 << 20), static_cast<double>(least) / (1 << 20));
}

// The same with a spill between them: a far site that stopped, chunks waiting in the hop's spill
// (acknowledged to the sender already), then the gateway and the far site killed together. What
// the hop's spill holds was not delivered to the far site whatever the sender was told: the next
// gateway has the far receiver resume below it, hands the spill on, and the far copy never
// shrinks below what it recorded.
TEST(FanOut, AGatewayAndItsFarSiteKilledTogetherWithChunksInTheHopsSpillLoseNoneOfThem) {
  HopWithASpill hop(32u << 20, 59);
  auto gw = std::make_unique<Process>(hop.gateway);
  Process tx(hop.sender_args());
  hop.stop_far_after(4u << 20);
  eventually([&] { return hop.spilled() >= (8u << 20); });
  ASSERT_GE(hop.spilled(), 8u << 20) << gw->err();
  gw->signal(SIGKILL);
  hop.far->signal(SIGKILL);
  EXPECT_EQ(gw->wait(10s), 128 + SIGKILL);
  EXPECT_EQ(hop.far->wait(10s), 128 + SIGKILL);
  const std::string far_part = hop.dir + "/far.raw.part";
  const std::uintmax_t before = size_of(far_part);
  const std::uintmax_t recorded = recorded_length(far_part);
  hop.far.emplace(hop.far_receiver);
  gw = std::make_unique<Process>(hop.gateway);
  const std::uintmax_t least = least_size_until_renamed(far_part, before);
  EXPECT_GE(least, recorded) << "the far copy shrank below what it had recorded: from " << before
                             << " bytes (" << recorded << " recorded) to " << least;
  hop.both_sites_whole(*gw);
  ASSERT_EQ(tx.wait(60s), 0) << tx.err();
  const json f = summary(*hop.far);
  EXPECT_TRUE(resumed_or_kept(f, *hop.far)) << f.dump() << "\n" << hop.far->err();
  std::printf(
      "gateway and far receiver killed together with %.1f MiB at the far site and %d chunks in the "
      "hop's spill: the far site resumed after %d chunks, never below what it recorded; both files "
      "whole\n",
      static_cast<double>(before) / (1 << 20),
      summary(*gw)["consumers"][1]["spill"]["recovered"].get<int>(),
      f["delivered_before"].get<int>());
}

// Chunks the hop's sink has read out of its spill but the far site has not acknowledged (the far
// site came back briefly and stopped again) stay in the spill: the gateway killed then loses
// none of them, its next process hands them on again. (A small spill: segments of two chunks,
// each deleted once read through unless a chunk in it is still held.)
TEST(FanOut, ChunksReadOutOfASpillStayThereUntilTheFarSiteHasThem) {
  HopWithASpill hop(32u << 20, 47, 16u << 20);
  auto gw = std::make_unique<Process>(hop.gateway);
  Process tx(hop.sender_args());
  hop.stop_far_after(2u << 20);
  eventually([&] { return hop.spilled() >= (10u << 20); });
  ASSERT_GE(hop.spilled(), 10u << 20) << gw->err();
  const std::uintmax_t before = size_of(hop.dir + "/far.raw.part");
  hop.far->signal(SIGCONT);  // back briefly: the hop reads its spill out and sends
  ASSERT_TRUE(eventually([&] { return size_of(hop.dir + "/far.raw.part") >= before + (2u << 20); },
                         std::chrono::seconds(60), 5ms))
      << "the far site, back, took nothing from the hop";
  hop.far->signal(SIGSTOP);
  std::this_thread::sleep_for(
      500ms);  // the hop's window fills from the spill again, unacknowledged
  hop.gateway_killed_then_both_sites_whole(gw);
  ASSERT_EQ(tx.wait(60s), 0) << tx.err();
  const json g = summary(*gw);
  std::printf(
      "the far site back briefly and stopped again, the gateway killed: the next process recovered "
      "%d chunks "
      "from the spill; both files whole\n",
      g["consumers"][1]["spill"]["recovered"].get<int>());
}

// A lossless consumer that fails (its file cannot be written) fails the run, naming it: what
// it was promised cannot be kept, and the senders keep what was not acknowledged.
// Two pipelines (two gateways, each with its detector's stream 0) hand their streams to one far
// site. Stream ids are unique within a pipeline only: the far receiver keeps each pipeline's
// stream 0 apart by the origin its gateway names, and writes each to a file of its own. (Before,
// the two went into one file: each sequence number from whichever gateway came first, the other
// dropped as a duplicate.)
TEST(FanOut, TwoPipelinesWhoseStreamZeroMeetAtOneFarSiteEachEndInAFileOfTheirOwn) {
  const std::string dir = temp_dir();
  const std::string a = source_file(dir + "/a.in", 24u << 20, 41);
  const std::string b = source_file(dir + "/b.in", 24u << 20, 42);
  const int port = free_ports(3);  // gateway a, gateway b, the far receiver
  Process far(receiver(port + 2, 1,
                       {"--sink", "file", "--sink-path", dir + "/far/{origin}/{stream}.raw",
                        "--set", "streams=2", "--idle-timeout", "60"}));
  auto gateway = [&](int at, const std::string& origin) {
    const json sinks = json::array({{{"kind", "file"}, {"path", dir + "/" + origin + ".raw"}},
                                    {{"kind", "numastream"}, {"endpoint", ep(port + 2)}}});
    return receiver(port + at, 1, {"--set", "sinks=" + sinks.dump(), "--set", "origin=" + origin});
  };
  Process ga(gateway(0, "beamline-a.scan"));
  Process gb(gateway(1, "beamline-b.scan"));
  Process ta(sender(port, 1,
                    {"--source", "file", "--source-path", dir + "/a.in", "--rate-gbps", "0.4",
                     "--set", "origin=beamline-a.scan"}));
  Process tb(sender(port + 1, 1,
                    {"--source", "file", "--source-path", dir + "/b.in", "--rate-gbps", "0.4",
                     "--set", "origin=beamline-b.scan"}));
  for (Process* p : {&ta, &tb, &ga, &gb})
    ASSERT_EQ(p->wait(120s), 0) << p->err() << "\n--- far:\n" << far.err();
  ASSERT_EQ(far.wait(60s), 0) << far.err();
  EXPECT_TRUE(read_bytes(dir + "/beamline-a.scan.raw") == a);
  EXPECT_TRUE(read_bytes(dir + "/beamline-b.scan.raw") == b);
  EXPECT_TRUE(read_bytes(dir + "/far/beamline-a.scan/0.raw") == a)
      << "pipeline a's stream 0 at the far site is pipeline a's, byte for byte";
  EXPECT_TRUE(read_bytes(dir + "/far/beamline-b.scan/0.raw") == b)
      << "pipeline b's stream 0 at the far site is pipeline b's, byte for byte";
  const json f = summary(far);
  EXPECT_EQ(f["lost"], 0) << f.dump();
  EXPECT_EQ(f["duplicates"], 0) << f.dump();
  ASSERT_EQ(f["streams"].size(), 2u) << f.dump();
  std::set<std::string> origins;
  for (const auto& s : f["streams"]) {
    EXPECT_EQ(s["origin_stream_id"], 0) << s.dump();
    EXPECT_EQ(s["delivered"], 24) << s.dump();
    origins.insert(s["origin"].get<std::string>());
  }
  EXPECT_EQ(origins, (std::set<std::string>{"beamline-a.scan", "beamline-b.scan"}));
}

TEST(FanOut, ALosslessConsumerThatFailsEndsTheRunNamingIt) {
  const std::string dir = temp_dir();
  const int port = free_ports(2);
  const json sinks = json::array({
      {{"kind", "file"}, {"path", dir + "/a-{stream}.raw"}},
      {{"kind", "file"}, {"path", dir + "/b.raw"}},  // no {stream}: the second stream is refused
  });
  Process rx(receiver(port, 1, {"--streams", "2", "--set", "sinks=" + sinks.dump()}));
  Process a(sender(port, 1,
                   {"--chunks", "0", "--rate-gbps", "0.1", "--set", "stream_id=1",
                    "--metrics-listen", "127.0.0.1:0"}));
  ASSERT_TRUE(acknowledged(a, 1)) << a.err() << rx.err();  // the first stream has its file
  Process b(sender(port, 1, {"--chunks", "0", "--rate-gbps", "0.1", "--set", "stream_id=2"}));
  EXPECT_EQ(rx.wait(20s), 1) << rx.err();
  EXPECT_NE(rx.err().find("sink.path has no {stream} placeholder"), std::string::npos) << rx.err();
  a.signal(SIGKILL);
  b.signal(SIGKILL);
}

}  // namespace
}  // namespace numastream::testing
