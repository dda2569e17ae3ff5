// A set of sequence numbers that is mostly a prefix: a floor (every sequence below it is in the
// set) plus a bitmap of the members in a bounded window above it. Acknowledgements and deliveries
// are kept this way: they arrive nearly in order, so the bitmap stays as small as the chunks in
// flight; and however far apart the members are, it never holds more than `window` bits (a
// member at or beyond floor + window is refused). Memory is bounded by configuration, never by a
// number someone else chose.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <deque>
#include <limits>
#include <span>
#include <vector>

namespace numastream {

class SeqSet {
 public:
  // Members above the floor that the set can hold: 2^20 (128 KiB of bits at most).
  static constexpr std::uint64_t kDefaultWindow = std::uint64_t{1} << 20;
  // Sequences at or above this are never members (no stream reaches it; arithmetic on them
  // cannot wrap).
  static constexpr std::uint64_t kMaxSeq = std::uint64_t{1} << 62;

  explicit SeqSet(std::uint64_t window = kDefaultWindow)
      : window_(std::max<std::uint64_t>(64, window)) {}

  // Whether `seq` is a sequence this set can hold now (below the floor, or within the window).
  bool fits(std::uint64_t seq) const noexcept {
    return seq < floor_ || (seq < kMaxSeq && seq - floor_ < window_);
  }

  // True when `seq` was not yet in the set. A sequence beyond the window is not added (false).
  bool insert(std::uint64_t seq) {
    if (seq < floor_ || !fits(seq)) return false;
    const std::uint64_t off = seq - floor_;
    const std::size_t w = static_cast<std::size_t>(off / 64);
    if (w >= words_.size()) words_.resize(w + 1, 0);
    const std::uint64_t bit = std::uint64_t{1} << (off % 64);
    if (words_[w] & bit) return false;
    words_[w] |= bit;
    ++above_count_;
    end_ = std::max(end_, seq + 1);
    compact();
    return true;
  }
  // Adds every sequence below `floor` and the listed ones (those beyond the window are dropped;
  // the caller checks fits() first where that matters).
  void merge(std::uint64_t floor, std::span<const std::uint64_t> seqs) {
    raise_floor(floor);
    for (auto s : seqs) insert(s);
  }
  // Every sequence below `floor` joins the set; returns how many were not members yet.
  std::uint64_t raise_floor(std::uint64_t floor) {
    floor = std::min(floor, kMaxSeq);
    if (floor <= floor_) return 0;
    std::uint64_t added = 0;
    while (floor_ < floor && !words_.empty()) {
      const std::uint64_t step = std::min<std::uint64_t>(64, floor - floor_);
      const std::uint64_t mask = step == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << step) - 1;
      const std::uint64_t present = words_.front() & mask;
      const auto had = static_cast<std::uint64_t>(std::popcount(present));
      added += step - had;
      above_count_ -= had;
      if (step == 64) {
        words_.pop_front();
      } else {
        shift_down(step);
      }
      floor_ += step;
    }
    if (floor_ < floor) {  // nothing held above: a jump
      added += floor - floor_;
      floor_ = floor;
    }
    end_ = std::max(end_, floor_);
    compact();
    return added;
  }
  bool contains(std::uint64_t seq) const {
    if (seq < floor_) return true;
    if (!fits(seq)) return false;
    const std::uint64_t off = seq - floor_;
    const std::size_t w = static_cast<std::size_t>(off / 64);
    return w < words_.size() && (words_[w] >> (off % 64)) & 1u;
  }
  std::uint64_t floor() const noexcept { return floor_; }
  std::uint64_t window() const noexcept { return window_; }
  // Members above the floor, ascending, at most `max`.
  std::vector<std::uint64_t> above(
      std::size_t max = std::numeric_limits<std::size_t>::max()) const {
    std::vector<std::uint64_t> out;
    for (std::size_t w = 0; w < words_.size() && out.size() < max; ++w) {
      std::uint64_t bits = words_[w];
      while (bits && out.size() < max) {
        const int b = std::countr_zero(bits);
        out.push_back(floor_ + w * 64 + static_cast<std::uint64_t>(b));
        bits &= bits - 1;
      }
    }
    return out;
  }
  std::uint64_t size() const noexcept { return floor_ + above_count_; }
  // One past the highest member (0 when empty).
  std::uint64_t end() const noexcept { return end_; }
  // Bytes the bitmap holds now (for tests of the bound).
  std::size_t bitmap_bytes() const noexcept { return words_.size() * sizeof(std::uint64_t); }

 private:
  // Drops the `n` (< 64) lowest bits of the window: the floor moved up by n.
  void shift_down(std::uint64_t n) {
    for (std::size_t w = 0; w < words_.size(); ++w) {
      std::uint64_t next = w + 1 < words_.size() ? words_[w + 1] : 0;
      words_[w] = (words_[w] >> n) | (next << (64 - n));
    }
    while (!words_.empty() && words_.back() == 0) words_.pop_back();
  }
  void compact() {
    while (!words_.empty() && words_.front() == ~std::uint64_t{0}) {
      words_.pop_front();
      floor_ += 64;
      above_count_ -= 64;
    }
    if (words_.empty()) return;
    const int ones = std::countr_one(words_.front());
    if (ones > 0) {
      above_count_ -= static_cast<std::uint64_t>(ones);
      floor_ += static_cast<std::uint64_t>(ones);
      shift_down(static_cast<std::uint64_t>(ones));
    }
    while (!words_.empty() && words_.back() == 0) words_.pop_back();
  }

  std::uint64_t window_;
  std::uint64_t floor_ = 0;
  std::uint64_t above_count_ = 0;
  std::uint64_t end_ = 0;
  std::deque<std::uint64_t> words_;  // bit i of word w: floor + 64 w + i is a member
};

}  // namespace numastream
