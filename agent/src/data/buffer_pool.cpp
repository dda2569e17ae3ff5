#include "data/buffer_pool.hpp"

#include <numa.h>

#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <set>
#include <string>

#include "base/error.hpp"
#include "base/log.hpp"

namespace numastream {
namespace {

// Whether libnuma reported a refused call on this thread since it was last cleared: a pool asked
// for a node the kernel would not bind it to is not on that node.
thread_local bool numa_refused = false;

// Each of libnuma's messages once, through the agent's log: in a container whose seccomp profile
// refuses mbind and set_mempolicy (without CAP_SYS_NICE), libnuma would print a bare
// "mbind: Operation not permitted" for every buffer pool and thread.
void log_numa_once(const std::string& message) {
  static std::mutex mu;
  static std::set<std::string> seen;
  const std::lock_guard lock(mu);
  if (seen.insert(message).second) log_warn(message);
}

}  // namespace
}  // namespace numastream

// libnuma's error and warning hooks (numa(3): an application may define its own).
extern "C" void numa_error(char* where) {
  const int err = errno;
  numastream::numa_refused = true;
  numastream::log_numa_once(
      std::string("NUMA: the kernel refused ") + where + " (" + numastream::errno_text(err) +
      "): memory is placed where it is first written, not bound to the planned node (a "
      "container's seccomp profile refuses it without CAP_SYS_NICE)");
}

extern "C" void numa_warn(int /*number*/, char* where, ...) {
  char text[512];
  va_list args;
  va_start(args, where);
  std::vsnprintf(text, sizeof text, where, args);
  va_end(args);
  numastream::log_numa_once(std::string("NUMA (libnuma): ") + text);
}

namespace numastream {

bool numa_supported() noexcept {
  static const bool available = numa_available() >= 0;
  return available;
}

namespace {
constexpr std::size_t kAlign = 4096;
std::size_t round_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

BufferPool::BufferPool(std::string name, std::size_t count, std::size_t buffer_bytes, int numa_node,
                       Touch touch)
    : name_(std::move(name)), buffer_bytes_(buffer_bytes), numa_node_(numa_node) {
  NS_ASSERT(count >= 1);
  std::size_t stride = round_up(buffer_bytes ? buffer_bytes : 1);
  region_bytes_ = stride * count;
  if (numa_node >= 0 && numa_supported() && numa_node <= numa_max_node()) {
    numa_refused = false;
    region_ = static_cast<std::byte*>(numa_alloc_onnode(region_bytes_, numa_node));
    numa_allocated_ = region_ != nullptr;
    bound_ = numa_allocated_ && !numa_refused;
  }
  if (!region_) {
    region_ = static_cast<std::byte*>(std::aligned_alloc(kAlign, region_bytes_));
    if (!region_) throw std::bad_alloc();
  }
  if (touch == Touch::now) std::memset(region_, 0, region_bytes_);
  buffers_.resize(count);
  free_.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    buffers_[i].data = region_ + i * stride;
    buffers_[i].capacity = buffer_bytes;
    buffers_[i].pool = this;
    free_.push_back(&buffers_[i]);
  }
}

BufferPool::~BufferPool() {
  if (numa_allocated_) {
    numa_free(region_, region_bytes_);
  } else {
    std::free(region_);
  }
}

Buffer* BufferPool::acquire() {
  std::unique_lock lock(mu_);
  if (free_.empty() && !closed_) {
    auto start = std::chrono::steady_clock::now();
    available_.wait(lock, [&] { return !free_.empty() || closed_; });
    wait_ns_ += static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                               std::chrono::steady_clock::now() - start)
                                               .count());
  }
  if (closed_) return nullptr;
  Buffer* b = free_.back();
  free_.pop_back();
  b->size = 0;
  return b;
}

void BufferPool::release(Buffer* b) noexcept {
  NS_ASSERT(b && b->pool == this);
  {
    std::lock_guard lock(mu_);
    NS_ASSERT(free_.size() < buffers_.size());
    free_.push_back(b);
  }
  available_.notify_one();
}

void BufferPool::close() noexcept {
  {
    std::lock_guard lock(mu_);
    closed_ = true;
  }
  available_.notify_all();
}

std::size_t BufferPool::in_use() const {
  std::lock_guard lock(mu_);
  return buffers_.size() - free_.size();
}

std::uint64_t BufferPool::wait_ns() const {
  std::lock_guard lock(mu_);
  return wait_ns_;
}

}  // namespace numastream
