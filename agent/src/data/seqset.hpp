// A set of sequence numbers that is mostly a prefix: a floor (every sequence below it is in the
// set) plus the members above it. Acknowledgements are kept this way: they arrive nearly in
// order, so the set above the floor stays as small as the window of chunks in flight.
#pragma once

#include <cstdint>
#include <set>
#include <span>
#include <vector>

namespace numastream {

class SeqSet {
 public:
  // True when `seq` was not yet in the set.
  bool insert(std::uint64_t seq) {
    if (seq < floor_ || !above_.insert(seq).second) return false;
    compact();
    return true;
  }
  // Adds every sequence below `floor` and the listed ones.
  void merge(std::uint64_t floor, std::span<const std::uint64_t> seqs) {
    if (floor > floor_) {
      floor_ = floor;
      above_.erase(above_.begin(), above_.lower_bound(floor_));
    }
    for (auto s : seqs) {
      if (s >= floor_) above_.insert(s);
    }
    compact();
  }
  bool contains(std::uint64_t seq) const { return seq < floor_ || above_.count(seq) > 0; }
  std::uint64_t floor() const noexcept { return floor_; }
  // Members above the floor, ascending, at most `max`.
  std::vector<std::uint64_t> above(std::size_t max) const {
    std::vector<std::uint64_t> out;
    for (auto it = above_.begin(); it != above_.end() && out.size() < max; ++it) out.push_back(*it);
    return out;
  }
  std::uint64_t size() const noexcept { return floor_ + above_.size(); }
  // One past the highest member (0 when empty).
  std::uint64_t end() const noexcept { return above_.empty() ? floor_ : *above_.rbegin() + 1; }

 private:
  void compact() {
    while (!above_.empty() && *above_.begin() == floor_) {
      above_.erase(above_.begin());
      ++floor_;
    }
  }
  std::uint64_t floor_ = 0;
  std::set<std::uint64_t> above_;
};

}  // namespace numastream
