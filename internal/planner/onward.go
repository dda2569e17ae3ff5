package planner

import (
	"math"
	"time"
)

// The onward hop: a gateway carries its stream on to a numastream receiver at another site (an
// HPC or analysis site's transfer node) over a wide-area path. One TCP connection carries at most
// what its window lets through per round trip and, under a loss-based congestion control, what
// its loss recovery allows (Mathis et al.); several connections add up until the path is full.
// The model is in docs/planner.md ("The onward hop").

// Congestion is the TCP congestion control of the gateway's host (what Linux's
// net.ipv4.tcp_congestion_control says there).
type Congestion string

const (
	// CongestionLossBased: CUBIC (Linux's default) or Reno: a lost packet halves (Reno) or cuts
	// (CUBIC) the window, so loss and round trip bound a connection's rate.
	CongestionLossBased Congestion = "loss-based"
	// CongestionBBR paces to the path's measured bandwidth and round trip; random loss of a few
	// percent barely slows it.
	CongestionBBR Congestion = "bbr"
)

// Onward model constants.
const (
	// MaxOnwardConnections is the most connections an onward hop opens (the agent's limit).
	MaxOnwardConnections = 16
	// OnwardInFlightBytes is what one connection keeps in flight at most: half of Linux's default
	// largest send buffer (net.ipv4.tcp_wmem 4 MiB; the rest is the kernel's bookkeeping).
	OnwardInFlightBytes = 2 << 20
	// SegmentBytes is a TCP segment's payload on a 1500-byte MTU path.
	SegmentBytes = 1448
	// mathisC is the constant of Mathis et al.'s bound, rate = MSS/RTT x C/sqrt(loss).
	mathisC = 1.22
	// bbrLossLimit: above this loss BBR is held to the loss-based bound too.
	bbrLossLimit = 0.05
)

// OnwardLink is the path from a gateway to the far receiver.
type OnwardLink struct {
	// BandwidthMbps is the path's narrowest hop (0: not given, the stream's rate is the goal).
	BandwidthMbps float64
	// RTT is the round trip time (0: a local network, no per-connection bound).
	RTT time.Duration
	// Loss is the fraction of packets lost (0.001 = 0.1%).
	Loss float64
	// Congestion is the gateway's TCP congestion control.
	Congestion Congestion
}

// Onward limits: what bounds the predicted rate.
const (
	OnwardLimitStream      = "stream"      // the stream's own rate: the hop keeps up
	OnwardLimitLink        = "link"        // the path's bandwidth
	OnwardLimitConnections = "connections" // MaxOnwardConnections connections carry less
)

// OnwardPlan is how a gateway forwards one stream.
type OnwardPlan struct {
	Connections int
	// PerConnectionMbps is what one connection carries on this path (+Inf: no bound).
	PerConnectionMbps float64
	// PredictedMbps is the rate the hop carries the stream at, on the path.
	PredictedMbps float64
	// Limit names what bounds PredictedMbps.
	Limit string
}

// PerConnectionMbps is what one TCP connection carries across `l`: its window per round trip,
// and under a loss-based congestion control (or BBR past a few percent) Mathis et al.'s bound
// MSS/RTT x 1.22/sqrt(loss).
func (l OnwardLink) PerConnectionMbps() float64 {
	if l.RTT <= 0 {
		return math.Inf(1)
	}
	rtt := l.RTT.Seconds()
	rate := OnwardInFlightBytes * 8 / rtt / 1e6
	if l.Loss > 0 && (l.Congestion != CongestionBBR || l.Loss > bbrLossLimit) {
		rate = math.Min(rate, SegmentBytes*8/rtt*mathisC/math.Sqrt(l.Loss)/1e6)
	}
	return rate
}

// PlanOnward sizes the onward hop of one stream that arrives at `streamMbps` (as it is
// forwarded: compressed), when `streams` gateways share the path: as few connections as carry the stream,
// or the path's share of it if that is less, at most MaxOnwardConnections; or `connections`
// when given (> 0), predicted as what they carry.
func PlanOnward(streamMbps float64, streams int, l OnwardLink, connections int) OnwardPlan {
	if streams < 1 {
		streams = 1
	}
	share := math.Inf(1)
	if l.BandwidthMbps > 0 {
		share = l.BandwidthMbps / float64(streams)
	}
	goal := math.Min(streamMbps, share)
	per := l.PerConnectionMbps()
	n := 1
	if !math.IsInf(per, 1) && goal > per {
		n = int(math.Ceil(goal/per - 1e-9))
	}
	n = min(n, MaxOnwardConnections)
	if connections > 0 {
		n = connections
	}
	p := OnwardPlan{Connections: n, PerConnectionMbps: per, PredictedMbps: goal, Limit: OnwardLimitStream}
	if share < streamMbps {
		p.Limit = OnwardLimitLink
	}
	if carried := float64(n) * per; carried < goal {
		p.PredictedMbps, p.Limit = carried, OnwardLimitConnections
	}
	return p
}
