#include "codec/codec.hpp"

#include <lz4.h>

#include <algorithm>
#include <cstring>

#include "base/error.hpp"
#include "codec/bitshuffle.hpp"

namespace numastream {

std::optional<Codec> parse_codec(std::string_view name) noexcept {
  if (name == "lz4") return Codec::lz4;
  if (name == "shuffle-lz4") return Codec::shuffle_lz4;
  if (name == "bslz4") return Codec::bslz4;
  if (name == "none") return Codec::none;
  return std::nullopt;
}

std::string_view codec_name(Codec c) noexcept {
  switch (c) {
    case Codec::none:
      return "none";
    case Codec::lz4:
      return "lz4";
    case Codec::shuffle_lz4:
      return "shuffle-lz4";
    case Codec::bslz4:
      return "bslz4";
  }
  return "unknown";
}

bool codec_known(std::uint8_t value) noexcept { return value <= 3; }

bool valid_element_size(std::size_t bytes) noexcept {
  return bytes == 1 || bytes == 2 || bytes == 4 || bytes == 8;
}

std::size_t max_encoded_size(std::size_t raw_size) noexcept {
  if (raw_size > static_cast<std::size_t>(LZ4_MAX_INPUT_SIZE)) return raw_size;
  std::size_t bound = static_cast<std::size_t>(LZ4_compressBound(static_cast<int>(raw_size)));
  return std::max({bound, raw_size, bslz4::max_encoded_size(raw_size)});
}

void shuffle16(const std::byte* in, std::byte* out, std::size_t n) noexcept {
  std::size_t pairs = n / 2;
  std::byte* lo = out;
  std::byte* hi = out + pairs;
  for (std::size_t i = 0; i < pairs; ++i) {
    lo[i] = in[2 * i];
    hi[i] = in[2 * i + 1];
  }
  if (n % 2) out[n - 1] = in[n - 1];
}

void unshuffle16(const std::byte* in, std::byte* out, std::size_t n) noexcept {
  std::size_t pairs = n / 2;
  const std::byte* lo = in;
  const std::byte* hi = in + pairs;
  for (std::size_t i = 0; i < pairs; ++i) {
    out[2 * i] = lo[i];
    out[2 * i + 1] = hi[i];
  }
  if (n % 2) out[n - 1] = in[n - 1];
}

Compressor::Compressor(Codec codec, int acceleration, std::size_t max_raw, std::size_t element_size)
    : codec_(codec),
      acceleration_(acceleration < 1 ? 1 : acceleration),
      max_raw_(max_raw),
      element_size_(element_size) {
  NS_ASSERT(max_raw <= static_cast<std::size_t>(LZ4_MAX_INPUT_SIZE));
  if (codec_ == Codec::bslz4) {
    NS_ASSERT(valid_element_size(element_size_));
    bslz4_ = std::make_unique<bslz4::Workspace>();
  } else if (codec_ != Codec::none) {
    lz4_state_ = std::make_unique<std::byte[]>(static_cast<std::size_t>(LZ4_sizeofState()));
  }
  if (codec_ == Codec::shuffle_lz4) scratch_ = std::make_unique<std::byte[]>(max_raw_);
}

Compressor::~Compressor() = default;
Compressor::Compressor(Compressor&&) noexcept = default;
Compressor& Compressor::operator=(Compressor&&) noexcept = default;

Compressor::Result Compressor::compress(std::span<const std::byte> raw, std::span<std::byte> out,
                                        RawObserver* seen) noexcept {
  NS_ASSERT(raw.size() <= max_raw_);
  NS_ASSERT(out.size() >= max_encoded_size(raw.size()));
  if (codec_ == Codec::bslz4 && !raw.empty() && raw.size() % element_size_ == 0) {
    // Always bslz4, even when it does not shrink the chunk: what stores it (an HDF5 dataset with
    // the filter) expects every frame in that framing.
    return {codec_, bslz4_->encode(raw, element_size_, out, 0, seen)};
  }
  if (seen && !raw.empty()) seen->raw(raw);  // LZ4 takes the chunk whole
  if (codec_ != Codec::none && codec_ != Codec::bslz4 && !raw.empty()) {
    const std::byte* src = raw.data();
    if (codec_ == Codec::shuffle_lz4) {
      shuffle16(raw.data(), scratch_.get(), raw.size());
      src = scratch_.get();
    }
    int n = LZ4_compress_fast_extState(
        lz4_state_.get(), reinterpret_cast<const char*>(src), reinterpret_cast<char*>(out.data()),
        static_cast<int>(raw.size()), static_cast<int>(out.size()), acceleration_);
    if (n > 0 && static_cast<std::size_t>(n) < raw.size()) {
      return {codec_, static_cast<std::size_t>(n)};
    }
  }
  // Incompressible (or codec none): ship the raw bytes; the frame says so.
  if (!raw.empty()) std::memcpy(out.data(), raw.data(), raw.size());
  return {Codec::none, raw.size()};
}

Decompressor::Decompressor(std::size_t max_raw)
    : max_raw_(max_raw),
      scratch_(std::make_unique<std::byte[]>(max_raw ? max_raw : 1)),
      bslz4_(std::make_unique<bslz4::Workspace>()) {}

Decompressor::~Decompressor() = default;

bool Decompressor::decompress(Codec codec, std::span<const std::byte> in, std::span<std::byte> out,
                              std::size_t element_size, RawObserver* seen) noexcept {
  if (out.size() > max_raw_) return false;
  if (codec == Codec::bslz4) {
    return valid_element_size(element_size) && bslz4_->decode(in, element_size, out, seen);
  }
  const bool ok = decompress_whole(codec, in, out);
  if (ok && seen && !out.empty()) seen->raw(out);
  return ok;
}

bool Decompressor::decompress_whole(Codec codec, std::span<const std::byte> in,
                                    std::span<std::byte> out) noexcept {
  switch (codec) {
    case Codec::bslz4:
      return false;
    case Codec::none:
      if (in.size() != out.size()) return false;
      if (!in.empty()) std::memcpy(out.data(), in.data(), in.size());
      return true;
    case Codec::lz4: {
      if (in.empty() || in.size() > static_cast<std::size_t>(LZ4_MAX_INPUT_SIZE)) return false;
      int n = LZ4_decompress_safe(reinterpret_cast<const char*>(in.data()),
                                  reinterpret_cast<char*>(out.data()), static_cast<int>(in.size()),
                                  static_cast<int>(out.size()));
      return n >= 0 && static_cast<std::size_t>(n) == out.size();
    }
    case Codec::shuffle_lz4: {
      if (in.empty() || in.size() > static_cast<std::size_t>(LZ4_MAX_INPUT_SIZE)) return false;
      int n = LZ4_decompress_safe(reinterpret_cast<const char*>(in.data()),
                                  reinterpret_cast<char*>(scratch_.get()),
                                  static_cast<int>(in.size()), static_cast<int>(out.size()));
      if (n < 0 || static_cast<std::size_t>(n) != out.size()) return false;
      unshuffle16(scratch_.get(), out.data(), out.size());
      return true;
    }
  }
  return false;
}

}  // namespace numastream
