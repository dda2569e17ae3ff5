package controllers

import (
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/conditions"
	"github.com/numastream/numastream/internal/observe"
)

// Only curve costs cores per byte: the planner budgets them for it (the default), not for
// authenticate (frames travel as they are) or none.
func TestThePlannerBudgetsEncryptionOnlyForCurve(t *testing.T) {
	for mode, want := range map[v1beta1.SecurityMode]bool{
		"": true, v1beta1.SecurityCurve: true, v1beta1.SecurityAuthenticate: false, v1beta1.SecurityNone: false,
	} {
		sp := &v1beta1.StreamPipeline{}
		if mode != "" {
			sp.Spec.Security = &v1beta1.Security{Mode: mode}
		}
		if got := request(sp, facts{}).Encrypt; got != want {
			t.Errorf("security mode %q: planner Encrypt = %v, want %v", mode, got, want)
		}
	}
}

// The re-plan watch lives in status: a new leader (a fresh Observer) goes on counting the
// departing readings the last one counted, and re-plans at the third, not at its own third.
func TestANewLeaderGoesOnCountingDeparturesFromStatus(t *testing.T) {
	sp := &v1beta1.StreamPipeline{}
	sp.Spec.ExpectedRatio = "2.0"
	sp.Spec.Senders = []v1beta1.Sender{{Node: "det-a", Source: v1beta1.Source{Synthetic: &v1beta1.SyntheticSource{Chunks: 100}}}}
	sp.Status.Plan = &v1beta1.Plan{}
	obs := &v1beta1.Observed{Ratio: "3.50", DecompressMBps: "900"}
	for reading := 1; reading <= 3; reading++ {
		(&Observer{}).considerReplan(sp, obs) // each reading by another leader
		d := sp.Status.Departure
		if reading < 3 {
			if d == nil || d.Readings != int32(reading) || sp.Status.Replan != nil {
				t.Fatalf("reading %d: departure %+v, replan %+v", reading, d, sp.Status.Replan)
			}
		} else if sp.Status.Replan == nil || sp.Status.Replan.Ratio != "3.50" || d.Readings != 0 || d.LastReplanAt == nil {
			t.Fatalf("the third reading in a row should re-plan: departure %+v, replan %+v", d, sp.Status.Replan)
		}
		// The next reading comes a rate window later.
		back := metav1.NewMicroTime(d.LastReadingAt.Add(-2 * observe.MinRateWindow))
		d.LastReadingAt = &back
	}
	// A new leader's first reading has no rate window to take a ratio from: it neither counts
	// nor starts the count again.
	sp.Status.Replan = nil
	sp.Status.Departure = &v1beta1.Departure{Readings: 2, FirstRatio: "3.5000"}
	(&Observer{}).considerReplan(sp, &v1beta1.Observed{Ratio: ""})
	if d := sp.Status.Departure; d.Readings != 2 || sp.Status.Replan != nil {
		t.Errorf("a reading without a ratio changed the count: %+v", d)
	}
	(&Observer{}).considerReplan(sp, obs)
	if sp.Status.Replan == nil {
		t.Errorf("the third departing reading after one without a ratio did not re-plan: %+v", sp.Status.Departure)
	}
	// Within the same rate window a reading is not counted again, by any leader.
	now := metav1.NewMicroTime(time.Now())
	sp.Status.Replan.Applied = true
	sp.Status.Departure = &v1beta1.Departure{Readings: 1, FirstRatio: "3.5000", LastReadingAt: &now}
	(&Observer{}).considerReplan(sp, obs)
	if sp.Status.Departure.Readings != 1 {
		t.Errorf("a reading inside the rate window counted: %+v", sp.Status.Departure)
	}
	// Re-planning turned off: the watch is dropped.
	sp.Spec.Replan = ReplanOff
	(&Observer{}).considerReplan(sp, obs)
	if sp.Status.Departure != nil {
		t.Errorf("watch kept with re-planning off: %+v", sp.Status.Departure)
	}
}

// A pipeline converging towards what its watches report (pods, Jobs, nodes) is not reconciled
// on a timer: 1000 pending pipelines would be 100 reconciles a second. It is while a Job has
// no pod (the Job controller's refusals are events, not watched), while a refusal may go away
// by itself, while Jobs are replaced, and at its next key rotation.
func TestAPipelineIsReconciledOnATimerOnlyForWhatNoWatchReports(t *testing.T) {
	reconciling := func() *v1beta1.StreamPipeline {
		sp := &v1beta1.StreamPipeline{}
		sp.Status.Conditions = []metav1.Condition{{Type: conditions.Reconciling, Status: metav1.ConditionTrue}}
		return sp
	}
	converged := &v1beta1.StreamPipeline{}
	podless := facts{podless: map[string]*batchv1.Job{"p-sender-0": {}}}
	for _, c := range []struct {
		name string
		sp   *v1beta1.StreamPipeline
		f    facts
		d    Decision
		want time.Duration
	}{
		{"waiting for pods of its Jobs", reconciling(), facts{}, Decision{}, 0},
		{"a Job without a pod", reconciling(), podless, Decision{}, 10 * time.Second},
		{"a refusal that may go away", reconciling(), facts{},
			Decision{Facts: conditions.Facts{Refusal: &conditions.Refusal{Reason: "NoStorageRoot", Retry: true}}}, 10 * time.Second},
		{"a refusal only a change of the pipeline lifts", reconciling(), facts{},
			Decision{Facts: conditions.Facts{Refusal: &conditions.Refusal{Reason: ReasonNoCapacity}}}, 0},
		{"replacing its Jobs", reconciling(), facts{}, Decision{Facts: conditions.Facts{Replacing: true}}, 2 * time.Second},
		{"a key rotation due sooner than the poll", reconciling(), podless, Decision{NextRotation: 4 * time.Second}, 4 * time.Second},
		{"a key rotation due later than the poll", reconciling(), podless, Decision{NextRotation: time.Hour}, 10 * time.Second},
		{"converged, a key rotation due", converged, facts{}, Decision{NextRotation: time.Hour}, time.Hour},
		{"converged with a Job without a pod (completed)", converged, podless, Decision{}, 0},
	} {
		if got := requeueAfter(c.sp, c.f, c.d); got != c.want {
			t.Errorf("%s: reconciled again after %v, want %v", c.name, got, c.want)
		}
	}
}

// What a pass would apply is held by an object when every field it sets has the value it sets:
// the API server's defaults and other managers' fields do not count; a value changed, a field
// or list item gone, or a list grown does.
func TestAnObjectHoldsWhatWouldBeAppliedOnlyWithEveryFieldAsSet(t *testing.T) {
	want := map[string]any{
		"metadata": map[string]any{"labels": map[string]any{"a": "1"}, "creationTimestamp": nil},
		"spec":     map[string]any{"ports": []any{map[string]any{"port": int64(5555)}}, "replicas": int64(2)},
	}
	have := func(edit func(map[string]any)) map[string]any {
		h := map[string]any{
			"metadata": map[string]any{"labels": map[string]any{"a": "1", "other": "x"}, "uid": "u", "creationTimestamp": "2026-11-27T00:00:00Z"},
			"spec": map[string]any{"ports": []any{map[string]any{"port": int64(5555), "protocol": "TCP"}}, "replicas": int64(2),
				"clusterIP": "10.0.0.1"},
			"status": map[string]any{"ready": true},
		}
		if edit != nil {
			edit(h)
		}
		return h
	}
	spec := func(h map[string]any) map[string]any { return h["spec"].(map[string]any) }
	for _, c := range []struct {
		name string
		have map[string]any
		want bool
	}{
		{"as applied, with defaults and others' fields", have(nil), true},
		{"a value changed", have(func(h map[string]any) { spec(h)["replicas"] = int64(3) }), false},
		{"a label removed", have(func(h map[string]any) { delete(h["metadata"].(map[string]any)["labels"].(map[string]any), "a") }), false},
		{"a list item added", have(func(h map[string]any) {
			spec(h)["ports"] = append(spec(h)["ports"].([]any), map[string]any{"port": int64(6000)})
		}), false},
		{"a list item changed", have(func(h map[string]any) { spec(h)["ports"].([]any)[0].(map[string]any)["port"] = int64(1) }), false},
		{"a field of a different type", have(func(h map[string]any) { spec(h)["ports"] = "5555" }), false},
	} {
		if got := contains(c.have, want); got != c.want {
			t.Errorf("%s: holds = %v, want %v", c.name, got, c.want)
		}
	}
}

// A new pipeline's events say what was decided (planned), not that nothing has gone wrong or
// happened yet (its agents starting); a later change of any condition is an event, Degraded,
// NICLocal and Ready's Pending included, one event for what several conditions say at once. The
// scheduler counting the nodes anew is no change.
func TestANewPipelineRecordsEventsOnlyForWhatHappened(t *testing.T) {
	rec := events.NewFakeRecorder(16)
	r := &StreamPipelineReconciler{Recorder: rec}
	sp := &v1beta1.StreamPipeline{}
	cond := func(typ string, status metav1.ConditionStatus, reason string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: status, Reason: reason, Message: reason}
	}
	got := func() []string {
		var out []string
		for {
			select {
			case e := <-rec.Events:
				out = append(out, strings.Fields(e)[1])
			default:
				return out
			}
		}
	}
	r.setConditions(sp, []metav1.Condition{
		cond(v1beta1.ConditionPlanned, metav1.ConditionTrue, ReasonPlanned),
		cond(v1beta1.ConditionReady, metav1.ConditionFalse, ReasonPending),
		cond(v1beta1.ConditionDegraded, metav1.ConditionFalse, conditions.ReasonHealthy),
		cond(v1beta1.ConditionNICLocal, metav1.ConditionUnknown, conditions.ReasonAwaitingAgents),
		cond(conditions.Reconciling, metav1.ConditionTrue, ReasonPending),
	})
	if e := got(); !slices.Equal(e, []string{ReasonPlanned}) {
		t.Errorf("a new pipeline's events: %v, want Planned", e)
	}
	unschedulable := func(msg string) metav1.Condition {
		c := cond(v1beta1.ConditionReady, metav1.ConditionFalse, conditions.ReasonUnschedulable)
		c.Message = msg
		return c
	}
	first := "pod p cannot be scheduled: 0/205 nodes are available: 168 node(s) didn't match Pod's node affinity/selector, 37 Insufficient cpu."
	stalled := func(msg string) metav1.Condition {
		c := cond(conditions.Stalled, metav1.ConditionTrue, conditions.ReasonUnschedulable)
		c.Message = "stalled: " + msg
		return c
	}
	r.setConditions(sp, []metav1.Condition{unschedulable(first), stalled(first)}) // one event says it
	again := strings.NewReplacer("168", "200", "37", "5").Replace(first)
	r.setConditions(sp, []metav1.Condition{unschedulable(again), stalled(again)})
	if c := meta.FindStatusCondition(sp.Status.Conditions, v1beta1.ConditionReady); c == nil || c.Message != first {
		t.Errorf("Ready after the scheduler counted anew: %+v, want the first wording kept", c)
	}
	r.setConditions(sp, []metav1.Condition{cond(v1beta1.ConditionReady, metav1.ConditionFalse, ReasonPending)})
	if e := got(); !slices.Equal(e, []string{conditions.ReasonUnschedulable, ReasonPending}) {
		t.Errorf("events while the agents wait for a node: %v, want Unschedulable once, then Pending", e)
	}
	r.setConditions(sp, []metav1.Condition{
		cond(v1beta1.ConditionDegraded, metav1.ConditionTrue, conditions.ReasonDataLoss),
		cond(v1beta1.ConditionNICLocal, metav1.ConditionFalse, ReasonReceiversRemote),
	})
	r.setConditions(sp, []metav1.Condition{cond(v1beta1.ConditionDegraded, metav1.ConditionFalse, conditions.ReasonHealthy)})
	if e := got(); !slices.Equal(e, []string{conditions.ReasonDataLoss, ReasonReceiversRemote, conditions.ReasonHealthy}) {
		t.Errorf("later changes' events: %v, want DataLoss, ReceiversRemote and Healthy", e)
	}
}
