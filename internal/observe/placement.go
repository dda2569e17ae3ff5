package observe

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
)

// threadRow is one stage of one agent as its numastream_thread_info samples report it.
type threadRow struct {
	agent, stage string
	threads      int
	cpus, nodes  map[int]bool
	// plannedNodes are the NUMA nodes of the plan's threads, without the adaptive runtime's
	// spare and extra workers (which sit on other stages' CPUs by design).
	plannedNodes map[int]bool
}

// threadRows groups an agent's numastream_thread_info samples by (agent role, stage); the I/O
// thread (ZeroMQ's, not a stage of the plan) is left out. The adaptive runtime's workers count
// in the threads and CPUs (the kernel runs them there) but not in whether the stage is on plan.
func threadRows(samples []Sample) []threadRow {
	byKey := map[string]*threadRow{}
	var keys []string
	for _, s := range samples {
		if s.Name != "numastream_thread_info" || s.Labels["stage"] == "io" || s.Labels["stage"] == "" {
			continue
		}
		key := s.Labels["role"] + "/" + s.Labels["stage"]
		r, ok := byKey[key]
		if !ok {
			r = &threadRow{agent: s.Labels["role"], stage: s.Labels["stage"], cpus: map[int]bool{}, nodes: map[int]bool{},
				plannedNodes: map[int]bool{}}
			byKey[key] = r
			keys = append(keys, key)
		}
		r.threads++
		if cpu, err := strconv.Atoi(s.Labels["cpu"]); err == nil && cpu >= 0 {
			r.cpus[cpu] = true
		}
		if node, err := strconv.Atoi(s.Labels["numa_node"]); err == nil && node >= 0 {
			r.nodes[node] = true
			if s.Labels["adaptive"] != "true" {
				r.plannedNodes[node] = true
			}
		}
	}
	sort.Strings(keys)
	out := make([]threadRow, 0, len(keys))
	for _, k := range keys {
		out = append(out, *byKey[k])
	}
	return out
}

// plannedTarget is the plan's NUMA target of `stage` for the pod of `role` and `stream`, with
// "nic" resolved to the NIC's node. In a gateway pod the decompressing agent's one receiving
// thread reads the relay next to the decompressors: its target is theirs.
func plannedTarget(plan *v1beta1.Plan, role string, stream int32, agent, stage string) string {
	if plan == nil {
		return ""
	}
	if role == "gateway" && agent == "receive" && stage == "receive" {
		stage = "decompress"
	}
	for _, n := range plan.Nodes {
		if n.Role != role || (role == "sender" && (n.StreamID == nil || *n.StreamID != stream)) {
			continue
		}
		for _, st := range n.Stages {
			if st.Stage != stage {
				continue
			}
			if st.NUMA == "nic" {
				return strconv.Itoa(int(plan.NICNUMANode))
			}
			return st.NUMA
		}
	}
	return ""
}

// placementOf is the status rows of one pod's agents.
func placementOf(plan *v1beta1.Plan, role string, stream int32, rows []threadRow) []v1beta1.StagePlacement {
	out := make([]v1beta1.StagePlacement, 0, len(rows))
	for _, r := range rows {
		planned := plannedTarget(plan, role, stream, r.agent, r.stage)
		onPlan := true
		if want, err := strconv.Atoi(planned); err == nil {
			for n := range r.plannedNodes {
				onPlan = onPlan && n == want
			}
		}
		out = append(out, v1beta1.StagePlacement{Stream: stream, Role: role, Agent: r.agent, Stage: r.stage,
			Threads: int32(r.threads), CPUs: cpuList(r.cpus), NUMANodes: nodeList(r.nodes), Planned: planned, OnPlan: onPlan})
	}
	return out
}

func sortedKeys(m map[int]bool) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}

// cpuList formats CPUs as a cpulist ("0-3,8").
func cpuList(m map[int]bool) string {
	ids := sortedKeys(m)
	var parts []string
	for i := 0; i < len(ids); {
		j := i
		for j+1 < len(ids) && ids[j+1] == ids[j]+1 {
			j++
		}
		if i == j {
			parts = append(parts, strconv.Itoa(ids[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", ids[i], ids[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

func nodeList(m map[int]bool) string {
	var parts []string
	for _, n := range sortedKeys(m) {
		parts = append(parts, strconv.Itoa(n))
	}
	if len(parts) == 0 {
		return "unknown"
	}
	return strings.Join(parts, ",")
}

// consumerRow is one consumer's numastream_consumer_* samples of an agent with several sinks.
type consumerRow struct {
	index                      int
	kind, guarantee            string
	chunks, passedOver, behind float64
	spillBytes                 float64
}

// consumerRows reads the numastream_consumer_* samples, by consumer index.
func consumerRows(samples []Sample) []consumerRow {
	byIndex := map[int]*consumerRow{}
	for _, s := range samples {
		var field func(*consumerRow) *float64
		switch s.Name {
		case "numastream_consumer_chunks_total":
			field = func(r *consumerRow) *float64 { return &r.chunks }
		case "numastream_consumer_passed_over_total":
			field = func(r *consumerRow) *float64 { return &r.passedOver }
		case "numastream_consumer_behind":
			field = func(r *consumerRow) *float64 { return &r.behind }
		case "numastream_consumer_spill_bytes":
			field = func(r *consumerRow) *float64 { return &r.spillBytes }
		default:
			continue
		}
		i, err := strconv.Atoi(s.Labels["consumer"])
		if err != nil || i < 0 {
			continue
		}
		r, ok := byIndex[i]
		if !ok {
			r = &consumerRow{index: i, kind: s.Labels["kind"], guarantee: s.Labels["guarantee"]}
			byIndex[i] = r
		}
		*field(r) = s.Value
	}
	out := make([]consumerRow, 0, len(byIndex))
	for _, r := range byIndex {
		out = append(out, *r)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].index < out[b].index })
	return out
}

// consumersOf is the status rows of one stream's consumers, named as in spec.sinks.
func consumersOf(sp *v1beta1.StreamPipeline, stream int32, rows []consumerRow) []v1beta1.ConsumerStatus {
	ks := sp.Spec.Consumers()
	out := make([]v1beta1.ConsumerStatus, 0, len(rows))
	for _, r := range rows {
		name := strconv.Itoa(r.index)
		if r.index < len(ks) {
			name = ks[r.index].Name
		}
		out = append(out, v1beta1.ConsumerStatus{Stream: stream, Name: name, Kind: r.kind, Guarantee: r.guarantee,
			Chunks: int64(r.chunks), PassedOver: int64(r.passedOver), Behind: int64(r.behind), SpillBytes: int64(r.spillBytes)})
	}
	return out
}
