// Package nodelabels turns what the agent reports about a node (`numastream-agent topology` and
// `numastream-agent bench codec --json`) into the labels of docs/node-labels.md. The agent is the
// project's only sysfs parser; this package only translates its JSON.
package nodelabels

import (
	"encoding/json"
	"fmt"
	"math"
	"net"
	"sort"
	"strconv"
	"strings"

	"github.com/numastream/numastream/internal/topology"
)

// AgentTopology is the JSON of `numastream-agent topology`.
type AgentTopology struct {
	NUMANodes []struct {
		ID        int `json:"id"`
		CPUCount  int `json:"cpu_count"`
		CoreCount int `json:"core_count"`
	} `json:"numa_nodes"`
	NICs []AgentNIC `json:"nics"`
}

// AgentNIC is one network interface as the agent reports it.
type AgentNIC struct {
	Name      string `json:"name"`
	NUMANode  int    `json:"numa_node"`
	PCI       string `json:"pci_address"`
	SpeedMbps int64  `json:"speed_mbps"`
	Virtual   bool   `json:"virtual"`
	// Address is the NIC's IPv4 address in the host's network namespace: not in the agent's
	// sysfs report, the node daemon adds it when it runs with hostNetwork.
	Address string `json:"address,omitempty"`
}

// AgentBench is the JSON of `numastream-agent bench codec --json`.
type AgentBench struct {
	Codec struct {
		CompressMBps   float64 `json:"compress_mbps"`
		DecompressMBps float64 `json:"decompress_mbps"`
		// bslz4 (0 from an agent without it: not published).
		BSLZ4CompressMBps   float64 `json:"bslz4_compress_mbps"`
		BSLZ4DecompressMBps float64 `json:"bslz4_decompress_mbps"`
	} `json:"codec"`
}

// ParseTopology decodes the agent's topology JSON.
func ParseTopology(data []byte) (AgentTopology, error) {
	var t AgentTopology
	if err := json.Unmarshal(data, &t); err != nil {
		return t, fmt.Errorf("agent topology JSON: %w", err)
	}
	if len(t.NUMANodes) == 0 {
		return t, fmt.Errorf("agent topology JSON lists no NUMA node")
	}
	return t, nil
}

// ParseBench decodes the agent's bench JSON.
func ParseBench(data []byte) (AgentBench, error) {
	var b AgentBench
	if err := json.Unmarshal(data, &b); err != nil {
		return b, fmt.Errorf("agent bench JSON: %w", err)
	}
	if b.Codec.CompressMBps <= 0 || b.Codec.DecompressMBps <= 0 {
		return b, fmt.Errorf("agent bench JSON has no positive codec speeds")
	}
	return b, nil
}

// validLabelValue: Kubernetes label values are at most 63 characters of [A-Za-z0-9_.-].
func validName(s string) bool {
	if s == "" || len(s) > 40 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// Labels builds the label set. NUMA node ids run 0..max; a node without CPUs (memory only) is
// published with 0 CPUs so NIC node ids keep their meaning. Virtual interfaces and NICs whose
// NUMA node the kernel does not know get no label: the operator must not guess.
func Labels(t AgentTopology, b *AgentBench) map[string]string {
	out := map[string]string{}
	maxID := -1
	for _, n := range t.NUMANodes {
		maxID = max(maxID, n.ID)
	}
	cpus := make([]int, maxID+1)
	cores := make([]int, maxID+1)
	for _, n := range t.NUMANodes {
		cpus[n.ID], cores[n.ID] = n.CPUCount, n.CoreCount
	}
	out[topology.LabelNUMANodes] = strconv.Itoa(maxID + 1)
	for id, c := range cpus {
		out[topology.NUMACPUsLabel(id)] = strconv.Itoa(c)
		if cores[id] > 0 && cores[id] <= c { // an agent too old to count cores publishes none
			out[topology.NUMACoresLabel(id)] = strconv.Itoa(cores[id])
		}
	}
	for _, nic := range t.NICs {
		node := nicNode(t, nic.NUMANode)
		if nic.Virtual || node < 0 || node > maxID || !validName(nic.Name) {
			continue
		}
		out[topology.NICNUMALabel(nic.Name)] = strconv.Itoa(node)
		if nic.SpeedMbps > 0 {
			out[topology.NICSpeedLabel(nic.Name)] = strconv.FormatInt(nic.SpeedMbps, 10)
		}
		if ip := net.ParseIP(nic.Address); ip != nil && ip.To4() != nil {
			out[topology.NICAddressLabel(nic.Name)] = ip.To4().String()
		}
	}
	if b != nil {
		out[topology.LabelCompressMBps] = strconv.FormatInt(int64(math.Round(b.Codec.CompressMBps)), 10)
		out[topology.LabelDecompressMBps] = strconv.FormatInt(int64(math.Round(b.Codec.DecompressMBps)), 10)
		if b.Codec.BSLZ4CompressMBps >= 1 && b.Codec.BSLZ4DecompressMBps >= 1 {
			out[topology.LabelBSLZ4CompressMBps] = strconv.FormatInt(int64(math.Round(b.Codec.BSLZ4CompressMBps)), 10)
			out[topology.LabelBSLZ4DecompressMBps] = strconv.FormatInt(int64(math.Round(b.Codec.BSLZ4DecompressMBps)), 10)
		}
	}
	return out
}

// Declare applies what an administrator declared about data NICs (node daemon --nic-rate): a
// declared interface is a data NIC even when the kernel calls it virtual (a veth or macvlan
// master, a bond), and its speed is the declared rate of the path behind it in Mbit/s — a
// shaped or WAN-limited path carries less than the NIC's sysfs speed, and the planner must
// predict with what the path carries. Declared names that are not present change nothing.
func Declare(t AgentTopology, rates map[string]int64) AgentTopology {
	if len(rates) == 0 {
		return t
	}
	nics := make([]AgentNIC, len(t.NICs))
	copy(nics, t.NICs)
	for i := range nics {
		if rate, ok := rates[nics[i].Name]; ok {
			nics[i].Virtual = false
			nics[i].SpeedMbps = rate
		}
	}
	t.NICs = nics
	return t
}

// ParseRates parses "name=mbit[,name=mbit...]" (node daemon --nic-rate).
func ParseRates(s string) (map[string]int64, error) {
	out := map[string]int64{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for _, item := range strings.Split(s, ",") {
		name, v, ok := strings.Cut(strings.TrimSpace(item), "=")
		rate, err := strconv.ParseInt(v, 10, 64)
		if !ok || !validName(name) || err != nil || rate <= 0 {
			return nil, fmt.Errorf("--nic-rate: %q is not NIC=MBIT (a NIC name and a positive rate in Mbit/s)", item)
		}
		out[name] = rate
	}
	return out, nil
}

// LocalNICs lists the NICs that get a locality device resource: physical, NUMA node known.
type LocalNIC struct {
	Name     string
	NUMANode int
}

// NICs returns the NICs with a known NUMA node, sorted by name.
// nicNode is a NIC's NUMA node. The kernel reports -1 when it does not know; on a machine with
// one NUMA node (most VMs) every device is on that node, so -1 means it. With several nodes an
// unknown node stays unknown (-1): guessing would put receivers on the wrong socket.
func nicNode(t AgentTopology, reported int) int {
	if reported < 0 && len(t.NUMANodes) == 1 {
		return t.NUMANodes[0].ID
	}
	return reported
}

func NICs(t AgentTopology) []LocalNIC {
	var out []LocalNIC
	for _, nic := range t.NICs {
		if node := nicNode(t, nic.NUMANode); !nic.Virtual && node >= 0 && validName(nic.Name) {
			out = append(out, LocalNIC{Name: nic.Name, NUMANode: node})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// FeaturesFile renders NFD's local-source feature file: one `name=value` per line, sorted.
func FeaturesFile(labels map[string]string) []byte {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b []byte
	b = append(b, "# Written by numastream's node daemon (docs/node-labels.md). Do not edit.\n"...)
	for _, k := range keys {
		b = append(b, k+"="+labels[k]+"\n"...)
	}
	return b
}
