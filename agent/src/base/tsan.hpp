// What ThreadSanitizer cannot see for itself, told to it. Debian's libzmq is not built with TSan,
// so the reference count that orders every holder of a shared message before the one that frees
// it is invisible: a thread that read a payload and let its reference go, and a thread that gets
// the same buffer back from its pool after the last reference went elsewhere, look unordered.
// Letting a reference go releases the bytes; the free function acquires them before returning
// them. Without TSan these are no-ops.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define NUMASTREAM_TSAN_ANNOTATE 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define NUMASTREAM_TSAN_ANNOTATE 1
#endif
#endif

#ifdef NUMASTREAM_TSAN_ANNOTATE
extern "C" void __tsan_acquire(void* addr);  // NOLINT(bugprone-reserved-identifier)
extern "C" void __tsan_release(void* addr);  // NOLINT(bugprone-reserved-identifier)
#endif

namespace numastream::tsan {

// This thread is done with the bytes at `p` (all it did to them happens before an acquire).
inline void release(const void* p) noexcept {
#ifdef NUMASTREAM_TSAN_ANNOTATE
  __tsan_release(const_cast<void*>(p));
#else
  (void)p;
#endif
}

// Everything released on `p` happens before what this thread does next.
inline void acquire(const void* p) noexcept {
#ifdef NUMASTREAM_TSAN_ANNOTATE
  __tsan_acquire(const_cast<void*>(p));
#else
  (void)p;
#endif
}

}  // namespace numastream::tsan
