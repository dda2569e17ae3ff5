#include "data/spill.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "temp_dir.hpp"

namespace numastream {
namespace {

std::vector<std::byte> frame(std::size_t size, int tag) {
  std::vector<std::byte> f(size);
  for (std::size_t i = 0; i < size; ++i)
    f[i] = static_cast<std::byte>((i * 31 + static_cast<std::size_t>(tag)) & 0xFF);
  return f;
}

std::size_t seg_files(const std::string& dir) {
  std::size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    n += e.path().extension() == ".seg";
  return n;
}

TEST(Spill, FramesComeBackInOrderAcrossSegments) {
  const std::string dir = temp_dir();
  SpillStore s(dir, 7, 64 << 20);                                         // segments of 8 MiB
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

// A frame held in two pieces (a header, then a detector's message it was received in) is one
// record: it comes back whole, the two pieces one after the other, counted against the limit
// as one; one that would pass the limit is refused whole.
TEST(Spill, AFrameInTwoPiecesComesBackAsOne) {
  const std::string dir = temp_dir();
  SpillStore s(dir, 3, 1 << 20);
  const auto head = frame(48, 1), body = frame(300000, 2);
  ASSERT_TRUE(s.append(head, body));
  ASSERT_TRUE(s.append(frame(10, 3), {}));
  EXPECT_EQ(s.pending_bytes(), 48u + 300000u + 10u);
  EXPECT_FALSE(s.append(head, frame(1 << 20, 4))) << "past the limit: refused whole";
  EXPECT_EQ(s.frames(), 2u);
  std::vector<std::byte> out(1 << 20);
  ASSERT_EQ(s.read(out), 48u + 300000u);
  std::vector<std::byte> whole(head);
  whole.insert(whole.end(), body.begin(), body.end());
  EXPECT_TRUE(std::equal(whole.begin(), whole.end(), out.begin()));
  ASSERT_EQ(s.read(out), 10u);
  EXPECT_TRUE(std::equal(out.begin(), out.begin() + 10, frame(10, 3).begin()));
  EXPECT_TRUE(s.empty());
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

TEST(Spill, AnEmptyStoreRemovesItsFilesAndOneWithFramesLeavesThemForTheNextProcess) {
  const std::string dir = temp_dir();
  {
    SpillStore first(dir, 3, 8 << 20);
    first.append(frame(1000, 1));
    std::vector<std::byte> out(1000);
    first.read(out);
  }
  EXPECT_EQ(seg_files(dir), 0u) << "read through: nothing left";
  {
    SpillStore first(dir, 3, 8 << 20);
    first.append(frame(1000, 1));
  }
  EXPECT_EQ(seg_files(dir), 1u) << "a frame never read stays on disk";
  {
    SpillStore a(dir, 3, 8 << 20);  // no recovery: what the earlier process left is removed
    EXPECT_TRUE(a.empty());
    EXPECT_EQ(seg_files(dir), 0u);
    a.append(frame(1000, 1));
    SpillStore other(dir, 4, 8 << 20);  // another stream's files are not touched
    EXPECT_EQ(seg_files(dir), 1u);
  }
}

// Every frame an earlier process left comes back first, in order across its segments (those it
// had read out too), then what the new one appends; a record cut short by a crash mid-write ends
// the recovery there, and the file is cut back to the last whole record.
TEST(Spill, AnEarlierProcessesFramesAreRecoveredInOrderUpToACutRecord) {
  const std::string dir = temp_dir();
  {
    SpillStore first(dir, 5, 8 << 20);  // segments of 1 MiB: 4 frames of 300 KiB fill one
    for (int i = 0; i < 8; ++i) ASSERT_TRUE(first.append(frame(300 << 10, i)));
    std::vector<std::byte> out(300 << 10);
    for (int i = 0; i < 5; ++i)
      first.read(out);  // segment 0 read through and removed, frame 4 read out
  }
  // A crash while writing a ninth record: its length and half of it.
  std::string last;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    last = std::max(last, e.path().string());
  {
    FILE* f = std::fopen(last.c_str(), "ab");
    const std::uint32_t n = 300 << 10;
    std::fwrite(&n, 4, 1, f);
    std::vector<std::byte> half(150 << 10, std::byte{9});
    std::fwrite(half.data(), 1, half.size(), f);
    std::fclose(f);
  }
  std::vector<std::size_t> seen_sizes;
  SpillStore s(dir, 5, 8 << 20, [&](std::span<const std::byte> head, std::size_t size) {
    EXPECT_EQ(head.size(), SpillStore::kRecoverHead);
    seen_sizes.push_back(size);
    return true;
  });
  // Segment 0 (frames 0-3) is gone; segment 1 holds 4-7 (4 was read out, perhaps never
  // acknowledged: it comes again) and the cut record.
  EXPECT_EQ(s.recovered().frames, 4u);
  EXPECT_EQ(s.recovered().dropped_bytes, 4u + (150 << 10));
  EXPECT_NE(s.recovered().why_dropped.find("cut short"), std::string::npos)
      << s.recovered().why_dropped;
  EXPECT_EQ(seen_sizes, std::vector<std::size_t>(4, 300 << 10));
  ASSERT_TRUE(s.append(frame(1000, 42)));
  std::vector<std::byte> out(300 << 10);
  for (int i = 4; i < 8; ++i) {
    ASSERT_EQ(s.read(out), std::size_t{300 << 10});
    EXPECT_TRUE(std::equal(out.begin(), out.end(), frame(300 << 10, i).begin())) << "frame " << i;
  }
  ASSERT_EQ(s.read(out), 1000u) << "then what this process appended";
  EXPECT_TRUE(std::equal(out.begin(), out.begin() + 1000, frame(1000, 42).begin()));
  EXPECT_TRUE(s.empty());
}

// A record the caller refuses (not a frame of the stream: damaged) ends the recovery there;
// that segment is cut back and every later one removed.
TEST(Spill, ARefusedRecordEndsTheRecoveryAndLaterSegmentsGo) {
  const std::string dir = temp_dir();
  {
    SpillStore first(dir, 6, 8 << 20);
    for (int i = 0; i < 10; ++i)
      ASSERT_TRUE(first.append(frame(300 << 10, i)));  // segments 0-3, 4-7, 8-9
  }
  int n = 0;
  SpillStore s(dir, 6, 8 << 20, [&](std::span<const std::byte>, std::size_t) { return n++ < 5; });
  EXPECT_EQ(s.recovered().frames, 5u);
  EXPECT_NE(s.recovered().why_dropped.find("spill-6-1.seg: the record at byte"), std::string::npos)
      << s.recovered().why_dropped;
  EXPECT_EQ(s.recovered().dropped_bytes, 5u * (4 + (300 << 10)));
  EXPECT_EQ(seg_files(dir), 2u);
  EXPECT_EQ(s.disk_bytes(), 5u * (4 + (300 << 10)));
}

// Frames read out held (a consumer's spill: until its sink has the chunk) keep their segment on
// disk, released in any order; a process that dies before releasing them leaves them to the
// next one, which reads them again (they may come twice, never not at all).
TEST(Spill, AHeldFrameStaysOnDiskUntilReleasedAndANextProcessRecoversIt) {
  const std::string dir = temp_dir();
  auto accept = [](std::span<const std::byte>, std::size_t) { return true; };
  std::vector<std::byte> out(256 << 10);
  {
    SpillStore s(dir, 5, 8 << 20);  // segments of 1 MiB: four frames of 256 KiB + 4 bytes each
    for (int i = 0; i < 8; ++i) ASSERT_TRUE(s.append(frame(256 << 10, i)));
    std::vector<std::uint64_t> tokens(8);
    for (int i = 0; i < 8; ++i) {
      ASSERT_EQ(s.read(out, &tokens[i]), 256u << 10);
      EXPECT_EQ(out, frame(256 << 10, i));
    }
    EXPECT_TRUE(s.empty()) << "nothing left to read";
    EXPECT_EQ(s.disk_bytes(), 8u * (4 + (256 << 10))) << "every segment held";
    for (int i = 0; i < 3; ++i) s.release(tokens[i]);
    EXPECT_EQ(seg_files(dir), 2u) << "the first segment still holds frame 3";
    EXPECT_EQ(s.disk_bytes(), 8u * (4 + (256 << 10)));
    s.release(tokens[7]);
    s.release(tokens[3]);
    EXPECT_EQ(s.disk_bytes(), 4u * (4 + (256 << 10)))
        << "the first segment released, the second still held";
    // The process dies with frames 4-6 held: its segment stays for the next process.
  }
  SpillStore next(dir, 5, 8 << 20, accept);
  EXPECT_EQ(next.recovered().frames, 4u) << "the held segment's frames, read again from its start";
  for (int i = 4; i < 8; ++i) {
    ASSERT_EQ(next.read(out), 256u << 10);
    EXPECT_EQ(out, frame(256 << 10, i));
  }
  EXPECT_TRUE(next.empty());
}

// The spill makes its directories the agent's own (0700) whatever the umask: a gateway with file
// sinks runs under the files' (0137 for 0640), which would leave a new directory without its
// search bit, and the spill could not be written (seen on the facility's gateway pods).
TEST(Spill, ItsDirectoriesAreSearchableUnderTheFileSinksUmask) {
  const std::string dir = temp_dir() + "/spill/ns/pipeline-uid/hpc/stream-0";
  const mode_t before = ::umask(0137);
  try {
    SpillStore s(dir, 0, 8 << 20);
    ASSERT_TRUE(s.append(frame(1000, 1)));
    std::vector<std::byte> out(1000);
    ASSERT_EQ(s.read(out), 1000u);
  } catch (...) {
    ::umask(before);
    throw;
  }
  ::umask(before);
  struct stat sb {};
  ASSERT_EQ(::stat(dir.c_str(), &sb), 0);
  EXPECT_EQ(sb.st_mode & 0777, 0700u);
}

}  // namespace
}  // namespace numastream
