// A consumer's spill (pipeline/consumer_spill.hpp) belongs to the consumer, not to its place in
// `sinks`: reordered across a restart it still reaches its sink; another consumer's is refused.
#include "pipeline/consumer_spill.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "chunks.hpp"
#include "data/spill.hpp"
#include "wire/wire.hpp"

namespace numastream {
namespace {

Chunk chunk(std::uint64_t seq) { return testing::chunk_of(seq, 32); }

struct Dir {
  std::string path;
  Dir() {
    char tmpl[] = "/tmp/numastream-consumer-spill-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~Dir() { std::filesystem::remove_all(path); }
};

const AckFn kSettle = [](int, std::uint32_t, std::uint64_t) {};

// A gateway process whose consumer spilled `n` chunks its sink never took (killed with them).
void spill_and_die(const SpillConfig& cfg, std::uint32_t index, const std::string& who, int n) {
  ConsumerSpill s(cfg, index, who, kSettle);
  for (int i = 0; i < n; ++i) {
    Chunk c = chunk(static_cast<std::uint64_t>(i));
    ASSERT_TRUE(s.put(c, [] { return false; }));
  }
}

TEST(ConsumerSpill, ItsChunksReachItsConsumerWhereverTheConsumerMovesInSinks) {
  const Dir dir;
  const SpillConfig cfg{dir.path + "/hop", 1 << 20};
  spill_and_die(cfg, 1, "numastream tcp://hpc:6000", 5);  // the second of two consumers
  // The next process: the same consumer first in `sinks` (before, its spill was named by its
  // place: this one found nothing, and the 5 acknowledged chunks never reached the far site).
  ConsumerSpill again(cfg, 0, "numastream tcp://hpc:6000", kSettle);
  EXPECT_EQ(again.recovered(), 5u);
  for (std::uint64_t seq = 0; seq < 5; ++seq) {
    auto c = again.take(std::chrono::milliseconds(100), 1 << 20);
    ASSERT_TRUE(c.has_value()) << "chunk " << seq;
    EXPECT_EQ(c->header.sequence, seq);
  }
}

// A spill record whose frame header was damaged on disk: the next process recovers the records
// before it and drops the rest, naming the file, the byte and how much it dropped (before, it
// handed the damaged frame to the sink and stopped, and so did every process after it).
TEST(ConsumerSpill, ARecordDamagedOnDiskEndsTheRecoveryThereInsteadOfStoppingEveryProcess) {
  const Dir dir;
  const SpillConfig cfg{dir.path + "/hop", 1 << 20};
  spill_and_die(cfg, 0, "numastream tcp://hpc:6000", 6);
  const std::string seg = cfg.path + "/spill-0-0.seg";
  ASSERT_TRUE(std::filesystem::exists(seg));
  const auto record = std::filesystem::file_size(seg) / 6;  // six records of one size
  {
    std::fstream io(seg, std::ios::in | std::ios::out | std::ios::binary);
    const auto at = static_cast<std::streamoff>(3 * record + 4 + 8);  // record 3's frame header
    io.seekg(at);
    const char was = static_cast<char>(io.get());
    io.seekp(at);
    io.put(static_cast<char>(~was));
  }
  ConsumerSpill again(cfg, 0, "numastream tcp://hpc:6000", kSettle);
  EXPECT_EQ(again.recovered(), 3u);
  for (std::uint64_t seq = 0; seq < 3; ++seq) {
    auto c = again.take(std::chrono::milliseconds(100), 1 << 20);
    ASSERT_TRUE(c.has_value()) << "chunk " << seq;
    EXPECT_EQ(c->header.sequence, seq);
    again.taken(c->via, c->header.stream_id, c->header.sequence);
  }
  EXPECT_FALSE(again.take(std::chrono::milliseconds(100), 1 << 20).has_value());
  const nlohmann::json r = again.report();
  EXPECT_EQ(r["dropped_bytes"], 3 * record) << r.dump();
  EXPECT_NE(r["dropped"].get<std::string>().find(seg + ": the record at byte " +
                                                 std::to_string(3 * record) + " is damaged"),
            std::string::npos)
      << r.dump();
}

// A chunk whose payload changed on disk after it was spilled (a bit flipped on the disk or on
// its way back): the sink never gets it; it is declared lost by stream and sequence, named in
// the summary, and the chunks after it go on. (Before, a spill record's payload was not
// checked: the damaged chunk went into the consumer's file as if it were the detector's.)
TEST(ConsumerSpill, AChunkWhosePayloadChangedOnDiskIsDeclaredLostNotHandedToTheSink) {
  const Dir dir;
  const SpillConfig cfg{dir.path + "/hop", 1 << 20};
  spill_and_die(cfg, 0, "file /data/a.raw", 6);
  const std::string seg = cfg.path + "/spill-0-0.seg";
  const auto record = std::filesystem::file_size(seg) / 6;
  {
    std::fstream io(seg, std::ios::in | std::ios::out | std::ios::binary);
    const auto at = static_cast<std::streamoff>(3 * record + 4 + wire::kHeaderSize + 5);
    io.seekg(at);
    const char was = static_cast<char>(io.get());
    io.seekp(at);
    io.put(static_cast<char>(was ^ 0x10));  // one bit of chunk 3's payload
  }
  std::vector<std::pair<std::uint32_t, std::uint64_t>> lost;
  ConsumerSpill again(
      cfg, 0, "file /data/a.raw", kSettle,
      [&](std::uint32_t stream, std::uint64_t seq) { lost.emplace_back(stream, seq); });
  EXPECT_EQ(again.recovered(), 6u) << "its header is whole: recovered, checked when read";
  std::vector<std::uint64_t> handed;
  while (auto c = again.take(std::chrono::milliseconds(100), 1 << 20)) {
    const Chunk want = chunk(c->header.sequence);
    EXPECT_TRUE(std::equal(c->payload().begin(), c->payload().end(), want.payload().begin(),
                           want.payload().end()))
        << "chunk " << c->header.sequence;
    ASSERT_TRUE(c->body.has_value());
    EXPECT_EQ(c->body->bytes().size(), wire::kHeaderSize + c->header.payload_size)
        << "the frame alone, as an onward hop sends it";
    handed.push_back(c->header.sequence);
    again.taken(c->via, c->header.stream_id, c->header.sequence);
  }
  EXPECT_EQ(handed, std::vector<std::uint64_t>({0, 1, 2, 4, 5}));
  EXPECT_EQ(lost, (std::vector<std::pair<std::uint32_t, std::uint64_t>>{{0, 3}}));
  EXPECT_FALSE(again.owes(0)) << "nothing is owed for the chunk declared lost";
  const nlohmann::json r = again.report();
  EXPECT_EQ(r["damaged"], 1) << r.dump();
  EXPECT_EQ(r["damaged_last"], nlohmann::json::array({"stream 0 chunk 3"})) << r.dump();
}

// A record an earlier version wrote (the frame without the payload's checksum after it) is read
// back as it is.
TEST(ConsumerSpill, ARecordWithoutAChecksumFromAnEarlierVersionIsReadBack) {
  const Dir dir;
  const SpillConfig cfg{dir.path + "/hop", 1 << 20};
  spill_and_die(cfg, 0, "file /data/a.raw", 0);  // the directory claimed by the consumer
  {
    SpillStore old(cfg.path, 0, cfg.max_bytes);
    Chunk c = chunk(7);
    std::byte head[wire::kHeaderSize];
    wire::encode_header(c.header, head);
    ASSERT_TRUE(old.append(head, c.payload()));
    std::vector<std::byte> out(old.next_size());
    std::uint64_t token = 0;
    old.read(out, &token);  // held: left on disk for the next process
  }
  ConsumerSpill again(cfg, 0, "file /data/a.raw", kSettle);
  ASSERT_EQ(again.recovered(), 1u);
  auto c = again.take(std::chrono::milliseconds(100), 1 << 20);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->header.sequence, 7u);
  const Chunk want = chunk(7);
  EXPECT_TRUE(std::equal(c->payload().begin(), c->payload().end(), want.payload().begin(),
                         want.payload().end()));
}

// What a consumer with a spill has had of a stream, from its senders' record: everything they
// had acknowledged except what the spill still holds for the sink (this process's chunks and an
// earlier process's, recovered).
TEST(ConsumerSpill, WhatItHasHadLeavesOutWhatItsSpillStillHolds) {
  const Dir dir;
  const SpillConfig cfg{dir.path + "/hop", 1 << 20};
  spill_and_die(cfg, 0, "numastream tcp://hpc:6000", 3);  // 0, 1, 2 never reached the far site
  ConsumerSpill s(cfg, 0, "numastream tcp://hpc:6000", kSettle);
  for (std::uint64_t seq = 3; seq < 6; ++seq) {
    Chunk c = chunk(seq);
    ASSERT_TRUE(s.put(c, [] { return false; }));
  }
  // The senders were told 0..5 and 8 were taken.
  const std::vector<std::uint64_t> above = {8};
  auto [floor, rest] = s.had(0, 6, above);
  EXPECT_EQ(floor, 0u) << "chunk 0 is still in the spill";
  EXPECT_EQ(rest, std::vector<std::uint64_t>({8}));
  // The sink takes 0 and 1 (recovered) and 3 (this process's); 2, 4 and 5 stay held.
  for (std::uint64_t seq = 0; seq < 4; ++seq) {
    auto c = s.take(std::chrono::milliseconds(100), 1 << 20);
    ASSERT_TRUE(c.has_value());
    if (seq != 2) s.taken(c->via, 0, c->header.sequence);
  }
  std::tie(floor, rest) = s.had(0, 6, above);
  EXPECT_EQ(floor, 2u);
  EXPECT_EQ(rest, std::vector<std::uint64_t>({3, 8}));
  EXPECT_EQ(s.had(7, 6, above), std::pair(std::uint64_t{6}, above)) << "another stream: all of it";
}

TEST(ConsumerSpill, WithoutHeldKeepsWhatIsNotHeld) {
  EXPECT_EQ(without_held(10, {12, 14}, {}),
            std::pair(std::uint64_t{10}, std::vector<std::uint64_t>{12, 14}));
  EXPECT_EQ(without_held(10, {12, 14}, {12}),
            std::pair(std::uint64_t{10}, std::vector<std::uint64_t>{14}));
  EXPECT_EQ(without_held(10, {12}, {7, 9}),
            std::pair(std::uint64_t{7}, std::vector<std::uint64_t>{8, 12}));
  EXPECT_EQ(without_held(0, {}, {0}), std::pair(std::uint64_t{0}, std::vector<std::uint64_t>{}));
}

TEST(ConsumerSpill, AnotherConsumersSpillIsRefusedNamingBoth) {
  const Dir dir;
  const SpillConfig cfg{dir.path + "/shared", 1 << 20};
  spill_and_die(cfg, 0, "file /data/a.raw", 3);
  try {
    ConsumerSpill other(cfg, 0, "numastream tcp://hpc:6000", kSettle);
    ADD_FAILURE() << "a spill another consumer left was taken";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("\"file /data/a.raw\""), std::string::npos) << what;
    EXPECT_NE(what.find("\"numastream tcp://hpc:6000\""), std::string::npos) << what;
  }
  ConsumerSpill owner(cfg, 4, "file /data/a.raw", kSettle);  // untouched by the refusal
  EXPECT_EQ(owner.recovered(), 3u);
}

TEST(ConsumerSpill, ASpillAnEarlierVersionNamedByPositionIsRecovered) {
  const Dir dir;
  const std::string path = dir.path + "/old";
  std::filesystem::create_directories(path);
  {  // 0.1's consumer at position 2 wrote spill-2-*.seg and no identity file
    SpillStore old(path, 2, 1 << 20, [](std::span<const std::byte>, std::size_t) { return true; });
    for (std::uint64_t seq = 0; seq < 4; ++seq) {
      Chunk c = chunk(seq);
      std::byte head[wire::kHeaderSize];
      wire::encode_header(c.header, head);
      ASSERT_TRUE(old.append(head, c.payload()));
    }
  }
  ConsumerSpill now(SpillConfig{path, 1 << 20}, 0, "file /data/a.raw", kSettle);
  EXPECT_EQ(now.recovered(), 4u);
}

// A gateway with file sinks runs under their umask (0137 for 0640 files): the spill's directories
// still let their owner in (a facility's pods run as a user that is not root, whom a directory
// without its search bit shuts out).
TEST(ConsumerSpill, ItsDirectoriesAreTheAgentsOwnUnderAFileSinksUmask) {
  const Dir dir;
  const std::string path = dir.path + "/backlog/spill/hpc/stream-0";
  const mode_t before = ::umask(0137);
  spill_and_die(SpillConfig{path, 1 << 20}, 1, "numastream tcp://hpc:6000", 2);
  ::umask(before);
  for (std::string d = path; d != dir.path; d = std::filesystem::path(d).parent_path()) {
    struct stat st {};
    ASSERT_EQ(::stat(d.c_str(), &st), 0) << d;
    EXPECT_EQ(st.st_mode & 0777u, 0700u) << d;
  }
  EXPECT_EQ(ConsumerSpill(SpillConfig{path, 1 << 20}, 1, "numastream tcp://hpc:6000", kSettle)
                .recovered(),
            2u);
}

// A claim a crash cut short (the identity file empty: made, never written) is not another
// consumer's: the consumer claims it again.
TEST(ConsumerSpill, AClaimACrashLeftEmptyIsClaimedAgain) {
  const Dir dir;
  const std::string path = dir.path + "/hop";
  std::filesystem::create_directories(path);
  { std::ofstream(path + "/consumer").flush(); }
  ConsumerSpill s(SpillConfig{path, 1 << 20}, 0, "numastream tcp://hpc:6000", kSettle);
  EXPECT_EQ(s.recovered(), 0u);
  std::ifstream in(path + "/consumer");
  std::string held;
  std::getline(in, held);
  EXPECT_EQ(held, "numastream tcp://hpc:6000");
}

}  // namespace
}  // namespace numastream
