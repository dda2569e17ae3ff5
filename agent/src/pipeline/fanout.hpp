// Fan-out: one receiver's verified chunks to several consumers at once (config `sinks`), each
// with its guarantee (ConsumerConfig). Internal to the agent.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <utility>

#include "pipeline/sink.hpp"

namespace numastream {

// The acknowledgement of a chunk delivered to several lossless consumers: it goes upstream once
// every one of them has settled it (kept it, or given it up), as a discard if any gave it up.
// A chunk the receiver settled before (`settled`: a consumer keeping a chunk it kept already,
// after a restart) is acknowledged again at once, never held. Thread-safe: consumers settle from
// their own threads.
class AckJoin {
 public:
  // `lossless`: how many consumers must settle each chunk (1..64).
  AckJoin(int lossless, AckFn ack, AckFn discard,
          std::function<bool(std::uint32_t, std::uint64_t)> settled)
      : all_(lossless >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << lossless) - 1),
        ack_(std::move(ack)),
        discard_(std::move(discard)),
        settled_(std::move(settled)) {}

  // Consumer `who` (0-based among the lossless) kept the chunk (`kept`), or gave it up.
  void settle(int who, int via, std::uint32_t stream, std::uint64_t seq, bool kept) {
    if (all_ == 1) {  // one lossless consumer: nothing to join
      (kept ? ack_ : discard_)(via, stream, seq);
      return;
    }
    bool done = false, gave_up = false;
    {
      std::lock_guard lock(mu_);
      auto it = open_.find({stream, seq});
      if (it == open_.end()) {
        if (settled_(stream, seq)) {
          done = true, gave_up = !kept;
        } else {
          it = open_.emplace(std::pair{stream, seq}, Open{}).first;
        }
      }
      if (!done) {
        it->second.who |= std::uint64_t{1} << who;
        it->second.gave_up = it->second.gave_up || !kept;
        if (it->second.who == all_) {
          done = true, gave_up = it->second.gave_up;
          open_.erase(it);
        }
      }
    }
    if (done) (gave_up ? discard_ : ack_)(via, stream, seq);
  }
  // The acknowledgement and discard functions of consumer `who`.
  std::pair<AckFn, AckFn> of(int who) {
    return {[this, who](int via, std::uint32_t stream, std::uint64_t seq) {
              settle(who, via, stream, seq, true);
            },
            [this, who](int via, std::uint32_t stream, std::uint64_t seq) {
              settle(who, via, stream, seq, false);
            }};
  }
  // Chunks some lossless consumer has settled and another not yet.
  std::size_t open() const {
    std::lock_guard lock(mu_);
    return open_.size();
  }

 private:
  struct Open {
    std::uint64_t who = 0;
    bool gave_up = false;
  };
  const std::uint64_t all_;
  AckFn ack_, discard_;
  std::function<bool(std::uint32_t, std::uint64_t)> settled_;
  mutable std::mutex mu_;
  std::map<std::pair<std::uint32_t, std::uint64_t>, Open> open_;
};

}  // namespace numastream
