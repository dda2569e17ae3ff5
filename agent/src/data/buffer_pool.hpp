// Fixed-size buffer pools, one per NUMA node and stage: allocated once (numa_alloc_onnode when
// the machine has NUMA support), pre-faulted, then reused. acquire() blocks while all buffers are
// out, which is how a slow downstream stage slows the stages that feed it. release() is
// thread-safe and noexcept: ZeroMQ's I/O threads call it when a zero-copy message is sent.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace numastream {

class BufferPool;

struct Buffer {
  std::byte* data = nullptr;
  std::size_t capacity = 0;
  std::size_t size = 0;  // bytes in use, set by whoever fills it
  BufferPool* pool = nullptr;
};

// A buffer on loan from its pool: it goes back when this handle is destroyed or reset, so no
// path (an error, a full queue, a duplicate chunk, shutdown) can leak it. release() hands it to a
// new owner that returns it itself (ZeroMQ's zero-copy free callback).
class PooledBuffer {
 public:
  PooledBuffer() = default;
  explicit PooledBuffer(Buffer* b) noexcept : b_(b) {}
  ~PooledBuffer() { reset(); }
  PooledBuffer(PooledBuffer&& o) noexcept : b_(o.release()) {}
  PooledBuffer& operator=(PooledBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      b_ = o.release();
    }
    return *this;
  }
  PooledBuffer(const PooledBuffer&) = delete;
  PooledBuffer& operator=(const PooledBuffer&) = delete;

  explicit operator bool() const noexcept { return b_ != nullptr; }
  Buffer* get() const noexcept { return b_; }
  Buffer* operator->() const noexcept { return b_; }
  Buffer* release() noexcept { return std::exchange(b_, nullptr); }
  void reset() noexcept;

 private:
  Buffer* b_ = nullptr;
};

class BufferPool {
 public:
  // `numa_node` < 0 allocates without a node binding. Every page is faulted in at once (on the
  // node), not on the first chunk; `Touch::on_use` leaves that to the first use (a pool that may
  // never be written: a mapped file's chunks only take its buffers' places).
  enum class Touch { now, on_use };
  BufferPool(std::string name, std::size_t count, std::size_t buffer_bytes, int numa_node,
             Touch touch = Touch::now);
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // Blocks until a buffer is free. nullptr once the pool is closed (shutdown).
  Buffer* acquire();
  // acquire() as a handle that returns the buffer by itself; empty once the pool is closed.
  PooledBuffer take() { return PooledBuffer(acquire()); }
  void release(Buffer* b) noexcept;
  // Wakes every waiter; acquire() returns nullptr from now on.
  void close() noexcept;

  const std::string& name() const noexcept { return name_; }
  int numa_node() const noexcept { return numa_node_; }
  bool on_requested_node() const noexcept { return bound_; }
  std::size_t count() const noexcept { return buffers_.size(); }
  std::size_t buffer_bytes() const noexcept { return buffer_bytes_; }
  std::size_t in_use() const;
  std::uint64_t wait_ns() const;  // total time acquire() blocked

 private:
  std::string name_;
  std::size_t buffer_bytes_;
  int numa_node_;
  bool bound_ = false;
  std::byte* region_ = nullptr;
  std::size_t region_bytes_ = 0;
  bool numa_allocated_ = false;
  std::vector<Buffer> buffers_;
  mutable std::mutex mu_;
  std::condition_variable available_;
  std::vector<Buffer*> free_;
  bool closed_ = false;
  std::uint64_t wait_ns_ = 0;
};

inline void PooledBuffer::reset() noexcept {
  if (Buffer* b = std::exchange(b_, nullptr)) b->pool->release(b);
}

// libnuma availability, asked once (numa_available() before any other libnuma call).
bool numa_supported() noexcept;

}  // namespace numastream
