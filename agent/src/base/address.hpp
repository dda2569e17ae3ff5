// IP address blocks (CIDR): which peers may connect.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace numastream {

// A set of IPv4 and IPv6 address blocks ("10.0.0.0/24", "fd00::/8"; a bare address is one host).
// An IPv4 peer seen through an IPv6 socket ("::ffff:10.0.0.7") matches the IPv4 blocks.
class AddressBlocks {
 public:
  // Parses each entry; throws std::invalid_argument naming the entry and what is wrong with it
  // (not an address, a prefix past the address's length, host bits set below the prefix).
  static AddressBlocks parse(const std::vector<std::string>& entries);

  bool empty() const noexcept { return blocks_.empty(); }
  std::size_t size() const noexcept { return blocks_.size(); }
  // Whether the textual address (as ZeroMQ reports a peer) lies in one of the blocks. Anything
  // that is not an IP address is outside every block.
  bool contains(std::string_view address) const;

 private:
  struct Block {
    std::array<std::uint8_t, 16> net{};  // IPv4 as IPv4-mapped IPv6
    int prefix = 0;                      // in IPv6 bits
  };
  std::vector<Block> blocks_;
};

}  // namespace numastream
