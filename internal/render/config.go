package render

import (
	"fmt"
	"strconv"

	v1alpha1 "github.com/numastream/numastream/api/v1alpha1"
	"github.com/numastream/numastream/internal/planner"
)

// agentConfig is the agent's JSON configuration for one plan entry (schema: docs/agent-config.md).
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
		gw := gatewayFor(in.Plan, n.Stream)
		cfg["endpoint"] = fmt.Sprintf("tcp://%s.%s.svc:%d", Name(sp, gw), sp.Namespace, gw.Port)
		cfg["stream_id"] = n.Stream
		cfg["source"] = sourceConfig(sp.Spec.Senders[n.Stream].Source)
	} else {
		cfg["endpoint"] = "tcp://0.0.0.0:" + strconv.Itoa(n.Port)
		cfg["streams"] = 1
		cfg["sink"] = sinkConfig(sp.Spec.Sink)
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
