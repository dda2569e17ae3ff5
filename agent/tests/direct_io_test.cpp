// The direct-I/O HDF5 driver (store/direct_io.hpp): files it writes, read back through HDF5's own
// POSIX driver (the Reader), frame for frame; frames larger than its window and smaller than a
// block; frames out of order; a file resumed; what a flush returned from survives a process that
// dies without closing the file.
#include "store/direct_io.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <numeric>
#include <string>
#include <vector>

#include "store/hdf5_io.hpp"
#include "temp_dir.hpp"

namespace numastream::hdf5 {
namespace {

// Whether the filesystem of `dir` takes O_DIRECT (the driver then must use it).
bool takes_o_direct(const std::string& dir) {
  const std::string probe = dir + "/probe";
  const int fd = ::open(probe.c_str(), O_CREAT | O_WRONLY | O_DIRECT, 0600);
  if (fd >= 0) ::close(fd);
  ::unlink(probe.c_str());
  return fd >= 0;
}

// Frame `i`'s pixels: every byte depends on the frame and its place.
std::vector<std::byte> frame(const FrameShape& s, std::uint64_t i) {
  std::vector<std::byte> out(s.frame_bytes());
  for (std::size_t k = 0; k < out.size(); ++k)
    out[k] = static_cast<std::byte>((k * 131 + i * 7919 + k / 4099) & 0xff);
  return out;
}

void expect_frames(const std::string& path, const FrameShape& s,
                   const std::vector<std::uint64_t>& indices) {
  Reader r(path, "/exchange/data");  // HDF5's own driver
  std::vector<std::byte> got(r.max_read_bytes());
  for (auto i : indices) {
    ASSERT_EQ(r.read_frame(i, got), s.frame_bytes()) << "frame " << i;
    EXPECT_TRUE(std::equal(got.begin(), got.begin() + s.frame_bytes(), frame(s, i).begin()))
        << "frame " << i << " differs";
  }
}

void write_frames(Writer& w, const FrameShape& s, const std::vector<std::uint64_t>& indices) {
  for (auto i : indices) w.write_frame(i, frame(s, i), Stored::raw);
}

TEST(DirectIo, FramesLargerThanTheWindowAndOutOfOrderReadBackThroughHdf5sOwnDriver) {
  const std::string dir = temp_dir("/var/tmp");
  const std::string path = dir + "/big.h5";
  FrameShape s{"uint16", {2048, 2500}};  // 10.2 MB a frame: more than the 8 MiB window
  ASSERT_GT(s.frame_bytes(), kDirectWindow);
  {
    Writer w(path, "/exchange/data", s, false, false, true);
    EXPECT_EQ(w.direct(), takes_o_direct(dir));
    write_frames(w, s, {3, 0, 1});
    w.flush();
    write_frames(w, s, {2, 5});
    w.close();
  }
  expect_frames(path, s, {0, 1, 2, 3, 5});
  EXPECT_EQ(::system(("rm -rf " + dir).c_str()), 0);
}

TEST(DirectIo, FramesSmallerThanABlockWithFlushesBetweenThemReadBackAndResume) {
  const std::string dir = temp_dir("/var/tmp");
  const std::string path = dir + "/small.h5";
  FrameShape s{"uint8",
               {3, 5}};  // 15 bytes a frame: HDF5 packs them, rewriting blocks behind the window
  std::vector<std::uint64_t> first(700);
  std::iota(first.begin(), first.end(), 0);
  {
    Writer w(path, "/exchange/data", s, false, false, true);
    for (auto i : first) {
      w.write_frame(i, frame(s, i), Stored::raw);
      if (i % 50 == 0) w.flush();
    }
  }
  expect_frames(path, s, first);
  {
    Writer w(path, "/exchange/data", s, false, true,
             true);  // resumed: the window's first block read back
    EXPECT_EQ(w.written().size(), first.size());
    EXPECT_EQ(w.direct(), takes_o_direct(dir));
    write_frames(w, s, {700, 701, 1500});
  }
  first.insert(first.end(), {700, 701, 1500});
  expect_frames(path, s, first);
  EXPECT_EQ(::system(("rm -rf " + dir).c_str()), 0);
}

TEST(DirectIo, WhatAFlushReturnedFromSurvivesAProcessThatDiesWithoutClosing) {
  // The sink acknowledges frames once a flush returned: the driver must have written them (its
  // window's partial block included), not kept them in memory.
  const std::string dir = temp_dir("/var/tmp");
  const std::string path = dir + "/killed.h5";
  FrameShape s{"uint16", {100, 333}};  // 66,600 bytes: whole windows never line up with a frame
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    Writer w(path, "/exchange/data", s, false, false, true);
    for (std::uint64_t i = 0; i < 20; ++i) w.write_frame(i, frame(s, i), Stored::raw);
    w.flush();
    ::_exit(0);  // no close, no destructors: as a gateway killed right after acknowledging
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  std::vector<std::uint64_t> all(20);
  std::iota(all.begin(), all.end(), 0);
  expect_frames(path, s, all);
  Writer resumed(path, "/exchange/data", s, false, true, true);
  EXPECT_EQ(resumed.written().size(), 20u);
  resumed.close();
  EXPECT_EQ(::system(("rm -rf " + dir).c_str()), 0);
}

}  // namespace
}  // namespace numastream::hdf5
