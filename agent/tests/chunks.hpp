// Test helper: a chunk of stream 0 as a sink or a spill receives it (one connection, its checksum).
#pragma once

#include <cstdint>
#include <vector>

#include "pipeline/chunk.hpp"
#include "wire/wire.hpp"

namespace numastream::testing {

// Chunk `seq` of stream 0 holding `payload` (codec none), in a message of its own.
inline Chunk chunk_of(std::uint64_t seq, const std::vector<std::byte>& payload) {
  Chunk c;
  c.header.stream_id = 0;
  c.header.sequence = seq;
  c.header.connections = 1;
  c.header.payload_size = static_cast<std::uint32_t>(payload.size());
  c.header.raw_size = static_cast<std::uint32_t>(payload.size());
  c.header.checksum = wire::checksum(payload);
  c.body = zmq::Message::of(payload);
  return c;
}

// Chunk `seq` of `size` bytes, each the byte `seq`.
inline Chunk chunk_of(std::uint64_t seq, std::size_t size) {
  return chunk_of(seq, std::vector<std::byte>(size, static_cast<std::byte>(seq)));
}

}  // namespace numastream::testing
