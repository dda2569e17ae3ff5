// delay-line: a wide-area link between two network namespaces (tests/delay_line.hpp) for as long
// as it runs, for the facility in a box's tests. Prints "ready" once the link is up, and on
// SIGTERM or SIGINT a JSON line of what it carried and dropped.
//
//   delay-line NS_A NS_B IP_A IP_B DELAY_MS LOSS_FRACTION RATE_MBIT NAME_NUMBER
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "delay_line.hpp"

int main(int argc, char** argv) {
  if (argc != 9) {
    std::fprintf(
        stderr,
        "usage: delay-line NS_A NS_B IP_A IP_B DELAY_MS LOSS_FRACTION RATE_MBIT NAME_NUMBER\n");
    return 2;
  }
  const double delay_ms = std::atof(argv[5]), loss = std::atof(argv[6]),
               rate_mbit = std::atof(argv[7]);
  if (delay_ms < 0 || loss < 0 || loss > 1 || rate_mbit < 0) {
    std::fprintf(
        stderr,
        "delay-line: DELAY_MS >= 0, 0 <= LOSS_FRACTION <= 1, RATE_MBIT >= 0 (0: no limit)\n");
    return 2;
  }
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop,
                  nullptr);  // the link's threads inherit it; sigwait below takes them
  numastream::testing::DelayLine line(argv[1], argv[2], argv[3], argv[4],
                                      std::chrono::microseconds(static_cast<long>(delay_ms * 1000)),
                                      loss, std::atoi(argv[8]), rate_mbit * 1e6 / 8);
  if (!line.ok) {
    std::fprintf(stderr, "delay-line: %s\n", line.why.c_str());
    return 1;
  }
  std::printf("ready\n");
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  std::printf("{\"carried\": %llu, \"dropped\": %llu}\n",
              static_cast<unsigned long long>(line.carried()),
              static_cast<unsigned long long>(line.dropped()));
  return 0;
}
