// Package topology turns a node's labels into the facts the planner needs: NUMA nodes and their
// CPUs, each NIC's NUMA node and speed, and the measured per-core codec speeds. The labels are
// published through node-feature-discovery by numastream's node daemon (docs/node-labels.md).
// A node that lacks a label the planner needs is an error naming that label; nothing is guessed.
package topology

import (
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
)

// Label keys (docs/node-labels.md).
const (
	Prefix = "numastream.io/"
	// LabelNUMANodes is the number of NUMA nodes with CPUs.
	LabelNUMANodes = Prefix + "numa-nodes"
	// LabelCompressMBps is the measured single-core LZ4 compression speed, MB/s.
	LabelCompressMBps = Prefix + "lz4-compress-mb-per-s"
	// LabelDecompressMBps is the measured single-core LZ4 decompression speed, MB/s.
	LabelDecompressMBps = Prefix + "lz4-decompress-mb-per-s"
	// LabelBSLZ4CompressMBps / LabelBSLZ4DecompressMBps: the same for bitshuffle + LZ4 (bslz4).
	LabelBSLZ4CompressMBps   = Prefix + "bslz4-compress-mb-per-s"
	LabelBSLZ4DecompressMBps = Prefix + "bslz4-decompress-mb-per-s"
	// NICResourcePrefix names the device-plugin resource that carries a NIC's NUMA node.
	NICResourcePrefix = Prefix + "nic-"
)

// NUMACPUsLabel is the label holding the CPU count of NUMA node id.
func NUMACPUsLabel(id int) string { return fmt.Sprintf("%snuma%d-cpus", Prefix, id) }

// NUMACoresLabel is the label holding the physical core count of NUMA node id (optional: a node
// without it counts every CPU as a core).
func NUMACoresLabel(id int) string { return fmt.Sprintf("%snuma%d-cores", Prefix, id) }

// NICNUMALabel is the label holding the NUMA node of NIC name.
func NICNUMALabel(nic string) string { return Prefix + "nic." + nic + ".numa-node" }

// NICSpeedLabel is the label holding the link speed of NIC name, in Mbit/s.
func NICSpeedLabel(nic string) string { return Prefix + "nic." + nic + ".speed-mbit" }

// NICAddressLabel is the label holding NIC name's IPv4 address on the node (published by a node
// daemon that runs in the host's network namespace): where hostNetwork senders connect.
func NICAddressLabel(nic string) string { return Prefix + "nic." + nic + ".ipv4" }

// NICResource is the NIC-locality resource numastream's device plugin advertises for nic.
func NICResource(nic string) string { return NICResourcePrefix + nic }

// NUMANode is one NUMA node with CPUs.
type NUMANode struct {
	ID   int
	CPUs int
	// Cores are the physical cores among the CPUs (fewer with SMT: hardware threads of one core
	// share its execution units).
	Cores int
}

// NIC is a network interface with its NUMA node and link speed.
type NIC struct {
	Name      string
	NUMANode  int
	SpeedMbit int64
	// Address is the NIC's IPv4 address on the node ("" when not published).
	Address string
}

// Node is what the planner knows about one Kubernetes node.
type Node struct {
	Name      string
	NUMANodes []NUMANode // sorted by ID
	NICs      map[string]NIC
	// Per-core LZ4 speeds measured by the node daemon, MB/s.
	CompressMBps   float64
	DecompressMBps float64
	// Per-core bslz4 speeds, MB/s (0: not published, a node daemon older than bslz4).
	BSLZ4CompressMBps   float64
	BSLZ4DecompressMBps float64
	// AllocatableCPUs is what the kubelet can give pods (whole CPUs of status.allocatable):
	// below the CPU count when CPUs are reserved for the system, as the static CPU manager
	// requires. 0: unknown, plan with the CPU count.
	AllocatableCPUs int
	// AllocatableMilliCPU is status.allocatable exactly, in millicores (the static CPU manager
	// reserves whole CPUs, but kubeReserved of 100m leaves 1.9 of 2 to pods). 0: unknown, use
	// AllocatableCPUs.
	AllocatableMilliCPU int64
	// OtherPodsMilliCPU is what pods of other workloads already request on the node (the node
	// daemon's own pod, system agents, other jobs), in millicores: the scheduler will not give
	// it to the pipeline.
	OtherPodsMilliCPU int64
}

// MissingLabelError says which label a node lacks and why it matters.
type MissingLabelError struct {
	Node  string
	Label string
	Why   string
}

func (e *MissingLabelError) Error() string {
	return fmt.Sprintf("node %s has no usable label %s (%s); is numastream's node daemon running there?", e.Node, e.Label, e.Why)
}

// CoresPerCPU is the node's physical cores per CPU: 1 without SMT, 0.5 with two hardware
// threads per core.
func (n Node) CoresPerCPU() float64 {
	cpus, cores := 0, 0
	for _, nn := range n.NUMANodes {
		cpus += nn.CPUs
		cores += nn.Cores
	}
	if cpus == 0 || cores == 0 {
		return 1
	}
	return float64(cores) / float64(cpus)
}

// TotalCPUs is the sum of CPUs over NUMA nodes.
func (n Node) TotalCPUs() int {
	total := 0
	for _, nn := range n.NUMANodes {
		total += nn.CPUs
	}
	return total
}

// UsableCPUs is what pods can have on the node in whole CPUs (UsableMilliCPU rounded down).
func (n Node) UsableCPUs() int { return int(n.UsableMilliCPU() / 1000) }

// UsableMilliCPU is what pods can have on the node, in millicores: its allocatable CPUs when
// known, at most its CPU count, less what other pods request there.
func (n Node) UsableMilliCPU() int64 {
	milli := int64(n.TotalCPUs()) * 1000
	alloc := n.AllocatableMilliCPU
	if alloc == 0 {
		alloc = int64(n.AllocatableCPUs) * 1000
	}
	if alloc > 0 && alloc < milli {
		milli = alloc
	}
	return max(milli-n.OtherPodsMilliCPU, 0)
}

// Why describes where the usable CPUs come from, for messages: "30 allocatable of 32, other pods
// request 1.5".
func (n Node) Why() string {
	s := fmt.Sprintf("%d CPUs", n.TotalCPUs())
	alloc := n.AllocatableMilliCPU
	if alloc == 0 {
		alloc = int64(n.AllocatableCPUs) * 1000
	}
	if alloc > 0 && alloc < int64(n.TotalCPUs())*1000 {
		s = fmt.Sprintf("%s allocatable of %d", strconv.FormatFloat(float64(alloc)/1000, 'f', -1, 64), n.TotalCPUs())
	}
	if n.OtherPodsMilliCPU > 0 {
		s += fmt.Sprintf(", other pods request %s", strconv.FormatFloat(float64(n.OtherPodsMilliCPU)/1000, 'f', -1, 64))
	}
	return s
}

// NIC returns the named NIC, or an error naming the label that would describe it.
func (n Node) NIC(name string) (NIC, error) {
	nic, ok := n.NICs[name]
	if !ok {
		return NIC{}, &MissingLabelError{Node: n.Name, Label: NICNUMALabel(name), Why: "the data NIC's NUMA node decides where receivers run"}
	}
	return nic, nil
}

func positiveInt(labels map[string]string, node, key, why string) (int64, error) {
	v, ok := labels[key]
	if !ok {
		return 0, &MissingLabelError{Node: node, Label: key, Why: why}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 {
		return 0, &MissingLabelError{Node: node, Label: key, Why: fmt.Sprintf("value %q is not a positive integer; %s", v, why)}
	}
	return n, nil
}

// FromLabels builds a Node from its labels. Every NIC that has a NUMA-node label is read; its
// speed label is optional (-1 when missing: the planner then needs the other end's speed).
func FromLabels(name string, labels map[string]string) (Node, error) {
	n := Node{Name: name, NICs: map[string]NIC{}}
	count, err := positiveInt(labels, name, LabelNUMANodes, "the planner places stages per NUMA node")
	if err != nil {
		return n, err
	}
	for id := 0; id < int(count); id++ {
		key := NUMACPUsLabel(id)
		v, ok := labels[key]
		cpus, err := strconv.Atoi(v)
		if !ok || err != nil || cpus < 0 {
			return n, &MissingLabelError{Node: name, Label: key, Why: fmt.Sprintf("value %q is not a CPU count; the planner counts cores per NUMA node", v)}
		}
		cores := cpus
		if v, ok := labels[NUMACoresLabel(id)]; ok {
			c, err := strconv.Atoi(v)
			if err != nil || c < 0 || c > cpus || (cpus > 0 && c == 0) {
				return n, &MissingLabelError{Node: name, Label: NUMACoresLabel(id), Why: fmt.Sprintf("value %q is not a core count between 1 and the node's %d CPUs", v, cpus)}
			}
			cores = c
		}
		// A memory-only node (0 CPUs) keeps its id so NIC node ids keep their meaning.
		n.NUMANodes = append(n.NUMANodes, NUMANode{ID: id, CPUs: cpus, Cores: cores})
	}
	if n.TotalCPUs() == 0 {
		return n, &MissingLabelError{Node: name, Label: NUMACPUsLabel(0), Why: "no NUMA node has CPUs"}
	}
	c, err := positiveInt(labels, name, LabelCompressMBps, "compression threads are sized by measured speed")
	if err != nil {
		return n, err
	}
	d, err := positiveInt(labels, name, LabelDecompressMBps, "decompression threads are sized by measured speed")
	if err != nil {
		return n, err
	}
	n.CompressMBps, n.DecompressMBps = float64(c), float64(d)
	if _, ok := labels[LabelBSLZ4CompressMBps]; ok {
		bc, err := positiveInt(labels, name, LabelBSLZ4CompressMBps, "bslz4 threads are sized by measured speed")
		if err != nil {
			return n, err
		}
		bd, err := positiveInt(labels, name, LabelBSLZ4DecompressMBps, "bslz4 threads are sized by measured speed")
		if err != nil {
			return n, err
		}
		n.BSLZ4CompressMBps, n.BSLZ4DecompressMBps = float64(bc), float64(bd)
	}

	for key, value := range labels {
		if !strings.HasPrefix(key, Prefix+"nic.") || !strings.HasSuffix(key, ".numa-node") {
			continue
		}
		nicName := strings.TrimSuffix(strings.TrimPrefix(key, Prefix+"nic."), ".numa-node")
		numa, err := strconv.Atoi(value)
		if err != nil || numa < 0 || numa >= int(count) {
			return n, &MissingLabelError{Node: name, Label: key, Why: fmt.Sprintf("value %q is not a NUMA node of this node (0..%d)", value, count-1)}
		}
		nic := NIC{Name: nicName, NUMANode: numa, SpeedMbit: -1}
		if s, ok := labels[NICSpeedLabel(nicName)]; ok {
			if speed, err := strconv.ParseInt(s, 10, 64); err == nil && speed > 0 {
				nic.SpeedMbit = speed
			}
		}
		if a, ok := labels[NICAddressLabel(nicName)]; ok {
			if ip := net.ParseIP(a); ip == nil || ip.To4() == nil {
				return n, &MissingLabelError{Node: name, Label: NICAddressLabel(nicName), Why: fmt.Sprintf("value %q is not an IPv4 address", a)}
			}
			nic.Address = a
		}
		n.NICs[nicName] = nic
	}
	sort.Slice(n.NUMANodes, func(i, j int) bool { return n.NUMANodes[i].ID < n.NUMANodes[j].ID })
	return n, nil
}

// ForCodec is the node as the planner sees it for a codec: its codec speeds are that codec's.
// bslz4 needs the node daemon's bslz4 calibration; a node without it is refused naming the label.
func (n Node) ForCodec(codec string) (Node, error) {
	if codec != "bslz4" {
		return n, nil
	}
	if n.BSLZ4CompressMBps <= 0 || n.BSLZ4DecompressMBps <= 0 {
		return n, &MissingLabelError{Node: n.Name, Label: LabelBSLZ4CompressMBps,
			Why: "codec bslz4 threads are sized by its measured speed (a node daemon of numastream 0.2 or later publishes it)"}
	}
	n.CompressMBps, n.DecompressMBps = n.BSLZ4CompressMBps, n.BSLZ4DecompressMBps
	return n, nil
}
