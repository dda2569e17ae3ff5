package planner

import (
	"math"
	"testing"
	"time"
)

func TestOneConnectionAcrossAShortCleanPathCarriesTheStream(t *testing.T) {
	p := PlanOnward(800, 1, OnwardLink{BandwidthMbps: 10000, RTT: time.Millisecond, Congestion: CongestionLossBased}, 0)
	if p.Connections != 1 || p.PredictedMbps != 800 || p.Limit != OnwardLimitStream {
		t.Fatalf("got %+v, want 1 connection carrying the stream's 800 Mbit/s", p)
	}
	// No round trip given (a local network): nothing bounds a connection.
	if p := PlanOnward(50000, 1, OnwardLink{}, 0); p.Connections != 1 || !math.IsInf(p.PerConnectionMbps, 1) {
		t.Fatalf("got %+v, want 1 unbounded connection", p)
	}
}

// Mathis et al. at 20 ms and 0.1% loss: 1448 B x 8 / 0.02 s x 1.22 / sqrt(0.001) = 22.3 Mbit/s a
// connection; 100 Mbit/s of stream needs 5 of them.
func TestLossAndRoundTripSizeTheConnectionsOfALossBasedHop(t *testing.T) {
	l := OnwardLink{BandwidthMbps: 1000, RTT: 20 * time.Millisecond, Loss: 0.001, Congestion: CongestionLossBased}
	per := l.PerConnectionMbps()
	if math.Abs(per-22.35) > 0.05 {
		t.Fatalf("per connection %.2f Mbit/s, want 22.35 (Mathis)", per)
	}
	p := PlanOnward(100, 1, l, 0)
	if p.Connections != 5 || p.PredictedMbps != 100 || p.Limit != OnwardLimitStream {
		t.Fatalf("got %+v, want 5 connections carrying 100 Mbit/s", p)
	}
	// BBR is not slowed by 0.1% loss: its window per round trip bounds it (2 MiB / 20 ms = 839 Mbit/s).
	l.Congestion = CongestionBBR
	if p := PlanOnward(100, 1, l, 0); p.Connections != 1 {
		t.Fatalf("bbr: got %+v, want 1 connection", p)
	}
	if p := PlanOnward(2000, 1, l, 0); p.Connections != 2 || p.Limit != OnwardLimitLink || p.PredictedMbps != 1000 {
		t.Fatalf("bbr, a stream faster than the link: got %+v, want 2 connections filling the 1000 Mbit/s link", p)
	}
}

// Gateways of one pipeline share the path: each plans for its share.
func TestStreamsShareThePathsBandwidth(t *testing.T) {
	l := OnwardLink{BandwidthMbps: 400, RTT: 10 * time.Millisecond, Congestion: CongestionBBR}
	p := PlanOnward(1000, 4, l, 0)
	if p.PredictedMbps != 100 || p.Limit != OnwardLimitLink || p.Connections != 1 {
		t.Fatalf("got %+v, want 100 Mbit/s (a quarter of the link) on 1 connection", p)
	}
}

// A path so lossy and long that 16 connections carry less than the stream: predicted as what
// they carry, and said so.
func TestAPathTooLossyForSixteenConnectionsIsPredictedAsWhatTheyCarry(t *testing.T) {
	l := OnwardLink{BandwidthMbps: 10000, RTT: 150 * time.Millisecond, Loss: 0.01, Congestion: CongestionLossBased}
	p := PlanOnward(5000, 1, l, 0)
	want := 16 * l.PerConnectionMbps()
	if p.Connections != MaxOnwardConnections || math.Abs(p.PredictedMbps-want) > 1e-9 || p.Limit != OnwardLimitConnections {
		t.Fatalf("got %+v, want 16 connections carrying %.1f Mbit/s", p, want)
	}
	if p.PredictedMbps >= 5000 {
		t.Fatalf("predicted %.1f, not below the stream's 5000", p.PredictedMbps)
	}
}

// Connections the spec gives are kept, and predicted as what they carry.
func TestGivenConnectionsArePredictedAsWhatTheyCarry(t *testing.T) {
	l := OnwardLink{BandwidthMbps: 1000, RTT: 20 * time.Millisecond, Loss: 0.001, Congestion: CongestionLossBased}
	p := PlanOnward(100, 1, l, 2)
	if p.Connections != 2 || math.Abs(p.PredictedMbps-2*l.PerConnectionMbps()) > 1e-9 || p.Limit != OnwardLimitConnections {
		t.Fatalf("got %+v, want 2 connections carrying %.1f", p, 2*l.PerConnectionMbps())
	}
}

// The planner adds each gateway's onward hop to its stream's stages: a hop slower than the
// pipeline is its bottleneck; sized by the planner, it keeps up. The hop carries the stream
// compressed as it came (ratio 2 here): a connection's 70.7 Mbit/s on the path are 141 Mbit/s of
// the stream, and half the connections a raw hop would need carry it.
func TestAnOnwardHopSlowerThanThePipelineIsItsBottleneck(t *testing.T) {
	r := request(updraft1)
	r.TargetMbit = 1000 // 1 Gbit/s to an HPC site 20 ms away, 0.01% loss: 70.7 Mbit/s a connection
	r.Onward = []OnwardRequest{{Name: "hpc", Link: OnwardLink{BandwidthMbps: 10000, RTT: 20 * time.Millisecond,
		Loss: 0.0001, Congestion: CongestionLossBased}, Connections: 1}}
	p, err := Make(r)
	if err != nil {
		t.Fatal(err)
	}
	g := p.Gateways[0]
	if len(g.Onward) != 1 || g.Onward[0].Name != "hpc" || g.Onward[0].Connections != 1 {
		t.Fatalf("gateway onward: %+v", g.Onward)
	}
	hop := g.Onward[0]
	if math.Abs(hop.PredictedMbps-hop.PerConnectionMbps) > 1e-9 || math.Abs(hop.RawMbps-r.Ratio*hop.PredictedMbps) > 1e-9 {
		t.Fatalf("one connection: %.1f Mbit/s on the path, %.1f raw; want %.1f and x%.0f", hop.PredictedMbps, hop.RawMbps,
			hop.PerConnectionMbps, r.Ratio)
	}
	if p.Bottleneck != StageOnward || math.Abs(p.RateMbit-hop.RawMbps) > 1e-9 {
		t.Fatalf("bottleneck %s at %.1f, want onward at %.1f", p.Bottleneck, p.RateMbit, hop.RawMbps)
	}
	r.Onward[0].Connections = 0
	p, err = Make(r)
	if err != nil {
		t.Fatal(err)
	}
	// 1000 Mbit/s raw is 500 on the path: 8 connections of 70.7 (15 for the stream decoded).
	if p.Bottleneck != StageTarget || p.Gateways[0].Onward[0].Connections != 8 {
		t.Fatalf("sized: bottleneck %s, %+v", p.Bottleneck, p.Gateways[0].Onward)
	}
	t.Logf("one connection: %.0f Mbit/s on the path, %.0f of the stream; sized: %d connections, stream %.0f Mbit/s (%s)",
		hop.PredictedMbps, hop.RawMbps, p.Gateways[0].Onward[0].Connections, p.RateMbit, p.Bottleneck)
}
