// A chunk as it travels through a pipeline: its frame header, decoded once where the chunk enters
// (read from a source, or taken off the network) and encoded once where it leaves (onto the wire,
// into a sink); its bytes in a pooled buffer that returns itself to its pool when the chunk is
// dropped, or, for a chunk passed through as it came (a detector's message, a frame stored
// compressed), in the ZeroMQ message it arrived in (`body`), never copied; and, on the receiving
// side, the connection it arrived on (its acknowledgement goes back there). Internal to the agent.
#pragma once

#include <cstddef>
#include <cstring>
#include <optional>
#include <span>
#include <utility>

#include "data/buffer_pool.hpp"
#include "net/transport.hpp"
#include "wire/wire.hpp"

namespace numastream {

// ZeroMQ's free function for a buffer sent zero-copy (the buffer is the hint): it goes back to
// its pool once ZeroMQ has sent it.
inline void return_to_pool(void* data, void* hint) noexcept {
  zmq::free_message(data);
  PooledBuffer returned(static_cast<Buffer*>(hint));
}

struct Chunk {
  wire::Header header;
  PooledBuffer buffer;  // wire::kHeaderSize bytes of room for the header, then the payload
  // Or the message ZeroMQ received it in (no buffer then): the payload alone (body_offset 0), or
  // the whole frame it arrived as (body_offset wire::kHeaderSize).
  std::optional<zmq::Message> body;
  std::size_t body_offset = 0;
  int via = 0;

  // The payload: header.payload_size bytes after the header's room, or in the body.
  std::span<std::byte> payload() const noexcept {
    if (body)
      return {const_cast<zmq::Message&>(*body).mutable_data() + body_offset, header.payload_size};
    return {buffer->data + wire::kHeaderSize, header.payload_size};
  }
  // The payload as a message of its own, uncopied (the chunk gives it up).
  zmq::Message take_payload() {
    if (body && body_offset == 0) return std::exchange(*body, zmq::Message());
    if (body)
      return zmq::Message::slice(std::exchange(*body, zmq::Message()), body_offset,
                                 header.payload_size);
    Buffer* buf = buffer.release();  // ZeroMQ returns it to its pool once sent
    return zmq::Message::adopt(buf->data + wire::kHeaderSize, header.payload_size, return_to_pool,
                               buf);
  }
  // The frame as one message (header and payload), for a peer that takes frames whole: the
  // buffer or the frame it arrived as, its header rewritten, zero-copy; or the header and a
  // payload that came alone copied into one.
  zmq::Message whole() {
    if (body && body_offset == wire::kHeaderSize) {
      wire::encode_header(header, body->mutable_data());
      return std::exchange(*body, zmq::Message());
    }
    if (!body) {
      seal();
      Buffer* buf = buffer.release();  // ZeroMQ returns it to its pool once sent
      return zmq::Message::adopt(buf->data, wire::kHeaderSize + header.payload_size, return_to_pool,
                                 buf);
    }
    zmq::Message m = zmq::Message::sized(wire::kHeaderSize + header.payload_size);
    wire::encode_header(header, m.mutable_data());
    std::memcpy(m.mutable_data() + wire::kHeaderSize, payload().data(), header.payload_size);
    return m;
  }
  // The header alone, the first part of a frame sent in two (the body the second).
  zmq::Message head() const {
    std::byte h[wire::kHeaderSize];
    wire::encode_header(header, h);
    return zmq::Message::of({h, sizeof(h)});
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

}  // namespace numastream
