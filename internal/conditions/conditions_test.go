package conditions

import (
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
)

func job(name string, mod ...func(*batchv1.Job)) Job {
	j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, m := range mod {
		m(j)
	}
	return Job{Name: name, Object: j}
}

func readyJob(j *batchv1.Job) { j.Status.Ready = ptr.To[int32](1); j.Status.Active = 1 }
func succeededJob(j *batchv1.Job) {
	j.Status.Succeeded = 1
	failedWith(batchv1.JobComplete, "CompletionsReached")(j)
}
func failedWith(t batchv1.JobConditionType, reason string) func(*batchv1.Job) {
	return func(j *batchv1.Job) {
		j.Status.Conditions = append(j.Status.Conditions, batchv1.JobCondition{Type: t, Status: corev1.ConditionTrue, Reason: reason, Message: "msg of " + reason})
		if t == batchv1.JobFailed {
			j.Status.Failed = 7
		}
	}
}

func pod(name, job string, age time.Duration, mod ...func(*corev1.Pod)) corev1.Pod {
	p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{batchv1.JobNameLabel: job},
		CreationTimestamp: metav1.NewTime(time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC).Add(-age))}}
	p.Status.Phase = corev1.PodPending
	for _, m := range mod {
		m(&p)
	}
	return p
}

func unschedulable(p *corev1.Pod) {
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable,
		Message: "0/14 nodes are available: 1 Insufficient cpu"}}
}

func waiting(reason string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.NodeName = "lynx"
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "agent", State: corev1.ContainerState{
			Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: "detail of " + reason}}}}
	}
}

func exited(code int32, msg string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Status.Phase = corev1.PodFailed
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "agent", State: corev1.ContainerState{
			Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Message: msg}}}}
	}
}

type want struct {
	cond, status, reason string
	// message must contain every one of these
	says []string
}

func TestConditions(t *testing.T) {
	planned := func(f Facts) Facts { f.PlanMessage = "1 streams x 2 connections"; f.Generation = 3; return f }
	cases := []struct {
		name  string
		facts Facts
		want  []want
	}{
		{"refused: the pipeline does not fit, before any pod exists",
			Facts{Refusal: &Refusal{Reason: "NoCapacity", Message: "sender d can give pods 1 CPUs"}},
			[]want{{"Planned", "False", "NoCapacity", []string{"1 CPUs"}}, {"Ready", "False", ReasonNotPlanned, nil},
				{Stalled, "True", "NoCapacity", nil}, {Reconciling, "False", "NoCapacity", nil}}},
		{"a missing node label may still come: reconciling, not stalled",
			Facts{Refusal: &Refusal{Reason: "MissingNodeLabels", Message: "no label", Retry: true}},
			[]want{{Stalled, "False", "", nil}, {Reconciling, "True", "MissingNodeLabels", nil}}},
		{"running",
			planned(Facts{Jobs: []Job{job("a-sender-0", readyJob), job("a-gateway-0", readyJob)}}),
			[]want{{"Ready", "True", ReasonRunning, []string{"2 agents"}}, {"Degraded", "False", ReasonHealthy, nil},
				{Stalled, "False", "", nil}, {Reconciling, "False", "", nil}, {"NICLocal", "Unknown", ReasonAwaitingAgents, nil}}},
		{"completed only when every Job succeeded",
			planned(Facts{Jobs: []Job{job("a-sender-0", succeededJob), job("a-gateway-0", succeededJob)}}),
			[]want{{"Ready", "True", ReasonCompleted, []string{"verified"}}}},
		{"one Job still running is not completed",
			planned(Facts{Jobs: []Job{job("a-sender-0", succeededJob), job("a-gateway-0", readyJob)}}),
			[]want{{"Ready", "True", ReasonRunning, []string{"1 agents"}}}},
		{"unschedulable, with the scheduler's message",
			planned(Facts{Jobs: []Job{job("a-sender-0"), job("a-gateway-0", readyJob)},
				Pods: []corev1.Pod{pod("a-sender-0-x", "a-sender-0", 0, unschedulable)}}),
			[]want{{"Ready", "False", ReasonUnschedulable, []string{"a-sender-0-x", "Insufficient cpu"}},
				{Stalled, "True", ReasonUnschedulable, nil}, {Reconciling, "False", "", nil}}},
		// The claims the operator made for the pipeline's storage bind within seconds after the
		// pods are created (the demo showed Stalled=True for that moment): Pending, not Stalled.
		{"claims not bound yet: waiting, not stalled",
			planned(Facts{Jobs: []Job{job("a-gateway-0")}, Pods: []corev1.Pod{pod("a-gateway-0-x", "a-gateway-0", 0, func(p *corev1.Pod) {
				p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable,
					Message: "0/18 nodes are available: pod has unbound immediate PersistentVolumeClaims. not found"}}
			})}}),
			[]want{{"Ready", "False", ReasonPending, []string{"waiting for a-gateway-0"}}, {Stalled, "False", "", nil}}},
		{"image pull failure",
			planned(Facts{Jobs: []Job{job("a-gateway-0")}, Pods: []corev1.Pod{pod("a-gateway-0-x", "a-gateway-0", 0, waiting("ImagePullBackOff"))}}),
			[]want{{"Ready", "False", ReasonImagePull, []string{"ImagePullBackOff", "detail of"}}, {Stalled, "True", ReasonImagePull, nil}}},
		{"admission refusal: the Job cannot create its pod",
			planned(Facts{Jobs: []Job{{Name: "a-gateway-0", Object: &batchv1.Job{},
				FailedCreate: `pods "a-gateway-0-x" is forbidden: violates PodSecurity "restricted:latest"`}}}),
			[]want{{"Ready", "False", ReasonAdmission, []string{"PodSecurity"}}, {Stalled, "True", ReasonAdmission, nil}}},
		{"backoff exhausted, with the agent's last words",
			planned(Facts{Jobs: []Job{job("a-gateway-0", failedWith(batchv1.JobFailed, batchv1.JobReasonBackoffLimitExceeded))},
				Pods: []corev1.Pod{pod("a-gateway-0-old", "a-gateway-0", time.Hour, exited(1, "old")),
					pod("a-gateway-0-new", "a-gateway-0", time.Minute, exited(1, `{"role":"receive","chunks":3,"error":"sink: disk full"}`))}}),
			[]want{{"Ready", "False", ReasonBackoffExhausted, []string{"7 times", "a-gateway-0-new", "disk full"}},
				{"Degraded", "True", ReasonBackoffExhausted, nil}, {Stalled, "True", ReasonBackoffExhausted, nil}}},
		{"exit 2 fails fast and is not 'waiting for'",
			planned(Facts{Jobs: []Job{job("a-sender-0", failedWith(batchv1.JobFailed, batchv1.JobReasonPodFailurePolicy))},
				Pods: []corev1.Pod{pod("a-sender-0-x", "a-sender-0", 0, exited(2, "starting\nnumastream-agent: codec: unknown 'zstd'"))}}),
			[]want{{"Ready", "False", ReasonConfigError, []string{"exit 2", "unknown 'zstd'"}}, {Stalled, "True", ReasonConfigError, nil}}},
		{"data loss degrades a running pipeline",
			planned(Facts{Jobs: []Job{job("a-gateway-0", readyJob)}, Observed: &v1beta1.Observed{ChunksDelivered: 90, ChunksLost: 3, ChunksCorrupt: 1}}),
			[]want{{"Degraded", "True", ReasonDataLoss, []string{"3 chunks lost", "1 corrupt"}}, {"Ready", "True", ReasonRunning, nil}}},
		{"chunks a restarted detector sender declared missing are named",
			planned(Facts{Jobs: []Job{job("a-gateway-0", readyJob)}, Observed: &v1beta1.Observed{ChunksDelivered: 270, ChunksLost: 16,
				ChunksDeclaredMissing: 16, MissingChunks: []string{"stream 0: chunks 110-125 (sender_restarted)"}}}),
			[]want{{"Degraded", "True", ReasonDataLoss, []string{"16 chunks lost", "16 declared missing by their senders", "chunks 110-125 (sender_restarted)"}},
				{"Ready", "True", ReasonRunning, nil}}},
		{"a detector series that ended incomplete degrades it, named",
			planned(Facts{Jobs: []Job{job("a-gateway-0", readyJob)}, Observed: &v1beta1.Observed{ChunksDelivered: 40, SeriesIncomplete: 1,
				IncompleteSeries: []string{"series 7 (01GRX): the detector at tcp://dcu:31001 disconnected after 3 images, before its end message"}}}),
			[]want{{"Degraded", "True", ReasonSeriesIncomplete, []string{"1 detector series ended incomplete", "series 7 (01GRX)", "after 3 images"}},
				{"Ready", "True", ReasonRunning, nil}}},
		{"threads off their planned NUMA node degrade it, named from the agents' report",
			planned(Facts{Jobs: []Job{job("a-gateway-0", readyJob)}, Observed: &v1beta1.Observed{ChunksDelivered: 40, Placement: []v1beta1.StagePlacement{
				{Stream: 0, Role: "gateway", Agent: "relay", Stage: "receive", Threads: 2, CPUs: "16-17", NUMANodes: "1", Planned: "1", OnPlan: true},
				{Stream: 0, Role: "gateway", Agent: "receive", Stage: "decompress", Threads: 2, CPUs: "20-21", NUMANodes: "1", Planned: "0", OnPlan: false},
			}}}),
			[]want{{"Degraded", "True", ReasonOffPlannedNode, []string{"stream 0 gateway decompress (receive agent): 2 threads on NUMA node 1, planned 0"}},
				{"Ready", "True", ReasonRunning, nil}}},
		{"threads on their planned nodes keep it healthy",
			planned(Facts{Jobs: []Job{job("a-gateway-0", readyJob)}, Observed: &v1beta1.Observed{ChunksDelivered: 40, Placement: []v1beta1.StagePlacement{
				{Stream: 0, Role: "gateway", Agent: "relay", Stage: "receive", Threads: 2, CPUs: "16-17", NUMANodes: "1", Planned: "1", OnPlan: true},
			}}}),
			[]want{{"Degraded", "False", ReasonHealthy, nil}}},
		{"a write the API server refuses is said in status, with its reason, while the older plan runs",
			planned(Facts{Jobs: []Job{job("a-gateway-0", readyJob)}, ApplyError: `configmaps "a-agent" is forbidden: exceeded quota: no-configmaps`}),
			[]want{{"Ready", "False", ReasonApplyFailed, []string{"cannot write", "exceeded quota"}}, {"Planned", "True", ReasonPlanned, nil},
				{Reconciling, "True", ReasonApplyFailed, []string{"exceeded quota"}}, {Stalled, "False", "", nil}}},
		{"topology affinity error",
			planned(Facts{Jobs: []Job{job("a-gateway-0")}, Rejected: []string{"a-gateway-0-x on lynx"}}),
			[]want{{"Degraded", "True", ReasonTopologyAffinity, []string{"a-gateway-0-x on lynx", "fewer receiving cores"}}}},
		{"NIC locality as the agents report it",
			planned(Facts{Jobs: []Job{job("a-gateway-0", readyJob)}, Observed: &v1beta1.Observed{NICLocal: ptr.To(false)}}),
			[]want{{"NICLocal", "False", ReasonReceiversRemote, []string{"Topology Manager"}}}},
		{"pending says what it waits for",
			planned(Facts{Jobs: []Job{{Name: "a-sender-0", HeldBack: "the gateway's data-network address"}, job("a-gateway-0")},
				Pods: []corev1.Pod{pod("a-gateway-0-x", "a-gateway-0", 0)}}),
			[]want{{"Ready", "False", ReasonPending, []string{"a-sender-0 (the gateway's data-network address), a-gateway-0"}},
				{Reconciling, "True", ReasonPending, nil}, {Stalled, "False", "", nil}}},
		{"suspended",
			planned(Facts{Suspended: true, Jobs: []Job{job("a-gateway-0")}}),
			[]want{{"Ready", "False", ReasonSuspended, nil}, {Reconciling, "False", "", nil}}},
		{"replacing the agents with a new plan",
			planned(Facts{Replacing: true, Jobs: []Job{job("a-gateway-0", readyJob)}}),
			[]want{{"Ready", "False", ReasonReplacing, nil}, {Reconciling, "True", ReasonReplacing, nil}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Compute(tc.facts)
			for _, w := range tc.want {
				c := meta.FindStatusCondition(got, w.cond)
				if c == nil {
					t.Fatalf("no %s condition in %+v", w.cond, got)
				}
				if string(c.Status) != w.status || (w.reason != "" && c.Reason != w.reason) {
					t.Errorf("%s = %s/%s (%s), want %s/%s", w.cond, c.Status, c.Reason, c.Message, w.status, w.reason)
				}
				for _, s := range w.says {
					if !strings.Contains(c.Message, s) {
						t.Errorf("%s message %q does not say %q", w.cond, c.Message, s)
					}
				}
				if c.ObservedGeneration != tc.facts.Generation {
					t.Errorf("%s observedGeneration %d", w.cond, c.ObservedGeneration)
				}
			}
			for _, typ := range []string{v1beta1.ConditionPlanned, v1beta1.ConditionReady, Reconciling, Stalled} {
				if meta.FindStatusCondition(got, typ) == nil {
					t.Errorf("%s missing", typ)
				}
			}
			if meta.IsStatusConditionTrue(got, Stalled) && meta.IsStatusConditionTrue(got, Reconciling) {
				t.Error("Stalled and Reconciling both true")
			}
		})
	}
}

func TestTheSchedulersCountsAnewAreNotANewMessage(t *testing.T) {
	unschedulable := func(msg string) metav1.Condition {
		return metav1.Condition{Type: v1beta1.ConditionReady, Status: metav1.ConditionFalse, Reason: ReasonUnschedulable, Message: msg}
	}
	was := unschedulable("pod a-gateway-0-x cannot be scheduled: 0/205 nodes are available: 168 node(s) didn't match Pod's node affinity/selector, 37 Insufficient cpu.")
	for _, tc := range []struct {
		name string
		now  metav1.Condition
		want bool
	}{
		{"other counts", unschedulable("pod a-gateway-0-x cannot be scheduled: 0/206 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 205 Insufficient cpu."), true},
		{"the same", was, true},
		{"its reasons in another order", unschedulable("pod a-gateway-0-x cannot be scheduled: 0/205 nodes are available: 37 Insufficient cpu, 168 node(s) didn't match Pod's node affinity/selector."), true},
		{"another reason the scheduler gives", unschedulable("pod a-gateway-0-x cannot be scheduled: 0/205 nodes are available: 168 node(s) didn't match Pod's node affinity/selector, 37 Insufficient memory."), false},
		{"another pod", unschedulable("pod a-gateway-0-y cannot be scheduled: 0/205 nodes are available: 168 node(s) didn't match Pod's node affinity/selector, 37 Insufficient cpu."), false},
		{"a count where there was none", unschedulable("pod a-gateway-0-x cannot be scheduled: 0/205 nodes are available: 168 node(s) didn't match Pod's node affinity/selector, 37 Insufficient cpu. 2"), false},
		{"another reason", metav1.Condition{Type: v1beta1.ConditionReady, Status: metav1.ConditionFalse, Reason: ReasonPending, Message: was.Message}, false},
	} {
		if got := Restated(was, tc.now); got != tc.want {
			t.Errorf("%s: Restated = %v, want %v", tc.name, got, tc.want)
		}
	}
	// Figures elsewhere are news: a plan's predicted rate, a loss.
	planned := metav1.Condition{Type: v1beta1.ConditionPlanned, Status: metav1.ConditionTrue, Reason: ReasonPlanned, Message: "predicted 7.0 Gbit/s"}
	if replanned := (metav1.Condition{Type: planned.Type, Status: planned.Status, Reason: planned.Reason, Message: "predicted 9.0 Gbit/s"}); Restated(planned, replanned) {
		t.Error("a new predicted rate taken for the old one")
	}
}
