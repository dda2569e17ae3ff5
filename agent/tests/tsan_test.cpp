// Built into the unit tests of the ThreadSanitizer build only (NUMASTREAM_TSAN): that a race
// fails the suite, and that what the agent tells TSan about libzmq (base/tsan.hpp) orders what
// libzmq's reference counts order, and nothing more.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "data/buffer_pool.hpp"
#include "net/transport.hpp"
#include "pipeline/chunk.hpp"

namespace numastream {
namespace {

// Waits for `flag` with relaxed loads: an order TSan does not count as one, as it cannot count
// libzmq's atomics.
void spin_until(const std::atomic<bool>& flag) {
  while (!flag.load(std::memory_order_relaxed)) std::this_thread::yield();
}

TEST(ThreadSanitizer, ARaceEndsTheProcessWithItsExitCode) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        std::vector<int> shared(16, 0);
        std::atomic<bool> written{false};
        std::thread writer([&] {
          shared[3] = 1;
          written.store(true, std::memory_order_relaxed);
        });
        spin_until(written);
        shared[3] = 2;
        writer.join();
        std::exit(shared[3] == 2 ? 0 : 1);
      },
      testing::ExitedWithCode(66), "ThreadSanitizer: data race");
}

// The fan-out's case: a consumer reads a pooled buffer shared through ZeroMQ and lets its
// reference go first; the last reference goes on another thread, the buffer returns to its pool
// and is written again. Ordered by libzmq's reference count; a report here fails the suite.
TEST(ThreadSanitizer, APooledBufferSharedThroughZeroMQIsReusedAfterItsLastReferenceWithoutAReport) {
  BufferPool pool("tsan", 1, 4096, -1);
  Chunk c;
  c.buffer = pool.take();
  c.header.payload_size = 1024;
  std::memset(c.payload().data(), 7, c.payload().size());
  zmq::Message mine = c.take_payload();
  zmq::Message theirs = mine.share();
  std::atomic<bool> done{false};
  std::vector<std::byte> copy(1024);
  std::thread consumer([&] {
    std::memcpy(copy.data(), theirs.bytes().data(), copy.size());
    theirs = zmq::Message();  // its reference let go
    done.store(true, std::memory_order_relaxed);
  });
  spin_until(done);
  mine = zmq::Message();  // the last reference: the buffer goes back to its pool
  EXPECT_EQ(pool.in_use(), 0u);
  PooledBuffer again = pool.take();  // the pool's one buffer, the same bytes
  ASSERT_TRUE(again);
  std::memset(again->data, 0, again->capacity);
  consumer.join();
  EXPECT_EQ(copy[1023], std::byte{7});
}

}  // namespace
}  // namespace numastream
