#include "host/placement.hpp"

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "host/cpuset.hpp"

namespace numastream {
namespace {

Topology fixture(const std::string& name) {
  return read_topology(std::string(NUMASTREAM_FIXTURES) + "/" + name);
}

StageRequest stage(Stage name, int threads, const std::string& target) {
  return {name, threads, NumaTarget::parse(target)};
}

std::set<int> nodes_of(const Placement& p, Stage stage) {
  std::set<int> out;
  for (const auto& t : p.stage(stage)) out.insert(t.numa_node);
  return out;
}

bool all_distinct_cpus(const Placement& p) {
  std::set<int> seen;
  for (const auto& t : p.threads) {
    if (!seen.insert(t.cpu).second) return false;
  }
  return true;
}

TEST(NumaTarget, ParsesEveryForm) {
  EXPECT_EQ(NumaTarget::parse("any").kind, NumaTarget::Kind::any);
  EXPECT_EQ(NumaTarget::parse("spread").kind, NumaTarget::Kind::spread);
  EXPECT_EQ(NumaTarget::parse("nic").kind, NumaTarget::Kind::nic);
  EXPECT_EQ(NumaTarget::parse("3").node, 3);
  EXPECT_THROW(NumaTarget::parse("-1"), std::invalid_argument);
  EXPECT_THROW(NumaTarget::parse("socket1"), std::invalid_argument);
  EXPECT_EQ(NumaTarget::parse("2").to_string(), "2");
}

// The paper's receiving configuration on the gateway: 4 receivers on the NIC's node, decompression
// on the other node, every thread on its own core.
TEST(Placement, PaperGatewayReceiversNicLocalDecompressionElsewhere) {
  Topology t = fixture("paper-gateway");
  auto allowed = parse_cpulist("0-31");
  Placement p = place(t, allowed, 1,
                      {stage(Stage::receive, 4, "nic"), stage(Stage::decompress, 4, "0"),
                       stage(Stage::io, 4, "nic")});
  EXPECT_EQ(nodes_of(p, Stage::receive), std::set<int>{1});
  EXPECT_EQ(nodes_of(p, Stage::io), std::set<int>{1});
  EXPECT_EQ(nodes_of(p, Stage::decompress), std::set<int>{0});
  EXPECT_TRUE(all_distinct_cpus(p));
  EXPECT_EQ(p.nic_local(Stage::receive), true);
  EXPECT_EQ(p.nic_local(Stage::decompress), false);
  EXPECT_TRUE(p.warnings.empty());
  for (const auto& th : p.threads) EXPECT_EQ(th.numa_node, t.node_of_cpu(th.cpu));
}

TEST(Placement, SpreadDealsDecompressorsOverNodes) {
  Topology t = fixture("paper-gateway");
  Placement p = place(t, parse_cpulist("0-31"), 1, {stage(Stage::decompress, 8, "spread")});
  std::map<int, int> per_node;
  for (const auto& th : p.stage(Stage::decompress)) ++per_node[th.numa_node];
  EXPECT_EQ(per_node[0], 4);
  EXPECT_EQ(per_node[1], 4);
  EXPECT_TRUE(all_distinct_cpus(p));
}

TEST(Placement, FixedTargetsGoFirstSoSpreadDoesNotTakeNicCores) {
  Topology t = fixture("paper-gateway");
  // Only 4 allowed CPUs on the NIC node: spread (listed first) must leave them to the receivers.
  Placement p = place(t, parse_cpulist("0-15,16-19"), 1,
                      {stage(Stage::decompress, 6, "spread"), stage(Stage::receive, 4, "nic")});
  EXPECT_EQ(p.stage_cpus(Stage::receive), parse_cpulist("16-19"));
  EXPECT_EQ(nodes_of(p, Stage::decompress), std::set<int>{0});
  EXPECT_TRUE(all_distinct_cpus(p));
}

TEST(Placement, SpreadCoversFourNodesWithNicOnTheLast) {
  Topology t = fixture("epyc-4node");
  Placement p = place(t, parse_cpulist("0-63"), 3,
                      {stage(Stage::receive, 2, "nic"), stage(Stage::decompress, 8, "spread")});
  EXPECT_EQ(nodes_of(p, Stage::receive), std::set<int>{3});
  EXPECT_EQ(nodes_of(p, Stage::decompress), (std::set<int>{0, 1, 2, 3}));
  EXPECT_TRUE(all_distinct_cpus(p));
}

TEST(Placement, FewerCpusThanThreadsSharesRoundRobinAndWarns) {
  Topology t = fixture("paper-gateway");
  Placement p = place(t, parse_cpulist("16-17"), 1, {stage(Stage::receive, 5, "nic")});
  ASSERT_EQ(p.threads.size(), 5u);
  std::map<int, int> uses;
  for (const auto& th : p.threads) {
    ++uses[th.cpu];
    EXPECT_TRUE(th.shared_cpu);
  }
  EXPECT_EQ(uses[16], 3);
  EXPECT_EQ(uses[17], 2);
  ASSERT_EQ(p.warnings.size(), 1u);
  EXPECT_NE(p.warnings[0].find("share"), std::string::npos);
}

TEST(Placement, NodeWithoutAllowedCpusFallsBackAndSaysSo) {
  Topology t = fixture("paper-gateway");
  // The container's cpuset holds only node-0 CPUs, but the NIC is on node 1.
  Placement p = place(t, parse_cpulist("2-5"), 1, {stage(Stage::receive, 2, "nic")});
  EXPECT_EQ(nodes_of(p, Stage::receive), std::set<int>{0});
  EXPECT_EQ(p.nic_local(Stage::receive), false);
  ASSERT_FALSE(p.warnings.empty());
  EXPECT_NE(p.warnings[0].find("NUMA node 1 has none of the allowed CPUs (2-5)"), std::string::npos)
      << p.warnings[0];
  EXPECT_EQ(p.stage(Stage::receive)[0].requested_node, 1);
}

TEST(Placement, UnknownNicNodeFallsBackToAny) {
  Topology t = fixture("nic-unknown");
  Placement p = place(t, parse_cpulist("0-15"), std::nullopt, {stage(Stage::receive, 2, "nic")});
  EXPECT_EQ(p.threads.size(), 2u);
  EXPECT_EQ(p.nic_local(Stage::receive), std::nullopt);
  ASSERT_FALSE(p.warnings.empty());
  EXPECT_NE(p.warnings[0].find("NIC's NUMA node is unknown"), std::string::npos);
}

TEST(Placement, NodeThatDoesNotExistFallsBack) {
  Topology t = fixture("vm-1node");
  Placement p = place(t, parse_cpulist("0-3"), std::nullopt, {stage(Stage::compress, 2, "1")});
  EXPECT_EQ(nodes_of(p, Stage::compress), std::set<int>{0});
  ASSERT_FALSE(p.warnings.empty());
  EXPECT_NE(p.warnings[0].find("does not exist"), std::string::npos);
}

TEST(Placement, SingleNodeVmPlacesEverythingOnNodeZero) {
  Topology t = fixture("vm-1node");
  Placement p = place(t, parse_cpulist("0-3"), std::nullopt,
                      {stage(Stage::compress, 2, "any"), stage(Stage::send, 2, "spread")});
  EXPECT_EQ(nodes_of(p, Stage::compress), std::set<int>{0});
  EXPECT_EQ(nodes_of(p, Stage::send), std::set<int>{0});
  EXPECT_TRUE(all_distinct_cpus(p));
}

TEST(Placement, ThreadsKeepRequestOrderInTheResult) {
  Topology t = fixture("paper-gateway");
  Placement p = place(t, parse_cpulist("0-31"), 1,
                      {stage(Stage::source, 1, "any"), stage(Stage::compress, 2, "spread"),
                       stage(Stage::send, 2, "nic")});
  ASSERT_EQ(p.threads.size(), 5u);
  EXPECT_EQ(p.threads[0].stage, Stage::source);
  EXPECT_EQ(p.threads[1].stage, Stage::compress);
  EXPECT_EQ(p.threads[3].stage, Stage::send);
  EXPECT_EQ(p.threads[4].index, 1);
}

TEST(Placement, AllowedCpusOutsideTheTopologyAreAnError) {
  Topology t = fixture("vm-1node");
  EXPECT_THROW(place(t, parse_cpulist("40-41"), std::nullopt, {stage(Stage::send, 1, "any")}),
               std::invalid_argument);
}

// A container given whole cores (every hardware thread of each): its threads take a core each
// before any shares one with a sibling, whatever the kernel's numbering of the siblings (here
// adjacent: CPUs 16/17 are one core, 18/19 another).
TEST(Placement, ThreadsTakeACoreEachBeforeSharingOneWithASibling) {
  Topology t;
  NumaNode n0, n1;
  n0.id = 0;
  n0.cpus = {0, 1};
  n1.id = 1;
  n1.cpus = {16, 17, 18, 19};
  t.nodes = {n0, n1};
  t.core_of = {{0, 0}, {1, 0}, {16, 8}, {17, 8}, {18, 9}, {19, 9}};
  Placement p = place(t, parse_cpulist("16-19"), 1, {stage(Stage::receive, 2, "nic")});
  ASSERT_EQ(p.threads.size(), 2u);
  EXPECT_EQ(p.threads[0].cpu, 16);
  EXPECT_EQ(p.threads[1].cpu, 18)
      << "the second receiving thread takes the other core, not 16's sibling";
  p = place(t, parse_cpulist("16-19"), 1, {stage(Stage::receive, 3, "nic")});
  std::set<int> cpus;
  for (const auto& th : p.threads) cpus.insert(th.cpu);
  EXPECT_EQ(cpus, (std::set<int>{16, 17, 18}))
      << "a third thread takes a sibling only once each core has one";
  // Without the kernel's core ids every CPU is a core of its own: lowest ids first, as before.
  t.core_of.clear();
  p = place(t, parse_cpulist("16-19"), 1, {stage(Stage::receive, 2, "nic")});
  EXPECT_EQ(p.threads[0].cpu, 16);
  EXPECT_EQ(p.threads[1].cpu, 17);
}

TEST(Placement, OsModePinsNothing) {
  Placement p =
      place_os({stage(Stage::receive, 2, "nic"), stage(Stage::decompress, 3, "spread")}, 1);
  ASSERT_EQ(p.threads.size(), 5u);
  for (const auto& th : p.threads) {
    EXPECT_EQ(th.cpu, -1);
    EXPECT_EQ(th.numa_node, -1);
  }
  EXPECT_EQ(p.nic_local(Stage::receive), std::nullopt);
}

}  // namespace
}  // namespace numastream
