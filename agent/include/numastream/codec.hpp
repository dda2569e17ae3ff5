// Chunk codecs: lz4, shuffle-lz4 (16-bit byte shuffle, then LZ4) and none.
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

namespace numastream {

enum class Codec : std::uint8_t { none = 0, lz4 = 1, shuffle_lz4 = 2 };

std::optional<Codec> parse_codec(std::string_view name) noexcept;
std::string_view codec_name(Codec c) noexcept;
bool codec_known(std::uint8_t value) noexcept;

// Worst-case encoded size of `raw_size` bytes (what an output buffer must hold).
std::size_t max_encoded_size(std::size_t raw_size) noexcept;

// Splits 16-bit samples into a plane of low bytes then a plane of high bytes. An odd trailing
// byte is copied as is. `in` and `out` must not overlap.
void shuffle16(const std::byte* in, std::byte* out, std::size_t n) noexcept;
void unshuffle16(const std::byte* in, std::byte* out, std::size_t n) noexcept;

class Compressor {
 public:
  Compressor(Codec codec, int acceleration, std::size_t max_raw);
  ~Compressor();
  Compressor(const Compressor&) = delete;
  Compressor& operator=(const Compressor&) = delete;
  Compressor(Compressor&&) noexcept;
  Compressor& operator=(Compressor&&) noexcept;

  struct Result {
    Codec codec;       // what was applied: `none` when compression would not shrink the chunk
    std::size_t size;  // bytes written to `out`
  };
  // `out` must hold max_encoded_size(raw.size()); raw.size() must be <= max_raw.
  Result compress(std::span<const std::byte> raw, std::span<std::byte> out) noexcept;

 private:
  Codec codec_;
  int acceleration_;
  std::size_t max_raw_;
  std::unique_ptr<std::byte[]> lz4_state_;
  std::unique_ptr<std::byte[]> scratch_;  // shuffle plane, shuffle-lz4 only
};

class Decompressor {
 public:
  explicit Decompressor(std::size_t max_raw);
  // Decodes `in` into exactly out.size() bytes. False when the input is malformed or does not
  // decode to exactly out.size() bytes. Never reads or writes out of bounds.
  bool decompress(Codec codec, std::span<const std::byte> in, std::span<std::byte> out) noexcept;

 private:
  std::size_t max_raw_;
  std::unique_ptr<std::byte[]> scratch_;
};

}  // namespace numastream
