package planner

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/numastream/numastream/internal/topology"
)

// node builds a topology: numaCPUs per NUMA node, NICs as name -> {numa, speed}.
func node(name string, numaCPUs []int, nics map[string][2]int64, c, d float64) topology.Node {
	n := topology.Node{Name: name, NICs: map[string]topology.NIC{}, CompressMBps: c, DecompressMBps: d}
	for i, cpus := range numaCPUs {
		n.NUMANodes = append(n.NUMANodes, topology.NUMANode{ID: i, CPUs: cpus})
	}
	for nic, v := range nics {
		n.NICs[nic] = topology.NIC{Name: nic, NUMANode: int(v[0]), SpeedMbit: v[1]}
	}
	return n
}

// The paper's machines: lynxdtn (2 x 16 cores, 200G NIC on node 1) and updraft (same shape,
// 100G); polaris (1 socket, 32 cores, 100G). Per-core LZ4 speeds as measured on this kind of data.
var (
	lynx     = node("lynxdtn", []int{16, 16}, map[string][2]int64{"ens1f0": {1, 200000}, "eno1": {0, 1000}}, 440, 1600)
	updraft1 = node("updraft1", []int{16, 16}, map[string][2]int64{"ens1f0": {1, 100000}}, 440, 1600)
	updraft2 = node("updraft2", []int{16, 16}, map[string][2]int64{"ens1f0": {1, 100000}}, 440, 1600)
	polaris1 = node("polaris1", []int{32}, map[string][2]int64{"hsn0": {0, 100000}}, 440, 1600)
	polaris2 = node("polaris2", []int{32}, map[string][2]int64{"hsn0": {0, 100000}}, 440, 1600)
)

func request(senders ...topology.Node) Request {
	return Request{Senders: senders, Gateway: lynx, GatewayNIC: "ens1f0", Ratio: 2, Mode: NUMAAware, Port: 5555}
}

func stage(t *testing.T, p Plan, role Role, stream int, name StageName) Stage {
	t.Helper()
	for _, n := range p.Pods() {
		if n.Role != role || n.Stream != stream {
			continue
		}
		for _, s := range n.Stages {
			if s.Name == name {
				return s
			}
		}
	}
	t.Fatalf("no %s stage %s for stream %d", role, name, stream)
	return Stage{}
}

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol }

// Paper, single stream (updraft1 -> lynxdtn over 100G): compression bound at the sender's cores;
// the paper measured 97 Gbps end to end with 32 compress threads and receivers NIC-local.
func TestPaperSingleStream(t *testing.T) {
	p, err := Make(request(updraft1))
	if err != nil {
		t.Fatal(err)
	}
	if got := stage(t, p, "sender", 0, StageCompress).Threads; got != 31 {
		t.Errorf("compress threads = %d, want 31 (32 cores minus one for source and send)", got)
	}
	recv := stage(t, p, "gateway", 0, StageReceive)
	if recv.NUMA != "nic" || recv.Threads != 5 {
		t.Errorf("receive = %+v, want 5 threads NIC-local", recv)
	}
	if dec := stage(t, p, "gateway", 0, StageDecompress); dec.Threads != 9 || dec.NUMA != "0" {
		t.Errorf("decompress = %+v, want 9 threads on node 0", dec)
	}
	if p.Bottleneck != StageCompress || !near(p.RateMbit, 31*440*8, 1) {
		t.Errorf("predicted %.0f Mbit/s limited by %s", p.RateMbit, p.Bottleneck)
	}
	if p.Holds[1] != 5 || p.Holds[0] != 9 {
		t.Errorf("holds %v", p.Holds)
	}
}

// Paper, 4 streams into one 200G gateway: 4 receive threads per stream on the NIC's node (16),
// 4 decompress threads per stream on the other node (16); decompression limits; the paper
// measured 213 Gbps end to end (105 Gbps on the network).
func TestPaperFourStreams(t *testing.T) {
	p, err := Make(request(updraft1, updraft2, polaris1, polaris2))
	if err != nil {
		t.Fatal(err)
	}
	if p.Connections != 4 {
		t.Fatalf("connections = %d, want 4", p.Connections)
	}
	for i := 0; i < 4; i++ {
		if r := stage(t, p, "gateway", i, StageReceive); r.Threads != 4 || r.NUMA != "nic" {
			t.Errorf("stream %d receive %+v", i, r)
		}
		if d := stage(t, p, "gateway", i, StageDecompress); d.Threads != 4 || d.NUMA != "0" {
			t.Errorf("stream %d decompress %+v", i, d)
		}
	}
	if p.Bottleneck != StageDecompress {
		t.Errorf("bottleneck %s", p.Bottleneck)
	}
	if !near(p.TotalMbit, 4*4*1600*8, 1) {
		t.Errorf("total %.0f Mbit/s", p.TotalMbit)
	}
	if p.Holds[1] != 16 || p.Holds[0] != 16 {
		t.Errorf("holds %v", p.Holds)
	}
	// Ports: each stream its own range.
	if p.Gateways[0].Port != 5555 || p.Gateways[1].Port != 5559 {
		t.Errorf("ports %d %d", p.Gateways[0].Port, p.Gateways[1].Port)
	}
}

// Four single-stream pipelines share the gateway's NIC-local cores; a fifth does not fit.
func TestPipelinesShareTheGatewayAndTheFifthIsRefused(t *testing.T) {
	held := map[int]int{}
	streams := 0
	for i := 0; i < 4; i++ {
		r := request(updraft1)
		r.Connections = 4
		r.DecompressThreads = 4
		r.Held, r.HeldStreams = held, streams
		p, err := Make(r)
		if err != nil {
			t.Fatalf("pipeline %d: %v", i, err)
		}
		for k, v := range p.Holds {
			held[k] += v
		}
		streams++
	}
	if held[1] != 16 {
		t.Fatalf("NIC node held %d", held[1])
	}
	r := request(updraft1)
	r.Connections = 4
	r.Held, r.HeldStreams = held, streams
	_, err := Make(r)
	var refused *RefusedError
	if !errors.As(err, &refused) {
		t.Fatalf("fifth pipeline: %v", err)
	}
	for _, want := range []string{"lynxdtn", "NUMA node 1", "ens1f0", "0 free cores", "hold 16"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("reason %q lacks %q", err, want)
		}
	}
}

// Without explicit connections the planner shrinks them to fit what is left, never oversubscribes.
func TestConnectionsShrinkToTheFreeNICCores(t *testing.T) {
	r := request(updraft1)
	r.Held = map[int]int{1: 13}
	p, err := Make(r)
	if err != nil {
		t.Fatal(err)
	}
	if p.Connections != 3 {
		t.Fatalf("connections %d, want the 3 free NIC-local cores", p.Connections)
	}
}

// After a Topology Affinity Error the operator caps the receiving cores below what the refused
// pod asked for: the plan follows the cap, also over an explicit spec.connections, and keeps
// the cores it frees for decompression.
func TestReceiveCoresLimitAfterATopologyRejection(t *testing.T) {
	free, err := Make(request(updraft1))
	if err != nil {
		t.Fatal(err)
	}
	r := request(updraft1)
	r.ReceiveCoresLimit = free.Connections - 1
	capped, err := Make(r)
	if err != nil {
		t.Fatal(err)
	}
	if capped.Connections != free.Connections-1 {
		t.Fatalf("connections %d, want %d", capped.Connections, free.Connections-1)
	}
	if g := stage(t, capped, "gateway", 0, StageReceive); g.Threads != capped.Connections {
		t.Errorf("receive threads %d", g.Threads)
	}
	r.Connections = 8
	if p, _ := Make(r); p.Connections != r.ReceiveCoresLimit {
		t.Errorf("spec.connections 8 under a limit of %d gave %d", r.ReceiveCoresLimit, p.Connections)
	}
}

func TestNUMALayouts(t *testing.T) {
	cases := []struct {
		name       string
		gw         topology.Node
		nic        string
		decompress NUMATarget
	}{
		{"1 node", node("vm", []int{32}, map[string][2]int64{"eth0": {0, 100000}}, 440, 1600), "eth0", "any"},
		{"2 nodes, NIC on node 0", node("g", []int{16, 16}, map[string][2]int64{"ens": {0, 100000}}, 440, 1600), "ens", "1"},
		{"4 nodes, NIC on the last", node("epyc", []int{8, 8, 8, 8}, map[string][2]int64{"ens": {3, 100000}}, 440, 1600), "ens", "spread"},
		{"8 nodes, NIC on node 0", node("big", []int{4, 4, 4, 4, 4, 4, 4, 4}, map[string][2]int64{"ens": {0, 100000}}, 440, 1600), "ens", "spread"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := request(updraft1)
			r.Gateway, r.GatewayNIC = tc.gw, tc.nic
			p, err := Make(r)
			if err != nil {
				t.Fatal(err)
			}
			recv := stage(t, p, "gateway", 0, StageReceive)
			if recv.NUMA != "nic" {
				t.Errorf("receive %+v", recv)
			}
			nicNode := tc.gw.NICs[tc.nic].NUMANode
			if recv.Threads > tc.gw.NUMANodes[nicNode].CPUs {
				t.Errorf("%d receivers on a %d-core node", recv.Threads, tc.gw.NUMANodes[nicNode].CPUs)
			}
			if d := stage(t, p, "gateway", 0, StageDecompress); d.NUMA != tc.decompress {
				t.Errorf("decompress %+v, want %s", d, tc.decompress)
			}
			total := 0
			for _, v := range p.Holds {
				total += v
			}
			if total > tc.gw.TotalCPUs() {
				t.Errorf("holds %v exceed %d cores", p.Holds, tc.gw.TotalCPUs())
			}
		})
	}
}

func TestMissingSpeedsAreNamed(t *testing.T) {
	gw := node("lynx", []int{16, 16}, map[string][2]int64{"ens1f0": {1, -1}}, 440, 1600)
	r := request(updraft1)
	r.Gateway = gw
	_, err := Make(r)
	var missing *topology.MissingLabelError
	if !errors.As(err, &missing) || missing.Label != topology.NICSpeedLabel("ens1f0") {
		t.Fatalf("got %v", err)
	}
	r.GatewayNIC = "ens9"
	_, err = Make(r)
	if !errors.As(err, &missing) || missing.Label != topology.NICNUMALabel("ens9") {
		t.Fatalf("got %v", err)
	}
}

func TestTargetRateUsesOnlyTheCoresItNeeds(t *testing.T) {
	r := request(updraft1)
	r.TargetMbit = 20000
	p, err := Make(r)
	if err != nil {
		t.Fatal(err)
	}
	if c := stage(t, p, "sender", 0, StageCompress).Threads; c != 6 {
		t.Errorf("compress threads %d, want ceil(20000/3520)=6", c)
	}
	if p.Connections != 1 {
		t.Errorf("connections %d", p.Connections)
	}
	if d := stage(t, p, "gateway", 0, StageDecompress).Threads; d != 2 {
		t.Errorf("decompress %d, want 2", d)
	}
	if p.Bottleneck != StageTarget || p.RateMbit != 20000 {
		t.Errorf("rate %.0f by %s", p.RateMbit, p.Bottleneck)
	}
}

func TestOSModePinsNothingAndPaysTheRemotePenalty(t *testing.T) {
	r := request(updraft1)
	r.Connections = 2
	r.CompressThreads = 31
	numa, _ := Make(r)
	r.Mode = OS
	os, err := Make(r)
	if err != nil {
		t.Fatal(err)
	}
	if s := stage(t, os, "gateway", 0, StageReceive); s.NUMA != "any" {
		t.Errorf("receive %+v", s)
	}
	nr := stage(t, numa, "gateway", 0, StageReceive).RateMbit
	or := stage(t, os, "gateway", 0, StageReceive).RateMbit
	if !(or < nr) {
		t.Errorf("os receive %.0f should be below numa-aware %.0f", or, nr)
	}
}

func TestBadRequestsAreRefused(t *testing.T) {
	r := request()
	if _, err := Make(r); err == nil {
		t.Error("no senders accepted")
	}
	r = request(updraft1)
	r.Ratio = 0
	if _, err := Make(r); err == nil {
		t.Error("ratio 0 accepted")
	}
	r = request(node("tiny", []int{1}, nil, 440, 1600))
	if _, err := Make(r); err == nil || !strings.Contains(err.Error(), "tiny") {
		t.Errorf("1-core sender: %v", err)
	}
	r = request(updraft1)
	r.Port = 65530
	r.Connections = 8
	if _, err := Make(r); err == nil || !strings.Contains(err.Error(), "65535") {
		t.Errorf("port overflow: %v", err)
	}
	r = request(updraft1)
	r.DecompressThreads = 40
	if _, err := Make(r); err == nil || !strings.Contains(err.Error(), "decompress") {
		t.Errorf("too many decompress threads: %v", err)
	}
}

// Sizing from what the kubelet can allocate: with CPUs reserved for the system (the static CPU
// manager requires a reservation), a 32-CPU node offers 30, and a plan that asked for 32 would
// leave its pods Pending forever.
func TestPlansFitAllocatableCPUs(t *testing.T) {
	sender, gw := updraft1, lynx
	sender.AllocatableCPUs, gw.AllocatableCPUs = 30, 30
	r := request(sender)
	r.Gateway = gw
	p, err := Make(r)
	if err != nil {
		t.Fatal(err)
	}
	total := map[string]int{}
	for _, n := range p.Pods() {
		total[n.Node] += n.CPUs
	}
	if total["updraft1"] > 30 || total["lynxdtn"] > 30 {
		t.Fatalf("plan asks more than allocatable: %v", total)
	}
	if got := stage(t, p, "sender", 0, StageCompress).Threads; got != 29 {
		t.Errorf("compress threads = %d, want 29 (30 allocatable minus the sending core)", got)
	}
	if p.Holds[1] < stage(t, p, "gateway", 0, StageReceive).Threads {
		t.Errorf("the receivers lost their NIC-local cores to the reservation: holds %v", p.Holds)
	}
}

// The facility in a box: 2-CPU nodes, a 1 Gbit/s link. The sink shares the decompressing core
// instead of the pipeline being refused, and the link is the bottleneck.
// What other pods request on a node (the node daemon's own pod, system agents) is not the
// pipeline's: a sender with 30 allocatable CPUs and 1.5 requested by others compresses with 27
// threads (28 CPUs for its pod), and a refusal says where the CPUs went.
func TestOtherPodsRequestsAreNotPlanned(t *testing.T) {
	s := updraft1
	s.AllocatableCPUs = 30
	s.OtherPodsMilliCPU = 1500
	p, err := Make(request(s))
	if err != nil {
		t.Fatal(err)
	}
	if c := stage(t, p, "sender", 0, StageCompress); c.Threads != 27 || p.Senders[0].CPUs != 28 {
		t.Errorf("compress %d threads in a %d-CPU pod, want 27 in 28", c.Threads, p.Senders[0].CPUs)
	}
	gw := lynx
	gw.AllocatableCPUs = 30
	gw.OtherPodsMilliCPU = 4000
	r := request(updraft1)
	r.Gateway = gw
	p, err = Make(r)
	if err != nil {
		t.Fatal(err)
	}
	used := 0
	for _, n := range p.Gateways {
		used += n.CPUs
	}
	if used > 26 {
		t.Errorf("gateway pods request %d CPUs of the 26 left", used)
	}
	s.OtherPodsMilliCPU = 29000
	_, err = Make(request(s))
	if err == nil || !strings.Contains(err.Error(), "other pods request 29") || !strings.Contains(err.Error(), "30 allocatable of 32") {
		t.Errorf("refusal %v", err)
	}
}

// Hardware threads are not cores: on a sender with two threads per core, its codec threads are
// worth half the measured per-core speed (the prediction halves and compression stays the
// bottleneck), unless the spec counts hardware threads as cores; the gateway sizes its
// decompression threads the same way.
func TestHardwareThreadsCountAsHalfACoreForTheCodecs(t *testing.T) {
	smt := func(n topology.Node) topology.Node {
		n.NUMANodes = append([]topology.NUMANode(nil), n.NUMANodes...)
		for i := range n.NUMANodes {
			n.NUMANodes[i].Cores = n.NUMANodes[i].CPUs / 2
		}
		return n
	}
	plain, err := Make(request(updraft1))
	if err != nil {
		t.Fatal(err)
	}
	halved, err := Make(request(smt(updraft1)))
	if err != nil {
		t.Fatal(err)
	}
	pc, hc := stage(t, plain, "sender", 0, StageCompress), stage(t, halved, "sender", 0, StageCompress)
	if hc.Threads != pc.Threads || !near(hc.RateMbit, pc.RateMbit/2, 1) {
		t.Errorf("SMT sender: %d threads at %.0f Mbit/s, want %d at %.0f", hc.Threads, hc.RateMbit, pc.Threads, pc.RateMbit/2)
	}
	r := request(smt(updraft1))
	r.CountHardwareThreads = true
	if counted, _ := Make(r); !near(stage(t, counted, "sender", 0, StageCompress).RateMbit, pc.RateMbit, 1) {
		t.Error("counting hardware threads as cores should predict as without SMT")
	}
	r = request(updraft1)
	r.Gateway = smt(lynx)
	gwSMT, err := Make(r)
	if err != nil {
		t.Fatal(err)
	}
	if d, d0 := stage(t, gwSMT, "gateway", 0, StageDecompress), stage(t, plain, "gateway", 0, StageDecompress); d.Threads <= d0.Threads {
		t.Errorf("an SMT gateway decompresses with %d threads, no more than the %d of one without", d.Threads, d0.Threads)
	}
}

// The planner splits each pod between its agents: the gateway's receiving container gets one
// CPU per connection and only the receive stage; the decompressing container the rest, with
// one thread reading the relay next to the decompressors, and the sink; memory follows the
// chunk size and the CPUs.
func TestThePlannerSplitsTheGatewayPodBetweenItsContainers(t *testing.T) {
	r := request(updraft1)
	r.HasSink = true
	p, err := Make(r)
	if err != nil {
		t.Fatal(err)
	}
	gw := p.Gateways[len(p.Gateways)-1]
	if len(gw.Containers) != 2 {
		t.Fatalf("containers %+v", gw.Containers)
	}
	rx, dx := gw.Containers[0], gw.Containers[1]
	if rx.Name != ContainerReceive || rx.CPUs != p.Connections || len(rx.Stages) != 1 || rx.Stages[0].NUMA != "nic" {
		t.Errorf("receiving container %+v", rx)
	}
	dec := stage(t, p, "gateway", 0, StageDecompress)
	if dx.CPUs != gw.CPUs-p.Connections || dx.Stages[0] != (Stage{Name: StageReceive, Threads: 1, NUMA: dec.NUMA}) ||
		dx.Stages[1].Name != StageDecompress || dx.Stages[2].Name != StageSink {
		t.Errorf("decompressing container %+v", dx)
	}
	small := r
	small.ChunkBytes = 1 << 20
	q, _ := Make(small)
	if q.Gateways[len(q.Gateways)-1].Containers[1].MemoryBytes >= dx.MemoryBytes || dx.MemoryBytes%(1<<20) != 0 {
		t.Errorf("memory %d for 11 MB chunks, %d for 1 MiB chunks", dx.MemoryBytes, q.Gateways[len(q.Gateways)-1].Containers[1].MemoryBytes)
	}
	if s := p.Senders[0].Containers; len(s) != 1 || s[0].CPUs != p.Senders[0].CPUs {
		t.Errorf("sender containers %+v", s)
	}
}

func TestTwoCPUNodesFitWithTheSinkSharingACore(t *testing.T) {
	det := node("detector-a", []int{2}, map[string][2]int64{"fab0": {0, 1000}}, 400, 1500)
	gw := node("gateway-a", []int{2}, map[string][2]int64{"fab0": {0, 1000}}, 400, 1500)
	det.AllocatableCPUs, gw.AllocatableCPUs = 2, 2
	p, err := Make(Request{Senders: []topology.Node{det}, Gateway: gw, GatewayNIC: "fab0", Ratio: 2,
		Mode: NUMAAware, HasSink: true, Port: 5555})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range p.Pods() {
		if n.CPUs > 2 {
			t.Errorf("%s %s asks %d CPUs of 2", n.Role, n.Node, n.CPUs)
		}
	}
	if p.Bottleneck != StageNetwork || !near(p.RateMbit, 2000, 1) {
		t.Errorf("want the 1 Gbit/s link x ratio 2 = 2000 Mbit/s raw as the bottleneck, got %.0f %s", p.RateMbit, p.Bottleneck)
	}
	det.AllocatableCPUs = 1
	_, err = Make(Request{Senders: []topology.Node{det}, Gateway: gw, GatewayNIC: "fab0", Ratio: 2, Mode: NUMAAware, Port: 5555})
	var refused *RefusedError
	if !errors.As(err, &refused) || !strings.Contains(err.Error(), "1 allocatable of 2") {
		t.Errorf("a sender with 1 allocatable CPU: want a refusal naming it, got %v", err)
	}
}

// A Stream V2 detector's messages are carried as they came: no compression to size on the
// sender, only checksums to check at the gateway. The plan gives each codec stage one thread and
// no rate, and the network (the messages' own bytes, ratio 1) or the receivers set the rate —
// not the codec speeds, which the same request without PassThrough is limited by.
func TestPassThroughSourcesPlanNoCodecWork(t *testing.T) {
	slow := node("eiger-dcu", []int{8}, map[string][2]int64{"ens1f0": {0, 100000}}, 100, 300)
	r := request(slow)
	coded, err := Make(r)
	if err != nil {
		t.Fatal(err)
	}
	if coded.Bottleneck != StageCompress {
		t.Fatalf("with compression, the slow codec should limit: %s", coded.Bottleneck)
	}
	r.PassThrough = true
	p, err := Make(r)
	if err != nil {
		t.Fatal(err)
	}
	if c := stage(t, p, "sender", 0, StageCompress); c.Threads != 1 || c.RateMbit != 0 {
		t.Errorf("compress = %+v, want 1 thread and no codec rate", c)
	}
	if d := stage(t, p, "gateway", 0, StageDecompress); d.Threads != 1 || d.RateMbit != 0 {
		t.Errorf("decompress = %+v, want 1 thread and no codec rate", d)
	}
	if p.Bottleneck != StageNetwork && p.Bottleneck != StageReceive {
		t.Errorf("bottleneck %s, want the network or the receivers", p.Bottleneck)
	}
	if p.Bottleneck == StageNetwork && !near(p.RateMbit, 100000, 1) {
		t.Errorf("predicted %.0f Mbit/s: the messages cross the 100G link as they are (ratio 1)", p.RateMbit)
	}
	if _, ok := p.Streams[0].Stages[StageCompress]; ok {
		t.Errorf("a pass-through stream's prediction lists a compress rate: %v", p.Streams[0].Stages)
	}
	if got := stage(t, p, "sender", 0, StageCompress).Threads + SenderOverheadCPUs; p.Senders[0].CPUs != got {
		t.Errorf("sender pod asks %d CPUs, want %d", p.Senders[0].CPUs, got)
	}
}

// With CURVE the sender budgets cores for encrypting what it sends (taken from compression)
// and each receiving core also decrypts, so more connections are planned for the same rate.
func TestEncryptionBudgetsCipherCores(t *testing.T) {
	plain, err := Make(request(updraft1))
	if err != nil {
		t.Fatal(err)
	}
	r := request(updraft1)
	r.Encrypt = true
	p, err := Make(r)
	if err != nil {
		t.Fatal(err)
	}
	enc := stage(t, p, "sender", 0, StageEncrypt)
	comp := stage(t, p, "sender", 0, StageCompress)
	// 27 compress threads make 27 x 3520 = 95040 Mbit/s raw, 47520 on the wire at ratio 2:
	// 3.5 cores of a 13600 Mbit/s cipher, so 4; 27 + 4 + 1 is the sender's 32.
	if comp.Threads != 27 || enc.Threads != 4 || p.Senders[0].CPUs != 32 {
		t.Errorf("compress %d, encrypt %d, sender CPUs %d; want 27, 4, 32", comp.Threads, enc.Threads, p.Senders[0].CPUs)
	}
	if _, ok := plain.Streams[0].Stages[StageEncrypt]; ok {
		t.Errorf("an unencrypted plan predicts an encrypt stage: %v", plain.Streams[0].Stages)
	}
	if !near(p.Streams[0].Stages[StageEncrypt], 4*CipherMbitPerCore*2, 1) {
		t.Errorf("encrypt stage predicted at %.0f Mbit/s raw", p.Streams[0].Stages[StageEncrypt])
	}
	// Receiving and decrypting 47520 Mbit/s at 6513 per core takes 8 NIC-local cores (5 plain).
	recv := stage(t, p, "gateway", 0, StageReceive)
	if plainRecv := stage(t, plain, "gateway", 0, StageReceive); plainRecv.Threads != 5 || recv.Threads != 8 || recv.NUMA != "nic" {
		t.Errorf("receive threads plain %d, encrypted %+v; want 5 and 8 NIC-local", plainRecv.Threads, recv)
	}
	if p.Bottleneck != StageCompress || !near(p.RateMbit, 27*440*8, 1) || p.RateMbit >= plain.RateMbit {
		t.Errorf("encrypted: %.0f Mbit/s limited by %s; plain %.0f", p.RateMbit, p.Bottleneck, plain.RateMbit)
	}
	if p.Holds[1] != 8 {
		t.Errorf("holds %v, want 8 on the NIC's node", p.Holds)
	}
}

// A sender with no core to spare encrypts on its source-and-send core, rated at half a core;
// an explicit compress thread count is kept and the cipher gets what is left.
func TestEncryptionOnASmallSender(t *testing.T) {
	small := node("small", []int{2}, map[string][2]int64{"eth0": {0, 100000}}, 440, 1600)
	r := request(small)
	r.Encrypt = true
	p, err := Make(r)
	if err != nil {
		t.Fatal(err)
	}
	if p.Senders[0].CPUs != 2 || stage(t, p, "sender", 0, StageEncrypt).Threads != 0 {
		t.Errorf("sender %d CPUs, encrypt %+v; want 2 CPUs and no core of its own", p.Senders[0].CPUs, stage(t, p, "sender", 0, StageEncrypt))
	}
	if !near(p.Streams[0].Stages[StageEncrypt], 0.5*CipherMbitPerCore*2, 1) {
		t.Errorf("encrypt predicted %.0f", p.Streams[0].Stages[StageEncrypt])
	}
	big := node("big", []int{16}, map[string][2]int64{"eth0": {0, 100000}}, 440, 1600)
	r = request(big)
	r.Encrypt, r.CompressThreads = true, 12
	p, err = Make(r)
	if err != nil {
		t.Fatal(err)
	}
	// 12 x 3520 / 2 = 21120 Mbit/s on the wire: 2 cipher cores; 12 + 2 + 1 = 15 of 16.
	if c, e := stage(t, p, "sender", 0, StageCompress), stage(t, p, "sender", 0, StageEncrypt); c.Threads != 12 || e.Threads != 2 || p.Senders[0].CPUs != 15 {
		t.Errorf("compress %d, encrypt %d, CPUs %d", c.Threads, e.Threads, p.Senders[0].CPUs)
	}
}

// The paper's machines as the node daemon would label them: hardware threads included (Xeon Gold
// 6346: 16 cores, 32 threads per socket; EPYC 7543P: 32 cores, 64 threads, one NUMA node), read
// through topology.FromLabels as the operator reads them. The codec speeds are assumed (the paper
// gives none per core: 440 / 1600 MB/s, decompression 3.6x compression where the paper saw
// about 3x), so the figures are predictions; docs/planner.md sets them beside the paper's.
func paperLabels(t *testing.T, name string, numa []int, cores []int, nics map[string][2]int64) topology.Node {
	t.Helper()
	l := map[string]string{
		topology.LabelNUMANodes:      strconv.Itoa(len(numa)),
		topology.LabelCompressMBps:   "440",
		topology.LabelDecompressMBps: "1600",
	}
	for i := range numa {
		l[topology.NUMACPUsLabel(i)] = strconv.Itoa(numa[i])
		l[topology.NUMACoresLabel(i)] = strconv.Itoa(cores[i])
	}
	for nic, v := range nics {
		l[topology.NICNUMALabel(nic)] = strconv.FormatInt(v[0], 10)
		l[topology.NICSpeedLabel(nic)] = strconv.FormatInt(v[1], 10)
	}
	n, err := topology.FromLabels(name, l)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestPaperMachinesWithTheirHardwareThreads(t *testing.T) {
	lynxHT := paperLabels(t, "lynxdtn", []int{32, 32}, []int{16, 16}, map[string][2]int64{"ens1f0": {1, 200000}, "eno1": {0, 1000}})
	updraft := func(name string) topology.Node {
		return paperLabels(t, name, []int{32, 32}, []int{16, 16}, map[string][2]int64{"ens1f0": {1, 100000}})
	}
	polaris := func(name string) topology.Node {
		return paperLabels(t, name, []int{64}, []int{32}, map[string][2]int64{"hsn0": {0, 100000}})
	}
	one := request(updraft("updraft1"))
	one.Gateway = lynxHT
	p1, err := Make(one)
	if err != nil {
		t.Fatal(err)
	}
	four := request(updraft("updraft1"), updraft("updraft2"), polaris("polaris1"), polaris("polaris2"))
	four.Gateway = lynxHT
	p4, err := Make(four)
	if err != nil {
		t.Fatal(err)
	}
	// One stream: 63 compressing threads (64 hardware threads, one kept) worth half a core each.
	if c := stage(t, p1, "sender", 0, StageCompress); c.Threads != 63 || !near(c.RateMbit, 63*0.5*440*8, 1) {
		t.Errorf("one stream: compress %+v, want 63 threads at %.0f Mbit/s", c, 63*0.5*440*8)
	}
	if p1.Bottleneck != StageCompress || !near(p1.TotalMbit, 110880, 1) {
		t.Errorf("one stream: %.0f Mbit/s limited by %s, want 110880 by compress", p1.TotalMbit, p1.Bottleneck)
	}
	if r, d := stage(t, p1, "gateway", 0, StageReceive), stage(t, p1, "gateway", 0, StageDecompress); r.Threads != 5 ||
		r.NUMA != "nic" || d.Threads != 18 || d.NUMA != "0" {
		t.Errorf("one stream: receive %+v, decompress %+v; want 5 NIC-local, 18 on node 0", r, d)
	}
	if p1.Holds[1] != 10 || p1.Holds[0] != 18 {
		t.Errorf("one stream: holds %v, want 10 hardware threads (5 whole cores) on node 1, 18 on node 0", p1.Holds)
	}
	if rx := p1.Gateways[0].Containers[0]; rx.Name != ContainerReceive || rx.CPUs != 10 {
		t.Errorf("one stream: the receiving container %+v, want 10 CPUs: 5 whole cores", rx)
	}
	// Four streams: 16 receiving threads hold the 16 cores of the NIC's node (all 32 hardware
	// threads); the decompressors get node 0's 32 hardware threads, 8 per stream at half a core
	// each: the paper's hand-tuned layout (4 per stream on the other node's 16 cores).
	if p4.Connections != 4 || p4.Bottleneck != StageDecompress || !near(p4.TotalMbit, 4*8*0.5*1600*8, 1) {
		t.Errorf("four streams: %d connections, %.0f Mbit/s limited by %s; want 4, %.0f by decompress",
			p4.Connections, p4.TotalMbit, p4.Bottleneck, 4*8*0.5*1600*8)
	}
	for i := 0; i < 4; i++ {
		if d := stage(t, p4, "gateway", i, StageDecompress); d.Threads != 8 || d.NUMA != "0" {
			t.Errorf("four streams: stream %d decompress %+v, want 8 on node 0", i, d)
		}
	}
	if p4.Holds[0] != 32 || p4.Holds[1] != 32 {
		t.Errorf("four streams: holds %v, want every hardware thread of both nodes", p4.Holds)
	}
	t.Logf("paper machines as labelled (hardware threads): one stream %.1f Gbit/s (paper measured 97), four "+
		"streams %.1f Gbit/s (paper measured 212.95)", p1.TotalMbit/1000, p4.TotalMbit/1000)
}

// A gateway whose kubelet leaves no whole core for decompression once the receivers have theirs
// (two NUMA nodes of one CPU, the static CPU manager reserving one for kubeReserved 100m: 1.9
// allocatable): the receiving container keeps its whole core on the NIC's node and decompression
// runs in the node's shared pool on what is left (0.8 here after 100m of other pods), its rate
// scaled by that share; nothing is held on a NUMA node for it. Too little left is refused.
func TestAGatewayShortOfWholeCoresDecompressesInTheSharedPool(t *testing.T) {
	det := node("detector-a", []int{2}, map[string][2]int64{"fab0": {0, 1000}}, 400, 1500)
	gw := node("gateway-n", []int{1, 1}, map[string][2]int64{"fab0": {1, 1000}}, 400, 1500)
	gw.AllocatableMilliCPU, gw.OtherPodsMilliCPU = 1900, 100
	r := Request{Senders: []topology.Node{det}, Gateway: gw, GatewayNIC: "fab0", Ratio: 2, Mode: NUMAAware, HasSink: true, Port: 5555}
	p, err := Make(r)
	if err != nil {
		t.Fatal(err)
	}
	g := p.Gateways[0]
	if g.CPUs != 1 || g.SharedMilliCPU != 800 {
		t.Errorf("gateway pod %d CPUs + %dm shared, want 1 + 800m", g.CPUs, g.SharedMilliCPU)
	}
	rx, dx := g.Containers[0], g.Containers[1]
	if rx.CPUs != 1 || rx.MilliCPU != 0 || dx.CPUs != 0 || dx.MilliCPU != 800 {
		t.Errorf("containers: receive %d CPUs %dm, decompress %d CPUs %dm", rx.CPUs, rx.MilliCPU, dx.CPUs, dx.MilliCPU)
	}
	if s := stage(t, p, RoleGateway, 0, StageReceive); s.NUMA != NUMANIC || s.Threads != 1 {
		t.Errorf("receive %+v, want 1 thread on the NIC's node", s)
	}
	d := stage(t, p, RoleGateway, 0, StageDecompress)
	if d.Threads != 1 || d.NUMA != NUMAAny || !near(d.RateMbit, 0.8*1500*8, 1) {
		t.Errorf("decompress %+v, want 1 thread anywhere at 0.8 x 1500 MB/s", d)
	}
	if len(p.Holds) != 1 || p.Holds[1] != 1 {
		t.Errorf("holds %v, want the receiving core on node 1 only", p.Holds)
	}
	gw.AllocatableMilliCPU = 1150
	r.Gateway = gw
	if _, err := Make(r); err == nil || !strings.Contains(err.Error(), "no core is left for decompression") {
		t.Errorf("50m left: want a refusal, got %v", err)
	}
	gw.AllocatableMilliCPU, gw.OtherPodsMilliCPU = 0, 0 // whole cores: decompression has its own
	r.Gateway = gw
	if p, err = Make(r); err != nil || p.Gateways[0].SharedMilliCPU != 0 || p.Gateways[0].Containers[1].CPUs != 1 {
		t.Errorf("whole cores left: want no shared pool, got %+v %v", p.Gateways, err)
	}
}
