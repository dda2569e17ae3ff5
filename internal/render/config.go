package render

import (
	"fmt"
	"net/netip"
	"path"
	"sort"
	"strconv"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/planner"
	"github.com/numastream/numastream/internal/storage"
)

// AgentConfig is one agent's JSON configuration (docs/agent-config.md). The agent's parser is
// the schema's one source of truth: the golden files under agent/tests/golden are rendered from
// these types and parsed by the agent's own tests, so the two languages cannot drift.
type AgentConfig struct {
	Version     int             `json:"version"`
	Endpoint    string          `json:"endpoint"`
	Connections int             `json:"connections"`
	ChunkBytes  int64           `json:"chunk_bytes"`
	Codec       string          `json:"codec"`
	StreamID    *int            `json:"stream_id,omitempty"`
	Origin      string          `json:"origin,omitempty"` // the pipeline, <namespace>.<name>: a far site keeps pipelines apart by it
	Streams     int             `json:"streams,omitempty"`
	Relay       bool            `json:"relay,omitempty"`
	Source      *SourceConfig   `json:"source,omitempty"`
	Sink        *SinkConfig     `json:"sink,omitempty"`
	Sinks       []SinkConfig    `json:"sinks,omitempty"` // several consumers (spec.sinks), each with its guarantee
	StateDir    string          `json:"state_dir,omitempty"`
	Spill       *SpillConfig    `json:"spill,omitempty"`
	Timeouts    *TimeoutsConfig `json:"timeouts,omitempty"`
	Metrics     MetricsConfig   `json:"metrics"`
	Preview     *PreviewConfig  `json:"preview,omitempty"`
	Placement   PlacementConfig `json:"placement"`
	Security    *SecurityConfig `json:"security,omitempty"`
}

// SourceConfig is a sender's source.
type SourceConfig struct {
	Kind     string `json:"kind"`
	Path     string `json:"path,omitempty"`
	Dataset  string `json:"dataset,omitempty"`
	Endpoint string `json:"endpoint,omitempty"`
	Chunks   *int64 `json:"chunks,omitempty"`
	Seed     *int64 `json:"seed,omitempty"`
	RateGbps *int32 `json:"rate_gbps,omitempty"`
}

// SinkConfig is where a receiver hands verified chunks.
type SinkConfig struct {
	Kind     string `json:"kind"`
	Path     string `json:"path,omitempty"`
	Dataset  string `json:"dataset,omitempty"`
	Endpoint string `json:"endpoint,omitempty"`
	// Mode: file and hdf5 sinks, the files' permission bits (octal text, spec.files.mode).
	Mode string `json:"mode,omitempty"`
	// IO: hdf5 sink, "direct" writes past the page cache (spec.sink.hdf5.io; unset: buffered).
	IO string `json:"io,omitempty"`
	// Redeliver: stream2 sink, messages kept for a consumer that goes away (nil: the agent's default).
	Redeliver *int32 `json:"redeliver,omitempty"`
	// AllowFrom: stream2 sink, the address blocks its consumers may connect from (spec's allowFrom).
	AllowFrom []string `json:"allow_from,omitempty"`
	// Layout "nxmx": hdf5 sink, series as NXmx master and data files (spec.sink.hdf5.nxmx).
	Layout        string `json:"layout,omitempty"`
	FramesPerFile int64  `json:"frames_per_file,omitempty"`
	Instrument    string `json:"instrument,omitempty"`
	Source        string `json:"source,omitempty"`
	Sample        string `json:"sample,omitempty"`
	// Guarantee: one of several sinks, "lossless" or "latest" (spec.sinks[].guarantee).
	Guarantee string `json:"guarantee,omitempty"`
	// Connections: numastream (onward) sink, the links to the far receiver (the plan's).
	Connections int `json:"connections,omitempty"`
	// Curve: numastream (onward) sink, the gateway's key and the far receiver's public key.
	Curve *OnwardCurveConfig `json:"curve,omitempty"`
	// Spill: a lossless consumer's own spill (spec.sinks[].spill).
	Spill *SpillConfig `json:"spill,omitempty"`
}

// OnwardCurveConfig keys an onward hop: the gateway's secret key (from the pipeline's keys
// Secret) and the far receiver's public key (spec.sinks[].onward.serverKey).
type OnwardCurveConfig struct {
	SecretKeyFile string `json:"secret_key_file"`
	ServerKey     string `json:"server_key"`
	Mode          string `json:"mode"`
}

// SpillConfig is a sender's node-local spill (spec.spill) or a gateway consumer's (spec.sinks[].spill).
type SpillConfig struct {
	Path     string `json:"path"`
	MaxBytes int64  `json:"max_bytes"`
}

// TimeoutsConfig: idle_s fails a started stream silent for that long (0: never).
type TimeoutsConfig struct {
	IdleSeconds int32 `json:"idle_s"`
}

// MetricsConfig is the agent's Prometheus endpoint.
type MetricsConfig struct {
	Listen string `json:"listen"`
	// TokenSHA256: the SHA-256 (hex) of the token a client off the pod's loopback must send.
	TokenSHA256 string `json:"token_sha256,omitempty"`
	// TLS: clients off the pod's loopback are served over HTTPS only (with a certificate the
	// agent makes at start); plain HTTP serves them /healthz only. On with a token.
	TLS bool `json:"tls,omitempty"`
}

// PreviewConfig is a decompressing gateway's live preview (spec.preview): on the pod's loopback
// (Listen), or with host networking on its metrics port.
type PreviewConfig struct {
	Enabled    bool   `json:"enabled"`
	MaxSide    *int32 `json:"max_side,omitempty"`
	IntervalMs *int32 `json:"interval_ms,omitempty"`
	Listen     string `json:"listen,omitempty"`
}

// PlacementConfig is where the agent pins its stage threads.
type PlacementConfig struct {
	Mode        string                 `json:"mode"`
	Stages      map[string]StageConfig `json:"stages"`
	NICNUMANode *int                   `json:"nic_numa_node,omitempty"`
}

// StageConfig is one stage's threads and NUMA target.
type StageConfig struct {
	Threads int    `json:"threads"`
	NUMA    string `json:"numa"`
}

// SecurityConfig holds the CURVE settings and, for a gateway, the addresses senders may
// connect from.
type SecurityConfig struct {
	Curve     *CurveConfig `json:"curve,omitempty"`
	AllowFrom []string     `json:"allow_from,omitempty"`
}

// CurveConfig names the key files the agent reads.
type CurveConfig struct {
	Mode            string `json:"mode"`
	SecretKeyFile   string `json:"secret_key_file"`
	ServerKeyFile   string `json:"server_key_file,omitempty"`
	AllowedKeysFile string `json:"allowed_keys_file,omitempty"`
}

// senderConfigs is a sender's configuration, by ConfigMap key, dialling endpoint. The planner
// has decided every figure; this only translates.
func senderConfigs(in Inputs, s planner.SenderPlan, endpoint string) map[string]AgentConfig {
	n := s.PodPlan
	sp := in.Pipeline
	tx := agentConfig(in, n)
	stream := n.Stream
	tx.Endpoint = endpoint
	tx.StreamID = &stream
	tx.Source = sourceConfig(sp.Spec.Senders[sp.SenderOfStream(n.Stream)].Source, podDir(in, n, false))
	tx.StateDir = StateMountPath
	if sp.Spec.Spill != nil {
		// A root is shared: each pipeline object spills under its own part of it, so that the
		// next sender of a stream recovers its own spill and never another's.
		path := SpillMountPath
		if sp.Spec.Spill.Root != "" {
			path = inVolume(SpillMountPath, storage.SpillDir(sp), podDir(in, n, true))
		}
		tx.Spill = &SpillConfig{Path: path, MaxBytes: sp.Spec.Spill.MaxBytes}
	}
	if dataKeys(in) {
		tx.Security = &SecurityConfig{Curve: &CurveConfig{Mode: securityMode(in),
			SecretKeyFile: KeysMountPath + "/secret", ServerKeyFile: KeysMountPath + "/server.public"}}
	}
	return map[string]AgentConfig{configKey(n): tx}
}

// gatewayConfigs are a gateway stream's two configurations, by ConfigMap key: the receiving
// container's, which relays to the decompressing container's.
func gatewayConfigs(in Inputs, g planner.GatewayPlan) map[string]AgentConfig {
	n := g.PodPlan
	sp := in.Pipeline
	base := agentConfig(in, n)
	base.Endpoint = "tcp://0.0.0.0:" + strconv.Itoa(g.Port)
	base.Streams = 1
	if len(sp.Spec.Sinks) > 0 {
		for _, k := range sp.Spec.Sinks {
			var c SinkConfig
			if k.Onward != nil {
				c = onwardSinkConfig(in, g, k)
			} else {
				c = *sinkConfig(&k.Sink, podDir(in, n, false))
				c.Guarantee = string(k.Guarantee)
				if c.Kind == "file" || c.Kind == "hdf5" {
					c.Mode = fmt.Sprintf("%04o", sp.Spec.FileMode())
				}
			}
			if k.Spill != nil {
				// Under the spill's root, a directory of this pipeline object, consumer and
				// stream: the next gateway process of the stream recovers it, no other.
				c.Spill = &SpillConfig{Path: inVolume(SpillMountPath, storage.ConsumerSpillDir(sp, &k, n.Stream), podDir(in, n, true)), MaxBytes: k.Spill.MaxBytes}
			}
			base.Sinks = append(base.Sinks, c)
		}
	} else {
		base.Sink = sinkConfig(sp.Spec.Sink, podDir(in, n, false))
		if base.Sink.Kind == "file" || base.Sink.Kind == "hdf5" {
			base.Sink.Mode = fmt.Sprintf("%04o", sp.Spec.FileMode())
		}
	}
	base.Timeouts = &TimeoutsConfig{IdleSeconds: idleSeconds(sp)}
	// Inside the pod the data interface has another name (Multus: net1) and sysfs shows only
	// the pod's interfaces, so the NIC's NUMA node comes from the node's labels.
	nicNode := in.Plan.NICNode
	base.Placement.NICNUMANode = &nicNode

	relay := base
	relay.Relay = true
	if dataKeys(in) {
		relay.Security = &SecurityConfig{Curve: &CurveConfig{Mode: securityMode(in),
			SecretKeyFile: KeysMountPath + "/secret", AllowedKeysFile: KeysMountPath + "/allowed"}}
	}
	if allow := allowFrom(in, n.Stream); len(allow) > 0 {
		if relay.Security == nil {
			relay.Security = &SecurityConfig{}
		}
		relay.Security.AllowFrom = allow
	}
	relay.Sink, relay.Sinks = &SinkConfig{Kind: "zmq", Endpoint: RelaySocket}, nil
	relay.Placement.Stages = placedStages(n.Containers[0].Stages)

	decompress := base
	decompress.Endpoint = RelaySocket
	decompress.Connections = 1
	_, dxMetrics := metricsPorts(in, n)
	decompress.Metrics.Listen = fmt.Sprintf("0.0.0.0:%d", dxMetrics)
	decompress.Placement.NICNUMANode = nil
	decompress.Placement.Stages = placedStages(n.Containers[1].Stages)
	if p := in.Pipeline.Spec.Preview; p != nil {
		// On the container that decodes: the relay forwards frames as they came.
		decompress.Preview = &PreviewConfig{Enabled: true, MaxSide: p.MaxSide, IntervalMs: p.IntervalMilliseconds}
		if !in.Pipeline.Spec.HostNetwork {
			// Only on the pod's loopback: reached through the API server's port-forward, which
			// it authorizes (pods/portforward in the namespace), never from the pod network.
			decompress.Preview.Listen = fmt.Sprintf("127.0.0.1:%d", PreviewPort)
		}
	}
	return map[string]AgentConfig{relayKey(n): relay, configKey(n): decompress}
}

// allowFrom is where a gateway stream admits its sender from: spec.security.allowFrom and, with
// host networking (no NetworkPolicy applies), the sender node's own addresses, one host each.
// Sorted and without repeats, so the pod template changes only when the addresses do.
func allowFrom(in Inputs, stream int) []string {
	seen := map[string]bool{}
	if sec := in.Pipeline.Spec.Security; sec != nil {
		for _, b := range sec.AllowFrom {
			seen[b] = true
		}
	}
	if in.Pipeline.Spec.HostNetwork {
		for _, a := range in.SenderAddresses[stream] {
			if ip, err := netip.ParseAddr(a); err == nil {
				seen[netip.PrefixFrom(ip.Unmap(), ip.Unmap().BitLen()).String()] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for b := range seen {
		out = append(out, b)
	}
	sort.Strings(out)
	return out
}

// placedStages are the stages an agent pins (the source, send and sink threads follow the
// agent's own defaults).
func placedStages(stages []planner.Stage) map[string]StageConfig {
	out := map[string]StageConfig{}
	for _, s := range stages {
		switch s.Name {
		case planner.StageCompress, planner.StageReceive, planner.StageDecompress:
			out[string(s.Name)] = StageConfig{Threads: s.Threads, NUMA: string(s.NUMA)}
		}
	}
	return out
}

// dataKeys: the data ports between senders and gateway use the pipeline's keys (security mode
// curve or authenticate; with mode none the Secret is only the onward hops').
func dataKeys(in Inputs) bool {
	return in.KeysSecret != "" && in.Pipeline.Spec.SecurityMode() != v1beta1.SecurityNone
}

// hopKeys: the gateway's onward hops connect with its key (every hop but an insecure-plaintext
// one).
func hopKeys(in Inputs) bool {
	if in.KeysSecret == "" {
		return false
	}
	for _, k := range in.Pipeline.Spec.Sinks {
		if k.Onward != nil && k.Onward.ServerKey != "" {
			return true
		}
	}
	return false
}

// securityMode is the agent's security.curve.mode for the pipeline's security mode.
func securityMode(in Inputs) string {
	if in.Pipeline.Spec.SecurityMode() == v1beta1.SecurityAuthenticate {
		return "authenticate"
	}
	return "encrypt"
}

// agentConfig is what every agent's configuration has: the codec, connections, chunk size,
// metrics and placement of the pod's plan.
func agentConfig(in Inputs, n planner.PodPlan) AgentConfig {
	sp := in.Pipeline
	codec := string(sp.Spec.Codec)
	if codec == "" {
		codec = "lz4"
	}
	mode := string(sp.Spec.Placement)
	if mode == "" {
		mode = string(v1beta1.PlacementNUMAAware)
	}
	stages := placedStages(n.Stages)
	agentMetrics, _ := metricsPorts(in, n)
	cfg := AgentConfig{
		Version:     1,
		Connections: in.Plan.Connections,
		ChunkBytes:  sp.Spec.ChunkBytes,
		Codec:       codec,
		Origin:      sp.Namespace + "." + sp.Name,
		Metrics:     MetricsConfig{Listen: fmt.Sprintf("0.0.0.0:%d", agentMetrics)},
		Placement:   PlacementConfig{Mode: mode, Stages: stages},
	}
	return cfg
}

// sourceConfig is a sender's source; its files' paths are in the data volume, which holds dir of
// their root.
func sourceConfig(s v1beta1.Source, dir string) *SourceConfig {
	switch {
	case s.File != nil:
		return &SourceConfig{Kind: "file", Path: inVolume(DataPathMount, s.File.Path, dir)}
	case s.HDF5 != nil:
		return &SourceConfig{Kind: "hdf5", Path: inVolume(DataPathMount, s.HDF5.Path, dir), Dataset: datasetOf(s.HDF5)}
	case s.ZMQ != nil:
		return &SourceConfig{Kind: "zmq", Endpoint: s.ZMQ.Endpoint}
	case s.Stream2 != nil:
		return &SourceConfig{Kind: "stream2", Endpoint: s.Stream2.Endpoint}
	default:
		out := &SourceConfig{Kind: "synthetic"}
		if s.Synthetic != nil {
			chunks, seed := s.Synthetic.Chunks, s.Synthetic.Seed
			out.Chunks, out.Seed, out.RateGbps = &chunks, &seed, s.Synthetic.RateGbps
		}
		return out
	}
}

// onwardSinkConfig is consumer k's onward hop from gateway stream g: the plan's connections,
// keyed with the gateway's key to the far receiver's when the pipeline has keys.
func onwardSinkConfig(in Inputs, g planner.GatewayPlan, k v1beta1.Consumer) SinkConfig {
	c := SinkConfig{Kind: "numastream", Endpoint: k.Onward.Endpoint, Guarantee: string(k.Guarantee), Connections: 1}
	for _, o := range g.Onward {
		if o.Name == k.Name {
			c.Connections = o.Connections
		}
	}
	if in.KeysSecret != "" && k.Onward.ServerKey != "" {
		// Encrypted whatever the facility network's mode: the path to another site is not the
		// facility's to trust.
		c.Curve = &OnwardCurveConfig{SecretKeyFile: KeysMountPath + "/secret", ServerKey: k.Onward.ServerKey, Mode: "encrypt"}
	}
	return c
}

// sinkConfig is a gateway's sink; its files' paths are in the data volume, which holds dir of
// their root.
func sinkConfig(s *v1beta1.Sink, dir string) *SinkConfig {
	switch {
	case s != nil && s.File != nil:
		return &SinkConfig{Kind: "file", Path: inVolume(DataPathMount, s.File.Path, dir)}
	case s != nil && s.ZMQ != nil:
		return &SinkConfig{Kind: "zmq", Endpoint: s.ZMQ.Endpoint}
	case s != nil && s.HDF5 != nil:
		out := &SinkConfig{Kind: "hdf5", Path: inVolume(DataPathMount, s.HDF5.Path, dir), Dataset: datasetOf(s.HDF5), IO: s.HDF5.IO}
		if nx := s.HDF5.NXmx; nx != nil {
			out.Layout, out.Instrument, out.Source, out.Sample = "nxmx", nx.Instrument, nx.Source, nx.Sample
			out.FramesPerFile = nx.FramesPerFile
			if out.FramesPerFile == 0 {
				out.FramesPerFile = 1000 // the CRD's default, for objects the API server did not default
			}
		}
		return out
	case s != nil && s.Stream2 != nil:
		return &SinkConfig{Kind: "stream2", Endpoint: fmt.Sprintf("tcp://*:%d", stream2Port(s.Stream2)), Redeliver: s.Stream2.Redeliver,
			AllowFrom: s.Stream2.AllowFrom}
	default:
		return &SinkConfig{Kind: "null"}
	}
}

// stream2Port is the port a stream2 sink binds on the gateway (0: no stream2 sink).
// inVolume is where the agent finds p (relative to its root) through a volume mounted at mount
// that holds dir of the root.
func inVolume(mount, p, dir string) string {
	return path.Join(mount, storage.InDir(p, dir))
}

// podDir is the directory of its root that the pod's data volume (or spill volume) holds: the
// pipeline's own (storage.Dir), or "" for the whole root or a claim.
func podDir(in Inputs, n planner.PodPlan, spill bool) string {
	for _, u := range podUses(in.Pipeline, n) {
		if u.Spill == spill {
			return storage.Dir(in.Pipeline, u, in.Roots, in.Prefixes)
		}
	}
	return ""
}

func stream2Port(s *v1beta1.Stream2Sink) int32 {
	if s == nil {
		return 0
	}
	if s.Port == 0 {
		return 31001
	}
	return s.Port
}

func datasetOf(d *v1beta1.HDF5Dataset) string {
	if d.Dataset == "" {
		return "/exchange/data"
	}
	return d.Dataset
}

// idleSeconds: how long a started stream may stay silent at the gateway. An endless source (a
// detector) pauses between scans, and a drained sender comes back when its node does: off
// unless the spec says. A source with an end: 600 s.
func idleSeconds(sp *v1beta1.StreamPipeline) int32 {
	if sp.Spec.IdleTimeoutSeconds != nil {
		return *sp.Spec.IdleTimeoutSeconds
	}
	for _, s := range sp.Spec.Senders {
		if s.Source.File == nil && s.Source.HDF5 == nil && (s.Source.Synthetic == nil || s.Source.Synthetic.Chunks == 0) {
			return 0
		}
	}
	return 600
}

// OnwardRequests are the pipeline's onward consumers (spec.sinks[].onward) as the planner
// takes them: the path each crosses, and the connections the spec fixes.
func OnwardRequests(sp *v1beta1.StreamPipeline) []planner.OnwardRequest {
	var out []planner.OnwardRequest
	for _, k := range sp.Spec.Sinks {
		o := k.Onward
		if o == nil {
			continue
		}
		r := planner.OnwardRequest{Name: k.Name, Link: planner.OnwardLink{Congestion: planner.CongestionLossBased}}
		if o.Connections != nil {
			r.Connections = int(*o.Connections)
		}
		if l := o.Link; l != nil {
			r.Link.BandwidthMbps = float64(l.BandwidthMbps)
			if l.RoundTrip != nil {
				r.Link.RTT = l.RoundTrip.Duration
			}
			if loss, err := strconv.ParseFloat(l.LossPercent, 64); err == nil {
				r.Link.Loss = loss / 100 // the API server checked its form
			}
			if l.CongestionControl == "bbr" {
				r.Link.Congestion = planner.CongestionBBR
			}
		}
		out = append(out, r)
	}
	return out
}

// ExtraConsumers are the pipeline's consumers past the first as the planner sizes their memory:
// true for one that restores the order (file, zmq, stream2, onward), false for an HDF5 one.
func ExtraConsumers(sp *v1beta1.StreamPipeline) []bool {
	var out []bool
	for i, k := range sp.Spec.Sinks {
		if i > 0 {
			out = append(out, k.HDF5 == nil)
		}
	}
	return out
}
