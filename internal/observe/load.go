package observe

import (
	"fmt"
	"sort"
	"strings"
)

// stageTimes are one stage's cumulative counters in one agent: thread-seconds busy, blocked on
// input and on output, and the threads that share them.
type stageTimes struct {
	busy, in, out float64
	threads       float64
}

// stageCounters reads the per-stage counters of an agent (roles send, receive, relay).
func stageCounters(samples []Sample) map[string]stageTimes {
	out := map[string]stageTimes{}
	active := map[string]float64{}
	for _, s := range samples {
		role := s.Labels["role"]
		if role != "send" && role != "receive" && role != "relay" {
			continue
		}
		key := role + "/" + s.Labels["stage"]
		t := out[key]
		switch s.Name {
		case "numastream_stage_busy_seconds_total":
			t.busy = s.Value
		case "numastream_stage_blocked_seconds_total":
			if s.Labels["cause"] == "input" {
				t.in = s.Value
			} else {
				t.out = s.Value
			}
		case "numastream_thread_info":
			if s.Labels["adaptive"] == "true" {
				continue // a spare worker: counted through numastream_adaptive_active_threads
			}
			t.threads++
		case "numastream_adaptive_active_threads":
			active[key] = s.Value
			continue
		default:
			continue
		}
		out[key] = t
	}
	// A codec stage the adaptive runtime grew or shrank works with its active threads.
	for key, n := range active {
		if t, ok := out[key]; ok && n > 0 {
			t.threads = n
			out[key] = t
		}
	}
	return out
}

// Load is a stage's share of its threads' time over a window: busy, and blocked on input and on
// output (1 = every thread, the whole window).
type Load struct {
	Busy, In, Out float64
}

// loads turns two readings of an agent's counters into shares over `seconds`.
func loads(prev, cur map[string]stageTimes, seconds float64) map[string]Load {
	out := map[string]Load{}
	for key, c := range cur {
		p, ok := prev[key]
		if !ok || c.threads <= 0 || seconds <= 0 {
			continue
		}
		d := c.threads * seconds
		out[key] = Load{Busy: (c.busy - p.busy) / d, In: (c.in - p.in) / d, Out: (c.out - p.out) / d}
	}
	return out
}

// Thresholds of Bottleneck.
const (
	busyBottleneck = 0.8 // a stage this busy limits the stream
	waitBottleneck = 0.5 // threads waiting this much on one side point at that side
)

// Bottleneck names the stage that limits the streams now, from the stages' loads (the most
// loaded agent's figure per stage; keys "role/stage"), and says why; empty when no stage stands
// out. The rule:
//  1. a codec stage (compress, decompress) or the sink busy >= 80%: the busiest of them;
//  2. else the sending threads waiting on their output (credit: the gateway has not acknowledged)
//     >= 50% while the receiving threads are not busy: the network;
//  3. else the compressing threads waiting on their input >= 50%: the source (its pace, or the
//     detector);
//  4. else nothing stands out.
func Bottleneck(l map[string]Load) (string, string) {
	type cand struct {
		name string
		load Load
	}
	var busy []cand
	for _, k := range []string{"send/compress", "receive/decompress", "receive/sink"} {
		if v, ok := l[k]; ok && v.Busy >= busyBottleneck {
			busy = append(busy, cand{strings.SplitN(k, "/", 2)[1], v})
		}
	}
	if len(busy) > 0 {
		sort.Slice(busy, func(a, b int) bool { return busy[a].load.Busy > busy[b].load.Busy })
		return busy[0].name, fmt.Sprintf("%s threads busy %.0f%%", busy[0].name, 100*busy[0].load.Busy)
	}
	send, sok := l["send/send"]
	recv := maxLoad(l, "relay/receive", "receive/receive")
	if sok && send.Out >= waitBottleneck && recv.Busy < busyBottleneck {
		return "network", fmt.Sprintf("sending threads wait %.0f%% for the gateway's credit, receiving threads busy %.0f%%",
			100*send.Out, 100*recv.Busy)
	}
	if c, ok := l["send/compress"]; ok && c.In >= waitBottleneck {
		return "source", fmt.Sprintf("compressing threads wait %.0f%% for the source", 100*c.In)
	}
	return "", ""
}

func maxLoad(l map[string]Load, keys ...string) Load {
	var out Load
	for _, k := range keys {
		if v, ok := l[k]; ok && v.Busy > out.Busy {
			out = v
		}
	}
	return out
}

// spill is what a sender's spill holds now and has lost (spec.spill).
func spill(samples []Sample) (bytes, lost float64) {
	for _, s := range samples {
		switch s.Name {
		case "numastream_spill_bytes":
			bytes = s.Value
		case "numastream_spill_lost_chunks_total":
			lost = s.Value
		}
	}
	return bytes, lost
}

// mergeLoads keeps, per stage, the most loaded agent's figures.
func mergeLoads(into, from map[string]Load) {
	for k, v := range from {
		if cur, ok := into[k]; !ok || v.Busy > cur.Busy || (v.Busy == cur.Busy && v.Out > cur.Out) {
			into[k] = v
		}
	}
}
