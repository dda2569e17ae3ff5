package facility

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/render"
)

// leaseName is the operator's leader election Lease (cmd/operator).
const leaseName = "numastream-operator.numastream.io"

// Two operator replicas with leader election; the leader is killed (SIGKILL: no lease released)
// while a re-plan is being counted (the observed ratio departs from the spec's, one reading of
// three counted). The other replica takes the lease once it expires, goes on counting from
// status.departure (the next reading is the second, not a first), re-plans at the third, and no
// stream ever has two Jobs or two running gateway pods; nothing is lost.
func TestKillingTheLeaderMidReplanKeepsTheCountAndMakesNoDuplicate(t *testing.T) {
	t.Logf("%s", strings.TrimSpace(facilityScript(t, "operator-replicas", "2")))
	defer func() { t.Logf("%s", strings.TrimSpace(facilityScript(t, "operator-replicas", "1"))) }()
	leader := leaseHolder(t, "")
	t.Logf("leader: %s", leader)

	sp := pipeline(t, ns, "failover", 0, `  expectedRatio: "4.0"`)
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	defer deleteAndCheckGone(t, sp)
	_, n := flowing(t, sp, "the stream flows", 5)

	// Watch the pipeline meanwhile: its Jobs and running pods per stream and role, and every
	// departure count status shows.
	var mu sync.Mutex
	var readings []int32
	var trace []string // every change of status.departure and status.replan, for a failure to explain itself
	var lastSeen string
	var lastRead time.Time // when the watch's last successful reading began
	var dup string
	stop := make(chan struct{})
	watched := make(chan struct{})
	stopWatching := sync.OnceFunc(func() { close(stop); <-watched })
	defer stopWatching() // before the pipeline is deleted
	go func() {
		defer close(watched)
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			cur := &v1beta1.StreamPipeline{}
			var jobs batchv1.JobList
			var pods corev1.PodList
			sel := client.MatchingLabels{render.LabelPipeline: sp.Name}
			// Each reading is bounded: a call that hangs (a dead connection) must not blind the
			// watch for the rest of the test; a failed one is kept in the trace.
			began := time.Now()
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := k8s.Get(cctx, client.ObjectKeyFromObject(sp), cur)
			if err == nil {
				err = k8s.List(cctx, &jobs, client.InNamespace(ns), sel)
			}
			if err == nil {
				err = k8s.List(cctx, &pods, client.InNamespace(ns), sel)
			}
			cancel()
			mu.Lock()
			if err != nil {
				if seen := "reading failed: " + err.Error(); seen != lastSeen {
					trace = append(trace, time.Now().Format("15:04:05.000")+" "+seen)
					lastSeen = seen
				}
				mu.Unlock()
				continue
			}
			lastRead = began
			if d := cur.Status.Departure; d != nil && (len(readings) == 0 || readings[len(readings)-1] != d.Readings) {
				readings = append(readings, d.Readings)
			}
			if seen := fmt.Sprintf("departure %s replan %s", departureText(cur.Status.Departure), replanText(cur.Status.Replan)); seen != lastSeen {
				trace = append(trace, time.Now().Format("15:04:05.000")+" "+seen)
				lastSeen = seen
			}
			live := map[string]int{}
			for _, j := range jobs.Items {
				if j.DeletionTimestamp == nil {
					live["job "+j.Labels[render.LabelRole]+" "+j.Labels[render.LabelStream]]++
				}
			}
			for _, p := range pods.Items {
				if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
					live["running pod "+p.Labels[render.LabelRole]+" "+p.Labels[render.LabelStream]]++
				}
			}
			for what, c := range live {
				if c > 1 && dup == "" {
					dup = fmt.Sprintf("%d of %s at %s", c, what, time.Now().Format(time.TimeOnly))
				}
			}
			mu.Unlock()
		}
	}()

	eventually(t, "a departing reading counted", 90*time.Second, func() (bool, string) {
		cur := get(t, sp)
		d := cur.Status.Departure
		return d != nil && d.Readings == 1 && cur.Status.Replan == nil, fmt.Sprintf("departure %+v", d)
	})
	killed := time.Now()
	pod := strings.SplitN(leader, "_", 2)[0]
	if err := k8s.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: "numastream-system"}}, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed the leader %s with one departing reading counted", pod)
	next := leaseHolder(t, leader)
	took := time.Since(killed)
	t.Logf("%s took the lease %.1f s later", next, took.Seconds())
	if took > 25*time.Second { // the lease (15 s) and a retry period (2 s), with slack for this machine
		t.Errorf("the new leader took %.1f s", took.Seconds())
	}
	eventually(t, "the re-plan, by the new leader", 120*time.Second, func() (bool, string) {
		cur := get(t, sp)
		return len(cur.Status.PlanHistory) == 1 && cur.Status.Replan != nil && cur.Status.Replan.Applied,
			fmt.Sprintf("departure %+v", cur.Status.Departure)
	})
	replanSeen := time.Now()
	gw, m := flowing(t, sp, "the stream goes on after the re-plan", n+5)
	// The watch must have read the status the re-plan wrote before it is stopped: flowing can
	// return at once (the gateway had delivered enough already), and a watch stopped between two
	// readings then missed the re-plan's count (the counts read [1 2]).
	eventually(t, "the watch read the status after the re-plan", 30*time.Second, func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return lastRead.After(replanSeen), "its last reading began at " + lastRead.Format("15:04:05.000")
	})
	stopWatching()
	mu.Lock()
	defer mu.Unlock()
	t.Logf("departure counts status showed: %v", readings)
	// 1 (the old leader), then 2 (the new one, counting on), then 0 (the third: re-planned).
	if len(readings) != 3 || readings[0] != 1 || readings[1] != 2 || readings[2] != 0 {
		t.Errorf("departure counts %v, want 1, 2, then 0 with the re-plan: the new leader did not count on; what status showed "+
			"(the watch's last reading began at %s):\n%s", readings, lastRead.Format("15:04:05.000"), strings.Join(trace, "\n"))
	}
	if dup != "" {
		t.Errorf("duplicate: %s", dup)
	}
	final := follow(t, gw, render.DecompressContainer)
	setSuspend(t, sp, true)
	s := await(t, "the gateway pod", final)
	t.Logf("delivered %.0f (%.0f before the kill), lost %.0f, duplicates %.0f", num(s, "chunks")+num(s, "delivered_before"), n,
		num(s, "lost"), num(s, "duplicates"))
	if num(s, "lost") != 0 || num(s, "duplicates") != 0 || num(s, "corrupt") != 0 || num(s, "chunks")+num(s, "delivered_before") < m {
		t.Errorf("gateway summary %v", s)
	}
}

// leaseHolder waits for the operator's Lease to be held by a running operator pod other than not,
// and returns its holder ("<pod>_<uuid>"). (A Lease outlives the replicas that held it: an
// earlier holder's name may still be in it.)
func leaseHolder(t *testing.T, not string) string {
	t.Helper()
	var holder string
	eventually(t, "a leader other than "+not, 90*time.Second, func() (bool, string) {
		l := &coordinationv1.Lease{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: "numastream-system", Name: leaseName}, l); err != nil {
			return false, err.Error()
		}
		if l.Spec.HolderIdentity == nil {
			return false, "no holder"
		}
		holder = *l.Spec.HolderIdentity
		p := &corev1.Pod{}
		err := k8s.Get(ctx, client.ObjectKey{Namespace: "numastream-system", Name: strings.SplitN(holder, "_", 2)[0]}, p)
		alive := err == nil && p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil
		return holder != "" && holder != not && alive, fmt.Sprintf("%s (its pod running: %v)", holder, alive)
	})
	return holder
}

func departureText(d *v1beta1.Departure) string {
	if d == nil {
		return "none"
	}
	at := ""
	if d.LastReadingAt != nil {
		at = d.LastReadingAt.Format("15:04:05.000")
	}
	return fmt.Sprintf("%d (first %s, last at %s)", d.Readings, d.FirstRatio, at)
}

func replanText(r *v1beta1.Replan) string {
	if r == nil {
		return "none"
	}
	return fmt.Sprintf("ratio %s applied %v", r.Ratio, r.Applied)
}
