// A series file (store/series_file.hpp) written by a gateway that is killed at any moment: the
// file that is left opens (a flush the kill interrupted is undone) and never records a message
// it does not hold — the next gateway
// takes a recorded message for a retransmission, so a recorded image that is not in the file
// would be lost from the series. Each trial writes a series in a child process, flushing after
// every image as a gateway does, and kills it (SIGKILL) after a random few milliseconds.
#include "store/series_file.hpp"

#include <gtest/gtest.h>
#include <hdf5.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "detector/stream2.hpp"
#include "store/undo_journal.hpp"
#include "temp_dir.hpp"

namespace numastream {
namespace {

// Writes the start message of a one-channel uint16 series (`id`, `images` of `dims`) and records
// it, as a gateway does first.
void start_series(hdf5::SeriesFile& f, const std::string& id, std::uint64_t images,
                  std::vector<std::uint64_t> dims) {
  stream2::StartInfo info;
  info.series_unique_id = id;
  info.number_of_images = images;
  info.dims = std::move(dims);
  info.channels = {"threshold_1"};
  f.write_start(stream2::build_start(info), 1, id, 0);
  f.record(0);
}

// A directory of its own for a trial, removed with everything in it.
struct TrialDir {
  std::string dir = temp_dir("/var/tmp");
  ~TrialDir() { std::filesystem::remove_all(dir); }
};

// The child: a series of 256 x 256 uint16 images, each recorded and flushed as it is written;
// once the series' start is on disk it says so on `started` (a pipe).
[[noreturn]] void write_until_killed(const std::string& path, bool direct, int started) {
  hdf5::SeriesFile f(path, 0, direct);
  start_series(f, "crash", 100000, {256, 256});
  f.flush();
  if (::write(started, "s", 1) != 1) std::_Exit(3);
  ::close(started);
  std::vector<std::byte> pixels(256 * 256 * 2);
  for (std::uint64_t id = 0; id < 100000; ++id) {
    for (std::size_t i = 0; i < pixels.size(); ++i)
      pixels[i] = static_cast<std::byte>((i + id) * 7);
    const auto image = stream2::build_image(1, "crash", id, {256, 256}, "uint16",
                                            stream2::Compression::none, {{"threshold_1", pixels}});
    f.write_image(image, id);
    f.record(id + 1);  // message sequence = image id + 1 (the start message is 0)
    f.flush();
  }
  std::_Exit(0);
}

TEST(SeriesFile, AGatewayKilledAtAnyMomentLeavesNoRecordOfAnImageTheFileLacks) {
  std::mt19937 rng(31);
  int opened = 0, unopenable = 0, checked_images = 0;
  for (const bool direct : {false, true}) {
    for (int trial = 0; trial < 12; ++trial) {
      const TrialDir scratch;
      const std::string path = scratch.dir + "/series.h5.part";
      int started[2];
      ASSERT_EQ(::pipe(started), 0);
      const pid_t pid = ::fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        ::close(started[0]);
        write_until_killed(path, direct, started[1]);
      }
      ::close(started[1]);
      // Killed while it writes images, however slowly it starts (a sanitizer, a loaded machine).
      pollfd ready{started[0], POLLIN, 0};
      char c = 0;
      const bool began = ::poll(&ready, 1, 30000) == 1 && ::read(started[0], &c, 1) == 1;
      ::close(started[0]);
      if (began) std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 120));
      ::kill(pid, SIGKILL);
      int status = 0;
      ::waitpid(pid, &status, 0);
      ASSERT_TRUE(began) << "the writer did not start its series within 30 s";
      ASSERT_TRUE(WIFSIGNALED(status)) << "the writer ended before it was killed";
      std::unique_ptr<hdf5::SeriesFile> f;
      try {
        f = hdf5::SeriesFile::reopen(path, direct);
      } catch (const std::exception& e) {
        ++unopenable;  // named by the gateway, left as it is; nothing recorded is trusted
        // ... and nothing of it held open: the gateway goes on with the series in this process
        // (a group and a dataset of a refused file stayed open when its chunk index was torn).
        EXPECT_EQ(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_GROUP | H5F_OBJ_DATASET), 0)
            << (direct ? "direct" : "buffered") << " trial " << trial << ": " << e.what();
        continue;
      }
      ++opened;
      std::set<std::uint64_t> ids;
      for (const auto& [channel, written] : f->images()) ids.insert(written.begin(), written.end());
      for (std::uint64_t seq : f->sequences_held()) {
        if (seq == 0) continue;
        EXPECT_TRUE(ids.count(seq - 1))
            << (direct ? "direct" : "buffered") << " trial " << trial << ": message " << seq
            << " is recorded but image " << seq - 1 << " is not in the file (" << ids.size()
            << " images, " << f->sequences_held().size() << " recorded)";
      }
      checked_images += static_cast<int>(ids.size());
      f->close();
    }
  }
  EXPECT_GT(opened, 0);
  // A flush the kill interrupted is undone when the file is reopened (its undo journal): every
  // file left opens.
  EXPECT_EQ(unopenable, 0);
  std::printf(
      "%d files left by a killed writer opened (%d did not), %d images in them checked against the "
      "record\n",
      opened, unopenable, checked_images);
}

std::vector<std::byte> pixels_of(std::uint64_t id) {
  std::vector<std::byte> pixels(64 * 80 * 2);
  for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<std::byte>((i + id) * 7);
  return pixels;
}

std::vector<std::byte> image_message(std::uint64_t id) {
  return stream2::build_image(1, "behind", id, {64, 80}, "uint16", stream2::Compression::none,
                              {{"threshold_1", pixels_of(id)}});
}

// The file's address of image `id`'s chunk, read with HDF5's own driver.
haddr_t chunk_address(const std::string& path, std::uint64_t id) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t dset = H5Dopen2(file, "/entry/data/threshold_1", H5P_DEFAULT);
  const hsize_t at[3] = {id, 0, 0};
  unsigned mask = 0;
  haddr_t addr = HADDR_UNDEF;
  hsize_t size = 0;
  H5Dget_chunk_info_by_coord(dset, at, &mask, &addr, &size);
  H5Dclose(dset);
  H5Fclose(file);
  return addr;
}

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void overwrite(const std::string& path, std::size_t at, const std::string& bytes) {
  std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
  io.seekp(static_cast<std::streamoff>(at));
  io.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::span<const std::byte> as_bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

// The journal on its own: an interrupted flush (two ranges overwritten, the file grown) is rolled
// back to the bytes and length of the last complete one; a record cut short (its write had not
// begun) is not applied; a committed journal undoes nothing.
TEST(UndoJournal, RollsAFileBackToItsLastCompleteFlush) {
  const TrialDir scratch;
  const std::string path = scratch.dir + "/f";
  const std::string committed = "0123456789abcdefghij";
  std::ofstream(path, std::ios::binary) << committed;
  {
    hdf5::UndoJournal j(path, committed.size());
    ASSERT_EQ(j.save(2, as_bytes(committed.substr(2, 3))), 0);
    overwrite(path, 2, "XYZ");
    ASSERT_EQ(j.save(15, as_bytes(committed.substr(15, 5))), 0);
    overwrite(path, 15, "QQQQQ");
    overwrite(path, 20, "grown past the last flush");
  }  // killed: never committed
  EXPECT_NE(bytes_of(path), committed);
  const std::string said = hdf5::UndoJournal::roll_back(path);
  EXPECT_NE(said.find("2 range(s) written back, the file cut to 20 bytes"), std::string::npos)
      << said;
  EXPECT_EQ(bytes_of(path), committed);
  EXPECT_FALSE(std::filesystem::exists(path + ".undo"));
  EXPECT_EQ(hdf5::UndoJournal::roll_back(path), "") << "nothing left to undo";

  {
    hdf5::UndoJournal j(path, committed.size());
    ASSERT_EQ(j.save(0, as_bytes(committed.substr(0, 4))), 0);
    overwrite(path, 0, "abcd");
    ASSERT_EQ(j.save(8, as_bytes(committed.substr(8, 4))), 0);  // its write never began
  }
  std::filesystem::resize_file(path + ".undo", std::filesystem::file_size(path + ".undo") - 3);
  hdf5::UndoJournal::roll_back(path);
  EXPECT_EQ(bytes_of(path), committed) << "the whole record applied, the cut one not";

  {
    hdf5::UndoJournal j(path, committed.size());
    ASSERT_EQ(j.save(4, as_bytes(committed.substr(4, 2))), 0);
    overwrite(path, 4, "!!");
    ASSERT_EQ(j.commit(committed.size()), 0);  // the flush completed
  }
  EXPECT_EQ(hdf5::UndoJournal::roll_back(path), "");
  EXPECT_EQ(bytes_of(path).substr(4, 2), "!!") << "a complete flush is kept";
}

TEST(SeriesFile, AFileWhoseRecordedEndIsBeforeItsLastImagesResumesAndReadsBack) {
  // A gateway killed in the middle of a flush can leave the chunk index written and the
  // superblock not: the file's recorded end of allocated space (EOA) falls before its last
  // images' chunks, which HDF5 then refuses to read or rewrite ("addr overflow"). The worst case:
  // the recorded end at the first byte of the last image, whose message is not recorded either;
  // the next gateway rewrites that image, writes the next ones, and every reader reads them all.
  for (const bool direct : {false, true}) {
    SCOPED_TRACE(direct ? "direct" : "buffered");
    const TrialDir scratch;
    const std::string path = scratch.dir + "/series.h5.part";
    {
      hdf5::SeriesFile f(path, 0, direct);
      start_series(f, "behind", 8, {64, 80});
      for (std::uint64_t id = 0; id < 5; ++id) {
        f.write_image(image_message(id), id);
        if (id < 4) f.record(id + 1);  // image 4's message: written, not yet recorded
        f.flush();
      }
      f.close();
    }
    const haddr_t last = chunk_address(path, 4);
    ASSERT_NE(last, HADDR_UNDEF);
    {
      // Superblock version 0 (what the gateway writes): its end-of-file address at byte 40.
      std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
      char head[48] = {};
      io.read(head, sizeof head);
      ASSERT_EQ(std::memcmp(head, "\x89HDF\r\n\x1a\n", 8), 0);
      ASSERT_EQ(head[8], 0) << "superblock version";
      const std::uint64_t eoa = last;  // little-endian, as x86 and the format both are
      io.seekp(40);
      io.write(reinterpret_cast<const char*>(&eoa), sizeof eoa);
    }
    auto f = hdf5::SeriesFile::reopen(path, direct);
    EXPECT_EQ(f->sequences_held(), (std::set<std::uint64_t>{0, 1, 2, 3, 4}));
    EXPECT_EQ(f->images().at("threshold_1"), (std::set<std::uint64_t>{0, 1, 2, 3, 4}));
    for (std::uint64_t id = 4; id < 8; ++id) {
      ASSERT_NO_THROW(f->write_image(image_message(id), id)) << "image " << id;
      f->record(id + 1);
      f->flush();
    }
    f->close();
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    ASSERT_GE(file, 0);
    const hid_t dset = H5Dopen2(file, "/entry/data/threshold_1", H5P_DEFAULT);
    for (std::uint64_t id = 0; id < 8; ++id) {
      std::vector<std::byte> got(64 * 80 * 2);
      const hsize_t start[3] = {id, 0, 0}, count[3] = {1, 64, 80};
      const hid_t space = H5Dget_space(dset);
      H5Sselect_hyperslab(space, H5S_SELECT_SET, start, nullptr, count, nullptr);
      const hid_t mem = H5Screate_simple(3, count, nullptr);
      EXPECT_GE(H5Dread(dset, H5T_NATIVE_UINT16, mem, space, H5P_DEFAULT, got.data()), 0)
          << "image " << id;
      EXPECT_EQ(got, pixels_of(id)) << "image " << id;
      H5Sclose(mem);
      H5Sclose(space);
    }
    H5Dclose(dset);
    H5Fclose(file);
  }
}

}  // namespace
}  // namespace numastream
