#include "data/buffer_pool.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>
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

}  // namespace
}  // namespace numastream
