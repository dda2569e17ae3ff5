#include "base/address.hpp"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

using numastream::AddressBlocks;

TEST(AddressBlocks, MatchBlocksOfBothFamilies) {
  const AddressBlocks b = AddressBlocks::parse({"10.212.0.0/24", "192.0.2.7", "fd00::/8", "::1"});
  EXPECT_EQ(b.size(), 4u);
  for (const char* in :
       {"10.212.0.1", "10.212.0.255", "192.0.2.7", "fd12:3456::1", "::1", "::ffff:10.212.0.9"}) {
    EXPECT_TRUE(b.contains(in)) << in;
  }
  const std::string huge(5000, '1');
  for (const std::string& out :
       {std::string("10.212.1.1"), std::string("192.0.2.8"), std::string("fe80::1"),
        std::string("::2"), std::string("::ffff:10.213.0.1"), std::string(),
        std::string("localhost"), std::string("10.212.0.1:5555"), std::string("10.212.0.1/32"),
        huge}) {
    EXPECT_FALSE(b.contains(out)) << out;
  }
  EXPECT_TRUE(AddressBlocks::parse({"0.0.0.0/0"}).contains("203.0.113.5"));
  EXPECT_FALSE(AddressBlocks::parse({"0.0.0.0/0"}).contains("2001:db8::1"))
      << "an IPv4 block holds no IPv6 peer";
  EXPECT_TRUE(AddressBlocks::parse({"::/0"}).contains("2001:db8::1"));
  EXPECT_TRUE(AddressBlocks::parse({"10.0.0.0/9"}).contains("10.127.255.255"));
  EXPECT_FALSE(AddressBlocks::parse({"10.0.0.0/9"}).contains("10.128.0.0"));
  EXPECT_TRUE(AddressBlocks::parse({}).empty());
}

TEST(AddressBlocks, EveryMalformedBlockIsRefusedNamingIt) {
  const std::vector<std::string> bads = {"",
                                         "10.0.0.0/33",
                                         "fd00::/129",
                                         "10.0.0.0/-1",
                                         "10.0.0.0/",
                                         "10.0.0.0/8x",
                                         "10.0.0.0/0008",
                                         "10.0.0.1/24",
                                         "fd00::1/8",
                                         "10.0.0",
                                         "10.0.0.0.0",
                                         "256.0.0.0",
                                         "host.example",
                                         "10.0.0.0/8/8",
                                         " 10.0.0.0/8",
                                         std::string(300, 'a')};
  for (const std::string& bad : bads) {
    try {
      AddressBlocks::parse({"10.1.0.0/16", bad});
      ADD_FAILURE() << "accepted \"" << bad << "\"";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("is not an address block"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find(bad.substr(0, 20)), std::string::npos) << e.what();
    }
  }
}
