// The gateway's Stream V2 series sink (pipeline/series_sink.hpp) killed at every write of its
// files and started again: the next gateway, sent what the killed one never acknowledged (as a
// sender does), publishes the series with each image exactly once — in the file, in the count it
// reports — for the one-file and the NXmx layouts, written through the page cache and past it;
// a flush the kill interrupted is undone (the undo journal of store/undo_journal.hpp), so none
// of the kill points leaves a file the next gateway cannot go on with.
#include "pipeline/series_sink.hpp"

#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "chunks.hpp"
#include "detector/stream2.hpp"
#include "kill_at_write.hpp"

namespace numastream {
namespace {

constexpr std::uint64_t kImages = 4;
constexpr std::uint64_t kRows = 8, kCols = 10;
// Kill points: every write of a one-file series; every third of an NXmx series (most of its
// writes are a master's, made whole under a temporary name); under a sanitizer (there for memory
// and thread errors, and slower) five times fewer.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr int kSanitizerStride = 5;
#else
constexpr int kSanitizerStride = 1;
#endif

std::vector<std::byte> pixels_of(std::uint64_t id) {
  std::vector<std::byte> p(kRows * kCols * 2);
  for (std::size_t i = 0; i < p.size(); ++i)
    p[i] = static_cast<std::byte>((i * 3 + id * 41) & 0xff);
  return p;
}

// The series as its sender carries it: message i has sequence i (start, images 0..3, end).
std::vector<std::vector<std::byte>> series_messages() {
  stream2::StartInfo info;
  info.series_id = 1;
  info.series_unique_id = "kill";
  info.number_of_images = kImages;
  info.dims = {kRows, kCols};
  info.channels = {"threshold_1"};
  std::vector<std::vector<std::byte>> out{stream2::build_start(info)};
  for (std::uint64_t id = 0; id < kImages; ++id) {
    out.push_back(stream2::build_image(1, "kill", id, {kRows, kCols}, "uint16",
                                       stream2::Compression::none,
                                       {{"threshold_1", pixels_of(id)}}));
  }
  out.push_back(stream2::build_end(1, "kill"));
  return out;
}

Chunk chunk(std::uint64_t seq, const std::vector<std::byte>& message) {
  return testing::chunk_of(seq, message);
}

struct Layout {
  bool direct;
  std::uint64_t frames_per_file;  // 0: one file per series
  std::string name() const {
    return std::string(frames_per_file ? "nxmx" : "one-file") +
           (direct ? ", direct" : ", buffered");
  }
};

// A gateway: puts `seqs` of the series into a sink on `dir`, flushing after each as an idle sink
// does; `ack` hears each acknowledgement. `resumed`: the stream's sender reports chunks an
// earlier gateway acknowledged.
nlohmann::json gateway(const std::string& dir, const Layout& layout, bool resumed,
                       const std::vector<std::uint64_t>& seqs,
                       const std::function<void(std::uint64_t)>& ack) {
  const auto messages = series_messages();
  SeriesOutcomes outcomes;
  NxmxOptions nxmx;
  nxmx.frames_per_file = layout.frames_per_file;
  SeriesSink sink(
      dir + "/scan.h5", 0640, layout.direct,
      [&](int, std::uint32_t, std::uint64_t seq) { ack(seq); },
      [resumed](std::uint32_t) { return resumed; }, outcomes, nxmx);
  StageStats st("sink");
  for (std::uint64_t seq : seqs) {
    sink.put(chunk(seq, messages[seq]), st);
    sink.idle(st);
  }
  sink.finish();
  nlohmann::json summary;
  sink.report(summary);
  return summary;
}

// What `fn` returns, run in a child process (its text through a pipe; "" if it died).
std::string in_child(const std::function<std::string()>& fn) {
  int out[2];
  if (::pipe(out) != 0) return "";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(out[0]);
    const std::string text = fn();
    for (std::size_t at = 0; at < text.size();) {
      const ssize_t w = ::write(out[1], text.data() + at, text.size() - at);
      if (w <= 0) std::_Exit(2);
      at += static_cast<std::size_t>(w);
    }
    std::_Exit(0);
  }
  ::close(out[1]);
  std::string text;
  char buf[4096];
  for (ssize_t r; (r = ::read(out[0], buf, sizeof buf)) > 0;)
    text.append(buf, static_cast<std::size_t>(r));
  ::close(out[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return text;
}

// The images a published series holds, read with HDF5: its shape and each image's pixels.
// The HDF5 objects open in this process, by type and file name (for a message).
std::string open_objects() {
  const ssize_t n = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);
  if (n <= 0) return "none";
  std::vector<hid_t> ids(static_cast<std::size_t>(n));
  const ssize_t got = H5Fget_obj_ids(H5F_OBJ_ALL, H5F_OBJ_ALL, ids.size(), ids.data());
  std::string out;
  for (ssize_t i = 0; i < got; ++i) {
    char name[512] = {};
    H5Fget_name(ids[static_cast<std::size_t>(i)], name, sizeof name);
    out += "[type " +
           std::to_string(static_cast<int>(H5Iget_type(ids[static_cast<std::size_t>(i)]))) +
           " in " + name + "] ";
  }
  return out;
}

void expect_whole(const std::string& file, const Layout& layout, const std::string& where) {
  // Closing the file closes whatever of it this reading opened (an NXmx master's virtual
  // dataset opens its data files).
  const hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG);
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, fapl);
  H5Pclose(fapl);
  ASSERT_GE(f, 0) << where << ": " << file << " does not open";
  const char* name = layout.frames_per_file ? "/entry/data/data" : "/entry/data/threshold_1";
  const hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
  ASSERT_GE(d, 0) << where << ": no " << name;
  const hid_t space = H5Dget_space(d);
  hsize_t dims[3] = {};
  H5Sget_simple_extent_dims(space, dims, nullptr);
  H5Sclose(space);
  EXPECT_EQ(dims[0], kImages) << where << ": images in " << file;
  std::vector<std::uint16_t> all(kImages * kRows * kCols);
  if (dims[0] == kImages) {
    EXPECT_GE(H5Dread(d, H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, all.data()), 0);
    for (std::uint64_t id = 0; id < kImages; ++id) {
      const auto want = pixels_of(id);
      EXPECT_EQ(std::memcmp(all.data() + id * kRows * kCols, want.data(), want.size()), 0)
          << where << ": image " << id << " is not the detector's";
    }
  }
  EXPECT_GE(H5Dclose(d), 0) << where;
  EXPECT_GE(H5Fclose(f), 0) << where << ": " << file << " does not close";
}

TEST(SeriesSink, AGatewayKilledAtEveryWriteOfItsFilesPublishesEachImageOnceWhenStartedAgain) {
  // What an earlier test of this process left open (the unit tests may share one: HDF5 keeps a
  // damaged file's objects when it refuses it) is not this test's.
  const ssize_t open_before = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);
  for (const Layout layout :
       {Layout{false, 0}, Layout{true, 0}, Layout{false, 2}, Layout{true, 2}}) {
    std::vector<std::uint64_t> all;
    for (std::uint64_t s = 0; s < kImages + 2; ++s) all.push_back(s);
    // The whole run once, untouched: how many writes there are to be killed at.
    const std::string dry = std::filesystem::temp_directory_path() / "numastream-series-sink-dry";
    std::filesystem::remove_all(dry);
    std::filesystem::create_directories(dry);
    const auto run =
        testing::kill_at_write(0, [&] { gateway(dry, layout, false, all, [](auto) {}); });
    ASSERT_FALSE(run.killed);
    ASSERT_TRUE(WIFEXITED(run.status) && WEXITSTATUS(run.status) == 0)
        << layout.name() << ": the gateway failed untouched (status " << run.status << ")";
    ASSERT_GT(run.writes, 0) << layout.name();
    std::filesystem::remove_all(dry);
    // What each kill point led to. A torn write of HDF5's metadata can leave a file HDF5 cannot
    // read back, or whose chunk index lost images it had flushed (HDF5 is not crash-consistent:
    // it rewrites metadata in place); the gateway must then say so, never publish a wrong series.
    int whole = 0, stopped = 0, given_up = 0;
    std::string not_whole;
    const int stride = (layout.frames_per_file ? 3 : 1) * kSanitizerStride;
    for (int n = 1; n <= run.writes; n += stride) {
      std::string where = layout.name() + ", killed at write " + std::to_string(n) + " of " +
                          std::to_string(run.writes);
      char tmpl[] = "/var/tmp/numastream-series-sink-XXXXXX";  // a disk filesystem: O_DIRECT
      ASSERT_NE(::mkdtemp(tmpl), nullptr);
      const std::string dir = tmpl;
      int acks[2];
      ASSERT_EQ(::pipe(acks), 0);
      const auto killed = testing::kill_at_write(n, [&] {
        ::close(acks[0]);
        gateway(dir, layout, false, all, [&](std::uint64_t seq) {
          if (::write(acks[1], &seq, sizeof seq) != sizeof seq) std::_Exit(3);
        });
      });
      ::close(acks[1]);
      std::set<std::uint64_t> acknowledged;
      for (std::uint64_t seq = 0; ::read(acks[0], &seq, sizeof seq) == sizeof seq;)
        acknowledged.insert(seq);
      ::close(acks[0]);
      ASSERT_TRUE(killed.killed) << where;
      where += " (" + std::to_string(acknowledged.size()) + " messages acknowledged)";
      // The sender sends again what was never acknowledged, in order; the next gateway resumes.
      std::vector<std::uint64_t> again;
      for (std::uint64_t s : all)
        if (!acknowledged.count(s)) again.push_back(s);
      // The next gateway, a process of its own as in a pod (HDF5 keeps a few hundred bytes of
      // a damaged file's metadata when it refuses it: the process that met it goes with them).
      const std::string answer = in_child([&] {
        try {
          return gateway(dir, layout, !acknowledged.empty(), again, [](auto) {}).dump();
        } catch (const std::exception& e) {
          return std::string("stopped: ") + e.what();
        }
      });
      if (answer.rfind("stopped: ", 0) == 0) {
        // It stops naming the file it cannot go on with (in a pod: restarted, and stopping
        // again, until a person moves the file aside).
        EXPECT_NE(answer.find(dir + "/scan_series_1"), std::string::npos)
            << where << ": " << answer;
        ++stopped;
        not_whole += " " + std::to_string(n) + "(stopped)";
        std::printf("%s: the next gateway %s\n", where.c_str(), answer.c_str());
        std::filesystem::remove_all(dir);
        continue;
      }
      const nlohmann::json summary = nlohmann::json::parse(answer, nullptr, false);
      ASSERT_TRUE(summary.is_object()) << where << ": the next gateway said: " << answer;
      const auto& series = summary["stream2_series"];
      ASSERT_EQ(series.size(), 1u) << where << ": " << summary.dump();
      if (series[0]["complete"] == true) {
        ++whole;
        EXPECT_EQ(series[0]["images"], kImages) << where << ": " << summary.dump();
        expect_whole(series[0]["file"], layout, where);
        for (const auto& entry : std::filesystem::directory_iterator(dir)) {
          // An unreadable file at the series' name, made before any message of it was
          // acknowledged, is left as it is and the series written at the next name.
          if (acknowledged.empty() && entry.path().extension() == ".part") continue;
          // A file HDF5 cannot reopen that held nothing acknowledged is moved aside (.damaged).
          if (std::string(entry.path().filename()).find(".part.damaged") != std::string::npos)
            continue;
          EXPECT_EQ(entry.path().extension(), ".h5")
              << where << ": " << entry.path() << " is left beside the published series";
        }
      } else {
        // Given up: it names the images it lacks (images an earlier gateway flushed, then lost
        // from a chunk index a torn write broke), never "nothing missing".
        ++given_up;
        not_whole += " " + std::to_string(n) + "(given up)";
        const std::string lacks = series[0]["lacks"];
        EXPECT_NE(lacks.find("image ids"), std::string::npos) << where << ": " << summary.dump();
        EXPECT_LT(series[0]["images"].get<std::uint64_t>(), kImages) << where;
      }
      std::filesystem::remove_all(dir);
    }
    const int points = (run.writes + stride - 1) / stride;
    EXPECT_EQ(whole + stopped + given_up, points);
    EXPECT_EQ(given_up, 0) << layout.name() << ": images an earlier gateway flushed were lost";
    // Every kill point resumes: NXmx's master is replaced whole and each data file made under a
    // temporary name; a one-file series (and each data file) is written with an undo journal, so
    // a flush the kill interrupted is undone before the next gateway reads the file (before it,
    // a kill in the flush of the first image or of the last message tore metadata HDF5 had
    // written already, and the next gateway stopped naming a file it could not reopen).
    EXPECT_EQ(whole, points) << layout.name() << ": not whole at write" << not_whole;
    // The gateways ran in processes of their own: what is open here, this test's reading left.
    EXPECT_EQ(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL), open_before)
        << layout.name()
        << ": HDF5 objects left open by reading the published series: " << open_objects();
    std::printf(
        "%s: killed at %d writes (every %d of %d): published whole %d times; stopped naming a file "
        "HDF5 "
        "cannot reopen %d times, gave the series up naming lost images %d times (at write%s)\n",
        layout.name().c_str(), points, stride, run.writes, whole, stopped, given_up,
        not_whole.c_str());
  }
}

}  // namespace
}  // namespace numastream
