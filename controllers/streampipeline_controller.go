// Package controllers holds the StreamPipeline reconciler: fetch, gather node facts, plan (pure),
// render (pure), apply, status. Decisions live in internal/planner and internal/render.
package controllers

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/numastream/numastream/api/v1alpha1"
	"github.com/numastream/numastream/internal/planner"
	"github.com/numastream/numastream/internal/render"
	"github.com/numastream/numastream/internal/topology"
)

// FieldOwner is the server-side apply field manager of everything the operator writes.
const FieldOwner = "numastream-operator"

// NetworkStatusAnnotation is where Multus reports a pod's networks and addresses.
const NetworkStatusAnnotation = "k8s.v1.cni.cncf.io/network-status"

// Condition reasons.
const (
	ReasonPlanned           = "Planned"
	ReasonNodeNotFound      = "NodeNotFound"
	ReasonMissingNodeLabels = "MissingNodeLabels"
	ReasonNoCapacity        = "NoCapacity"
	ReasonInvalidSpec       = "InvalidSpec"
	ReasonSuspended         = "Suspended"
	ReasonRunning           = "Running"
	ReasonCompleted         = "Completed"
	ReasonPending           = "Pending"
	ReasonNotPlanned        = "NotPlanned"
	ReasonTopologyAffinity  = "TopologyAffinityError"
	ReasonHealthy           = "Healthy"
	ReasonAwaitingAgents    = "AwaitingAgentReport"
	ReasonReceiversNICLocal = "ReceiversNICLocal"
	ReasonReceiversRemote   = "ReceiversNotNICLocal"
	indexNodeNames          = "spec.nodeNames"
	indexGateway            = "spec.gateway.node"
)

// StreamPipelineReconciler reconciles StreamPipelines.
type StreamPipelineReconciler struct {
	client.Client
	Scheme   *runtime.Scheme
	Recorder events.EventRecorder
	Render   render.Options
	// Observe reads the agents' metrics of a running pipeline (nil: not observed).
	Observe func(ctx context.Context, sp *v1alpha1.StreamPipeline, pods []corev1.Pod) (*v1alpha1.Observed, error)
	// ObserveEvery is how often a running pipeline's agents are read.
	ObserveEvery time.Duration
	// SecretReader reads Secrets without a cache (the manager's API reader); nil: the client.
	SecretReader client.Reader
}

// +kubebuilder:rbac:groups=numastream.io,resources=streampipelines,verbs=get;list;watch
// +kubebuilder:rbac:groups=numastream.io,resources=streampipelines/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=batch,resources=jobs,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=configmaps;services,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;create;update
// +kubebuilder:rbac:groups=networking.k8s.io,resources=networkpolicies,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile drives one StreamPipeline towards its plan.
func (r *StreamPipelineReconciler) Reconcile(ctx context.Context, req ctrl.Request) (result ctrl.Result, err error) {
	log := ctrl.LoggerFrom(ctx)
	sp := &v1alpha1.StreamPipeline{}
	if err := r.Get(ctx, req.NamespacedName, sp); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	before := sp.DeepCopy()
	defer func() {
		if !equality.Semantic.DeepEqual(before.Status, sp.Status) {
			if perr := r.Status().Patch(ctx, sp, client.MergeFrom(before)); perr != nil {
				err = errors.Join(err, perr)
			}
		}
	}()
	sp.Status.Streams = int32(len(sp.Spec.Senders))

	facts, err := r.gather(ctx, sp)
	if err != nil {
		return ctrl.Result{}, r.notPlanned(sp, err)
	}
	plan, err := planner.Make(request(sp, facts))
	if err != nil {
		return ctrl.Result{}, r.notPlanned(sp, err)
	}
	r.planned(sp, plan)
	keys, err := r.curveKeys(ctx, sp)
	if err != nil {
		return ctrl.Result{}, r.notPlanned(sp, err)
	}
	objs, err := render.Render(render.Inputs{Pipeline: sp, Plan: plan, Gateway: facts.gateway, KeysSecret: keys,
		GatewayAddress: facts.gatewayIP, DataAddresses: facts.dataAddresses}, r.Render)
	if err != nil {
		return ctrl.Result{}, r.notPlanned(sp, &notPlannedError{reason: ReasonInvalidSpec, err: err})
	}
	replaced, err := r.apply(ctx, sp, objs)
	if err != nil {
		return ctrl.Result{}, err
	}
	pods, err := r.pods(ctx, sp)
	if err != nil {
		return ctrl.Result{}, err
	}
	if err := r.handleTopologyRejections(ctx, sp, pods); err != nil {
		return ctrl.Result{}, err
	}
	ready := r.readiness(ctx, sp, objs)
	if ready && r.Observe != nil {
		if obs, oerr := r.Observe(ctx, sp, pods); oerr != nil {
			log.V(1).Info("Cannot read agent metrics", "pipeline", klog.KObj(sp), "error", oerr)
		} else if obs != nil {
			sp.Status.Observed = obs
			setNICLocal(sp, obs.NICLocal)
		}
	}
	sp.Status.ObservedGeneration = sp.Generation
	if replaced || !ready {
		return ctrl.Result{RequeueAfter: 2 * time.Second}, nil
	}
	if r.Observe != nil && r.ObserveEvery > 0 {
		return ctrl.Result{RequeueAfter: r.ObserveEvery}, nil
	}
	return ctrl.Result{}, nil
}

// notPlanned records why there is no plan. A missing node or label and a pipeline that does
// not fit are facts to report, not errors to retry blindly: the watches bring the change.
func (r *StreamPipelineReconciler) notPlanned(sp *v1alpha1.StreamPipeline, err error) error {
	reason := ReasonNoCapacity
	var np *notPlannedError
	var refused *planner.RefusedError
	var missing *topology.MissingLabelError
	switch {
	case errors.As(err, &np):
		reason = np.reason
	case errors.As(err, &missing):
		reason = ReasonMissingNodeLabels
	case errors.As(err, &refused):
		reason = ReasonNoCapacity
	default:
		return err // an API error: retry with backoff
	}
	msg := err.Error()
	if setCondition(sp, v1alpha1.ConditionPlanned, metav1.ConditionFalse, reason, msg) {
		r.Recorder.Eventf(sp, nil, corev1.EventTypeWarning, reason, "Plan", msg)
	}
	setCondition(sp, v1alpha1.ConditionReady, metav1.ConditionFalse, ReasonNotPlanned, "no plan: "+msg)
	sp.Status.ObservedGeneration = sp.Generation
	return nil
}

func (r *StreamPipelineReconciler) planned(sp *v1alpha1.StreamPipeline, p planner.Plan) {
	sp.Status.Plan = toAPIPlan(p)
	sp.Status.PredictedGbps = fmt.Sprintf("%.1f", p.TotalMbit/1000)
	sp.Status.Bottleneck = p.Bottleneck
	msg := fmt.Sprintf("%d streams x %d connections, predicted %.1f Gbit/s raw (%.1f per stream), limited by %s",
		len(sp.Spec.Senders), p.Connections, p.TotalMbit/1000, p.RateMbit/1000, p.Bottleneck)
	if setCondition(sp, v1alpha1.ConditionPlanned, metav1.ConditionTrue, ReasonPlanned, msg) {
		r.Recorder.Eventf(sp, nil, corev1.EventTypeNormal, ReasonPlanned, "Plan", msg)
	}
}

func toAPIPlan(p planner.Plan) *v1alpha1.Plan {
	out := &v1alpha1.Plan{
		Connections: int32(p.Connections), NICNUMANode: int32(p.NICNode),
		PredictedMbps: int64(p.RateMbit), PredictedTotalMbps: int64(p.TotalMbit), Bottleneck: p.Bottleneck,
	}
	ids := make([]int, 0, len(p.Holds))
	for id := range p.Holds {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	for _, id := range ids {
		if p.Holds[id] > 0 {
			out.GatewayCores = append(out.GatewayCores, v1alpha1.NUMACores{NUMANode: int32(id), Cores: int32(p.Holds[id])})
		}
	}
	for _, n := range p.Nodes {
		np := v1alpha1.NodePlan{Node: n.Node, Role: n.Role, CPUs: int32(n.CPUs)}
		np.StreamID = new(int32)
		*np.StreamID = int32(n.Stream)
		for _, s := range n.Stages {
			np.Stages = append(np.Stages, v1alpha1.StagePlan{Stage: s.Name, Threads: int32(s.Threads), NUMA: s.NUMA, RateMbps: int64(s.RateMbit)})
		}
		out.Nodes = append(out.Nodes, np)
	}
	return out
}

func (r *StreamPipelineReconciler) pods(ctx context.Context, sp *v1alpha1.StreamPipeline) ([]corev1.Pod, error) {
	var pods corev1.PodList
	err := r.List(ctx, &pods, client.InNamespace(sp.Namespace), client.MatchingLabels{render.LabelPipeline: sp.Name})
	return pods.Items, err
}

// handleTopologyRejections: a pod that Topology Manager refused is left Failed and never
// rescheduled by Kubernetes. Say so in status and delete it, so that the Job makes a new one
// (after the next plan, which sees the gateway as it is now).
func (r *StreamPipelineReconciler) handleTopologyRejections(ctx context.Context, sp *v1alpha1.StreamPipeline, pods []corev1.Pod) error {
	var rejected []string
	for i := range pods {
		p := &pods[i]
		if p.Status.Phase != corev1.PodFailed || p.Status.Reason != ReasonTopologyAffinity {
			continue
		}
		rejected = append(rejected, fmt.Sprintf("%s on %s", p.Name, p.Spec.NodeName))
		if err := r.Delete(ctx, p); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	if len(rejected) > 0 {
		msg := "Topology Manager rejected " + strings.Join(rejected, ", ") +
			": no NUMA node could hold the pod's CPUs together with the NIC; deleted so the Job retries after re-planning"
		if setCondition(sp, v1alpha1.ConditionDegraded, metav1.ConditionTrue, ReasonTopologyAffinity, msg) {
			r.Recorder.Eventf(sp, nil, corev1.EventTypeWarning, ReasonTopologyAffinity, "Replan", msg)
		}
		return nil
	}
	if c := meta.FindStatusCondition(sp.Status.Conditions, v1alpha1.ConditionDegraded); c == nil || c.Reason != ReasonTopologyAffinity || readyCount(sp) {
		setCondition(sp, v1alpha1.ConditionDegraded, metav1.ConditionFalse, ReasonHealthy, "no stage is failing")
	}
	return nil
}

func readyCount(sp *v1alpha1.StreamPipeline) bool {
	return meta.IsStatusConditionTrue(sp.Status.Conditions, v1alpha1.ConditionReady)
}

// readiness: Ready when every Job has a ready pod or has completed.
func (r *StreamPipelineReconciler) readiness(ctx context.Context, sp *v1alpha1.StreamPipeline, objs render.Objects) bool {
	if sp.Spec.Suspend {
		setCondition(sp, v1alpha1.ConditionReady, metav1.ConditionFalse, ReasonSuspended, "spec.suspend is true: the agents are stopped")
		return false
	}
	var waiting []string
	completed := 0
	names := make([]string, 0, len(objs.Jobs)+len(objs.Waiting))
	for _, j := range objs.Jobs {
		names = append(names, j.Name)
	}
	// A sender held back for its gateway's data address may exist from before (and may have
	// finished): it counts like the others.
	names = append(names, objs.Waiting...)
	for i, name := range names {
		cur := &batchv1.Job{}
		if err := r.Get(ctx, types.NamespacedName{Namespace: sp.Namespace, Name: name}, cur); err != nil {
			if i >= len(objs.Jobs) {
				name += " (the gateway's data-network address)"
			}
			waiting = append(waiting, name)
			continue
		}
		switch {
		case cur.Status.Succeeded > 0:
			completed++
		case cur.Status.Ready != nil && *cur.Status.Ready > 0:
		default:
			waiting = append(waiting, name)
		}
	}
	switch {
	case len(waiting) > 0:
		setCondition(sp, v1alpha1.ConditionReady, metav1.ConditionFalse, ReasonPending, "waiting for "+strings.Join(waiting, ", "))
		return false
	case completed == len(names) && len(names) > 0:
		setCondition(sp, v1alpha1.ConditionReady, metav1.ConditionTrue, ReasonCompleted, "every stream completed")
	default:
		setCondition(sp, v1alpha1.ConditionReady, metav1.ConditionTrue, ReasonRunning, fmt.Sprintf("%d agents running", len(names)-completed))
	}
	if meta.FindStatusCondition(sp.Status.Conditions, v1alpha1.ConditionNICLocal) == nil {
		setCondition(sp, v1alpha1.ConditionNICLocal, metav1.ConditionUnknown, ReasonAwaitingAgents, "the receiving agents have not reported their placement yet")
	}
	return true
}

func setNICLocal(sp *v1alpha1.StreamPipeline, local *bool) {
	switch {
	case local == nil:
		setCondition(sp, v1alpha1.ConditionNICLocal, metav1.ConditionUnknown, ReasonAwaitingAgents, "the agents do not know the NIC's NUMA node")
	case *local:
		setCondition(sp, v1alpha1.ConditionNICLocal, metav1.ConditionTrue, ReasonReceiversNICLocal, "every receiving thread runs on the NIC's NUMA node")
	default:
		setCondition(sp, v1alpha1.ConditionNICLocal, metav1.ConditionFalse, ReasonReceiversRemote,
			"a receiving thread runs off the NIC's NUMA node: the pod's cpuset has no CPU there (check the kubelet's Topology Manager policy and the NIC resource)")
	}
}

// setCondition sets a condition; true when it changed (status or reason), for events.
func setCondition(sp *v1alpha1.StreamPipeline, t string, s metav1.ConditionStatus, reason, msg string) bool {
	old := meta.FindStatusCondition(sp.Status.Conditions, t)
	changed := old == nil || old.Status != s || old.Reason != reason || old.Message != msg
	meta.SetStatusCondition(&sp.Status.Conditions, metav1.Condition{
		Type: t, Status: s, Reason: reason, Message: msg, ObservedGeneration: sp.Generation,
	})
	return changed
}

// SetupWithManager wires the watches: owned objects, the nodes a pipeline uses (a label change
// re-plans), the agent pods, and the other pipelines on the same gateway.
func (r *StreamPipelineReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	idx := mgr.GetFieldIndexer()
	if err := idx.IndexField(ctx, &v1alpha1.StreamPipeline{}, indexNodeNames, func(o client.Object) []string {
		sp := o.(*v1alpha1.StreamPipeline)
		names := []string{sp.Spec.Gateway.Node}
		for _, s := range sp.Spec.Senders {
			names = append(names, s.Node)
		}
		return names
	}); err != nil {
		return err
	}
	if err := idx.IndexField(ctx, &v1alpha1.StreamPipeline{}, indexGateway, func(o client.Object) []string {
		return []string{o.(*v1alpha1.StreamPipeline).Spec.Gateway.Node}
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
	sameGateway := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		sp := o.(*v1alpha1.StreamPipeline)
		return r.pipelinesMatching(ctx, client.MatchingFields{indexGateway: sp.Spec.Gateway.Node})
	})
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.StreamPipeline{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Owns(&batchv1.Job{}).
		Owns(&corev1.ConfigMap{}).
		Owns(&corev1.Service{}).
		Owns(&networkingv1.NetworkPolicy{}).
		Watches(&corev1.Node{}, byNode, builder.WithPredicates(predicate.LabelChangedPredicate{})).
		Watches(&corev1.Pod{}, byPodLabel).
		Watches(&v1alpha1.StreamPipeline{}, sameGateway).
		Complete(r)
}

func (r *StreamPipelineReconciler) pipelinesMatching(ctx context.Context, sel client.MatchingFields) []reconcile.Request {
	var list v1alpha1.StreamPipelineList
	if err := r.List(ctx, &list, sel); err != nil {
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for _, sp := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&sp)})
	}
	return out
}
