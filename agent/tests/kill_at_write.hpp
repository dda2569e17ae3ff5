// A process killed at a chosen write: `kill_at_write(n, body)` runs `body` in a child process it
// traces and SIGKILLs the child as it enters its n-th pwrite, so the files it leaves are exactly
// what a process killed right before that write leaves (what it wrote before is in the page
// cache, as after any SIGKILL). With n = 0 the child runs to its end, and the count of its writes
// says how many kill points there are. The child stops for its tracer only at pwrite, pwritev and
// pwritev2 (a seccomp filter returning SECCOMP_RET_TRACE), so it runs at nearly full speed. Test
// helper; Linux.
#pragma once

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>

namespace numastream::testing {

struct WriteKill {
  bool killed = false;  // killed at the n-th write; else it ran to its end
  int writes = 0;       // the pwrites it entered (the n-th included when killed)
  int status = 0;       // waitpid's status when it ended on its own
};

namespace detail {

#if defined(__x86_64__)
constexpr unsigned kAuditArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
constexpr unsigned kAuditArch = AUDIT_ARCH_AARCH64;
#else
#error "kill_at_write: name this architecture's AUDIT_ARCH"
#endif

// In the child: every pwrite, pwritev and pwritev2 stops it for its tracer; nothing else does.
inline bool trace_writes() {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kAuditArch, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_pwrite64, 3, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_pwritev, 2, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_pwritev2, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRACE),
  };
  sock_fprog prog{static_cast<unsigned short>(sizeof filter / sizeof filter[0]), filter};
  return ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

}  // namespace detail

inline WriteKill kill_at_write(int n, const std::function<void()>& body) {
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    if (::ptrace(PTRACE_TRACEME, 0, nullptr, nullptr) != 0) std::_Exit(120);
    ::raise(SIGSTOP);  // the tracer sets its options
    if (!detail::trace_writes()) std::_Exit(122);
    try {
      body();
    } catch (...) {
      std::_Exit(121);
    }
    std::_Exit(0);
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFSTOPPED(status)) {
    throw std::runtime_error("kill_at_write: the child did not stop for its tracer (status " +
                             std::to_string(status) + "; ptrace refused?)");
  }
  if (::ptrace(PTRACE_SETOPTIONS, pid, nullptr, PTRACE_O_TRACESECCOMP | PTRACE_O_EXITKILL) != 0) {
    ::kill(pid, SIGKILL);
    throw std::runtime_error(std::string("kill_at_write: PTRACE_SETOPTIONS: ") +
                             std::strerror(errno));
  }
  WriteKill out;
  long deliver = 0;
  for (;;) {
    if (::ptrace(PTRACE_CONT, pid, nullptr, reinterpret_cast<void*>(deliver)) != 0) {
      throw std::runtime_error(std::string("kill_at_write: PTRACE_CONT: ") + std::strerror(errno));
    }
    deliver = 0;
    if (::waitpid(pid, &status, 0) != pid) throw std::runtime_error("kill_at_write: waitpid");
    if (WIFEXITED(status) || WIFSIGNALED(status)) {
      if (WIFEXITED(status) && WEXITSTATUS(status) == 122)
        throw std::runtime_error("kill_at_write: the child could not install its seccomp filter");
      out.status = status;
      return out;
    }
    if (!WIFSTOPPED(status)) continue;
    if (status >> 8 != (SIGTRAP | (PTRACE_EVENT_SECCOMP << 8))) {
      deliver = WSTOPSIG(status) == SIGSTOP ? 0 : WSTOPSIG(status);  // a signal for the child
      continue;
    }
    if (++out.writes == n) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      out.killed = true;
      return out;
    }
  }
}

}  // namespace numastream::testing
