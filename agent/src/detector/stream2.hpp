// DECTRIS Stream V2: what a detector's PUSH socket sends, one CBOR map per ZeroMQ message —
// `start` (series metadata), `image` (one per image: channels of compressed pixels), `end`.
// numastream carries each message as it came; it reads only what routes it: the message type,
// the series it belongs to and the image number. Decoded with libcbor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace numastream::stream2 {

enum class Type { start, image, end };

struct Message {
  Type type = Type::image;
  std::uint64_t series_id = 0;
  std::string series_unique_id;
  std::uint64_t image_id = 0;  // image messages
};

// The routing fields of one message, or nullopt with `error` saying what is wrong (not CBOR,
// trailing bytes, not a map, no or unknown `type`, a missing or mistyped field).
std::optional<Message> parse(std::span<const std::byte> bytes, std::string& error);

const char* type_name(Type t) noexcept;

// A start message of our own (the detector simulator's, the tests'): type, series_id,
// series_unique_id, and the image count the series will have.
std::vector<std::byte> build_start(std::uint64_t series_id, const std::string& series_unique_id,
                                   std::uint64_t number_of_images);

// The start message for a recorded series that lacks one: the series id and unique id of the
// first message that names them, the number of its image messages.
std::vector<std::byte> start_for(std::span<const std::vector<std::byte>> series);

}  // namespace numastream::stream2
