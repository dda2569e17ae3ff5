#include "data/spill.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <vector>

namespace numastream {
namespace {

std::string temp_dir() {
  char tmpl[] = "/tmp/numastream-spill-XXXXXX";
  return mkdtemp(tmpl);
}

std::vector<std::byte> frame(std::size_t size, int tag) {
  std::vector<std::byte> f(size);
  for (std::size_t i = 0; i < size; ++i) f[i] = static_cast<std::byte>((i * 31 + static_cast<std::size_t>(tag)) & 0xFF);
  return f;
}

std::size_t seg_files(const std::string& dir) {
  std::size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) n += e.path().extension() == ".seg";
  return n;
}

TEST(Spill, FramesComeBackInOrderAcrossSegments) {
  const std::string dir = temp_dir();
  SpillStore s(dir, 7, 64 << 20);  // segments of 8 MiB
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(s.append(frame(1 << 20, i)));  // ~5 segments
  EXPECT_EQ(s.frames(), 40u);
  EXPECT_EQ(s.pending_bytes(), 40u << 20);
  EXPECT_GE(seg_files(dir), 5u);
  std::vector<std::byte> out(1 << 20);
  for (int i = 0; i < 40; ++i) {
    ASSERT_EQ(s.next_size(), 1u << 20);
    ASSERT_EQ(s.read(out), 1u << 20);
    ASSERT_EQ(out, frame(1 << 20, i)) << "frame " << i;
    // Interleaved appends land after what is already there.
    if (i == 10) {
      ASSERT_TRUE(s.append(frame(100, 1000)));
    }
  }
  ASSERT_EQ(s.read(out), 100u);
  out.resize(100);
  EXPECT_EQ(out, frame(100, 1000));
  EXPECT_TRUE(s.empty());
  EXPECT_EQ(s.disk_bytes(), 0u) << "read-through segments are deleted";
  EXPECT_LE(seg_files(dir), 1u);
}

TEST(Spill, NeverHoldsMoreThanItsLimitAndFreesSpaceAsItDrains) {
  const std::string dir = temp_dir();
  SpillStore s(dir, 1, 10 << 20);  // segments of 1 MiB
  int taken = 0;
  while (s.append(frame(256 << 10, taken))) ++taken;
  EXPECT_EQ(taken, 39) << "10 MiB holds 39 records of 256 KiB + 4 bytes";
  EXPECT_LE(s.disk_bytes(), 10u << 20);
  std::uintmax_t on_disk = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) on_disk += e.file_size();
  EXPECT_EQ(on_disk, s.disk_bytes());
  std::vector<std::byte> out(256 << 10);
  for (int i = 0; i < 8; ++i) s.read(out);  // two whole segments read through
  EXPECT_TRUE(s.append(frame(256 << 10, 99))) << "space comes back as segments are read";
}

TEST(Spill, ClearsWhatAnEarlierProcessOfTheStreamLeftAndRemovesItsFiles) {
  const std::string dir = temp_dir();
  { SpillStore first(dir, 3, 8 << 20); first.append(frame(1000, 1)); }
  EXPECT_EQ(seg_files(dir), 0u);
  {
    SpillStore a(dir, 3, 8 << 20);
    a.append(frame(1000, 1));
    SpillStore other(dir, 4, 8 << 20);  // another stream's files are not touched
    EXPECT_EQ(seg_files(dir), 1u);
  }
  EXPECT_EQ(seg_files(dir), 0u);
}

}  // namespace
}  // namespace numastream
