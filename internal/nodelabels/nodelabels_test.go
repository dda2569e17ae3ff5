package nodelabels

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/numastream/numastream/internal/testenv"
	"github.com/numastream/numastream/internal/topology"
)

// agentTopology runs the real agent against one of its sysfs fixtures, so this package is tested
// against the agent's actual output.
func agentTopology(t *testing.T, fixture string) AgentTopology {
	t.Helper()
	agent := testenv.Agent(t)
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..", "agent", "tests", "fixtures", fixture)
	out, err := exec.Command(agent, "topology", "--sysfs-root", root).Output()
	if err != nil {
		t.Fatalf("agent topology: %v", err)
	}
	topo, err := ParseTopology(out)
	if err != nil {
		t.Fatal(err)
	}
	return topo
}

func bench() *AgentBench {
	b := &AgentBench{}
	b.Codec.CompressMBps = 612.4
	b.Codec.DecompressMBps = 2589.6
	return b
}

// The labels the daemon publishes are exactly what the operator's topology parser needs.
func TestPaperGatewayLabelsRoundTripThroughTheOperatorsParser(t *testing.T) {
	labels := Labels(agentTopology(t, "paper-gateway"), bench())
	want := map[string]string{
		"numastream.io/numa-nodes":              "2",
		"numastream.io/numa0-cpus":              "16",
		"numastream.io/numa1-cpus":              "16",
		"numastream.io/nic.ens1f0.numa-node":    "1",
		"numastream.io/nic.ens1f0.speed-mbit":   "200000",
		"numastream.io/nic.eno1.numa-node":      "0",
		"numastream.io/nic.eno1.speed-mbit":     "1000",
		"numastream.io/lz4-compress-mb-per-s":   "612",
		"numastream.io/lz4-decompress-mb-per-s": "2590",
	}
	for k, v := range want {
		if labels[k] != v {
			t.Errorf("%s = %q, want %q", k, labels[k], v)
		}
	}
	for k := range labels {
		if strings.Contains(k, "veth") {
			t.Errorf("virtual interface published: %s", k)
		}
	}
	node, err := topology.FromLabels("lynx", labels)
	if err != nil {
		t.Fatal(err)
	}
	if nic, _ := node.NIC("ens1f0"); nic.NUMANode != 1 || nic.SpeedMbit != 200000 {
		t.Errorf("round trip: %+v", nic)
	}
	if got := NICs(agentTopology(t, "paper-gateway")); len(got) != 2 || got[1].Name != "ens1f0" || got[1].NUMANode != 1 {
		t.Errorf("locality NICs %+v", got)
	}
}

// A NIC whose NUMA node the kernel does not know gets no label on a multi-node machine; on a
// one-node machine (a VM) it is on that node, so it is labelled and gets locality tokens.
func TestUnknownNICNodesGetNoNICLabelUnlessThereIsOneNode(t *testing.T) {
	vm := agentTopology(t, "vm-1node")
	vmLabels := Labels(vm, bench())
	nics := NICs(vm)
	if len(nics) == 0 || nics[0].NUMANode != vm.NUMANodes[0].ID {
		t.Errorf("vm-1node locality NICs %+v", nics)
	}
	if vmLabels[topology.NICNUMALabel(nics[0].Name)] != strconv.Itoa(vm.NUMANodes[0].ID) {
		t.Errorf("vm-1node labels %v", vmLabels)
	}
	for _, fixture := range []string{"nic-unknown"} {
		labels := Labels(agentTopology(t, fixture), bench())
		for k := range labels {
			if strings.HasPrefix(k, "numastream.io/nic.") {
				t.Errorf("%s: NIC with unknown NUMA node published: %s", fixture, k)
			}
		}
		if _, err := topology.FromLabels("n", labels); err != nil {
			t.Errorf("%s: %v", fixture, err)
		}
	}
	if labels := Labels(agentTopology(t, "epyc-4node"), nil); labels["numastream.io/nic.enp193s0f0.numa-node"] != "3" {
		t.Errorf("epyc: %v", labels)
	}
}

func TestMemoryOnlyNodesKeepNICNodeIDs(t *testing.T) {
	topo, err := ParseTopology([]byte(`{"numa_nodes":[{"id":0,"cpu_count":8},{"id":2,"cpu_count":8}],
	  "nics":[{"name":"ens5","numa_node":2,"speed_mbps":100000,"virtual":false}]}`))
	if err != nil {
		t.Fatal(err)
	}
	l := Labels(topo, bench())
	if l["numastream.io/numa-nodes"] != "3" || l["numastream.io/numa1-cpus"] != "0" || l["numastream.io/nic.ens5.numa-node"] != "2" {
		t.Errorf("%v", l)
	}
	node, err := topology.FromLabels("n", l)
	if err != nil {
		t.Fatal(err)
	}
	if node.TotalCPUs() != 16 {
		t.Errorf("cpus %d", node.TotalCPUs())
	}
}

func TestBadAgentOutputIsAnError(t *testing.T) {
	for _, bad := range []string{"", "{", `{"numa_nodes": []}`} {
		if _, err := ParseTopology([]byte(bad)); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
	if _, err := ParseBench([]byte(`{"codec":{"compress_mbps":0}}`)); err == nil {
		t.Error("zero speeds accepted")
	}
}

func TestFeaturesFileIsSortedKeyValueLines(t *testing.T) {
	got := string(FeaturesFile(map[string]string{"numastream.io/b": "2", "numastream.io/a": "1"}))
	if !strings.HasSuffix(got, "numastream.io/a=1\nnumastream.io/b=2\n") || !strings.HasPrefix(got, "#") {
		t.Errorf("%q", got)
	}
}

func TestDeclaredNICIsADataNICAtTheDeclaredRate(t *testing.T) {
	topo, err := ParseTopology([]byte(`{"numa_nodes":[{"id":0,"cpu_count":2}],
		"nics":[{"name":"fab0","numa_node":-1,"speed_mbps":10000,"virtual":true},
		        {"name":"eth0","numa_node":0,"speed_mbps":25000,"virtual":false}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := Labels(topo, nil)["numastream.io/nic.fab0.numa-node"]; ok {
		t.Fatal("an undeclared veth must not be labelled a data NIC")
	}
	rates, err := ParseRates("fab0=1000, absent0=5")
	if err != nil {
		t.Fatal(err)
	}
	l := Labels(Declare(topo, rates), nil)
	if l["numastream.io/nic.fab0.numa-node"] != "0" || l["numastream.io/nic.fab0.speed-mbit"] != "1000" {
		t.Fatalf("declared fab0: got %v", l)
	}
	if l["numastream.io/nic.eth0.speed-mbit"] != "25000" {
		t.Fatalf("an undeclared NIC keeps its sysfs speed: %v", l)
	}
	if len(NICs(Declare(topo, rates))) != 2 {
		t.Fatal("a declared NIC gets a locality token")
	}
	for _, bad := range []string{"fab0", "fab0=0", "fab0=x", "bad name=10"} {
		if _, err := ParseRates(bad); err == nil {
			t.Errorf("ParseRates(%q) accepted", bad)
		}
	}
}

// With SMT the agent counts physical cores (EPYC fixture: 16 hardware threads of 8 cores per
// node); the daemon publishes them and the operator reads a core worth two CPUs.
func TestPhysicalCoresArePublishedNextToCPUs(t *testing.T) {
	labels := Labels(agentTopology(t, "epyc-4node"), bench())
	for id := 0; id < 4; id++ {
		if labels[topology.NUMACPUsLabel(id)] != "16" || labels[topology.NUMACoresLabel(id)] != "8" {
			t.Errorf("node %d: %s CPUs, %s cores", id, labels[topology.NUMACPUsLabel(id)], labels[topology.NUMACoresLabel(id)])
		}
	}
	n, err := topology.FromLabels("epyc", labels)
	if err != nil {
		t.Fatal(err)
	}
	if n.CoresPerCPU() != 0.5 {
		t.Errorf("cores per CPU %v", n.CoresPerCPU())
	}
	if paper := Labels(agentTopology(t, "paper-gateway"), bench()); paper[topology.NUMACoresLabel(1)] != "16" {
		t.Errorf("without SMT every CPU is a core: %v", paper)
	}
}

// A data NIC's IPv4 address (added by a daemon in the host's network namespace) is published and
// read back by the operator; an IPv6 or empty address is not.
func TestNICAddressesArePublishedForHostNetworkPipelines(t *testing.T) {
	topo := agentTopology(t, "paper-gateway")
	for i := range topo.NICs {
		switch topo.NICs[i].Name {
		case "ens1f0":
			topo.NICs[i].Address = "10.215.0.100"
		case "eno1":
			topo.NICs[i].Address = "fd00::1"
		}
	}
	labels := Labels(topo, bench())
	if labels[topology.NICAddressLabel("ens1f0")] != "10.215.0.100" {
		t.Errorf("ens1f0 address label %q", labels[topology.NICAddressLabel("ens1f0")])
	}
	if _, ok := labels[topology.NICAddressLabel("eno1")]; ok {
		t.Error("an IPv6 address cannot be a label value")
	}
	n, err := topology.FromLabels("lynx", labels)
	if err != nil {
		t.Fatal(err)
	}
	if nic, _ := n.NIC("ens1f0"); nic.Address != "10.215.0.100" {
		t.Errorf("operator reads %+v", nic)
	}
	labels[topology.NICAddressLabel("ens1f0")] = "not-an-ip"
	if _, err := topology.FromLabels("lynx", labels); err == nil || !strings.Contains(err.Error(), "ipv4") {
		t.Errorf("bad address label: %v", err)
	}
}

func TestBSLZ4SpeedsArePublishedWhenTheAgentMeasuredThem(t *testing.T) {
	b := bench()
	if l := Labels(agentTopology(t, "paper-gateway"), b); l["numastream.io/bslz4-compress-mb-per-s"] != "" {
		t.Fatalf("an agent that did not measure bslz4 published %q", l["numastream.io/bslz4-compress-mb-per-s"])
	}
	b.Codec.BSLZ4CompressMBps, b.Codec.BSLZ4DecompressMBps = 707.6, 1790.2
	l := Labels(agentTopology(t, "paper-gateway"), b)
	if l["numastream.io/bslz4-compress-mb-per-s"] != "708" || l["numastream.io/bslz4-decompress-mb-per-s"] != "1790" {
		t.Fatalf("bslz4 labels %q %q", l["numastream.io/bslz4-compress-mb-per-s"], l["numastream.io/bslz4-decompress-mb-per-s"])
	}
	n, err := topology.FromLabels("gw", l)
	if err != nil {
		t.Fatal(err)
	}
	if bs, err := n.ForCodec("bslz4"); err != nil || bs.CompressMBps != 708 {
		t.Fatalf("the operator reads them back: %+v %v", bs.CompressMBps, err)
	}
}
