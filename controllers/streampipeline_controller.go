// Package controllers holds the StreamPipeline reconciler: fetch, gather node facts, plan (pure),
// render (pure), apply, status. Decisions live in internal/planner and internal/render.
package controllers

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/conditions"
	"github.com/numastream/numastream/internal/curvekeys"
	"github.com/numastream/numastream/internal/planner"
	"github.com/numastream/numastream/internal/render"
	"github.com/numastream/numastream/internal/storage"
	"github.com/numastream/numastream/internal/topology"
)

// FieldOwner is the server-side apply field manager of everything the operator writes.
const FieldOwner = "numastream-operator"

// NetworkStatusAnnotation is where Multus reports a pod's networks and addresses.
const NetworkStatusAnnotation = "k8s.v1.cni.cncf.io/network-status"

// Condition reasons the controller itself decides; the rest are in internal/conditions.
const (
	ReasonPlanned           = conditions.ReasonPlanned
	ReasonNodeNotFound      = "NodeNotFound"
	ReasonMissingNodeLabels = "MissingNodeLabels"
	ReasonNoCapacity        = "NoCapacity"
	ReasonInvalidSpec       = "InvalidSpec"
	ReasonSuspended         = conditions.ReasonSuspended
	ReasonRunning           = conditions.ReasonRunning
	ReasonCompleted         = conditions.ReasonCompleted
	ReasonPending           = conditions.ReasonPending
	ReasonTopologyAffinity  = conditions.ReasonTopologyAffinity
	ReasonReceiversNICLocal = conditions.ReasonReceiversNICLocal
	ReasonReceiversRemote   = conditions.ReasonReceiversRemote
	indexNodeNames          = "spec.nodeNames"
	indexGateway            = "spec.gateway.node"
	indexPodNode            = "spec.nodeName"
)

// StreamPipelineReconciler reconciles StreamPipelines.
type StreamPipelineReconciler struct {
	client.Client
	Scheme   *runtime.Scheme
	Recorder events.EventRecorder
	Render   render.Options
	// APIReader reads what the operator does not cache (Secrets, Events): the manager's API
	// reader. Nil: the client for Secrets, and no admission refusals from Events.
	APIReader client.Reader
	// Namespaces the operator drives (nil: every namespace). It reads the pipelines of all
	// namespaces (they share gateways and storage) and writes in these only.
	Namespaces Namespaces
	// Workers: how many pipelines are reconciled at once (0: DefaultWorkers). One pipeline is
	// never reconciled twice at once; two on one gateway may be, and converge as they do one
	// after the other: each plan's change wakes the other (sameGateway), and the younger one
	// plans around the older one's cores.
	Workers int
	// Final reads the agents' final figures from a finished pipeline's pods (their exit
	// summaries), written with Ready=Completed so that no reader sees Completed beside the
	// figures of a reading taken while the agents still ran. Nil: the Observer's next reading
	// brings them.
	Final func(ctx context.Context, sp *v1beta1.StreamPipeline, pods []corev1.Pod) (*v1beta1.Observed, error)
}

// DefaultWorkers: a pass waits on the API server for most of its time (a dozen requests), so
// a few at once keep it busy when many pipelines arrive together.
const DefaultWorkers = 8

// +kubebuilder:rbac:groups=numastream.io,resources=streampipelines,verbs=get;list;watch
// +kubebuilder:rbac:groups=numastream.io,resources=streampipelines/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=batch,resources=jobs,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=configmaps;services,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups="",resources=pods/resize,verbs=patch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;create;update
// +kubebuilder:rbac:groups="",resources=events,verbs=list
// +kubebuilder:rbac:groups=networking.k8s.io,resources=networkpolicies,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=persistentvolumes,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=numastream.io,resources=storageroots,verbs=get;list;watch
// +kubebuilder:rbac:groups=numastream.io,resources=remotesites,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile drives one StreamPipeline towards its plan: get, gather (the only reads), plan,
// render, apply, then the conditions from what was gathered and done. The status is patched
// once, on the way out, when it changed.
func (r *StreamPipelineReconciler) Reconcile(ctx context.Context, req ctrl.Request) (result ctrl.Result, err error) {
	if !r.Namespaces.Watches(req.Namespace) {
		return ctrl.Result{}, nil // another namespace's (it shares a gateway or storage with one of ours)
	}
	sp := &v1beta1.StreamPipeline{}
	if err := r.Get(ctx, req.NamespacedName, sp); err != nil {
		if apierrors.IsNotFound(err) {
			forgetPipelineMetrics(req.Namespace, req.Name)
			// Its claims went with it; the volumes made for them are cluster-scoped.
			pvs, err := r.pipelineVolumes(ctx, req.Namespace, req.Name)
			if err != nil {
				return ctrl.Result{}, err
			}
			return ctrl.Result{}, r.deleteAll(ctx, unwantedPVs(pvs, nil))
		}
		return ctrl.Result{}, err
	}
	reconciles.WithLabelValues(sp.Namespace).Inc()
	before := sp.DeepCopy()
	defer func() {
		if !equality.Semantic.DeepEqual(before.Status, sp.Status) {
			if perr := r.Status().Patch(ctx, sp, client.MergeFrom(before)); perr != nil {
				err = errors.Join(err, perr)
			}
		}
	}()
	sp.Status.Streams = int32(len(sp.Spec.Senders))
	sp.Status.ExpectedChunks = sp.ExpectedChunks()
	sp.AssignStreams()
	newStreams := !equality.Semantic.DeepEqual(before.Status.Senders, sp.Status.Senders) || before.Status.NextStream != sp.Status.NextStream
	firstPlan := !meta.IsStatusConditionTrue(before.Status.Conditions, v1beta1.ConditionPlanned)

	f, err := r.gather(ctx, sp)
	if err != nil {
		return ctrl.Result{}, err
	}
	d, err := Decide(sp, f, decideOptions{Render: r.Render, Now: time.Now(), NewPair: curvekeys.New})
	if err != nil {
		return ctrl.Result{}, err
	}
	sp.Status = d.Status
	r.figuresBeforeReplacing(ctx, sp, d)
	if newStreams {
		// New stream ids are recorded before anything is named after them, and only on the
		// latest pipeline: a reconcile of a stale copy fails here (conflict) and runs again,
		// so no Job, key or file ever gets an id another sender had. With them goes the rest
		// of the pass's status, its conditions as if its writes succeed (conclude writes again
		// when they do not): a new pipeline's status is written once.
		var events []Event
		if !d.Facts.Replacing && d.Replan == nil {
			events = changeConditions(sp, conditions.Compute(d.Facts))
			sp.Status.ObservedGeneration = sp.Generation
		}
		if err := r.Status().Patch(ctx, sp, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
			sp.Status = before.Status // nor written on the way out: the ids are the stale copy's
			return ctrl.Result{}, err
		}
		before = sp.DeepCopy()
		d.Events = append(d.Events, events...)
	}
	for _, e := range d.Events {
		r.record(sp, e)
	}
	if newStreams && firstPlan && d.Plan != nil && !d.Facts.Replacing && d.Replan == nil {
		// A new pipeline's plan is in its status now; its objects are written by a pass queued
		// below the passes other pipelines' events ask for, so that pipelines applied together
		// are all planned before any holds a worker writing objects.
		setPipelineMetrics(sp)
		return ctrl.Result{RequeueAfter: time.Millisecond, Priority: new(objectsPriority)}, nil
	}
	did, err := r.execute(ctx, sp, d)
	if err != nil {
		// Said in status, not only retried: a refused write never leaves a stale status.
		d.Facts.ApplyError = err.Error()
		r.conclude(ctx, sp, d, did)
		return ctrl.Result{}, err
	}
	for _, p := range d.DeletePods {
		if err := r.Delete(ctx, p); client.IgnoreNotFound(err) != nil {
			return ctrl.Result{}, err
		}
	}
	r.conclude(ctx, sp, d, did)
	return ctrl.Result{RequeueAfter: requeueAfter(sp, f, d)}, nil
}

// objectsPriority queues a new pipeline's second pass, the one that writes its objects, below
// the passes watch events ask for (priority 0) and above what a restarted operator's first list
// asks for (handler.LowPriority).
var objectsPriority = -1

// requeueAfter is when the pipeline is reconciled again without a watch event: at its next key
// rotation, soon while Jobs are being replaced, and every 10 s while it converges towards
// something no watch reports: a Job with no pod (why the Job controller makes none is in
// events, not watched) or a refusal that may go away by itself (a StorageRoot the admin
// adds). Waiting for pods, Jobs, nodes or other pipelines needs no timer: their watches wake
// the pipeline, and a timer there would make 1000 pending pipelines 100 reconciles a second.
func requeueAfter(sp *v1beta1.StreamPipeline, f facts, d Decision) time.Duration {
	after := d.NextRotation
	unwatched := len(f.podless) > 0 || (d.Facts.Refusal != nil && d.Facts.Refusal.Retry)
	switch {
	case d.Facts.Replacing:
		after = 2 * time.Second
	case unwatched && meta.IsStatusConditionTrue(sp.Status.Conditions, conditions.Reconciling) && (after == 0 || after > 10*time.Second):
		after = 10 * time.Second
	}
	return after
}

// conclude sets what the writes' outcome decides: a re-plan's record (resized in place or not)
// and the conditions, with the agents' final figures when the pipeline has just completed.
func (r *StreamPipelineReconciler) conclude(ctx context.Context, sp *v1beta1.StreamPipeline, d Decision, did executed) {
	d.Facts.Replacing = d.Facts.Replacing || did.replaced
	if d.Replan != nil && d.Facts.ApplyError == "" {
		r.recordReplan(sp, d.Replan, d.PlanBefore, did.resized > 0)
	}
	computed := conditions.Compute(d.Facts)
	if obs := r.finalFigures(ctx, sp, computed); obs != nil {
		sp.Status.Observed, d.Facts.Observed = obs, obs
		computed = conditions.Compute(d.Facts) // Degraded from the final counts
	}
	r.setConditions(sp, computed)
	sp.Status.ObservedGeneration = sp.Generation
	setPipelineMetrics(sp)
}

// finalFigures: when this pass makes the pipeline Completed, the final figures its agents left
// in their exit summaries, read from the pods as the API server has them now (the cache may not
// have the last container's termination yet when the Job's completion wakes this pass). Nil when
// the pipeline was already Completed, or nothing could be read: the Observer's readings stand.
func (r *StreamPipelineReconciler) finalFigures(ctx context.Context, sp *v1beta1.StreamPipeline, computed []metav1.Condition) *v1beta1.Observed {
	now := meta.FindStatusCondition(computed, v1beta1.ConditionReady)
	was := meta.FindStatusCondition(sp.Status.Conditions, v1beta1.ConditionReady)
	if r.Final == nil || now == nil || now.Reason != ReasonCompleted || (was != nil && was.Reason == ReasonCompleted) {
		return nil
	}
	return r.readAgents(ctx, sp)
}

// figuresBeforeReplacing: a gateway Job this pass replaces takes its pod's counts with it (the
// pod drains, exits and is gone within a second or two, between two of the Observer's
// readings), so its agents are read first: the series it completed stay counted
// (status.observed.seriesByPod). What it completes while it drains is not seen.
func (r *StreamPipelineReconciler) figuresBeforeReplacing(ctx context.Context, sp *v1beta1.StreamPipeline, d Decision) {
	if r.Final == nil {
		return
	}
	for _, s := range d.Jobs {
		if (s.Action == JobReplace || s.Action == JobResize) && s.Existing != nil && s.Existing.DeletionTimestamp == nil &&
			s.Existing.Labels[render.LabelRole] == render.RoleGateway {
			if obs := r.readAgents(ctx, sp); obs != nil {
				sp.Status.Observed = obs
			}
			return
		}
	}
}

// readAgents reads the pipeline's agents now (running ones from their metrics, exited ones from
// their summaries), from the pods as the API server has them; nil when nothing could be read.
func (r *StreamPipelineReconciler) readAgents(ctx context.Context, sp *v1beta1.StreamPipeline) *v1beta1.Observed {
	var reader client.Reader = r.Client
	if r.APIReader != nil {
		reader = r.APIReader
	}
	var pods corev1.PodList
	if err := reader.List(ctx, &pods, client.InNamespace(sp.Namespace), client.MatchingLabels{render.LabelPipeline: sp.Name}); err != nil {
		ctrl.LoggerFrom(ctx).V(1).Info("Cannot list the pipeline's pods to read its agents", "error", err)
		return nil
	}
	obs, err := r.Final(ctx, sp, pods.Items)
	if err != nil {
		ctrl.LoggerFrom(ctx).V(1).Info("Cannot read the agents", "error", err)
		return nil
	}
	return obs
}

// refusal turns a planning failure into the Planned=False facts; an API error is returned as
// is, to be retried with backoff.
func refusal(err error) (*conditions.Refusal, error) {
	var np *notPlannedError
	var refused *planner.RefusedError
	var missing *topology.MissingLabelError
	var storageRefused *storage.Refusal
	switch {
	case errors.As(err, &storageRefused):
		// The admin may add the root, the older pipeline may go: retried, not stalled.
		return &conditions.Refusal{Reason: storageRefused.Reason, Message: err.Error(), Retry: true}, nil
	case errors.As(err, &np):
		return &conditions.Refusal{Reason: np.reason, Message: err.Error(), Retry: np.retry}, nil
	case errors.As(err, &missing):
		return &conditions.Refusal{Reason: ReasonMissingNodeLabels, Message: err.Error(), Retry: true}, nil
	case errors.As(err, &refused):
		return &conditions.Refusal{Reason: ReasonNoCapacity, Message: err.Error()}, nil
	}
	return nil, err
}

// receiveCoresOf is what the current plan asks of the NIC's NUMA node per stream.
func receiveCoresOf(sp *v1beta1.StreamPipeline) int {
	if sp.Status.Plan == nil {
		return 1
	}
	return int(sp.Status.Plan.Connections)
}

// resizable: the new plan runs the same pods as the one before (nodes, streams, connections,
// stages and their NUMA targets) with other CPU counts and thread counts only, which a resize in
// place can give them.
func resizable(before, after *v1beta1.Plan) bool {
	if before == nil || after == nil || before.Connections != after.Connections || before.NICNUMANode != after.NICNUMANode ||
		len(before.Nodes) != len(after.Nodes) {
		return false
	}
	stream := func(p *int32) int32 {
		if p == nil {
			return -1
		}
		return *p
	}
	for i, a := range before.Nodes {
		b := after.Nodes[i]
		if a.Node != b.Node || a.Role != b.Role || stream(a.StreamID) != stream(b.StreamID) || len(a.Stages) != len(b.Stages) {
			return false
		}
		for j, s := range a.Stages {
			if s.Stage != b.Stages[j].Stage || s.NUMA != b.Stages[j].NUMA {
				return false
			}
		}
	}
	return true
}

// planHistoryLength bounds status.planHistory.
const planHistoryLength = 10

// recordReplan: the plan made from the observed facts in status.replan (now sp.Status.Plan),
// against the one before, in the plan history and as a Replanned event. A plan that changes what
// the agents run re-renders their Jobs, and apply replaces them: their streams resume where they
// stopped (state_dir on the sender nodes).
func (r *StreamPipelineReconciler) recordReplan(sp *v1beta1.StreamPipeline, rp *v1beta1.Replan, before *v1beta1.Plan, inPlace bool) {
	rp.Applied = true
	from, to := describePlan(before), describePlan(sp.Status.Plan)
	change := v1beta1.PlanChange{At: metav1.Now(), Reason: rp.Reason, From: from, To: to}
	// What the agents run (nodes, CPUs, threads, connections) against what is only predicted.
	runs := func(p *v1beta1.Plan) string { return strings.SplitN(describePlan(p), ", predicted ", 2)[0] }
	switch {
	case from == to:
		change.Applied = "unchanged"
		r.Recorder.Eventf(sp, nil, corev1.EventTypeNormal, "Replanned", "Replan", "%s: the plan stays %s", rp.Reason, to)
	case inPlace:
		change.Applied = "in place"
		r.Recorder.Eventf(sp, nil, corev1.EventTypeNormal, "Replanned", "Replan",
			"%s: %s -> %s; the agents' pods were resized in place and their streams go on", rp.Reason, from, to)
	case runs(before) != runs(sp.Status.Plan):
		change.Applied = "re-created"
		r.Recorder.Eventf(sp, nil, corev1.EventTypeNormal, "Replanned", "Replan",
			"%s: %s -> %s; the agents' pods are re-created and their streams resume", rp.Reason, from, to)
	default:
		change.Applied = "status only"
		r.Recorder.Eventf(sp, nil, corev1.EventTypeNormal, "Replanned", "Replan",
			"%s: %s -> %s; the agents already run what it asks (only the prediction changed)", rp.Reason, from, to)
	}
	sp.Status.PlanHistory = append(sp.Status.PlanHistory, change)
	if n := len(sp.Status.PlanHistory); n > planHistoryLength {
		sp.Status.PlanHistory = sp.Status.PlanHistory[n-planHistoryLength:]
	}
}

// describePlan is a plan in one line: what each node runs, the prediction and its limit.
func describePlan(p *v1beta1.Plan) string {
	if p == nil {
		return "no plan"
	}
	var nodes []string
	for _, n := range p.Nodes {
		var stages []string
		for _, s := range n.Stages {
			stages = append(stages, fmt.Sprintf("%s %d", s.Stage, s.Threads))
		}
		shared := ""
		if n.SharedMilliCPU > 0 {
			shared = fmt.Sprintf(" + %dm shared", n.SharedMilliCPU)
		}
		nodes = append(nodes, fmt.Sprintf("%s %s %d CPUs%s (%s)", n.Role, n.Node, n.CPUs, shared, strings.Join(stages, ", ")))
	}
	return fmt.Sprintf("%s; %d connections, predicted %.1f Gbit/s, bottleneck %s",
		strings.Join(nodes, "; "), p.Connections, float64(p.PredictedTotalMbps)/1000, p.Bottleneck)
}

func toAPIPlan(p planner.Plan) *v1beta1.Plan {
	out := &v1beta1.Plan{
		Connections: int32(p.Connections), NICNUMANode: int32(p.NICNode),
		PredictedMbps: int64(p.RateMbit), PredictedTotalMbps: int64(p.TotalMbit), Bottleneck: string(p.Bottleneck),
	}
	for _, g := range p.Gateways {
		for _, o := range g.Onward {
			per := int64(0) // nothing bounds a connection
			if !math.IsInf(o.PerConnectionMbps, 1) {
				per = int64(o.PerConnectionMbps)
			}
			out.Onward = append(out.Onward, v1beta1.OnwardPlan{StreamID: int32(g.Stream), Consumer: o.Name,
				Connections: int32(o.Connections), PerConnectionMbps: per, PredictedMbps: int64(o.RawMbps),
				PredictedPathMbps: int64(o.PredictedMbps), Limit: o.Limit})
		}
	}
	ids := make([]int, 0, len(p.Holds))
	for id := range p.Holds {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	for _, id := range ids {
		if p.Holds[id] > 0 {
			out.GatewayCores = append(out.GatewayCores, v1beta1.NUMACores{NUMANode: int32(id), Cores: int32(p.Holds[id])})
		}
	}
	for _, n := range p.Pods() {
		np := v1beta1.NodePlan{Node: n.Node, Role: string(n.Role), CPUs: int32(n.CPUs), SharedMilliCPU: n.SharedMilliCPU}
		np.StreamID = new(int32)
		*np.StreamID = int32(n.Stream)
		for _, s := range n.Stages {
			np.Stages = append(np.Stages, v1beta1.StagePlan{Stage: string(s.Name), Threads: int32(s.Threads), NUMA: string(s.NUMA), RateMbps: int64(s.RateMbit)})
		}
		out.Nodes = append(out.Nodes, np)
	}
	return out
}

// setConditions writes the computed conditions and records an event for each decision and
// refusal: a new plan, and every change of a condition's status or reason. A condition that
// appears saying nothing has happened (Degraded=False, NICLocal=Unknown, Ready=False while the
// agents start) records none: every new pipeline would write three events to say so.
func (r *StreamPipelineReconciler) setConditions(sp *v1beta1.StreamPipeline, computed []metav1.Condition) {
	for _, e := range changeConditions(sp, computed) {
		r.record(sp, e)
	}
}

// changeConditions sets the computed conditions in sp's status and returns the events their
// changes call for (setConditions).
func changeConditions(sp *v1beta1.StreamPipeline, computed []metav1.Condition) []Event {
	var events []Event
	for _, c := range computed {
		old := meta.FindStatusCondition(sp.Status.Conditions, c.Type)
		if old != nil && conditions.Restated(*old, c) {
			c.Message = old.Message
		}
		changed := old == nil || old.Status != c.Status || old.Reason != c.Reason ||
			(c.Type == v1beta1.ConditionPlanned && old.Message != c.Message)
		meta.SetStatusCondition(&sp.Status.Conditions, c)
		if !changed || c.Type == conditions.Reconciling {
			continue
		}
		if old == nil && ((c.Type == v1beta1.ConditionDegraded && c.Status == metav1.ConditionFalse) ||
			(c.Type == v1beta1.ConditionNICLocal && c.Status == metav1.ConditionUnknown) ||
			(c.Type == v1beta1.ConditionReady && c.Reason == conditions.ReasonPending)) {
			continue
		}
		if c.Type == conditions.Stalled && c.Status != metav1.ConditionTrue {
			continue
		}
		if slices.ContainsFunc(events, func(e Event) bool { return e.Reason == c.Reason }) {
			continue // one event for what several conditions say at once (Ready and Stalled: Unschedulable)
		}
		kind := corev1.EventTypeNormal
		if conditions.Bad(c) {
			kind = corev1.EventTypeWarning
		}
		events = append(events, Event{Type: kind, Reason: c.Reason, Action: c.Type, Message: c.Message})
	}
	return events
}

// SetupWithManager wires the watches: owned objects, the nodes a pipeline uses (a label change
// re-plans), the agent pods, and the other pipelines on the same gateway.
func (r *StreamPipelineReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	idx := mgr.GetFieldIndexer()
	if err := idx.IndexField(ctx, &v1beta1.StreamPipeline{}, indexNodeNames, func(o client.Object) []string {
		sp := o.(*v1beta1.StreamPipeline)
		names := []string{sp.Spec.Gateway.Node}
		for _, s := range sp.Spec.Senders {
			names = append(names, s.Node)
		}
		return names
	}); err != nil {
		return err
	}
	if err := idx.IndexField(ctx, &v1beta1.StreamPipeline{}, indexGateway, func(o client.Object) []string {
		return []string{o.(*v1beta1.StreamPipeline).Spec.Gateway.Node}
	}); err != nil {
		return err
	}
	if err := idx.IndexField(ctx, &corev1.Pod{}, indexPodNode, func(o client.Object) []string {
		return []string{o.(*corev1.Pod).Spec.NodeName}
	}); err != nil {
		return err
	}
	byNode := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		return r.pipelinesMatching(ctx, client.MatchingFields{indexNodeNames: o.GetName()})
	})
	byPodLabel := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		name := o.GetLabels()[render.LabelPipeline]
		if name == "" {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
	})
	// The other pipelines on a gateway: a pipeline's own changes reach it through For (its own
	// status writes need no pass of their own).
	sameGateway := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		sp := o.(*v1beta1.StreamPipeline)
		return slices.DeleteFunc(r.pipelinesMatching(ctx, client.MatchingFields{indexGateway: sp.Spec.Gateway.Node}),
			func(q reconcile.Request) bool { return q.NamespacedName == client.ObjectKeyFromObject(sp) })
	})
	workers := r.Workers
	if workers <= 0 {
		workers = DefaultWorkers
	}
	return ctrl.NewControllerManagedBy(mgr).
		WithOptions(controller.Options{MaxConcurrentReconciles: workers}).
		For(&v1beta1.StreamPipeline{}, builder.WithPredicates(predicate.Or[client.Object](
			predicate.GenerationChangedPredicate{}, observedFactsChanged(), rotationAsked()))).
		Owns(&batchv1.Job{}).
		Owns(&corev1.ConfigMap{}).
		Owns(&corev1.Service{}).
		Owns(&networkingv1.NetworkPolicy{}).
		Owns(&corev1.PersistentVolumeClaim{}).
		Watches(&corev1.Node{}, byNode, builder.WithPredicates(nodeFactsChanged())).
		Watches(&corev1.Pod{}, byPodLabel).
		Watches(&v1beta1.StreamPipeline{}, sameGateway, builder.WithPredicates(gatewayShareChanged())).
		Watches(&v1beta1.RemoteSite{}, pipelinesOfSite(mgr.GetClient()), builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Complete(r)
}

// rotationAsked passes a new value of the numastream.io/rotate-keys annotation.
func rotationAsked() predicate.Funcs {
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			return e.ObjectOld.GetAnnotations()[v1beta1.AnnotationRotateKeys] != e.ObjectNew.GetAnnotations()[v1beta1.AnnotationRotateKeys]
		},
	}
}

// observedFactsChanged passes a status update that changes what the conditions say (chunks lost
// or corrupt, NIC locality) or asks for a re-plan. The observer's rates and timestamps, and the controller's own status
// patches, pass nothing, so no pipeline reconciles itself in a loop.
func observedFactsChanged() predicate.Funcs {
	key := func(o client.Object) string {
		obs := o.(*v1beta1.StreamPipeline).Status.Observed
		if obs == nil {
			return "none"
		}
		local := "?"
		if obs.NICLocal != nil {
			local = strconv.FormatBool(*obs.NICLocal)
		}
		// A re-plan the observer asked for (status.replan, not applied yet).
		pending := ""
		if rp := o.(*v1beta1.StreamPipeline).Status.Replan; rp != nil && !rp.Applied {
			pending = rp.ObservedAt.String()
		}
		return fmt.Sprint(obs.ChunksLost > 0, obs.ChunksCorrupt > 0, local, pending)
	}
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
		UpdateFunc:  func(e event.UpdateEvent) bool { return key(e.ObjectOld) != key(e.ObjectNew) },
	}
}

// gatewayShareChanged passes what changes the cores another pipeline holds on a shared gateway:
// its creation and deletion, a new spec, a new plan, its Planned condition.
func gatewayShareChanged() predicate.Funcs {
	share := func(o client.Object) string {
		sp := o.(*v1beta1.StreamPipeline)
		var cores []v1beta1.NUMACores
		if sp.Status.Plan != nil {
			cores = sp.Status.Plan.GatewayCores
		}
		return fmt.Sprint(sp.Generation, cores, meta.IsStatusConditionTrue(sp.Status.Conditions, v1beta1.ConditionPlanned))
	}
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool { return share(e.ObjectOld) != share(e.ObjectNew) }}
}

// nodeFactsChanged passes a node update that changes what the planner reads: labels,
// allocatable CPUs, addresses.
func nodeFactsChanged() predicate.Funcs {
	facts := func(o client.Object) string {
		n := o.(*corev1.Node)
		cpu := n.Status.Allocatable[corev1.ResourceCPU]
		return fmt.Sprint(n.Labels, cpu.String(), n.Status.Addresses)
	}
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool { return facts(e.ObjectOld) != facts(e.ObjectNew) }}
}

func (r *StreamPipelineReconciler) pipelinesMatching(ctx context.Context, sel client.MatchingFields) []reconcile.Request {
	var list v1beta1.StreamPipelineList
	if err := r.List(ctx, &list, sel); err != nil {
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for _, sp := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&sp)})
	}
	return out
}
