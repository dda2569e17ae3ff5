// What a codec shows of a chunk's raw bytes as it works: every raw byte once, in order, in
// pieces, each while it is still in the cache (bslz4: each block as it is shuffled or
// unshuffled). A chunk's checksum is taken this way instead of in a pass of its own.
#pragma once

#include <cstddef>
#include <span>

namespace numastream {

class RawObserver {
 public:
  virtual void raw(std::span<const std::byte> piece) noexcept = 0;

 protected:
  ~RawObserver() = default;
};

}  // namespace numastream
