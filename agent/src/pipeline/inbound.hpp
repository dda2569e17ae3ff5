// A frame off the network as a gateway's receiving threads hand it on. Internal to the agent.
#pragma once

#include <optional>
#include <span>

#include "net/transport.hpp"
#include "wire/wire.hpp"

namespace numastream {

// A frame off the network: its header (decoded and validated once, by the receiving thread), the
// message ZeroMQ read it into, and the connection it came on.
struct Inbound {
  wire::Header header;
  zmq::Message msg;                  // the frame; or its header alone, when it came in two parts
  std::optional<zmq::Message> body;  // the payload of a frame that came in two parts
  int via = 0;
  std::span<const std::byte> payload() const noexcept {
    return body ? body->bytes() : msg.bytes().subspan(wire::kHeaderSize);
  }
};

}  // namespace numastream
