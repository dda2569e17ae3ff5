package controllers

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/conditions"
	"github.com/numastream/numastream/internal/curvekeys"
	"github.com/numastream/numastream/internal/planner"
	"github.com/numastream/numastream/internal/render"
	"github.com/numastream/numastream/internal/storage"
)

// JobAction is what one pass does to one of the pipeline's Jobs.
type JobAction string

const (
	// JobCreate: the Job does not exist: it is created with the plan.
	JobCreate JobAction = "create"
	// JobKeep: the Job runs the plan: applied again as it is (labels, owner).
	JobKeep JobAction = "keep"
	// JobResize: the plan changed only the containers' CPUs and memory and the Job's one running
	// pod is resized in place (pods/resize); the Job stays. Should the API server refuse the
	// resize, the Job is replaced.
	JobResize JobAction = "resize"
	// JobResized: resized in place to the plan by an earlier pass: left as it is.
	JobResized JobAction = "resized"
	// JobReplace: the Job runs an older plan (another config, image, network, keys): deleted now
	// and created with the plan on a later pass; its stream drains and resumes where it stopped.
	JobReplace JobAction = "replace"
	// JobDeleting: the Job is being deleted (replaced): created again once it is gone.
	JobDeleting JobAction = "deleting"
	// JobHold: a sender held back until its gateway's data-network address is known; one that
	// exists runs on until then.
	JobHold JobAction = "hold"
	// JobDelete: the Job's stream is no longer in the pipeline.
	JobDelete JobAction = "delete"
	// JobRoll: the Job runs an older plan and waits its turn to be replaced (spec.rollout: other
	// streams are being replaced); its stream goes on meanwhile.
	JobRoll JobAction = "roll"
	// JobAfterSender: the Job of a stream whose sender reads a live detector waits while that
	// sender's old pod drains (the gateway to be replaced keeps taking what it read; the new
	// sender starts with the new gateway).
	JobAfterSender JobAction = "after-sender"
	// JobFinished: the Job's stream has finished (its sender's Job completed): left as it is,
	// whatever changed since. Replacing it would run a finished stream again.
	JobFinished JobAction = "finished"
)

// JobStep is the action decided for one Job.
type JobStep struct {
	Name   string
	Action JobAction
	// Desired is the Job as rendered for the plan (nil for JobDelete); Existing as it is (nil
	// when it does not exist).
	Desired, Existing *batchv1.Job
	// Pod is the running pod JobResize resizes.
	Pod *corev1.Pod
	// Event says what the step does, recorded when it is done ("" for none).
	Event *Event
}

// Event is an event to record about the pipeline.
type Event struct {
	Related                       runtime.Object // nil: the pipeline itself
	Type, Reason, Action, Message string
}

// Decision is everything one pass does, decided from the pipeline and the facts gathered for it
// (Decide). execute performs its writes; nothing after gather reads and nothing but execute
// writes.
type Decision struct {
	// Status is the pipeline's status after the pass, but for the conditions (conclude sets
	// them from Facts once the writes are done).
	Status v1beta1.StreamPipelineStatus
	// Facts are what the conditions are computed from.
	Facts conditions.Facts
	// Plan is the plan applied (nil when the pipeline is refused: Facts.Refusal says why).
	Plan *planner.Plan
	// Keys is the CURVE key Secret to write before anything that uses it.
	Keys keysDecision
	// Objects are applied as rendered (ConfigMap, Services, NetworkPolicy, volumes); their Jobs
	// go through Jobs.
	Objects render.Objects
	Jobs    []JobStep
	// DeleteClaims and DeleteVolumes are the pipeline's claims and volumes no pod needs any
	// more; DeletePods the pods the Topology Manager refused (their Jobs make new ones).
	DeleteClaims  []*corev1.PersistentVolumeClaim
	DeleteVolumes []*corev1.PersistentVolume
	DeletePods    []*corev1.Pod
	// Replan is the re-plan from observed facts this pass applies (nil: none), against the plan
	// before it; recorded once written (conclude), knowing whether pods were resized.
	Replan     *v1beta1.Replan
	PlanBefore *v1beta1.Plan
	// Events are the pass's decisions (topology refusals) to record whatever the writes do.
	Events []Event
	// NextRotation is when the next scheduled key rotation is due (0: none).
	NextRotation time.Duration
}

// decideOptions are Decide's inputs that are not facts of the cluster.
type decideOptions struct {
	Render  render.Options
	Now     time.Time
	NewPair func() (curvekeys.KeyPair, error)
}

// Decide is the whole decision of one pass over a pipeline, from the pipeline and the facts
// gather read: what to plan, render and write, what to do with each Job, and the status. It
// reads nothing and writes nothing (sp is not changed). A pipeline that cannot be planned is a
// decision (Facts.Refusal), not an error; an error is one no pass can decide around (the key
// generator failing).
func Decide(in *v1beta1.StreamPipeline, f facts, opts decideOptions) (Decision, error) {
	sp := in.DeepCopy()
	d := Decision{Facts: conditions.Facts{Generation: sp.Generation, Suspended: sp.Spec.Suspend, Pods: f.pods, Observed: sp.Status.Observed}}
	d.DeletePods, d.Events = topologyRejections(sp, f.pods)
	if err := decidePlan(sp, f, opts, &d); err != nil {
		ref, other := refusal(err)
		if other != nil {
			return d, other
		}
		d.Facts.Refusal = ref
	}
	if tr := sp.Status.TopologyRejection; tr != nil && tr.Generation == sp.Generation {
		d.Facts.Rejected = tr.Pods
	}
	d.Status = sp.Status
	return d, nil
}

// decidePlan plans, renders and decides each Job's action, into d and sp's status. A refusal
// is returned as an error refusal() knows.
func decidePlan(sp *v1beta1.StreamPipeline, f facts, opts decideOptions, d *Decision) error {
	if f.nodesErr != nil {
		return f.nodesErr
	}
	lead, err := useSites(sp, f.sites)
	if err != nil {
		return err
	}
	if err := storage.Check(sp, f.roots, opts.Render.StoragePrefixes); err != nil {
		return err
	}
	if !opts.Render.WholeRootVolumes {
		if err := storage.WholeRoot(sp, f.roots, opts.Render.StoragePrefixes); err != nil {
			return err
		}
	}
	if err := storage.Collision(sp, f.pipelines, f.roots, opts.Render.StoragePrefixes); err != nil {
		return err
	}
	if tr := sp.Status.TopologyRejection; tr != nil && tr.Generation == sp.Generation && tr.ReceiveCores == 0 {
		return &notPlannedError{reason: ReasonTopologyAffinity, err: fmt.Errorf(
			"Topology Manager refused the gateway pod even with 1 receiving core per stream (%s): "+
				"the NIC's NUMA node has no CPU left to align with it (CPUs the kubelet reserves, reservedSystemCPUs or "+
				"the static policy's share of kubeReserved, are never given to pods); free cores there or lower the number of streams",
			strings.Join(tr.Pods, ", "))}
	}
	plan, err := planner.Make(request(sp, f))
	if err != nil {
		return err
	}
	// A re-plan from observed facts is recorded once it is applied (conclude).
	replanned, before := sp.Status.Replan, sp.Status.Plan
	if replanned != nil && (replanned.Applied || sp.Spec.Replan == ReplanOff) {
		replanned = nil
	}
	sp.Status.Plan = toAPIPlan(plan)
	for i := range sp.Status.Plan.Onward {
		sp.Status.Plan.Onward[i].Security = onwardSecurity(sp, sp.Status.Plan.Onward[i].Consumer)
	}
	sp.Status.PredictedGbps = fmt.Sprintf("%.1f", plan.TotalMbit/1000)
	sp.Status.Bottleneck = string(plan.Bottleneck)
	d.Facts.PlanMessage = fmt.Sprintf("%d streams x %d connections, predicted %.1f Gbit/s raw (%.1f per stream), limited by %s",
		len(sp.Spec.Senders), plan.Connections, plan.TotalMbit/1000, plan.RateMbit/1000, plan.Bottleneck)
	keys, err := decideKeys(sp, f.keysSecret, lead, opts.Now, opts.NewPair)
	if err != nil {
		return err
	}
	d.NextRotation = keys.keys.nextRotation
	sp.Status.GatewayKey = keys.keys.gatewayKey
	objs, err := render.Render(render.Inputs{Pipeline: sp, Plan: plan, Gateway: f.gateway, KeysSecret: keys.keys.secret, KeysHashes: keys.keys.hashes,
		GatewayAddress: f.gatewayNICAddress, DataAddresses: f.dataAddresses, SenderAddresses: f.senderAddresses,
		Roots: f.roots, Prefixes: opts.Render.StoragePrefixes}, opts.Render)
	if err != nil {
		return &notPlannedError{reason: ReasonInvalidSpec, err: err}
	}
	if keys.rotated != "" {
		d.Events = append(d.Events, Event{Related: keys.write, Type: corev1.EventTypeNormal, Reason: "KeysRotated", Action: "Rotate",
			Message: fmt.Sprintf("new CURVE keys in Secret %s (%s): the agents are replaced with them, each stream drains and resumes", keys.keys.secret, keys.rotated)})
	}
	if keys.listed != "" {
		d.Events = append(d.Events, Event{Related: keys.write, Type: corev1.EventTypeNormal, Reason: "KeysListed", Action: "Rotate",
			Message: keys.listed})
	}
	d.Plan, d.Keys, d.Objects = &plan, keys, objs
	sp.Status.Endpoints = nil
	for _, stream := range sp.StreamIDs() {
		if ep, ok := objs.Endpoints[stream]; ok {
			sp.Status.Endpoints = append(sp.Status.Endpoints, v1beta1.StreamEndpoint{Stream: int32(stream), Endpoint: ep})
		}
	}
	if replanned != nil {
		d.Replan, d.PlanBefore = replanned, before
	}
	d.Jobs = senderFirst(sp, f, rollout(sp, f, before, decideJobs(sp, f, objs, replanned != nil && resizable(before, sp.Status.Plan))))
	d.DeleteClaims, d.DeleteVolumes = unwantedVolumes(sp, f, objs.Volumes)
	for _, s := range d.Jobs {
		switch s.Action {
		case JobReplace, JobDeleting, JobRoll, JobAfterSender:
			d.Facts.Replacing = true
		case JobDelete:
			continue
		case JobHold:
			j := conditions.Job{Name: s.Name, Object: s.Existing}
			if j.Object == nil {
				j.HeldBack = "waiting for the gateway's data-network address"
			}
			d.Facts.Jobs = append(d.Facts.Jobs, j)
			continue
		}
		d.Facts.Jobs = append(d.Facts.Jobs, conditions.Job{Name: s.Name, Object: s.Existing, FailedCreate: f.failedCreate[s.Name]})
	}
	return nil
}

// decideJobs decides each Job's action: the rendered ones (created, kept, resized in place when
// inPlace allows it, or replaced when they run an older plan), the held-back senders, and the
// Jobs of streams that are gone.
func decideJobs(sp *v1beta1.StreamPipeline, f facts, objs render.Objects, inPlace bool) []JobStep {
	var steps []JobStep
	want := map[string]bool{}
	for _, j := range objs.Jobs {
		want[j.Name] = true
		steps = append(steps, decideJob(sp, j, f.jobs[j.Name], f.pods, inPlace))
	}
	for _, name := range objs.Waiting { // held back, not removed: they run until replaced
		want[name] = true
		steps = append(steps, JobStep{Name: name, Action: JobHold, Existing: f.jobs[name]})
	}
	// A finished stream stays finished: edits and upgrades apply to the streams still running.
	for i, st := range steps {
		switch st.Action {
		case JobReplace, JobResize:
			if streamFinished(st.Existing, f.jobs) {
				steps[i].Action, steps[i].Event, steps[i].Pod = JobFinished, nil, nil
			}
		}
	}
	var gone []string
	for name, j := range f.jobs {
		if !want[name] && j.DeletionTimestamp == nil {
			gone = append(gone, name)
		}
	}
	slices.Sort(gone)
	for _, name := range gone {
		steps = append(steps, JobStep{Name: name, Action: JobDelete, Existing: f.jobs[name]})
	}
	return steps
}

// decideJob: a Job's pod template is immutable, so a Job whose plan hash (its agent config and
// whole pod template) changed is replaced, unless only its containers' CPUs and memory changed
// and its one running pod can be resized in place.
func decideJob(sp *v1beta1.StreamPipeline, desired, existing *batchv1.Job, pods []corev1.Pod, inPlace bool) JobStep {
	step := JobStep{Name: desired.Name, Desired: desired, Existing: existing}
	want := desired.Annotations[render.AnnotationPlanHash]
	switch {
	case existing == nil:
		step.Action = JobCreate
		return step
	case existing.DeletionTimestamp != nil:
		step.Action = JobDeleting
		return step
	case existing.Annotations[render.AnnotationPlanHash] == want:
		step.Action = JobKeep
		return step
	}
	running := runningPods(existing.Name, pods)
	if existing.Annotations[AnnotationResizedTo] == want {
		// Kept whatever its pod does now (a finished stream stays finished), unless the kubelet
		// refused the resize (PodResizePending, Infeasible: e.g. exclusive CPUs under the static
		// CPU manager without KEP-5554).
		for _, p := range running {
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodResizePending && c.Status == corev1.ConditionTrue && c.Reason == corev1.PodReasonInfeasible {
					step.Action = JobReplace
					step.Event = &Event{Related: existing, Type: corev1.EventTypeWarning, Reason: "ResizeInfeasible", Action: "Apply",
						Message: fmt.Sprintf("the kubelet cannot resize pod %s in place (%s): re-creating Job %s with the new plan", p.Name, c.Message, existing.Name)}
					return step
				}
			}
		}
		step.Action = JobResized
		return step
	}
	if inPlace && len(running) == 1 {
		step.Action, step.Pod = JobResize, running[0]
		step.Event = &Event{Related: running[0], Type: corev1.EventTypeNormal, Reason: "ResizedInPlace", Action: "Apply",
			Message: fmt.Sprintf("pod %s resized in place to the new plan (%s): its agents use the new CPUs as they run", running[0].Name, describeResources(desired.Spec.Template.Spec.Containers))}
		return step
	}
	step.Action = JobReplace
	step.Event = &Event{Related: existing, Type: corev1.EventTypeNormal, Reason: "Replacing", Action: "Apply",
		Message: fmt.Sprintf("Job %s runs an older plan: replacing it (its stream resumes where it stopped)", existing.Name)}
	return step
}

// rollout replaces at most spec.rollout.maxStreams streams at once, lowest stream id first. A
// stream is busy while one of its Jobs is being deleted, not made yet, or made without a pod of
// its own running (or finished); a Replace of another stream waits (JobRoll, its stream going on
// with its older plan) while maxStreams streams are busy. The facts decide it on every pass, so
// a stale copy of the status cannot start two streams at once. status.rollPending names the
// streams waiting their turn. A suspended pipeline runs no pods to wait for, and host-network
// streams whose connections change move their ports into each other's: those are replaced all
// at once.
func rollout(sp *v1beta1.StreamPipeline, f facts, before *v1beta1.Plan, steps []JobStep) []JobStep {
	limit := sp.Spec.RolloutMaxStreams()
	if sp.Spec.Suspend || (sp.Spec.HostNetwork && before != nil && before.Connections != sp.Status.Plan.Connections) {
		limit = 0
	}
	byStream := map[int][]int{} // stream -> indexes of its steps
	for i, s := range steps {
		if id, ok := stepStream(s); ok && s.Action != JobDelete {
			byStream[id] = append(byStream[id], i)
		}
	}
	busy := map[int]bool{}
	for id, idx := range byStream {
		for _, i := range idx {
			switch s := steps[i]; s.Action {
			case JobDeleting, JobCreate:
				busy[id] = true
			case JobReplace:
			default:
				if !jobRuns(s.Existing, f.pods) {
					busy[id] = true
				}
			}
		}
	}
	for _, id := range slices.Sorted(maps.Keys(byStream)) {
		if !slices.ContainsFunc(byStream[id], func(i int) bool { return steps[i].Action == JobReplace }) {
			continue
		}
		if limit == 0 || busy[id] || len(busy) < limit {
			busy[id] = true
			continue
		}
		for _, i := range byStream[id] {
			if steps[i].Action == JobReplace {
				steps[i].Action, steps[i].Event = JobRoll, nil
			}
		}
	}
	sp.Status.RollPending = nil
	for _, id := range slices.Sorted(maps.Keys(byStream)) {
		if slices.ContainsFunc(byStream[id], func(i int) bool { return steps[i].Action == JobRoll }) {
			sp.Status.RollPending = append(sp.Status.RollPending, int32(id))
		}
	}
	return steps
}

// senderFirst orders the replacement of a stream that reads a live detector (stream2, zmq)
// when both its Jobs are replaced (a key rotation, an upgrade): asked to stop, its sender reads
// the detector on until it pauses and needs its gateway to take what it read, while a gateway
// stops taking data when asked to stop. So the old sender goes first; while its pod drains, the
// gateway waits and so does the new sender (its new keys would not open the old gateway); then
// the gateway is replaced and the new sender made, and the detector meanwhile holds what it
// produces, as it does between any two senders.
func senderFirst(sp *v1beta1.StreamPipeline, f facts, steps []JobStep) []JobStep {
	draining := map[int]bool{}
	current := map[int]*batchv1.Job{} // each stream's sender Job that stays
	for _, s := range steps {
		id, ok := stepStream(s)
		if !ok || stepRole(s) != render.RoleSender {
			continue
		}
		if s.Action == JobReplace || s.Action == JobDeleting {
			draining[id] = true
		} else if s.Existing != nil {
			current[id] = s.Existing
		}
	}
	// A sender pod not yet finished that is going (or whose Job went: the garbage collector has
	// not marked it yet) is the old sender draining.
	for i := range f.pods {
		p := &f.pods[i]
		id, err := strconv.Atoi(p.Labels[render.LabelStream])
		if err != nil || p.Labels[render.LabelRole] != render.RoleSender || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		owner := metav1.GetControllerOf(p)
		if p.DeletionTimestamp != nil || current[id] == nil || owner == nil || owner.UID != current[id].UID {
			draining[id] = true
		}
	}
	// Only where the gateway is replaced too: a sender replaced alone waits for its gateway's
	// welcome anyway.
	gatewayReplaced := map[int]bool{}
	for _, s := range steps {
		if id, ok := stepStream(s); ok && stepRole(s) == render.RoleGateway && s.Action == JobReplace {
			gatewayReplaced[id] = true
		}
	}
	for i, s := range steps {
		id, ok := stepStream(s)
		if !ok || !draining[id] || !gatewayReplaced[id] || !liveSource(sp, id) {
			continue
		}
		if (stepRole(s) == render.RoleGateway && s.Action == JobReplace) || (stepRole(s) == render.RoleSender && s.Action == JobCreate) {
			steps[i].Action, steps[i].Event = JobAfterSender, nil
		}
	}
	return steps
}

// liveSource: the stream's sender reads a detector that does not wait (stream2, zmq).
func liveSource(sp *v1beta1.StreamPipeline, stream int) bool {
	i := sp.SenderOfStream(stream)
	if i < 0 || i >= len(sp.Spec.Senders) {
		return false
	}
	src := sp.Spec.Senders[i].Source
	return src.Stream2 != nil || src.ZMQ != nil
}

// stepRole is the role of a JobStep's Job (its role label).
func stepRole(s JobStep) string {
	j := s.Desired
	if j == nil {
		j = s.Existing
	}
	if j == nil {
		return ""
	}
	return j.Labels[render.LabelRole]
}

// stepStream is the stream a JobStep's Job belongs to (its stream label).
func stepStream(s JobStep) (int, bool) {
	j := s.Desired
	if j == nil {
		j = s.Existing
	}
	if j == nil {
		return 0, false
	}
	id, err := strconv.Atoi(j.Labels[render.LabelStream])
	return id, err == nil
}

// streamFinished: the stream of Job j has finished — its sender's Job completed (a gateway
// finishes after its sender).
func streamFinished(j *batchv1.Job, jobs map[string]*batchv1.Job) bool {
	if j == nil {
		return false
	}
	for _, o := range jobs {
		if o.Labels[render.LabelStream] == j.Labels[render.LabelStream] && o.Labels[render.LabelRole] == render.RoleSender &&
			o.DeletionTimestamp == nil && jobComplete(o) {
			return true
		}
	}
	return false
}

// jobComplete: the Job's Complete condition is true.
func jobComplete(j *batchv1.Job) bool {
	for _, c := range j.Status.Conditions {
		if c.Type == batchv1.JobComplete && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// jobRuns: the Job has a pod of its own running (not being deleted), or has finished.
func jobRuns(j *batchv1.Job, pods []corev1.Pod) bool {
	if j == nil {
		return false
	}
	if j.Status.Succeeded > 0 || j.Status.Failed > 0 && j.Status.Active == 0 {
		return true
	}
	for i := range pods {
		// Its own pods (by owner), not those of the Job of the same name it replaced.
		p := &pods[i]
		if owner := metav1.GetControllerOf(p); owner != nil && owner.UID == j.UID && p.DeletionTimestamp == nil &&
			(p.Status.Phase == corev1.PodRunning || p.Status.Phase == corev1.PodSucceeded) {
			return true
		}
	}
	return false
}

// runningPods are the Job's pods that run and are not being deleted.
func runningPods(job string, pods []corev1.Pod) []*corev1.Pod {
	var out []*corev1.Pod
	for i := range pods {
		p := &pods[i]
		if p.Labels[batchv1.JobNameLabel] == job && p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

// unwantedVolumes are the pipeline's claims and volumes no pod of the plan mounts: a claim goes
// when no pod uses it any more (the API server's protection), its volume once the claim is gone.
func unwantedVolumes(sp *v1beta1.StreamPipeline, f facts, vols []storage.Volume) ([]*corev1.PersistentVolumeClaim, []*corev1.PersistentVolume) {
	wantPV, wantClaim := map[string]bool{}, map[string]bool{}
	for _, v := range vols {
		wantPV[v.PV.Name], wantClaim[v.Claim.Name] = true, true
	}
	var claims []*corev1.PersistentVolumeClaim
	for i := range f.claims {
		c := &f.claims[i]
		if !wantClaim[c.Name] && metav1.IsControlledBy(c, sp) && c.DeletionTimestamp == nil {
			claims = append(claims, c)
		}
	}
	return claims, unwantedPVs(f.volumes, wantPV)
}

// unwantedPVs are the volumes but those in keep that are not being deleted already.
func unwantedPVs(pvs []corev1.PersistentVolume, keep map[string]bool) []*corev1.PersistentVolume {
	var out []*corev1.PersistentVolume
	for i := range pvs {
		if pv := &pvs[i]; !keep[pv.Name] && pv.DeletionTimestamp == nil {
			out = append(out, pv)
		}
	}
	return out
}

// topologyRejections finds the pods the kubelet's Topology Manager refused (Failed, reason
// TopologyAffinityError: Kubernetes never reschedules them) and records them in sp's status.
// A refused gateway pod lowers the receiving cores the next plan asks for by one, so the plan
// that follows is one the NIC's NUMA node can still align, never the same one again. The pods
// are returned to be deleted once the new plan is applied, so the Job makes new ones.
func topologyRejections(sp *v1beta1.StreamPipeline, pods []corev1.Pod) ([]*corev1.Pod, []Event) {
	var out []*corev1.Pod
	var events []Event
	for i := range pods {
		p := &pods[i]
		if p.Status.Phase != corev1.PodFailed || p.Status.Reason != ReasonTopologyAffinity || p.DeletionTimestamp != nil {
			continue
		}
		out = append(out, p)
		tr := sp.Status.TopologyRejection
		if tr == nil || tr.Generation != sp.Generation {
			tr = &v1beta1.TopologyRejection{Generation: sp.Generation, ReceiveCores: -1}
			sp.Status.TopologyRejection = tr
		}
		what := p.Name + " on " + p.Spec.NodeName
		if slices.Contains(tr.Pods, what) {
			continue
		}
		tr.Pods = append(tr.Pods, what)
		if len(tr.Pods) > 5 {
			tr.Pods = tr.Pods[len(tr.Pods)-5:]
		}
		if p.Labels[render.LabelRole] == render.RoleGateway {
			asked := receiveCoresOf(sp)
			if tr.ReceiveCores < 0 || int(tr.ReceiveCores) > asked-1 {
				tr.ReceiveCores = int32(max(asked-1, 0))
			}
		}
		msg := fmt.Sprintf("Topology Manager refused %s; planning again with at most %d receiving cores per stream", what, tr.ReceiveCores)
		if tr.ReceiveCores == 0 {
			msg = fmt.Sprintf("Topology Manager refused %s with 1 receiving core per stream: no plan can align one with the NIC; not planning again until the spec changes", what)
		}
		events = append(events, Event{Related: p, Type: corev1.EventTypeWarning, Reason: ReasonTopologyAffinity, Action: "Replan", Message: msg})
	}
	return out, events
}

// onwardSecurity is how the onward consumer named talks to its far site, for status.plan.onward.
func onwardSecurity(sp *v1beta1.StreamPipeline, consumer string) string {
	for _, k := range sp.Spec.Sinks {
		if k.Name == consumer && k.Onward != nil && k.Onward.InsecurePlaintext {
			return "insecure-plaintext"
		}
	}
	return "curve"
}
