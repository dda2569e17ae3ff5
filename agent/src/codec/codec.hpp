// Chunk codecs: lz4, shuffle-lz4 (16-bit byte shuffle, then LZ4), bslz4 (bit-shuffle of the
// element size, then LZ4 per block, in the HDF5 filter 32008 framing: bitshuffle.hpp) and none.
// One Compressor / Decompressor per thread: each owns its LZ4 state and scratch space, allocated
// once. Decompression always uses LZ4's bounds-checked (_safe) decoder: its input comes from the
// network.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>

#include "codec/raw_observer.hpp"

namespace numastream {

namespace bslz4 {
class Workspace;
}

enum class Codec : std::uint8_t { none = 0, lz4 = 1, shuffle_lz4 = 2, bslz4 = 3 };

// Element sizes bslz4 shuffles (bytes per pixel).
bool valid_element_size(std::size_t bytes) noexcept;

std::optional<Codec> parse_codec(std::string_view name) noexcept;
std::string_view codec_name(Codec c) noexcept;
bool codec_known(std::uint8_t value) noexcept;

// Worst-case encoded size of `raw_size` bytes by any codec (what an output buffer must hold).
std::size_t max_encoded_size(std::size_t raw_size) noexcept;

// Splits 16-bit samples into a plane of low bytes then a plane of high bytes. An odd trailing
// byte is copied as is. `in` and `out` must not overlap.
void shuffle16(const std::byte* in, std::byte* out, std::size_t n) noexcept;
void unshuffle16(const std::byte* in, std::byte* out, std::size_t n) noexcept;

class Compressor {
 public:
  // `element_size`: bytes per sample, for bslz4 (1, 2, 4 or 8).
  Compressor(Codec codec, int acceleration, std::size_t max_raw, std::size_t element_size = 2);
  ~Compressor();
  Compressor(const Compressor&) = delete;
  Compressor& operator=(const Compressor&) = delete;
  Compressor(Compressor&&) noexcept;
  Compressor& operator=(Compressor&&) noexcept;

  struct Result {
    Codec codec;       // what was applied: `none` when compression would not shrink the chunk
    std::size_t size;  // bytes written to `out`
  };
  // `out` must hold max_encoded_size(raw.size()); raw.size() must be <= max_raw. `seen` (if any)
  // is shown every byte of `raw` once, in order (bslz4: block by block as they are read).
  Result compress(std::span<const std::byte> raw, std::span<std::byte> out,
                  RawObserver* seen = nullptr) noexcept;

 private:
  Codec codec_;
  int acceleration_;
  std::size_t max_raw_;
  std::size_t element_size_;
  std::unique_ptr<std::byte[]> lz4_state_;
  std::unique_ptr<std::byte[]> scratch_;  // shuffle plane, shuffle-lz4 only
  std::unique_ptr<bslz4::Workspace> bslz4_;
};

class Decompressor {
 public:
  explicit Decompressor(std::size_t max_raw);
  ~Decompressor();
  // Decodes `in` into exactly out.size() bytes. False when the input is malformed or does not
  // decode to exactly out.size() bytes. Never reads or writes out of bounds. `element_size` is
  // bslz4's (the frame header carries it). `seen` (if any) is shown every byte of `out` once, in
  // order, when this succeeds (bslz4: block by block as they are written).
  bool decompress(Codec codec, std::span<const std::byte> in, std::span<std::byte> out,
                  std::size_t element_size = 0, RawObserver* seen = nullptr) noexcept;

 private:
  // lz4, shuffle-lz4, none: decoded in one piece.
  bool decompress_whole(Codec codec, std::span<const std::byte> in,
                        std::span<std::byte> out) noexcept;
  std::size_t max_raw_;
  std::unique_ptr<std::byte[]> scratch_;
  std::unique_ptr<bslz4::Workspace> bslz4_;
};

}  // namespace numastream
