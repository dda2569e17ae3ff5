package facility

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/numastream/numastream/internal/render"
)

// A pipeline whose spec expects a compression ratio of 4 while the detector's frames give 2: the
// operator reads the real ratio from the gateway's agent, re-plans from it (the prediction halves
// on the 1 Gbit/s link), says so in status.planHistory and a Replanned event (as `kubectl
// describe` shows them), and the stream goes on without losing a chunk.
func TestARatioUnlikeTheSpecsIsReplannedAsTheUserSeesIt(t *testing.T) {
	sp := pipeline(t, ns, "replan", 0, `  expectedRatio: "4.0"`)
	// The gateway is detector-b, a node with QoS cgroups: a re-plan that changes the gateway
	// pod's CPUs is applied in place, which kubelet 1.36.4 cannot do without them (gateway-a: its
	// kubelet panics in doPodResizeAction; resize_test.go).
	sp.Spec.Gateway.Node = detectorB
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	defer deleteAndCheckGone(t, sp)
	var first = get(t, sp)
	eventually(t, "a plan", 60*time.Second, func() (bool, string) {
		first = get(t, sp)
		return first.Status.PredictedGbps != "", "no plan yet"
	})
	_, n := flowing(t, sp, "the stream flows", 10)
	start := time.Now()
	eventually(t, "a re-plan from the observed ratio", 90*time.Second, func() (bool, string) {
		cur := get(t, sp)
		return len(cur.Status.PlanHistory) == 1 && cur.Status.Replan != nil && cur.Status.Replan.Applied,
			"observed " + func() string {
				if cur.Status.Observed == nil {
					return "nothing"
				}
				return cur.Status.Observed.Ratio
			}()
	})
	cur := get(t, sp)
	h := cur.Status.PlanHistory[0]
	ratio, _ := strconv.ParseFloat(cur.Status.Replan.Ratio, 64)
	t.Logf("re-planned %.0f s after the stream started: %s (%s)", time.Since(start).Seconds(), h.Reason, h.Applied)
	if o := cur.Status.Observed; o != nil {
		t.Logf("observed: %s Gbit/s raw, ratio %s, bottleneck %q (%s); the plan's: %s", o.RawGbps, o.Ratio, o.Bottleneck,
			o.BottleneckDetail, cur.Status.Bottleneck)
	}
	if ratio < 1.6 || ratio > 2.5 || !strings.Contains(h.Reason, "the plan assumed 4.00") {
		t.Errorf("re-planned from ratio %v: %q", cur.Status.Replan.Ratio, h.Reason)
	}
	before, _ := strconv.ParseFloat(first.Status.PredictedGbps, 64)
	after, _ := strconv.ParseFloat(cur.Status.PredictedGbps, 64)
	if !(after < 0.75*before) || cur.Status.Bottleneck != "network" {
		t.Errorf("predicted %.1f -> %.1f Gbit/s raw, bottleneck %s: the 1 Gbit/s link carries half the raw rate at half the ratio",
			before, after, cur.Status.Bottleneck)
	}
	out, err := exec.Command(kubectl, "--kubeconfig", kubeconfig, "-n", ns, "describe", "streampipeline", sp.Name).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl describe: %v\n%s", err, out)
	}
	desc := string(out)
	t.Logf("kubectl describe streampipeline %s (excerpt):\n%s", sp.Name, describeExcerpt(desc))
	if !strings.Contains(desc, "Plan History:") || !strings.Contains(desc, "Replanned") {
		t.Errorf("kubectl describe shows no plan history or Replanned event:\n%s", desc)
	}

	gw, m := flowing(t, sp, "the stream goes on", n+10)
	final := follow(t, gw, render.DecompressContainer)
	setSuspend(t, sp, true)
	s := await(t, "the gateway pod", final)
	t.Logf("delivered %.0f by %s (%.0f before the re-plan), lost %.0f, duplicates %.0f, corrupt %.0f",
		num(s, "chunks")+num(s, "delivered_before"), gw.Name, n, num(s, "lost"), num(s, "duplicates"), num(s, "corrupt"))
	if num(s, "lost") != 0 || num(s, "duplicates") != 0 || num(s, "corrupt") != 0 || num(s, "chunks")+num(s, "delivered_before") < m {
		t.Errorf("gateway summary %v", s)
	}
}

// describeExcerpt keeps the parts of `kubectl describe` a re-plan shows up in.
func describeExcerpt(desc string) string {
	var keep []string
	on, events := false, false
	for _, line := range strings.Split(desc, "\n") {
		switch {
		case strings.HasPrefix(line, "Events:"):
			events = true
		case events:
		case strings.HasPrefix(line, "  Plan History:"), strings.HasPrefix(line, "  Replan:"),
			strings.HasPrefix(line, "  Bottleneck:"), strings.HasPrefix(line, "  Predicted Gbps:"):
			on = true
		case strings.HasPrefix(line, "  ") && !strings.HasPrefix(line, "   "):
			on = false
		}
		if (on || events) && strings.TrimSpace(line) != "" {
			keep = append(keep, line)
		}
	}
	return strings.Join(keep, "\n")
}
