#include "wire/stream_names.hpp"

#include <gtest/gtest.h>

#include <string>

namespace numastream {
namespace {

std::span<const std::byte> bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

TEST(OriginName, AllowsWhatANamespaceAndANameMakeAndNothingThatLeavesADirectory) {
  EXPECT_EQ(origin_name_problem("beamline-7.p1"), "");
  EXPECT_EQ(origin_name_problem("A_b-c.9"), "");
  EXPECT_EQ(origin_name_problem(std::string(kMaxOriginName, 'a')), "");
  EXPECT_NE(origin_name_problem(std::string(kMaxOriginName + 1, 'a')), "");
  for (const char* bad :
       {"", ".", "..", ".hidden", "a/b", "../etc", "a..b", "a\\b", "a b", "a\nb", "caf\xc3\xa9"}) {
    EXPECT_NE(origin_name_problem(bad), "") << bad;
  }
  EXPECT_NE(origin_name_problem(std::string("a\0b", 3)), "");
}

TEST(OriginName, AnOriginFrameIsAJsonObjectWithOnlyAnAllowedOriginInIt) {
  EXPECT_EQ(origin_of_metadata(bytes(origin_metadata("ns.p"))), "ns.p");
  // Any other metadata (a stream's dtype and shape) is not an origin frame.
  EXPECT_EQ(origin_of_metadata(bytes(R"({"dtype":"uint16","shape":[2,3]})")), std::nullopt);
  EXPECT_EQ(origin_of_metadata(bytes("not json")), std::nullopt);
  EXPECT_EQ(origin_of_metadata(bytes("")), std::nullopt);
  EXPECT_EQ(origin_of_metadata(bytes("[\"origin\"]")), std::nullopt);
  // Origin frames a receiver refuses: the empty string says so.
  for (const char* bad : {R"({"origin":"../../etc"})", R"({"origin":""})", R"({"origin":5})",
                          R"({"origin":"a","dtype":"uint8"})", R"({"origin":null})"}) {
    EXPECT_EQ(origin_of_metadata(bytes(bad)), std::string()) << bad;
  }
}

TEST(StreamNames, EachPipelinesStreamZeroIsAStreamOfItsOwnAndAcksGoBackAsZero) {
  StreamNames names({"/data/{origin}/{stream}.raw"}, 8);
  auto a = names.local("ns.a", 0);
  auto b = names.local("ns.b", 0);
  ASSERT_EQ(a.why, wire::DecodeError::ok);
  ASSERT_EQ(b.why, wire::DecodeError::ok);
  EXPECT_EQ(a.id, 0u) << "the first keeps its id";
  EXPECT_NE(b.id, a.id);
  EXPECT_EQ(names.local("ns.b", 0).id, b.id) << "bound once";
  EXPECT_EQ(names.of(b.id).origin, "ns.b");
  EXPECT_EQ(names.of(b.id).stream, 0u);
  EXPECT_EQ(names.describe(b.id), "stream 0 of ns.b");
  EXPECT_EQ(names.describe(7), "stream 7") << "never bound: itself";
  // A sender that names no origin, and a stream whose id is a local id handed out already.
  auto none = names.local("", 0);
  ASSERT_EQ(none.why, wire::DecodeError::ok);
  EXPECT_NE(none.id, a.id);
  EXPECT_NE(none.id, b.id);
  auto high = names.local("ns.c", b.id);
  ASSERT_EQ(high.why, wire::DecodeError::ok);
  EXPECT_NE(high.id, b.id);
  EXPECT_EQ(names.of(high.id).stream, b.id);
  EXPECT_EQ(stream_path("/data/{origin}/{stream}.raw", names.of(b.id)), "/data/ns.b/0.raw");
  EXPECT_EQ(stream_path("/data/{origin}/{stream}.raw", names.of(none.id)), "/data/default/0.raw");
  EXPECT_FALSE(names.same_path("/data/{origin}/{stream}.raw", a.id, b.id));
  EXPECT_TRUE(names.same_path("/data/{stream}.raw", a.id, b.id));
}

TEST(StreamNames, ASecondPipelineIsRefusedWhereItWouldShareTheFirstOnesFile) {
  StreamNames names({"/data/{stream}.raw"}, 8);
  ASSERT_EQ(names.local("ns.a", 0).why, wire::DecodeError::ok);
  auto b = names.local("ns.b", 0);
  EXPECT_EQ(b.why, wire::DecodeError::contradicts_stream);
  EXPECT_NE(names.last_refusal().find("ns.a"), std::string::npos) << names.last_refusal();
  EXPECT_NE(names.last_refusal().find("{origin}"), std::string::npos) << names.last_refusal();
  EXPECT_EQ(names.local("", 0).why, wire::DecodeError::contradicts_stream);
  // Another stream id has a file of its own.
  EXPECT_EQ(names.local("ns.b", 1).why, wire::DecodeError::ok);
  // Paths that coincide although the placeholders are all there ("a1" + "2" = "a" + "12").
  StreamNames tight({"/d/{origin}{stream}"}, 8);
  ASSERT_EQ(tight.local("a1", 2).why, wire::DecodeError::ok);
  EXPECT_EQ(tight.local("a", 12).why, wire::DecodeError::contradicts_stream);
}

TEST(StreamNames, NamesNoMoreStreamsThanItsBound) {
  StreamNames names({}, 3);
  for (std::uint32_t s = 0; s < 3; ++s)
    EXPECT_EQ(names.local("p" + std::to_string(s), 0).why, wire::DecodeError::ok);
  EXPECT_EQ(names.local("p9", 0).why, wire::DecodeError::too_many_streams);
  EXPECT_EQ(names.local("p0", 0).why, wire::DecodeError::ok) << "a stream named already";
}

}  // namespace
}  // namespace numastream
