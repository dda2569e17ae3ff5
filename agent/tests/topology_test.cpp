#include "host/topology.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "host/cpuset.hpp"

namespace numastream {
namespace {

Topology fixture(const std::string& name) {
  return read_topology(std::string(NUMASTREAM_FIXTURES) + "/" + name);
}

TEST(Topology, PaperGatewayHasTwoSocketsAndTheDataNicOnNodeOne) {
  Topology t = fixture("paper-gateway");
  ASSERT_EQ(t.nodes.size(), 2u);
  EXPECT_TRUE(t.numa_from_sysfs);
  EXPECT_EQ(format_cpulist(t.nodes[0].cpus), "0-15");
  EXPECT_EQ(format_cpulist(t.nodes[1].cpus), "16-31");
  EXPECT_EQ(t.nodes[1].distances, (std::vector<int>{21, 10}));
  EXPECT_EQ(t.nodes[0].mem_total_kb, 131072000u);
  const Nic* nic = t.find_nic("ens1f0");
  ASSERT_NE(nic, nullptr);
  EXPECT_EQ(nic->numa_node, 1);
  EXPECT_EQ(nic->pci_address, "0000:98:00.0");
  EXPECT_EQ(nic->speed_mbps, 200000);
  EXPECT_FALSE(nic->is_virtual);
  EXPECT_EQ(t.find_nic("eno1")->numa_node, 0);
  EXPECT_EQ(t.find_nic("lo"), nullptr) << "loopback is not a data NIC";
  const Nic* veth = t.find_nic("veth0a1b2c");
  ASSERT_NE(veth, nullptr);
  EXPECT_TRUE(veth->is_virtual);
  EXPECT_EQ(veth->numa_node, -1);
  EXPECT_EQ(t.node_of_cpu(17), 1);
  EXPECT_EQ(t.node_of_cpu(99), -1);
}

TEST(Topology, EpycLikeFourNodesWithSmtSiblings) {
  Topology t = fixture("epyc-4node");
  ASSERT_EQ(t.nodes.size(), 4u);
  EXPECT_EQ(format_cpulist(t.nodes[3].cpus), "24-31,56-63");
  EXPECT_EQ(t.node_of_cpu(60), 3);
  EXPECT_EQ(t.nodes[3].cores, 8) << "16 hardware threads of 8 physical cores";
  EXPECT_EQ(topology_to_json(t, t.nodes[3].cpus)["numa_nodes"][3]["core_count"], 8);
  EXPECT_EQ(t.find_nic("enp193s0f0")->numa_node, 3);
  EXPECT_EQ(t.find_nic("enp65s0f0")->speed_mbps, -1) << "a link that is down has no speed";
  EXPECT_EQ(t.find_nic("enp65s0f0")->operstate, "down");
}

TEST(Topology, WithoutSmtEveryCpuIsACore) {
  Topology t = fixture("paper-gateway");
  EXPECT_EQ(t.nodes[0].cores, 16);
  EXPECT_EQ(t.nodes[1].cores, 16);
  Topology vm = fixture("vm-1node");  // no cpu<N>/topology at all
  EXPECT_EQ(vm.nodes[0].cores, 4);
}

TEST(Topology, VmWithoutNodeDirectoriesIsOneNode) {
  Topology t = fixture("vm-1node");
  ASSERT_EQ(t.nodes.size(), 1u);
  EXPECT_FALSE(t.numa_from_sysfs);
  EXPECT_EQ(format_cpulist(t.nodes[0].cpus), "0-3");
  const Nic* nic = t.find_nic("eth0");
  ASSERT_NE(nic, nullptr);
  EXPECT_EQ(nic->numa_node, -1);
  EXPECT_EQ(nic->pci_address, "");
  EXPECT_EQ(nic->speed_mbps, -1);
}

TEST(Topology, NicWithUnknownNumaNode) {
  Topology t = fixture("nic-unknown");
  EXPECT_EQ(t.nodes.size(), 2u);
  EXPECT_EQ(t.find_nic("ens3")->numa_node, -1);
  EXPECT_EQ(t.find_nic("ens3")->pci_address, "0000:00:03.0");
}

TEST(Topology, MissingRootIsAClearError) {
  try {
    read_topology("/nonexistent/sys");
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/sys"), std::string::npos);
  }
}

TEST(Topology, JsonNamesAllowedCpusPerNode) {
  Topology t = fixture("paper-gateway");
  auto j = topology_to_json(t, parse_cpulist("2-3,20-21"));
  EXPECT_EQ(j["allowed_cpus"], "2-3,20-21");
  EXPECT_EQ(j["numa_nodes"][1]["allowed_cpus"], "20-21");
  EXPECT_EQ(j["numa_nodes"][1]["cpu_count"], 16);
  bool found = false;
  for (const auto& nic : j["nics"]) {
    if (nic["name"] == "ens1f0") {
      found = true;
      EXPECT_EQ(nic["numa_node"], 1);
      EXPECT_EQ(nic["speed_mbps"], 200000);
      EXPECT_EQ(nic["pci_address"], "0000:98:00.0");
    }
  }
  EXPECT_TRUE(found);
}

TEST(Topology, ThisMachineReadsWithoutError) {
  Topology t = read_topology("/sys");
  EXPECT_FALSE(t.nodes.empty());
  EXPECT_FALSE(t.nodes[0].cpus.empty());
}

}  // namespace
}  // namespace numastream
