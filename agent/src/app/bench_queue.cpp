#include "app/bench_queue.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "data/queue.hpp"
#include "data/spin.hpp"
#include "wire/wire.hpp"

namespace numastream {
namespace {

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

void pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct HandOff {
  double items_per_s = 0;
  double cpu_us_per_item = 0;  // both threads
  double caught = 0;           // the share of the consumer's waits a spin ended
};

// One run: the producer checksums `item_bytes` per item (what a compressing thread does to a
// small chunk it passes on) and hands the item to the consumer through a queue of 4 (the
// default queue_depth); the consumer checksums a tenth of it (a sending thread's own work).
HandOff run_once(bool spin, int producer_cpu, int consumer_cpu, int items,
                 std::span<const std::byte> data) {
  BoundedQueue<int> q(4);
  SpinBudget budget;
  double producer_cpu_s = 0, consumer_cpu_s = 0;  // each written by its thread, read after join
  std::atomic<std::uint64_t> sink{0};
  const auto start = std::chrono::steady_clock::now();
  std::thread producer([&] {
    pin_to(producer_cpu);
    const double t0 = thread_cpu_seconds();
    std::uint64_t h = 0;
    for (int i = 0; i < items; ++i) {
      h ^= wire::checksum(data);
      int v = i;
      q.push(v);
    }
    q.close();
    sink += h;
    producer_cpu_s = thread_cpu_seconds() - t0;
  });
  std::thread consumer([&] {
    pin_to(consumer_cpu);
    const double t0 = thread_cpu_seconds();
    std::uint64_t h = 0;
    while (q.pop(spin ? &budget : nullptr)) h ^= wire::checksum(data.first(data.size() / 10));
    sink += h;
    consumer_cpu_s = thread_cpu_seconds() - t0;
  });
  producer.join();
  consumer.join();
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double waits = static_cast<double>(budget.caught_count() + budget.parked_count());
  return {static_cast<double>(items) / wall, (producer_cpu_s + consumer_cpu_s) / items * 1e6,
          waits > 0 ? static_cast<double>(budget.caught_count()) / waits : 0};
}

}  // namespace

nlohmann::json queue_report(int rounds, int items, std::size_t item_bytes, bool print) {
  cpu_set_t mine;
  CPU_ZERO(&mine);
  sched_getaffinity(0, sizeof(mine), &mine);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &mine)) cpus.push_back(c);
  }
  std::vector<std::byte> data(item_bytes);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>(i * 131 + 7);

  struct Setting {
    const char* name;
    int producer, consumer;
  };
  std::vector<Setting> settings;
  if (cpus.size() >= 2) settings.push_back({"own CPUs", cpus[0], cpus[1]});
  settings.push_back({"one shared CPU", cpus[0], cpus[0]});

  nlohmann::json out = {{"items", items}, {"item_bytes", item_bytes}, {"rounds", rounds}};
  if (print) {
    std::printf(
        "queue hand-off (the producer checksums %zu bytes per item, the consumer a tenth; queue of "
        "4; %d items; park and spin alternated, %d rounds, medians)\n"
        "  %-16s %12s %12s %9s %14s %14s %8s\n",
        item_bytes, items, rounds, "placement", "park items/s", "spin items/s", "spin/park",
        "park CPU us/it", "spin CPU us/it", "caught");
  }
  for (const Setting& s : settings) {
    std::vector<double> park_rate, spin_rate, park_cpu, spin_cpu, caught, ratio;
    for (int r = 0; r < rounds; ++r) {
      // Alternated, the first policy of a round alternating too.
      const bool spin_first = r % 2 == 1;
      HandOff a = run_once(spin_first, s.producer, s.consumer, items, data);
      HandOff b = run_once(!spin_first, s.producer, s.consumer, items, data);
      const HandOff& park = spin_first ? b : a;
      const HandOff& spun = spin_first ? a : b;
      park_rate.push_back(park.items_per_s);
      spin_rate.push_back(spun.items_per_s);
      park_cpu.push_back(park.cpu_us_per_item);
      spin_cpu.push_back(spun.cpu_us_per_item);
      caught.push_back(spun.caught);
      ratio.push_back(spun.items_per_s / park.items_per_s);
    }
    nlohmann::json j = {{"producer_cpu", s.producer},
                        {"consumer_cpu", s.consumer},
                        {"park_items_per_s", median(park_rate)},
                        {"spin_items_per_s", median(spin_rate)},
                        {"spin_over_park", median(ratio)},
                        {"park_cpu_us_per_item", median(park_cpu)},
                        {"spin_cpu_us_per_item", median(spin_cpu)},
                        {"caught_spinning", median(caught)}};
    if (print) {
      std::printf("  %-16s %12.0f %12.0f %8.2fx %14.2f %14.2f %7.0f%%\n", s.name, median(park_rate),
                  median(spin_rate), median(ratio), median(park_cpu), median(spin_cpu),
                  100 * median(caught));
    }
    out[s.producer == s.consumer ? "shared_cpu" : "own_cpus"] = j;
  }
  return out;
}

}  // namespace numastream
