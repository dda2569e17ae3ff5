#include "base/address.hpp"

#include <arpa/inet.h>

#include <charconv>
#include <cstring>
#include <optional>
#include <stdexcept>

namespace numastream {
namespace {

constexpr std::array<std::uint8_t, 12> kMappedPrefix = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

// The address as 16 bytes (IPv4 mapped) and whether it was IPv4.
std::optional<std::pair<std::array<std::uint8_t, 16>, bool>> parse_ip(std::string_view text) {
  if (text.empty() || text.size() > 45) return std::nullopt;
  char buf[46];
  std::memcpy(buf, text.data(), text.size());
  buf[text.size()] = '\0';
  std::array<std::uint8_t, 16> out{};
  in_addr v4{};
  if (inet_pton(AF_INET, buf, &v4) == 1) {
    std::memcpy(out.data(), kMappedPrefix.data(), kMappedPrefix.size());
    std::memcpy(out.data() + 12, &v4, 4);
    return std::make_pair(out, true);
  }
  in6_addr v6{};
  if (inet_pton(AF_INET6, buf, &v6) == 1) {
    std::memcpy(out.data(), &v6, 16);
    return std::make_pair(out, false);
  }
  return std::nullopt;
}

bool same_prefix(const std::array<std::uint8_t, 16>& a, const std::array<std::uint8_t, 16>& b,
                 int bits) {
  int i = 0;
  for (; bits >= 8; bits -= 8, ++i) {
    if (a[i] != b[i]) return false;
  }
  if (bits == 0) return true;
  const auto mask = static_cast<std::uint8_t>(0xff << (8 - bits));
  return (a[i] & mask) == (b[i] & mask);
}

}  // namespace

AddressBlocks AddressBlocks::parse(const std::vector<std::string>& entries) {
  AddressBlocks out;
  for (const std::string& entry : entries) {
    const auto bad = [&](const std::string& why) {
      return std::invalid_argument("\"" +
                                   (entry.size() > 60 ? entry.substr(0, 57) + "..." : entry) +
                                   "\" is not an address block: " + why);
    };
    const std::string_view text(entry);
    const std::size_t slash = text.find('/');
    const auto ip = parse_ip(text.substr(0, slash));
    if (!ip) throw bad("not an IPv4 or IPv6 address");
    const int width = ip->second ? 32 : 128;
    int prefix = width;
    if (slash != std::string_view::npos) {
      const std::string_view p = text.substr(slash + 1);
      const auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), prefix);
      if (p.empty() || p.size() > 3 || ec != std::errc() || end != p.data() + p.size() ||
          prefix < 0 || prefix > width) {
        throw bad("the prefix length must be a number from 0 to " + std::to_string(width));
      }
    }
    Block b;
    b.net = ip->first;
    b.prefix = ip->second ? prefix + 96 : prefix;
    std::array<std::uint8_t, 16> zeroed{};
    for (int bit = 0; bit < b.prefix; ++bit) {
      zeroed[bit / 8] |= static_cast<std::uint8_t>(b.net[bit / 8] & (0x80 >> (bit % 8)));
    }
    if (zeroed != b.net)
      throw bad("bits are set past the prefix (did you mean the network address?)");
    out.blocks_.push_back(b);
  }
  return out;
}

bool AddressBlocks::contains(std::string_view address) const {
  const auto ip = parse_ip(address);
  if (!ip) return false;
  for (const Block& b : blocks_) {
    if (same_prefix(b.net, ip->first, b.prefix)) return true;
  }
  return false;
}

}  // namespace numastream
