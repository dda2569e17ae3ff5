#include "base/mapped_file.hpp"

#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

namespace numastream {
namespace {

// The mappings the SIGBUS handler answers for: lock-free, read by the handler.
struct Slot {
  std::atomic<std::uintptr_t> begin{0};
  std::atomic<std::uintptr_t> end{0};
  std::atomic<bool> cut_short{false};
};
constexpr int kSlots = 64;
std::array<Slot, kSlots> g_slots;
std::mutex g_claim;  // claiming and releasing slots (not the handler)
struct sigaction g_previous {};
std::uintptr_t g_page = 4096;

void on_sigbus(int sig, siginfo_t* info, void* context) {
  const auto addr = reinterpret_cast<std::uintptr_t>(info->si_addr);
  for (Slot& s : g_slots) {
    if (addr >= s.begin.load(std::memory_order_acquire) &&
        addr < s.end.load(std::memory_order_acquire)) {
      // The page past the file's end becomes zeros, the read goes on, the reader is told.
      // The system call itself: a sanitizer's mmap wrapper need not be safe in a signal handler.
      const std::uintptr_t at = addr & ~(g_page - 1);
      if (static_cast<std::uintptr_t>(::syscall(SYS_mmap, at, g_page, PROT_READ,
                                                MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0)) !=
          at)
        break;
      s.cut_short.store(true, std::memory_order_release);
      return;
    }
  }
  // Not a mapped file's: what would have happened without this handler.
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction) return g_previous.sa_sigaction(sig, info, context);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    return g_previous.sa_handler(sig);
  }
  // The default action, for a fault and a signal sent alike: pending until this handler returns.
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void install_guard() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, &g_previous);
  });
}

}  // namespace

std::shared_ptr<const MappedFile> MappedFile::map(int fd, std::size_t size,
                                                  const std::string& path) {
  if (size == 0) return nullptr;
  install_guard();
  int slot = -1;
  {
    std::lock_guard lock(g_claim);
    for (int i = 0; i < kSlots && slot < 0; ++i) {
      if (g_slots[static_cast<std::size_t>(i)].end.load() == 0) slot = i;
    }
    if (slot < 0) return nullptr;
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return nullptr;
    ::madvise(p, size, MADV_SEQUENTIAL);
    Slot& s = g_slots[static_cast<std::size_t>(slot)];
    s.cut_short.store(false);
    s.begin.store(reinterpret_cast<std::uintptr_t>(p), std::memory_order_release);
    s.end.store(reinterpret_cast<std::uintptr_t>(p) + size, std::memory_order_release);
    return std::shared_ptr<const MappedFile>(
        new MappedFile(static_cast<const std::byte*>(p), size, path, slot));
  }
}

MappedFile::~MappedFile() {
  std::lock_guard lock(g_claim);
  Slot& s = g_slots[static_cast<std::size_t>(slot_)];
  s.end.store(0, std::memory_order_release);
  s.begin.store(0, std::memory_order_release);
  ::munmap(const_cast<std::byte*>(data_), size_);
}

bool MappedFile::cut_short() const {
  return g_slots[static_cast<std::size_t>(slot_)].cut_short.load(std::memory_order_acquire);
}

MappedView::MappedView(std::shared_ptr<const MappedFile> file, std::size_t offset, std::size_t size)
    : file_(std::move(file)), bytes_(file_->bytes().subspan(offset, size)) {}

MappedView& MappedView::operator=(MappedView&& o) noexcept {
  if (this != &o) {
    release();
    file_ = std::move(o.file_);
    bytes_ = std::exchange(o.bytes_, {});
  }
  return *this;
}

void MappedView::release() noexcept {
  if (!file_) return;
  // The pages wholly inside the view: one at either end may be a neighbour's too.
  static const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto from = (reinterpret_cast<std::uintptr_t>(bytes_.data()) + page - 1) & ~(page - 1);
  const auto to = (reinterpret_cast<std::uintptr_t>(bytes_.data()) + bytes_.size()) & ~(page - 1);
  if (to > from) ::madvise(reinterpret_cast<void*>(from), to - from, MADV_DONTNEED);
  file_.reset();
  bytes_ = {};
}

std::string cut_short_message(const std::string& path, std::size_t size) {
  return path + " was cut short while it was read, or its storage failed (it held " +
         std::to_string(size) + " bytes when opened): nothing read past its end is sent";
}

}  // namespace numastream
