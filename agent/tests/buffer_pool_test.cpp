#include "data/buffer_pool.hpp"

#include <gtest/gtest.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <iterator>
#include <set>
#include <string>
#include <thread>

namespace numastream {
namespace {

using namespace std::chrono_literals;

TEST(BufferPool, HandsOutDistinctBuffersAndTakesThemBack) {
  BufferPool pool("test", 3, 1000, -1);
  std::set<Buffer*> got;
  for (int i = 0; i < 3; ++i) got.insert(pool.acquire());
  EXPECT_EQ(got.size(), 3u);
  EXPECT_EQ(pool.in_use(), 3u);
  for (Buffer* b : got) {
    EXPECT_EQ(b->capacity, 1000u);
    EXPECT_EQ(b->pool, &pool);
    pool.release(b);
  }
  EXPECT_EQ(pool.in_use(), 0u);
}

TEST(BufferPool, AcquireBlocksUntilARelease) {
  BufferPool pool("test", 1, 64, -1);
  Buffer* first = pool.acquire();
  std::atomic<bool> got{false};
  std::thread t([&] {
    Buffer* b = pool.acquire();
    got = true;
    pool.release(b);
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(got.load());
  pool.release(first);
  t.join();
  EXPECT_TRUE(got.load());
  EXPECT_GT(pool.wait_ns(), 0u);
}

TEST(BufferPool, CloseWakesWaitersWithNull) {
  BufferPool pool("test", 1, 64, -1);
  Buffer* first = pool.acquire();
  std::thread t([&] { EXPECT_EQ(pool.acquire(), nullptr); });
  std::this_thread::sleep_for(20ms);
  pool.close();
  t.join();
  pool.release(first);
}

TEST(BufferPool, NodeBoundWhenNumaIsAvailable) {
  BufferPool pool("test", 2, 4096, 0);
  EXPECT_EQ(pool.on_requested_node(), numa_supported());
  Buffer* b = pool.acquire();
  b->data[4095] = std::byte{1};  // memory is usable to its last byte
  pool.release(b);
}

// A container's seccomp profile refuses mbind and set_mempolicy (without CAP_SYS_NICE): the pool
// says it is not on its node, and the agent's log says why once, not libnuma's bare line per call.
TEST(BufferPool, AKernelThatRefusesBindingIsReportedOnceAndThePoolIsNotOnItsNode) {
  if (!numa_supported()) GTEST_SKIP() << "no NUMA support: nothing to bind";
  int err[2];
  ASSERT_EQ(::pipe(err), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::dup2(err[1], 2);
    sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mbind, 1, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_set_mempolicy, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog prog{static_cast<unsigned short>(std::size(filter)), filter};
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0)
      ::_exit(3);
    bool any_bound = false;
    for (int i = 0; i < 3; ++i) {
      BufferPool pool("test", 2, 4096, 0);
      any_bound = any_bound || pool.on_requested_node();
    }
    ::_exit(any_bound ? 1 : 0);
  }
  ::close(err[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(err[0], buf, sizeof buf)) > 0;) text.append(buf, n);
  ::close(err[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "3: no seccomp filter; 1: a refused pool said it was bound";
  const std::string want = "NUMA: the kernel refused mbind (Operation not permitted)";
  const auto first = text.find(want);
  EXPECT_NE(first, std::string::npos) << text;
  EXPECT_EQ(text.find(want, first + 1), std::string::npos) << "said more than once:\n" << text;
  EXPECT_EQ(text.find("\nmbind:"), std::string::npos) << "libnuma's own line:\n" << text;
}

}  // namespace
}  // namespace numastream
