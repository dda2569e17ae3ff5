// A chunk as it travels through a pipeline: its frame header, decoded once where the chunk enters
// (read from a source, or taken off the network) and encoded once where it leaves (onto the wire,
// into a sink); its bytes in a pooled buffer that returns itself to its pool when the chunk is
// dropped; and, on the receiving side, the connection it arrived on (its acknowledgement goes back
// there). Internal to the agent.
#pragma once

#include <cstddef>
#include <span>

#include "data/buffer_pool.hpp"
#include "wire/wire.hpp"

namespace numastream {

struct Chunk {
  wire::Header header;
  PooledBuffer buffer;  // wire::kHeaderSize bytes of room for the header, then the payload
  int via = 0;

  // The payload after the header's room: header.payload_size bytes.
  std::span<std::byte> payload() const noexcept {
    return {buffer->data + wire::kHeaderSize, header.payload_size};
  }
  // Room for a payload of up to the buffer's capacity.
  std::span<std::byte> payload_room() const noexcept {
    return {buffer->data + wire::kHeaderSize, buffer->capacity - wire::kHeaderSize};
  }
  // Writes the header in front of the payload: the buffer now holds the frame as it goes out.
  void seal() noexcept {
    wire::encode_header(header, buffer->data);
    buffer->size = wire::kHeaderSize + header.payload_size;
  }
};

// ZeroMQ's free function for a buffer sent zero-copy (the buffer is the hint): it goes back to
// its pool once ZeroMQ has sent it.
inline void return_to_pool(void* /*data*/, void* hint) noexcept {
  PooledBuffer returned(static_cast<Buffer*>(hint));
}

}  // namespace numastream
