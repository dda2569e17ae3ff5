// A file mapped for reading, cut short while it is mapped.
#include "base/mapped_file.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "temp_dir.hpp"

namespace numastream {
namespace {

std::string file_of(const std::string& dir, const std::string& name, std::size_t bytes) {
  std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary) << std::string(bytes, 'a');
  return path;
}

// Reads every byte, as a codec would; their sum.
std::size_t sum_of(std::span<const std::byte> b) {
  std::size_t sum = 0;
  for (std::byte x : b) sum += static_cast<std::size_t>(x);
  return sum;
}

// Another process truncates a file while it is mapped: reading it past its new end finds zeros
// there (the process is not killed by SIGBUS), and the mapping says it was cut short; another
// mapped file is untouched.
TEST(MappedFile, AFileCutShortWhileMappedReadsZerosPastItsEndAndSaysSo) {
  const std::string dir = temp_dir();
  const std::size_t size = 1 << 20;
  const std::string cut = file_of(dir, "cut", size), whole = file_of(dir, "whole", size);
  const int fd = ::open(cut.c_str(), O_RDONLY | O_CLOEXEC);
  const int fd2 = ::open(whole.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_GE(fd2, 0);
  auto m = MappedFile::map(fd, size, cut);
  auto m2 = MappedFile::map(fd2, size, whole);
  ::close(fd);
  ::close(fd2);
  ASSERT_TRUE(m && m2);
  EXPECT_EQ(sum_of(m->bytes()), size * 'a');
  EXPECT_FALSE(m->cut_short());
  ASSERT_EQ(::truncate(cut.c_str(), 4096), 0);
  EXPECT_EQ(sum_of(m->bytes()), 4096u * 'a') << "past the new end: zeros";
  EXPECT_TRUE(m->cut_short());
  EXPECT_EQ(sum_of(m2->bytes()), size * 'a');
  EXPECT_FALSE(m2->cut_short());
  EXPECT_NE(cut_short_message(cut, size).find(cut), std::string::npos);
}

// SIGBUS that is not a mapped file's (here one the process sends itself) still ends the process.
TEST(MappedFile, AnyOtherSigbusStillEndsTheProcess) {
  const std::string dir = temp_dir();
  const std::string path = file_of(dir, "f", 4096);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    auto m = MappedFile::map(fd, 4096, path);  // the guard is installed
    ::raise(SIGBUS);
    ::_exit(m ? 0 : 2);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  // Killed by it; under a sanitizer, whose handler came first, ended by its report (an abort or
  // its exit code) instead.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  EXPECT_TRUE(WIFSIGNALED(status) ||
              (WIFEXITED(status) && WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != 2))
      << "status " << status << ": the process went on";
#else
  ASSERT_TRUE(WIFSIGNALED(status)) << "status " << status << ": the process went on";
  EXPECT_EQ(WTERMSIG(status), SIGBUS);
#endif
}

// Resident kB of the mapping that holds `at` (its /proc/self/smaps entry): the file's pages this
// process holds, without what a sanitizer maps beside them.
long mapped_resident_kb(const void* at) {
  std::ifstream in("/proc/self/smaps");
  const auto addr = reinterpret_cast<std::uintptr_t>(at);
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    unsigned long from = 0, to = 0;
    char dash = 0;
    std::istringstream range(line);
    if (range >> std::hex >> from >> dash >> to && dash == '-') {
      inside = addr >= from && addr < to;
    } else if (inside && line.rfind("Rss:", 0) == 0) {
      return std::stol(line.substr(4));
    }
  }
  return -1;
}

// A view let go leaves no page of it in the process's memory (a file read through once does not
// stay resident in full); the views beside it still read their bytes, and the file stays mapped
// while one is held.
TEST(MappedFile, AViewLetGoLeavesTheProcesssMemory) {
  const std::string dir = temp_dir();
  const std::size_t size = 16 << 20;
  const std::string path = file_of(dir, "f", size);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  std::optional<MappedView> first, second;
  {
    auto m = MappedFile::map(fd, size, path);
    ::close(fd);
    ASSERT_TRUE(m);
    first.emplace(m, 0, size / 2);
    second.emplace(m, size / 2, size / 2);
  }  // the views hold the mapping
  const void* at = first->bytes().data();
  EXPECT_EQ(sum_of(first->bytes()), size / 2 * 'a');
  EXPECT_GE(mapped_resident_kb(at), static_cast<long>(size / 2 / 1024)) << "pages read in";
  first.reset();
  EXPECT_LE(mapped_resident_kb(at), 64) << "the view's pages left with it";
  EXPECT_EQ(sum_of(second->bytes()), size / 2 * 'a');
  MappedView moved = std::move(*second);
  second.reset();  // moved from: lets nothing go
  EXPECT_EQ(sum_of(moved.bytes()), size / 2 * 'a');
  EXPECT_GE(mapped_resident_kb(at), static_cast<long>(size / 2 / 1024));
}

// An empty file is not mapped (the caller reads it: nothing).
TEST(MappedFile, AnEmptyFileIsNotMapped) {
  const std::string dir = temp_dir();
  const std::string path = file_of(dir, "empty", 0);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_EQ(MappedFile::map(fd, 0, path), nullptr);
  ::close(fd);
}

}  // namespace
}  // namespace numastream
