// Package planner is the paper's "runtime configuration generator" made quantitative: from the
// topology of the senders and the gateway, the measured per-core codec speeds, the expected
// compression ratio and the link speeds, it chooses per stream how many compress, connection
// (send/receive) and decompress threads to run and on which NUMA node, predicts each stage's rate,
// and names the slowest stage. Pure: no API server, no clock. The model is in docs/planner.md.
package planner

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"

	"github.com/numastream/numastream/internal/topology"
)

// Model constants (docs/planner.md).
const (
	// ReceiveMbitPerThread is the wire rate one receiving connection sustains next to the NIC.
	ReceiveMbitPerThread = 12500.0
	// RemoteReceiveFactor is the receive rate of a thread off the NIC's NUMA node relative to a
	// NIC-local one (the paper measured up to 15% less).
	RemoteReceiveFactor = 0.87
	// SenderOverheadCPUs is the core a sender keeps for its source, send and I/O threads.
	SenderOverheadCPUs = 1
	// MaxConnections caps the connections the planner picks on its own.
	MaxConnections = 16
	// CipherMbitPerCore is the wire rate one core encrypts or decrypts with CURVE
	// (XSalsa20-Poly1305): 1.7 GB/s, measured by `numastream-agent bench curve`
	// (docs/security.md). ZeroMQ's I/O threads do it, on the cores of the connection stages.
	CipherMbitPerCore = 13600.0
)

// Mode is numa-aware or os.
type Mode string

const (
	NUMAAware Mode = "numa-aware"
	OS        Mode = "os"
)

// StageName names a stage of a stream.
type StageName string

// Stage names.
const (
	StageSource     StageName = "source"
	StageCompress   StageName = "compress"
	StageSend       StageName = "send"
	StageNetwork    StageName = "network"
	StageReceive    StageName = "receive"
	StageDecompress StageName = "decompress"
	StageSink       StageName = "sink"
	StageTarget     StageName = "target"
	// StageEncrypt is the sender's CURVE encryption (security mode curve): its own cores.
	StageEncrypt StageName = "encrypt"
	// StageOnward is the gateway's onward hop to another site (OnwardRequest), lossless: the
	// stream goes no faster than the far site takes it.
	StageOnward StageName = "onward"
)

// Request is one pipeline to plan.
type Request struct {
	Senders    []topology.Node
	Gateway    topology.Node
	GatewayNIC string
	Ratio      float64
	Mode       Mode
	// Overrides; 0 = the planner chooses.
	Connections       int
	CompressThreads   int
	DecompressThreads int
	// TargetMbit is the raw rate per stream to plan for; 0 = as fast as possible.
	TargetMbit float64
	HasSink    bool
	// ExtraConsumers are the gateway's consumers past the first (spec.sinks), each true when it
	// restores the order (file, zmq, stream2, onward: it holds a reorder window of chunks) and
	// false for an HDF5 one (it writes each frame where it belongs): each holds buffers of its own.
	ExtraConsumers []bool
	// Held is what other pipelines already hold on the gateway: cores per NUMA node, and the
	// number of their streams that share the NIC.
	Held        map[int]int
	HeldStreams int
	// Port is the first data port; Ports checks that every stream's range fits.
	Port int
	// ChunkBytes sizes the agents' memory (0: the default chunk, one projection).
	ChunkBytes int64
	// CountHardwareThreads: every hardware thread counts as a core for the codec stages. By
	// default the hardware threads of one core share its codec throughput: on a node with two
	// threads per core, a codec thread is worth half the measured per-core speed.
	CountHardwareThreads bool
	// PassThrough: the sources' frames arrive compressed and are carried as they came (a DECTRIS
	// Stream V2 detector). The compressing stage only copies each message into a frame (one
	// thread), the decompressing stage only checks its checksum (one thread); neither limits
	// the rate, the codec's speeds do not matter, and what crosses the network is the messages'
	// bytes (Ratio is taken as 1).
	PassThrough bool
	// ReceiveCoresLimit caps the receiving cores (connections) per stream: after the kubelet's
	// Topology Manager refused a gateway pod, the operator plans with fewer than it asked for
	// (0: no cap).
	ReceiveCoresLimit int
	// StreamIDs are the senders' stream ids, in order (nil: 0, 1, 2, ...). A stream's id names
	// its plan entries; its position only decides its ports.
	StreamIDs []int
	// Slots are the streams' port slots, in order (nil: 0, 1, 2, ...): a gateway's data ports
	// are Port + slot x connections, so a stream keeps its ports when others come and go.
	Slots []int
	// ExtraPortsPerStream are ports each stream's slot holds past its data ports (host
	// networking: the metrics ports), so a slot's ports never depend on the other streams.
	ExtraPortsPerStream int
	// Encrypt: every data connection is encrypted (CURVE). The sender budgets cores for
	// encrypting what it sends, and each receiving core also decrypts what it receives.
	// (authenticate mode costs nothing per byte: leave it false.)
	Encrypt bool
	// Onward are the pipeline's onward consumers: each gateway forwards its stream to each.
	Onward []OnwardRequest
}

// OnwardRequest is one onward consumer of every stream.
type OnwardRequest struct {
	Name string
	Link OnwardLink
	// Connections: 0 = the planner sizes them from the link.
	Connections int
}

// Role is what a pod does in a pipeline.
type Role string

const (
	// RoleSender reads a detector's data, compresses (or passes it through) and sends it.
	RoleSender Role = "sender"
	// RoleGateway receives one stream next to the NIC, decompresses it and feeds the sink.
	RoleGateway Role = "gateway"
)

// NUMATarget is where a stage's threads run: a NUMA node's id ("0", "1", ...), or one of the
// targets below.
type NUMATarget string

const (
	// NUMAAny: wherever the OS runs them (the pod's CPUs).
	NUMAAny NUMATarget = "any"
	// NUMANIC: the data NIC's NUMA node.
	NUMANIC NUMATarget = "nic"
	// NUMASpread: spread over the NUMA nodes with free cores.
	NUMASpread NUMATarget = "spread"
)

// NUMANode is the target of one NUMA node.
func NUMANode(id int) NUMATarget { return NUMATarget(strconv.Itoa(id)) }

// Stage is one stage group on one node.
type Stage struct {
	Name     StageName
	Threads  int
	NUMA     NUMATarget
	RateMbit float64
}

// PodPlan is one pod's worth of work, a sender's or a gateway's: what both have.
type PodPlan struct {
	Node   string
	Role   Role
	Stream int // the stream's id (Request.StreamIDs)
	CPUs   int // whole CPUs
	// SharedMilliCPU is what a gateway pod short of whole cores asks besides them, in
	// millicores, for decompression in the node's shared pool (0: none).
	SharedMilliCPU int64
	Stages         []Stage
	// Containers split the pod's CPUs and stages between its agents: a sender's one, or a
	// gateway's receiving container (on the NIC's node, relaying) and decompressing container.
	Containers []Container
}

// SenderPlan is a sender's pod: one stream's source, compression (encryption) and sending
// threads in one container.
type SenderPlan struct {
	PodPlan
}

// GatewayPlan is one stream's pod on the gateway: a receiving container next to the NIC and a
// decompressing one, and the stream's data ports.
type GatewayPlan struct {
	PodPlan
	// Port is the stream's first data port (one per connection from there).
	Port int
	// Onward: the stream's hop to each onward consumer, in the request's order.
	Onward []OnwardPrediction
}

// OnwardPrediction is one stream's hop to one onward consumer. The hop carries the chunks
// compressed as they reached the gateway (the far receiver decodes them), so its OnwardPlan is
// in the path's (compressed) Mbit/s; RawMbps is the stream's raw rate through it (x Ratio).
type OnwardPrediction struct {
	Name string
	OnwardPlan
	RawMbps float64
}

// Container names.
const (
	ContainerAgent      = "agent"
	ContainerReceive    = "receive"
	ContainerDecompress = "decompress"
)

// Container is one agent container: its CPUs (Guaranteed, exclusive), its memory and the stage
// threads it runs.
type Container struct {
	Name string
	CPUs int // whole CPUs: exclusive ones under the static CPU manager
	// MilliCPU, set instead of CPUs, is a share of the node's shared pool (not exclusive; the
	// kubelet decides which CPUs it runs on).
	MilliCPU    int64
	MemoryBytes int64
	Stages      []Stage
}

// StreamPrediction is one stream's predicted rate per stage.
type StreamPrediction struct {
	Stream     int
	RateMbit   float64
	Bottleneck StageName
	Stages     map[StageName]float64 // stage -> raw Mbit/s it can sustain
}

// Plan is the decision for the whole pipeline.
type Plan struct {
	Connections int
	Senders     []SenderPlan  // in the request's order
	Gateways    []GatewayPlan // one per stream, in the same order
	Streams     []StreamPrediction
	// RateMbit is the slowest stream's predicted raw rate; TotalMbit the sum over streams.
	RateMbit   float64
	TotalMbit  float64
	Bottleneck StageName
	// Holds is what this plan takes on the gateway: cores per NUMA node.
	Holds   map[int]int
	NICNode int
}

// Pods are the plan's pods, senders first, then the gateways in stream order.
func (p Plan) Pods() []PodPlan {
	out := make([]PodPlan, 0, len(p.Senders)+len(p.Gateways))
	for _, s := range p.Senders {
		out = append(out, s.PodPlan)
	}
	for _, g := range p.Gateways {
		out = append(out, g.PodPlan)
	}
	return out
}

// Gateway is the gateway pod of a stream.
func (p Plan) Gateway(stream int) (GatewayPlan, bool) {
	for _, g := range p.Gateways {
		if g.Stream == stream {
			return g, true
		}
	}
	return GatewayPlan{}, false
}

// RefusedError is a pipeline that does not fit; Reason says what a person can change.
type RefusedError struct{ Reason string }

func (e *RefusedError) Error() string { return e.Reason }

func refuse(format string, args ...any) error {
	return &RefusedError{Reason: fmt.Sprintf(format, args...)}
}

// Make plans the request.
func Make(r Request) (Plan, error) {
	if len(r.Senders) == 0 {
		return Plan{}, refuse("the pipeline has no senders")
	}
	if r.Ratio <= 0 || math.IsNaN(r.Ratio) {
		return Plan{}, refuse("expected compression ratio must be positive, got %v", r.Ratio)
	}
	if r.PassThrough {
		r.Ratio = 1
	}
	gw := r.Gateway
	nic, err := gw.NIC(r.GatewayNIC)
	if err != nil {
		return Plan{}, err
	}
	if nic.SpeedMbit <= 0 {
		return Plan{}, &topology.MissingLabelError{Node: gw.Name, Label: topology.NICSpeedLabel(nic.Name), Why: "the gateway NIC's speed bounds every stream"}
	}
	streams := len(r.Senders)
	if r.StreamIDs != nil && len(r.StreamIDs) != streams {
		return Plan{}, refuse("%d stream ids for %d senders", len(r.StreamIDs), streams)
	}
	id := func(i int) int {
		if r.StreamIDs == nil {
			return i
		}
		return r.StreamIDs[i]
	}
	if r.Slots != nil && len(r.Slots) != streams {
		return Plan{}, refuse("%d port slots for %d senders", len(r.Slots), streams)
	}
	slot, span := func(i int) int { return i }, streams
	if r.Slots != nil {
		slot = func(i int) int { return r.Slots[i] }
		for _, s := range r.Slots {
			span = max(span, s+1)
		}
	}
	free := map[int]int{}
	for _, nn := range gw.NUMANodes {
		free[nn.ID] = nn.CPUs - r.Held[nn.ID]
	}
	capToAllocatable(gw, nic.NUMANode, free, r.Held)
	shareMbit := float64(nic.SpeedMbit) / float64(streams+r.HeldStreams)
	rcvMbit := ReceiveMbitPerThread * r.Ratio // raw-equivalent per receiving thread
	if r.Encrypt {
		// One core receives and decrypts: the two costs per byte add up.
		rcvMbit = r.Ratio / (1/ReceiveMbitPerThread + 1/CipherMbitPerCore)
	}
	decompressMbit := gw.DecompressMBps * 8 * r.codecShare(gw)

	// Per sender: compression up to the cores available and no further.
	sides := make([]senderSide, streams)
	wantConnections := 1
	for i, s := range r.Senders {
		avail := s.UsableCPUs() - SenderOverheadCPUs
		if avail < 1 {
			return Plan{}, refuse("sender %s can give pods %d CPUs (%s): at least %d are needed (compression plus one for source and sending)",
				s.Name, s.UsableCPUs(), s.Why(), SenderOverheadCPUs+1)
		}
		perCore := s.CompressMBps * 8 * r.codecShare(s)
		n := avail
		if r.PassThrough {
			// One thread copies messages into frames: no codec work to size.
			n, perCore = 1, math.Inf(1)
		} else if r.CompressThreads > 0 {
			n = r.CompressThreads
		} else if r.TargetMbit > 0 {
			n = min(avail, int(math.Ceil(r.TargetMbit/perCore)))
		}
		link := shareMbit
		if fastest := fastestNIC(s); fastest > 0 {
			link = math.Min(link, float64(fastest))
		}
		sides[i] = senderSide{compress: n, rate: float64(n) * perCore, link: link}
		if r.Encrypt {
			sides[i] = withCipher(r, sides[i].link, perCore, n, avail, r.PassThrough || r.CompressThreads > 0)
		}
		want := math.Min(sides[i].rate, link*r.Ratio)
		if r.Encrypt {
			want = math.Min(want, sides[i].encrypt)
		}
		if r.TargetMbit > 0 {
			want = math.Min(want, r.TargetMbit)
		}
		wantConnections = max(wantConnections, int(math.Ceil(want/rcvMbit)))
	}

	// Connections: enough receiving threads for the slower of compression and the link, all on
	// the NIC's NUMA node, shared fairly with the pipelines already there.
	conns := min(wantConnections, MaxConnections)
	if r.Connections > 0 {
		conns = r.Connections
	}
	if r.ReceiveCoresLimit > 0 && conns > r.ReceiveCoresLimit {
		conns = r.ReceiveCoresLimit
	}
	nicFree := free[nic.NUMANode]
	// A receiving thread holds a whole core: with hardware threads, its sibling stays idle (a
	// busy sibling would take the core's execution units from it).
	perConn := r.receiveCPUs(gw, nic.NUMANode)
	if r.Mode == NUMAAware && conns*streams*perConn > nicFree {
		if r.Connections > 0 || nicFree < streams*perConn {
			return Plan{}, refuse("gateway %s: NUMA node %d (NIC %s) has %d free cores, %d streams x %d connections need %d receiving cores%s; other pipelines hold %d there",
				gw.Name, nic.NUMANode, nic.Name, max(nicFree, 0), streams, conns, conns*streams*perConn, wholeCores(perConn), r.Held[nic.NUMANode])
		}
		conns = nicFree / (streams * perConn)
	}
	stride := conns + r.ExtraPortsPerStream
	if r.Port > 0 && r.Port+span*stride > 65536 {
		return Plan{}, refuse("ports %d..%d run past 65535: lower spec.port", r.Port, r.Port+span*stride-1)
	}
	receiveRate := float64(conns) * rcvMbit
	receiveNUMA := NUMANIC
	if r.Mode == OS {
		receiveNUMA = NUMAAny
		frac := float64(nodeCPUs(gw, nic.NUMANode)) / float64(gw.TotalCPUs())
		receiveRate *= frac + (1-frac)*RemoteReceiveFactor
	}

	// Decompression: enough threads to keep up with what arrives, from the cores left.
	sinkCores := 0
	if r.HasSink {
		sinkCores = 1
	}
	totalFree := 0
	for _, f := range free {
		totalFree += max(f, 0)
	}
	left := totalFree - conns*streams*perConn - sinkCores*streams
	if sinkCores > 0 && left < streams && r.DecompressThreads == 0 {
		// Short of cores: the sink's thread shares the decompressing core rather than the
		// pipeline being refused.
		sinkCores = 0
		left += streams
	}
	decompress := 0
	// A gateway with no whole core left for decompression after its receivers (a small node whose
	// kubelet reserves part of a CPU) runs it in the node's shared pool, on what is left of a core.
	sharedMilli := sharedPoolMilli(r, gw, conns*streams*perConn, streams)
	if r.PassThrough {
		decompress = 1 // checks each message's checksum and hands it on: nothing to decode
		if decompress*streams > left && sharedMilli == 0 {
			return Plan{}, refuse("gateway %s: no core is left to check the messages after %d receiving cores; other pipelines hold %s", gw.Name, conns*streams*perConn, describeHeld(r.Held))
		}
		if decompress*streams <= left {
			sharedMilli = 0
		}
	} else if r.DecompressThreads > 0 {
		decompress = r.DecompressThreads
		if decompress*streams > left {
			return Plan{}, refuse("gateway %s: %d streams x %d decompress threads need %d cores, %d are free after the receivers", gw.Name, streams, decompress, decompress*streams, max(left, 0))
		}
	} else {
		for i := range sides {
			want := math.Min(math.Min(sides[i].rate, sides[i].link*r.Ratio), receiveRate)
			if r.TargetMbit > 0 {
				want = math.Min(want, r.TargetMbit)
			}
			decompress = max(decompress, int(math.Ceil(want/decompressMbit)))
		}
		if decompress*streams > left {
			decompress = left / streams
		}
		switch {
		case decompress >= 1:
			sharedMilli = 0
		case sharedMilli > 0:
			decompress = 1
		default:
			return Plan{}, refuse("gateway %s: no core is left for decompression after %d receiving cores; other pipelines hold %s", gw.Name, conns*streams*perConn, describeHeld(r.Held))
		}
	}
	if r.DecompressThreads > 0 {
		sharedMilli = 0
	}
	if sharedMilli > 0 {
		sinkCores = 0 // the sink's thread shares the pool too
	}
	decompressShare := 1.0
	if sharedMilli > 0 {
		decompressShare = float64(sharedMilli) / 1000
	}
	afterReceivers := map[int]int{}
	for k, v := range free {
		afterReceivers[k] = v
	}
	afterReceivers[nic.NUMANode] -= conns * streams * perConn
	decompressNUMA := decompressTarget(gw, nic.NUMANode, afterReceivers, decompress*streams)
	if r.Mode == OS || sharedMilli > 0 {
		decompressNUMA = NUMAAny
	}

	plan := Plan{Connections: conns, NICNode: nic.NUMANode, Holds: map[int]int{}}
	plan.RateMbit = math.Inf(1)
	onward := make([][]OnwardPrediction, len(r.Senders))
	for i, s := range r.Senders {
		st := map[StageName]float64{
			StageCompress:   sides[i].rate,
			StageNetwork:    sides[i].link * r.Ratio,
			StageReceive:    receiveRate,
			StageDecompress: float64(decompress) * decompressMbit * decompressShare,
		}
		if r.PassThrough {
			// No codec work on either side: only the network and the receivers set the rate.
			delete(st, StageCompress)
			delete(st, StageDecompress)
		}
		if r.Encrypt {
			st[StageEncrypt] = sides[i].encrypt
		}
		if r.TargetMbit > 0 {
			st[StageTarget] = r.TargetMbit
		}
		onward[i] = planOnward(r, st)
		rate, neck := slowest(st)
		plan.Streams = append(plan.Streams, StreamPrediction{Stream: id(i), RateMbit: rate, Bottleneck: neck, Stages: st})
		plan.TotalMbit += rate
		if rate < plan.RateMbit {
			plan.RateMbit, plan.Bottleneck = rate, neck
		}
		stages := []Stage{
			{Name: StageSource, Threads: 1, NUMA: NUMAAny},
			{Name: StageCompress, Threads: sides[i].compress, NUMA: NUMAAny, RateMbit: codecRate(r, sides[i].rate)},
			{Name: StageSend, Threads: conns, NUMA: NUMAAny, RateMbit: sides[i].link * r.Ratio},
		}
		if r.Encrypt {
			stages = append(stages, Stage{Name: StageEncrypt, Threads: sides[i].cipher, NUMA: NUMAAny, RateMbit: sides[i].encrypt})
		}
		pod := PodPlan{Node: s.Name, Role: RoleSender, Stream: id(i), CPUs: sides[i].compress + SenderOverheadCPUs + sides[i].cipher, Stages: stages}
		pod.Containers = senderContainers(pod, conns, r.ChunkBytes)
		plan.Senders = append(plan.Senders, SenderPlan{pod})
	}
	for i := range r.Senders {
		stages := []Stage{
			{Name: StageReceive, Threads: conns, NUMA: receiveNUMA, RateMbit: receiveRate},
			{Name: StageDecompress, Threads: decompress, NUMA: decompressNUMA, RateMbit: codecRate(r, float64(decompress)*decompressMbit*decompressShare)},
		}
		if r.HasSink {
			stages = append(stages, Stage{Name: StageSink, Threads: 1, NUMA: NUMAAny})
		}
		pod := PodPlan{Node: gw.Name, Role: RoleGateway, Stream: id(i), CPUs: conns*perConn + decompress + sinkCores, Stages: stages}
		if sharedMilli > 0 {
			pod.CPUs, pod.SharedMilliCPU = conns*perConn, sharedMilli
		}
		pod.Containers = gatewayContainers(pod, conns, conns*perConn, r.ChunkBytes, r.ExtraConsumers)
		plan.Gateways = append(plan.Gateways, GatewayPlan{PodPlan: pod, Port: r.Port + slot(i)*stride, Onward: onward[i]})
	}
	rest := (decompress + sinkCores) * streams
	if sharedMilli > 0 {
		rest = 0 // no whole core: the shared pool is the kubelet's
	}
	plan.Holds = holds(gw, nic.NUMANode, free, conns*streams*perConn, rest)
	return plan, nil
}

// senderSide is what a sender can do: its compressing threads and their rate, its share of the
// link, and its encryption (Encrypt).
type senderSide struct {
	compress int
	rate     float64
	link     float64
	cipher   int     // cores encrypting; 0: it shares the source-and-send core
	encrypt  float64 // the raw-equivalent rate they sustain
}

// withCipher sizes a sender's encryption: enough cores to encrypt what it can send (the slower of
// its compression and its link), taken from compression's cores when they are the planner's to
// choose (fixed: an explicit thread count or pass-through). Where no core is left the encryption
// shares the source-and-send core and is rated at half a core.
func withCipher(r Request, link, perCore float64, n, avail int, fixed bool) (side senderSide) {
	need := func(n int) int {
		wire := link
		if !math.IsInf(perCore, 1) {
			wire = math.Min(float64(n)*perCore/r.Ratio, link)
		}
		if r.TargetMbit > 0 {
			wire = math.Min(wire, r.TargetMbit/r.Ratio)
		}
		return int(math.Ceil(wire / CipherMbitPerCore))
	}
	c := need(n)
	for !fixed && n > 1 && n+c > avail {
		n--
		c = need(n)
	}
	c = max(0, min(c, avail-n))
	side.compress, side.rate, side.link, side.cipher = n, float64(n)*perCore, link, c
	side.encrypt = math.Max(float64(c), 0.5) * CipherMbitPerCore * r.Ratio
	return side
}

// codecRate is a codec stage's predicted rate; 0 when the stage has no codec work (pass-through).
func codecRate(r Request, mbit float64) float64 {
	if r.PassThrough {
		return 0
	}
	return mbit
}

// DefaultChunkBytes is one 2560 x 2160 16-bit projection.
const DefaultChunkBytes = 11059200

// senderContainers: a sender pod runs one agent with every stage.
func senderContainers(n PodPlan, conns int, chunk int64) []Container {
	if chunk <= 0 {
		chunk = DefaultChunkBytes
	}
	return []Container{{Name: ContainerAgent, CPUs: n.CPUs, MemoryBytes: memoryFor(chunk, n.CPUs, conns), Stages: n.Stages}}
}

// gatewayContainers: a gateway pod runs two agents. The receiving container holds a core per
// connection (`rxCPUs`: with hardware threads, every thread of those cores; its relay and I/O
// threads share them) and the NIC-locality resource; the decompressing container holds the rest
// (at least one), where one thread reads the relay's socket next to the decompressors, or, on a
// gateway with no whole core left (SharedMilliCPU), a share of the node's shared pool.
func gatewayContainers(n PodPlan, conns, rxCPUs int, chunk int64, extra []bool) []Container {
	if chunk <= 0 {
		chunk = DefaultChunkBytes
	}
	rx := Container{Name: ContainerReceive, CPUs: rxCPUs, MemoryBytes: memoryFor(chunk, rxCPUs, conns)}
	dxCPUs := max(1, n.CPUs-rxCPUs)
	dxMemory := memoryFor(chunk, dxCPUs, conns)
	for _, ordered := range extra {
		dxMemory += consumerChunks(ordered, chunk, dxCPUs) * chunk
	}
	dx := Container{Name: ContainerDecompress, CPUs: dxCPUs, MemoryBytes: (dxMemory + (1<<20 - 1)) >> 20 << 20}
	if n.SharedMilliCPU > 0 {
		dx.CPUs, dx.MilliCPU = 0, n.SharedMilliCPU
	}
	for _, s := range n.Stages {
		switch s.Name {
		case StageReceive:
			rx.Stages = append(rx.Stages, s)
		case StageDecompress:
			dx.Stages = append(dx.Stages, Stage{Name: StageReceive, Threads: 1, NUMA: s.NUMA}, s)
		default:
			dx.Stages = append(dx.Stages, s)
		}
	}
	return []Container{rx, dx}
}

// memoryFor sizes a container's memory from the buffers the agent allocates (docs/planner.md):
// per CPU ~3 chunks in flight (input, output, zero-copy on the wire), the credit window of every
// connection (8 chunks each), queues, frames and the reorder window, plus 256 MiB for code and
// ZeroMQ; rounded up to whole MiB.
// consumerChunks is what one more consumer of a gateway's decompressing agent holds at most, in
// chunks: its queue and, when it restores the order, a reorder window and the slack beyond it
// (the agent's plan_receiver_pools with the defaults the operator leaves: queue 4, ZeroMQ
// high-water mark 2, reorder window 16, adaptive room 5, one receiving connection from the
// relay). The operator's contract test checks the container against the agent's own figure.
func consumerChunks(ordered bool, chunk int64, decompressors int) int64 {
	const queue, hwm, room, window = 4, 2, 5, 16
	if !ordered {
		return queue
	}
	perConnection := int64(2*hwm+4) + (8<<20)/max(1, chunk/2)
	slack := int64(decompressors + room + queue)
	return queue + max(window, perConnection+slack) + slack
}

func memoryFor(chunk int64, cpus, connections int) int64 {
	bytes := int64(cpus*3+connections*8+28)*chunk + 256<<20
	return (bytes + (1<<20 - 1)) >> 20 << 20
}

// receiveCPUs is what one receiving thread holds on the NIC's NUMA node: a whole core, i.e. every
// hardware thread of it (1 without SMT, or when hardware threads count as cores).
func (r Request) receiveCPUs(gw topology.Node, nicNode int) int {
	if r.CountHardwareThreads {
		return 1
	}
	for _, nn := range gw.NUMANodes {
		if nn.ID == nicNode && nn.Cores > 0 && nn.CPUs > nn.Cores {
			return int(math.Round(float64(nn.CPUs) / float64(nn.Cores)))
		}
	}
	return 1
}

func wholeCores(perConn int) string {
	if perConn == 1 {
		return ""
	}
	return fmt.Sprintf(" (hardware threads: %d per connection, a whole core)", perConn)
}

// codecShare is what one codec thread on the node is worth, in measured single-core speeds.
func (r Request) codecShare(n topology.Node) float64 {
	if r.CountHardwareThreads {
		return 1
	}
	return n.CoresPerCPU()
}

// capToAllocatable lowers the free cores per NUMA node so that their sum is what the kubelet
// can still give pods on the gateway (allocatable, less what other workloads' pods request,
// minus what other pipelines hold there): the
// reserved CPUs come off the nodes without the NIC first, so receivers keep their cores.
func capToAllocatable(gw topology.Node, nicNode int, free, held map[int]int) {
	usable := gw.UsableCPUs()
	if usable >= gw.TotalCPUs() {
		return
	}
	heldTotal := 0
	for _, h := range held {
		heldTotal += h
	}
	excess := -(usable - heldTotal)
	for _, f := range free {
		excess += max(f, 0)
	}
	ids := make([]int, 0, len(free))
	for id := range free {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { // the NIC's node last, then from the highest id
		if (ids[i] == nicNode) != (ids[j] == nicNode) {
			return ids[j] == nicNode
		}
		return ids[i] > ids[j]
	})
	for _, id := range ids {
		if excess <= 0 {
			return
		}
		take := min(excess, max(free[id], 0))
		free[id] -= take
		excess -= take
	}
}

// decompressTarget: off the NIC's node when the cores there suffice (one node: its id; several:
// spread over them), else spread over every node (the paper: decompression gains from it).
func decompressTarget(gw topology.Node, nicNode int, free map[int]int, need int) NUMATarget {
	var others []int
	otherFree := 0
	for _, nn := range gw.NUMANodes {
		if nn.ID != nicNode && free[nn.ID] > 0 {
			others = append(others, nn.ID)
			otherFree += free[nn.ID]
		}
	}
	switch {
	case len(gw.NUMANodes) == 1:
		return NUMAAny
	case len(others) == 1 && need <= otherFree:
		return NUMANode(others[0])
	default:
		return NUMASpread
	}
}

// MinSharedMilliCPU is the least share of a CPU the planner gives decompression in the node's
// shared pool when no whole core is left for it.
const MinSharedMilliCPU = 250

// sharedPoolMilli is what each stream's decompression can have of the gateway's shared pool
// when its whole cores go to receivers (and other pipelines): the usable millicores left after
// them, per stream, in steps of 10m; 0 when that is under MinSharedMilliCPU.
func sharedPoolMilli(r Request, gw topology.Node, receivers, streams int) int64 {
	whole := receivers
	for _, h := range r.Held {
		whole += h
	}
	per := (gw.UsableMilliCPU() - int64(whole)*1000) / int64(streams) / 10 * 10
	if per < MinSharedMilliCPU {
		return 0
	}
	return min(per, 990)
}

// holds books receivers on the NIC node and the rest on the other nodes first.
func holds(gw topology.Node, nicNode int, free map[int]int, receivers, rest int) map[int]int {
	h := map[int]int{nicNode: receivers}
	left := map[int]int{}
	for k, v := range free {
		left[k] = v
	}
	left[nicNode] -= receivers
	ids := make([]int, 0, len(gw.NUMANodes))
	for _, nn := range gw.NUMANodes {
		if nn.ID != nicNode {
			ids = append(ids, nn.ID)
		}
	}
	ids = append(ids, nicNode)
	for _, id := range ids {
		take := min(rest, max(left[id], 0))
		if take > 0 {
			h[id] += take
			rest -= take
		}
	}
	return h
}

// planOnward sizes a stream's hop to each onward consumer for the rate its other stages allow,
// and adds the slowest hop to its stages (`st`) when it is slower than they are. The hop's path
// carries the stream compressed: 1/Ratio of its raw rate.
func planOnward(r Request, st map[StageName]float64) []OnwardPrediction {
	if len(r.Onward) == 0 {
		return nil
	}
	before, _ := slowest(st)
	out := make([]OnwardPrediction, 0, len(r.Onward))
	hop := math.Inf(1)
	for _, o := range r.Onward {
		p := PlanOnward(before/r.Ratio, len(r.Senders), o.Link, o.Connections)
		raw := p.PredictedMbps * r.Ratio
		out = append(out, OnwardPrediction{Name: o.Name, OnwardPlan: p, RawMbps: raw})
		hop = math.Min(hop, raw)
	}
	if hop < before { // a hop that keeps up is not a stage that limits (ties go to the others)
		st[StageOnward] = hop
	}
	return out
}

func slowest(stages map[StageName]float64) (float64, StageName) {
	names := make([]StageName, 0, len(stages))
	for k := range stages {
		names = append(names, k)
	}
	slices.Sort(names)
	best, neck := math.Inf(1), StageName("")
	for _, k := range names {
		if stages[k] < best {
			best, neck = stages[k], k
		}
	}
	return best, neck
}

func fastestNIC(n topology.Node) int64 {
	var best int64
	for _, nic := range n.NICs {
		best = max(best, nic.SpeedMbit)
	}
	return best
}

func nodeCPUs(n topology.Node, id int) int {
	for _, nn := range n.NUMANodes {
		if nn.ID == id {
			return nn.CPUs
		}
	}
	return 0
}

func describeHeld(h map[int]int) string {
	if len(h) == 0 {
		return "nothing"
	}
	ids := make([]int, 0, len(h))
	for k := range h {
		ids = append(ids, k)
	}
	sort.Ints(ids)
	s := ""
	for _, k := range ids {
		if s != "" {
			s += ", "
		}
		s += fmt.Sprintf("%d cores on node %d", h[k], k)
	}
	return s
}
