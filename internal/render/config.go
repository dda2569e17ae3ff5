package render

import (
	"fmt"
	"strconv"

	v1alpha1 "github.com/numastream/numastream/api/v1alpha1"
	"github.com/numastream/numastream/internal/planner"
)

// agentConfigs are the agents' JSON configurations for one plan entry (schema:
// docs/agent-config.md), by ConfigMap key: a sender's, or a gateway's two (the receiving
// container relays to the decompressing one).
func agentConfigs(in Inputs, n planner.NodePlan) map[string]map[string]any {
	if n.Role != RoleGateway {
		tx := agentConfig(in, n)
		if in.KeysSecret != "" {
			tx["security"] = map[string]any{"curve": map[string]any{"mode": securityMode(in),
				"secret_key_file": KeysMountPath + "/secret", "server_key_file": KeysMountPath + "/server.public"}}
		}
		return map[string]map[string]any{configKey(n): tx}
	}
	relay := agentConfig(in, n)
	relay["relay"] = true
	if in.KeysSecret != "" {
		relay["security"] = map[string]any{"curve": map[string]any{"mode": securityMode(in),
			"secret_key_file": KeysMountPath + "/secret", "allowed_keys_file": KeysMountPath + "/allowed"}}
	}
	relay["sink"] = map[string]any{"kind": "zmq", "endpoint": RelaySocket}
	relay["placement"] = map[string]any{
		"mode":          relay["placement"].(map[string]any)["mode"],
		"stages":        pick(relay["placement"].(map[string]any)["stages"].(map[string]any), planner.StageReceive),
		"nic_numa_node": in.Plan.NICNode,
	}
	decompress := agentConfig(in, n)
	decompress["endpoint"] = RelaySocket
	decompress["connections"] = 1
	decompress["metrics"] = map[string]any{"listen": fmt.Sprintf("0.0.0.0:%d", DecompressMetricsPort)}
	stages := pick(decompress["placement"].(map[string]any)["stages"].(map[string]any), planner.StageDecompress)
	if d, ok := stages[planner.StageDecompress].(map[string]any); ok {
		// Its one receiving thread (reading the IPC socket) runs next to the decompressors.
		stages[planner.StageReceive] = map[string]any{"threads": 1, "numa": d["numa"]}
	}
	decompress["placement"] = map[string]any{"mode": decompress["placement"].(map[string]any)["mode"], "stages": stages}
	return map[string]map[string]any{relayKey(n): relay, configKey(n): decompress}
}

// securityMode is the agent's security.curve.mode for the pipeline's security mode.
func securityMode(in Inputs) string {
	if s := in.Pipeline.Spec.Security; s != nil && s.Mode == v1alpha1.SecurityAuthenticate {
		return "authenticate"
	}
	return "encrypt"
}

func pick(stages map[string]any, names ...string) map[string]any {
	out := map[string]any{}
	for _, n := range names {
		if v, ok := stages[n]; ok {
			out[n] = v
		}
	}
	return out
}

// agentConfig is one agent's configuration before the gateway split.
func agentConfig(in Inputs, n planner.NodePlan) map[string]any {
	sp := in.Pipeline
	codec := string(sp.Spec.Codec)
	if codec == "" {
		codec = "lz4"
	}
	mode := string(sp.Spec.Placement)
	if mode == "" {
		mode = string(v1alpha1.PlacementNUMAAware)
	}
	stages := map[string]any{}
	for _, s := range n.Stages {
		switch s.Name {
		case planner.StageCompress, planner.StageReceive, planner.StageDecompress:
			stages[s.Name] = map[string]any{"threads": s.Threads, "numa": s.NUMA}
		}
	}
	cfg := map[string]any{
		"version":     1,
		"connections": in.Plan.Connections,
		"chunk_bytes": sp.Spec.ChunkBytes,
		"codec":       codec,
		"metrics":     map[string]any{"listen": fmt.Sprintf("0.0.0.0:%d", MetricsPort)},
	}
	placement := map[string]any{"mode": mode, "stages": stages}
	if n.Role == RoleSender {
		cfg["endpoint"] = senderEndpoint(in, n)
		cfg["stream_id"] = n.Stream
		cfg["source"] = sourceConfig(sp.Spec.Senders[n.Stream].Source)
		cfg["state_dir"] = StateMountPath
	} else {
		cfg["endpoint"] = "tcp://0.0.0.0:" + strconv.Itoa(n.Port)
		cfg["streams"] = 1
		cfg["sink"] = sinkConfig(sp.Spec.Sink)
		cfg["timeouts"] = map[string]any{"idle_s": idleSeconds(sp)}
		// Inside the pod the data interface has another name (Multus: net1) and sysfs shows only
		// the pod's interfaces, so the NIC's NUMA node comes from the node's labels.
		placement["nic_numa_node"] = in.Plan.NICNode
	}
	cfg["placement"] = placement
	return cfg
}

func gatewayFor(p planner.Plan, stream int) planner.NodePlan {
	for _, n := range p.Nodes {
		if n.Role == RoleGateway && n.Stream == stream {
			return n
		}
	}
	return planner.NodePlan{}
}

func sourceConfig(s v1alpha1.Source) map[string]any {
	switch {
	case s.File != nil:
		return map[string]any{"kind": "file", "path": DataPathMount}
	case s.ZMQ != nil:
		return map[string]any{"kind": "zmq", "endpoint": s.ZMQ.Endpoint}
	default:
		out := map[string]any{"kind": "synthetic"}
		if s.Synthetic != nil {
			out["chunks"] = s.Synthetic.Chunks
			out["seed"] = s.Synthetic.Seed
			if s.Synthetic.RateGbps != nil {
				out["rate_gbps"] = *s.Synthetic.RateGbps
			}
		}
		return out
	}
}

func sinkConfig(s *v1alpha1.Sink) map[string]any {
	switch {
	case s != nil && s.File != nil:
		return map[string]any{"kind": "file", "path": DataPathMount + "/" + baseOf(s.File.Path)}
	case s != nil && s.ZMQ != nil:
		return map[string]any{"kind": "zmq", "endpoint": s.ZMQ.Endpoint}
	default:
		return map[string]any{"kind": "null"}
	}
}

// idleSeconds: how long a started stream may stay silent at the gateway. An endless source (a
// detector) pauses between scans, and a drained sender comes back when its node does: off
// unless the spec says. A source with an end: 600 s.
func idleSeconds(sp *v1alpha1.StreamPipeline) int32 {
	if sp.Spec.IdleTimeoutSeconds != nil {
		return *sp.Spec.IdleTimeoutSeconds
	}
	for _, s := range sp.Spec.Senders {
		if s.Source.File == nil && (s.Source.Synthetic == nil || s.Source.Synthetic.Chunks == 0) {
			return 0
		}
	}
	return 600
}
