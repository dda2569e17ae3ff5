// Package conditions computes a StreamPipeline's conditions from the facts the controller
// gathered: the plan (or why there is none), the Jobs and their pods, the agents' figures. One
// pure function, so every case a person must act on has a table test and no code path of the
// controller can forget one.
//
// The conditions:
//
//	Planned      the planner placed the pipeline (False: why not, before any pod exists)
//	Ready        every stream runs (Running) or has delivered and verified its data (Completed)
//	Degraded     running but impaired: chunks lost or corrupt, a pod the Topology Manager refused
//	NICLocal     the receiving threads run on the data NIC's NUMA node, as the agents report
//	Reconciling  the operator is still converging (kstatus: InProgress)
//	Stalled      it cannot converge without a person: the reason says what to change (kstatus: Failed)
package conditions

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
)

// Condition types beyond the API's own: kstatus's (Flux, Argo CD and `kubectl wait` read them).
const (
	Reconciling = "Reconciling"
	Stalled     = "Stalled"
)

// Reasons.
const (
	ReasonPlanned           = "Planned"
	ReasonSuspended         = "Suspended"
	ReasonRunning           = "Running"
	ReasonCompleted         = "Completed"
	ReasonPending           = "Pending"
	ReasonNotPlanned        = "NotPlanned"
	ReasonReplacing         = "Replacing"
	ReasonUnschedulable     = "Unschedulable"
	ReasonImagePull         = "ImagePullFailed"
	ReasonContainerConfig   = "ContainerCannotStart"
	ReasonAdmission         = "AdmissionRefused"
	ReasonBackoffExhausted  = "BackoffLimitExceeded"
	ReasonConfigError       = "AgentConfigurationError"
	ReasonJobFailed         = "JobFailed"
	ReasonTopologyAffinity  = "TopologyAffinityError"
	ReasonDataLoss          = "DataLoss"
	ReasonSeriesIncomplete  = "SeriesIncomplete"
	ReasonOffPlannedNode    = "OffPlannedNode"
	ReasonHealthy           = "Healthy"
	ReasonAwaitingAgents    = "AwaitingAgentReport"
	ReasonReceiversNICLocal = "ReceiversNICLocal"
	ReasonReceiversRemote   = "ReceiversNotNICLocal"
	ReasonProgressing       = "Progressing"
	ReasonConverged         = "Converged"
	ReasonApplyFailed       = "ApplyFailed"
)

// Facts is everything the conditions depend on.
type Facts struct {
	Generation int64
	Suspended  bool
	// Refusal is why there is no plan (nil: planned, PlanMessage says what was planned).
	Refusal     *Refusal
	PlanMessage string
	// Jobs are the pipeline's desired Jobs, in stream order.
	Jobs []Job
	// Pods are the pipeline's pods (any Job).
	Pods []corev1.Pod
	// Replacing: Jobs are being deleted to be created again with a new plan.
	Replacing bool
	// Rejected names the pods Topology Manager refused in this pass ("pod on node").
	Rejected []string
	// Observed are the agents' figures (nil: not read yet).
	Observed *v1beta1.Observed
	// ApplyError: the API server refused writing the pipeline's objects in this pass (a quota, an
	// admission webhook, a conflict); "" when they were written.
	ApplyError string
}

// Refusal is a reason and message for Planned=False.
type Refusal struct {
	Reason, Message string
	// Retry: the cause may go away without a change to the pipeline (a node not labelled yet),
	// so the pipeline is Reconciling rather than Stalled.
	Retry bool
}

// Job is one desired Job and what the API server says about it.
type Job struct {
	Name string
	// HeldBack: the Job is not created yet, and why (e.g. a sender waiting for its gateway's
	// data-network address).
	HeldBack string
	// Object is the Job as it is (nil: not created yet).
	Object *batchv1.Job
	// FailedCreate is the message of the Job controller's latest FailedCreate event (an
	// admission webhook or Pod Security refusing the pod).
	FailedCreate string
}

// Compute returns the conditions, each with the generation it describes.
func Compute(f Facts) []metav1.Condition {
	out := conds{gen: f.Generation}
	if f.Refusal != nil {
		msg := f.Refusal.Message
		out.set(v1beta1.ConditionPlanned, metav1.ConditionFalse, f.Refusal.Reason, msg)
		out.set(v1beta1.ConditionReady, metav1.ConditionFalse, ReasonNotPlanned, "no plan: "+msg)
		out.set(v1beta1.ConditionDegraded, metav1.ConditionFalse, ReasonHealthy, "no agent runs")
		if f.Refusal.Retry {
			out.progress(f.Refusal.Reason, msg)
		} else {
			out.stall(f.Refusal.Reason, msg)
		}
		return out.list
	}
	out.set(v1beta1.ConditionPlanned, metav1.ConditionTrue, ReasonPlanned, f.PlanMessage)
	blocked := blockers(f)
	ready(&out, f, blocked)
	degraded(&out, f, blocked)
	nicLocal(&out, f.Observed)
	if f.ApplyError != "" {
		// What runs may be an older plan: not Ready for this one until the objects are written.
		msg := "the operator cannot write the pipeline's objects, and retries: " + f.ApplyError
		out.set(v1beta1.ConditionReady, metav1.ConditionFalse, ReasonApplyFailed, msg)
		out.progress(ReasonApplyFailed, msg)
	}
	return out.list
}

// blocker is a Job that cannot make progress without a person.
type blocker struct{ reason, message string }

// blockers finds, Job by Job, what stops it: the Job failed for good, the pod is refused at
// admission, cannot be scheduled, or its image cannot be pulled.
func blockers(f Facts) []blocker {
	var out []blocker
	for _, j := range f.Jobs {
		if b, ok := jobBlocked(j, f.Pods); ok {
			out = append(out, b)
		}
	}
	return out
}

func jobBlocked(j Job, pods []corev1.Pod) (blocker, bool) {
	if j.Object == nil {
		return blocker{}, false
	}
	if c := jobCondition(j.Object, batchv1.JobFailed); c != nil {
		switch c.Reason {
		case batchv1.JobReasonPodFailurePolicy:
			msg := fmt.Sprintf("%s failed: an agent refused its configuration (exit 2, not retried)", j.Name)
			if why := agentError(pods, j.Name); why != "" {
				msg += ": " + why
			}
			return blocker{ReasonConfigError, msg}, true
		case batchv1.JobReasonBackoffLimitExceeded:
			msg := fmt.Sprintf("%s failed: its pods failed %d times (backoffLimit)", j.Name, j.Object.Status.Failed)
			if why := agentError(pods, j.Name); why != "" {
				msg += "; last: " + why
			}
			return blocker{ReasonBackoffExhausted, msg}, true
		default:
			return blocker{ReasonJobFailed, fmt.Sprintf("%s failed: %s: %s", j.Name, c.Reason, c.Message)}, true
		}
	}
	if jobCondition(j.Object, batchv1.JobComplete) != nil {
		return blocker{}, false
	}
	p := newestPod(pods, j.Name)
	if p == nil {
		if j.FailedCreate != "" {
			return blocker{ReasonAdmission, fmt.Sprintf("%s cannot create its pod: %s", j.Name, j.FailedCreate)}, true
		}
		return blocker{}, false
	}
	if p.Status.Phase == corev1.PodPending {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable &&
				!claimsBinding(c.Message) {
				return blocker{ReasonUnschedulable, fmt.Sprintf("pod %s cannot be scheduled: %s", p.Name, c.Message)}, true
			}
		}
	}
	for _, cs := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		w := cs.State.Waiting
		if w == nil {
			continue
		}
		switch w.Reason {
		case "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull":
			return blocker{ReasonImagePull, fmt.Sprintf("pod %s container %s: %s: %s", p.Name, cs.Name, w.Reason, w.Message)}, true
		case "CreateContainerConfigError", "CreateContainerError", "RunContainerError":
			return blocker{ReasonContainerConfig, fmt.Sprintf("pod %s container %s: %s: %s", p.Name, cs.Name, w.Reason, w.Message)}, true
		}
	}
	return blocker{}, false
}

func ready(out *conds, f Facts, blocked []blocker) {
	if f.Suspended {
		out.set(v1beta1.ConditionReady, metav1.ConditionFalse, ReasonSuspended, "spec.suspend is true: the agents are stopped")
		out.converged("suspended")
		return
	}
	if len(blocked) > 0 {
		msgs := make([]string, len(blocked))
		for i, b := range blocked {
			msgs[i] = b.message
		}
		msg := strings.Join(msgs, "; ")
		out.set(v1beta1.ConditionReady, metav1.ConditionFalse, blocked[0].reason, msg)
		out.stall(blocked[0].reason, msg)
		return
	}
	var waiting []string
	completed := 0
	for _, j := range f.Jobs {
		switch {
		case j.HeldBack != "":
			waiting = append(waiting, j.Name+" ("+j.HeldBack+")")
		case j.Object != nil && j.Object.Status.Succeeded > 0:
			completed++
		case j.Object != nil && j.Object.Status.Ready != nil && *j.Object.Status.Ready > 0:
		default:
			// By name only: where each pod is (created, scheduled, starting) is the pods' own
			// status; said here, it would rewrite the pipeline's status at each step of each pod.
			waiting = append(waiting, j.Name)
		}
	}
	switch {
	case f.Replacing:
		out.set(v1beta1.ConditionReady, metav1.ConditionFalse, ReasonReplacing, "replacing the agents with the new plan")
		out.progress(ReasonReplacing, "replacing the agents with the new plan")
	case len(waiting) > 0:
		msg := "waiting for " + strings.Join(waiting, ", ")
		out.set(v1beta1.ConditionReady, metav1.ConditionFalse, ReasonPending, msg)
		out.progress(ReasonPending, msg)
	case completed == len(f.Jobs) && len(f.Jobs) > 0:
		out.set(v1beta1.ConditionReady, metav1.ConditionTrue, ReasonCompleted, "every stream delivered its data, verified")
		out.converged("every stream completed")
	default:
		out.set(v1beta1.ConditionReady, metav1.ConditionTrue, ReasonRunning, fmt.Sprintf("%d agents running", len(f.Jobs)-completed))
		out.converged("the agents run the current plan")
	}
}

func degraded(out *conds, f Facts, blocked []blocker) {
	if o := f.Observed; o != nil && (o.ChunksLost > 0 || o.ChunksCorrupt > 0) {
		msg := fmt.Sprintf("%d chunks lost and %d corrupt of %d delivered: the data at the sink is incomplete", o.ChunksLost, o.ChunksCorrupt, o.ChunksDelivered)
		if o.ChunksDeclaredMissing > 0 {
			// Where they went: a restarted detector sender, a full spill (docs/wire-format.md).
			msg += fmt.Sprintf("; %d declared missing by their senders", o.ChunksDeclaredMissing)
			if len(o.MissingChunks) > 0 {
				msg += ": " + strings.Join(o.MissingChunks, "; ")
			}
		}
		out.set(v1beta1.ConditionDegraded, metav1.ConditionTrue, ReasonDataLoss, msg)
		return
	}
	if o := f.Observed; o != nil && o.SeriesIncomplete > 0 {
		out.set(v1beta1.ConditionDegraded, metav1.ConditionTrue, ReasonSeriesIncomplete,
			fmt.Sprintf("%d detector series ended incomplete (their detector went away before the end message): %s",
				o.SeriesIncomplete, strings.Join(o.IncompleteSeries, "; ")))
		return
	}
	if len(f.Rejected) > 0 {
		out.set(v1beta1.ConditionDegraded, metav1.ConditionTrue, ReasonTopologyAffinity,
			"Topology Manager rejected "+strings.Join(f.Rejected, ", ")+
				": no NUMA node could hold the pod's CPUs together with the NIC; re-planned with fewer receiving cores (status.topologyRejection)")
		return
	}
	if o := f.Observed; o != nil {
		if off := offPlan(o.Placement); len(off) > 0 {
			out.set(v1beta1.ConditionDegraded, metav1.ConditionTrue, ReasonOffPlannedNode,
				"threads run off their planned NUMA node (the agents' own report, status.observed.placement): "+
					strings.Join(off, "; ")+" -- check the kubelet's CPU manager (static) and Topology Manager and the NIC resource")
			return
		}
	}
	for _, b := range blocked {
		if b.reason == ReasonConfigError || b.reason == ReasonBackoffExhausted || b.reason == ReasonJobFailed {
			out.set(v1beta1.ConditionDegraded, metav1.ConditionTrue, b.reason, b.message)
			return
		}
	}
	out.set(v1beta1.ConditionDegraded, metav1.ConditionFalse, ReasonHealthy, "no stage is failing")
}

func nicLocal(out *conds, o *v1beta1.Observed) {
	switch {
	case o == nil:
		out.set(v1beta1.ConditionNICLocal, metav1.ConditionUnknown, ReasonAwaitingAgents, "the receiving agents have not reported their placement yet")
	case o.NICLocal == nil:
		out.set(v1beta1.ConditionNICLocal, metav1.ConditionUnknown, ReasonAwaitingAgents, "the agents do not know the NIC's NUMA node")
	case *o.NICLocal:
		out.set(v1beta1.ConditionNICLocal, metav1.ConditionTrue, ReasonReceiversNICLocal, "every receiving thread runs on the NIC's NUMA node")
	default:
		out.set(v1beta1.ConditionNICLocal, metav1.ConditionFalse, ReasonReceiversRemote,
			"a receiving thread runs off the NIC's NUMA node: the pod's cpuset has no CPU there (check the kubelet's Topology Manager policy and the NIC resource)")
	}
}

// claimsBinding: the scheduler waits for the pod's claims to be bound to their volumes. The
// operator makes both, the claim naming its volume, so the binding follows within seconds: the
// pipeline is pending, not stalled (a claim that stays unbound keeps it pending, and the
// NotReady alert says so).
func claimsBinding(schedulerMessage string) bool {
	return strings.Contains(schedulerMessage, "unbound immediate PersistentVolumeClaims")
}

// agentError is what the agent of the Job's newest failed pod said on exit (its termination
// message: the summary it wrote, or the tail of its log).
func agentError(pods []corev1.Pod, job string) string {
	var failed []corev1.Pod
	for _, p := range pods {
		if p.Labels[batchv1.JobNameLabel] == job && p.Status.Phase == corev1.PodFailed {
			failed = append(failed, p)
		}
	}
	if len(failed) == 0 {
		return ""
	}
	sortNewestFirst(failed)
	for _, cs := range failed[0].Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil && t.ExitCode != 0 {
			msg := strings.TrimSpace(t.Message)
			var summary struct {
				Error string `json:"error"`
			}
			if json.Unmarshal([]byte(msg), &summary) == nil && summary.Error != "" {
				msg = summary.Error // the summary an agent writes at exit names its failure
			}
			if msg == "" {
				msg = t.Reason
			}
			return fmt.Sprintf("pod %s container %s exited %d: %s", failed[0].Name, cs.Name, t.ExitCode, lastLines(msg, 3))
		}
	}
	return ""
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " / ")
}

func newestPod(pods []corev1.Pod, job string) *corev1.Pod {
	var mine []corev1.Pod
	for _, p := range pods {
		if p.Labels[batchv1.JobNameLabel] == job && p.DeletionTimestamp == nil {
			mine = append(mine, p)
		}
	}
	if len(mine) == 0 {
		return nil
	}
	sortNewestFirst(mine)
	return &mine[0]
}

func sortNewestFirst(pods []corev1.Pod) {
	sort.SliceStable(pods, func(a, b int) bool {
		ta, tb := pods[a].CreationTimestamp, pods[b].CreationTimestamp
		if !ta.Equal(&tb) {
			return tb.Before(&ta)
		}
		return pods[a].Name > pods[b].Name
	})
}

func jobCondition(j *batchv1.Job, t batchv1.JobConditionType) *batchv1.JobCondition {
	for i := range j.Status.Conditions {
		if c := &j.Status.Conditions[i]; c.Type == t && c.Status == corev1.ConditionTrue {
			return c
		}
	}
	return nil
}

// Restated says whether a condition computed again says what the one in status says, in other
// figures or order: the scheduler's message for a pod it cannot place counts the nodes anew at
// each attempt and lists its reasons most frequent first ("0/205 nodes are available: 168 ...,
// 37 ..."), as the other pods it weighs come and go, while why this pod waits has not changed.
// The status keeps the first wording, so a pending pipeline's status is not written again at
// every scheduling attempt in the cluster.
func Restated(was, now metav1.Condition) bool {
	if was.Type != now.Type || was.Status != now.Status || was.Reason != now.Reason || now.Reason != ReasonUnschedulable {
		return false
	}
	return slices.Equal(phrases(was.Message), phrases(now.Message))
}

// phrases are s's phrases (between ", ", ". " and ": "; no full stop), sorted, each run of
// digits in them one '#'.
func phrases(s string) []string {
	var b strings.Builder
	for i, r := range s {
		digit := r >= '0' && r <= '9'
		if digit && i > 0 && s[i-1] >= '0' && s[i-1] <= '9' {
			continue
		}
		if digit {
			r = '#'
		}
		b.WriteRune(r)
	}
	out := strings.FieldsFunc(strings.NewReplacer(", ", "\x00", ". ", "\x00", ": ", "\x00").Replace(b.String()), func(r rune) bool { return r == 0 })
	for i := range out {
		out[i] = strings.TrimSuffix(out[i], ".")
	}
	slices.Sort(out)
	return out
}

// Bad says whether a condition asks for attention (a Warning event): no plan, not ready for
// a reason other than starting or being suspended, degraded, receivers off the NIC, stalled.
func Bad(c metav1.Condition) bool {
	switch c.Type {
	case v1beta1.ConditionPlanned:
		return c.Status == metav1.ConditionFalse
	case v1beta1.ConditionReady:
		return c.Status == metav1.ConditionFalse && c.Reason != ReasonPending && c.Reason != ReasonSuspended &&
			c.Reason != ReasonReplacing && c.Reason != ReasonNotPlanned
	case v1beta1.ConditionDegraded, Stalled:
		return c.Status == metav1.ConditionTrue
	case v1beta1.ConditionNICLocal:
		return c.Status == metav1.ConditionFalse
	}
	return false
}

type conds struct {
	gen  int64
	list []metav1.Condition
}

func (c *conds) set(t string, s metav1.ConditionStatus, reason, msg string) {
	for i := range c.list {
		if c.list[i].Type == t {
			c.list[i].Status, c.list[i].Reason, c.list[i].Message = s, reason, msg
			return
		}
	}
	c.list = append(c.list, metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg, ObservedGeneration: c.gen})
}

func (c *conds) stall(reason, msg string) {
	c.set(Stalled, metav1.ConditionTrue, reason, msg)
	c.set(Reconciling, metav1.ConditionFalse, reason, "stalled: "+msg)
}

func (c *conds) progress(reason, msg string) {
	c.set(Reconciling, metav1.ConditionTrue, reason, msg)
	c.set(Stalled, metav1.ConditionFalse, ReasonProgressing, "making progress")
}

func (c *conds) converged(msg string) {
	c.set(Reconciling, metav1.ConditionFalse, ReasonConverged, msg)
	c.set(Stalled, metav1.ConditionFalse, ReasonConverged, msg)
}

// offPlan names the stages whose threads run off their planned node.
func offPlan(rows []v1beta1.StagePlacement) []string {
	var out []string
	for _, r := range rows {
		if !r.OnPlan {
			out = append(out, fmt.Sprintf("stream %d %s %s (%s agent): %d threads on NUMA node %s, planned %s",
				r.Stream, r.Role, r.Stage, r.Agent, r.Threads, r.NUMANodes, r.Planned))
		}
	}
	return out
}
