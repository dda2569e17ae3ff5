package controllers

import (
	"context"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/observe"
	"github.com/numastream/numastream/internal/render"
	"github.com/numastream/numastream/internal/replan"
)

// Observer reads the agents of every running pipeline at its own interval, apart from
// Reconcile, and patches only status.observed. Reconcile reacts to what it writes only when the
// conditions would change (chunks lost or corrupt, NIC locality), never to rates or timestamps.
type Observer struct {
	client.Client
	// Read reads one pipeline's agents from its pods (nil result: nothing to report yet).
	Read func(ctx context.Context, sp *v1beta1.StreamPipeline, pods []corev1.Pod) (*v1beta1.Observed, error)
	// Every is the interval between two readings of a pipeline; the rates are over it.
	Every time.Duration
	// Namespaces the operator drives (nil: every namespace).
	Namespaces Namespaces
	// Parallel is how many pipelines are read at once (0: DefaultObserveParallel). An agent that
	// does not answer holds one reader for its timeout, not the whole sweep.
	Parallel int
}

// DefaultObserveParallel: readers of one sweep. With 1000 pipelines and a 5 s timeout per
// unanswered read, one reader took over an hour per sweep when agents were unreachable.
const DefaultObserveParallel = 32

// Start runs until ctx ends (a manager Runnable; only the leader observes).
func (o *Observer) Start(ctx context.Context) error {
	t := time.NewTicker(o.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			o.observeAll(ctx)
		}
	}
}

// NeedLeaderElection: one replica observes, the one that reconciles.
func (o *Observer) NeedLeaderElection() bool { return true }

func (o *Observer) observeAll(ctx context.Context) {
	var list v1beta1.StreamPipelineList
	if err := o.List(ctx, &list); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Observer cannot list pipelines")
		return
	}
	parallel := o.Parallel
	if parallel <= 0 {
		parallel = DefaultObserveParallel
	}
	todo := make(chan *v1beta1.StreamPipeline)
	var wg sync.WaitGroup
	for w := 0; w < parallel; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for sp := range todo {
				if err := o.observe(ctx, sp); err != nil {
					observeErrors.WithLabelValues(sp.Namespace).Inc()
					ctrl.LoggerFrom(ctx).V(1).Info("Cannot read the agents", "pipeline", klog.KObj(sp), "error", err)
				}
			}
		}()
	}
	for i := range list.Items {
		sp := &list.Items[i]
		if !o.Namespaces.Watches(sp.Namespace) || sp.Spec.Suspend || sp.DeletionTimestamp != nil ||
			!meta.IsStatusConditionTrue(sp.Status.Conditions, v1beta1.ConditionPlanned) {
			continue
		}
		select {
		case todo <- sp:
		case <-ctx.Done():
		}
	}
	close(todo)
	wg.Wait()
}

func (o *Observer) observe(ctx context.Context, sp *v1beta1.StreamPipeline) error {
	var pods corev1.PodList
	if err := o.List(ctx, &pods, client.InNamespace(sp.Namespace),
		client.MatchingLabels{render.LabelPipeline: sp.Name}); err != nil {
		return err
	}
	if len(pods.Items) == 0 {
		return nil
	}
	observations.WithLabelValues(sp.Namespace).Inc()
	obs, err := o.Read(ctx, sp, pods.Items)
	if err != nil || obs == nil {
		return err
	}
	before := sp.DeepCopy()
	sp.Status.Observed = obs
	o.considerReplan(sp, obs)
	if equality.Semantic.DeepEqual(before.Status, sp.Status) {
		return nil
	}
	// What goes on from what status holds — a re-plan's count, the series each gateway pod
	// completed — is written only on the latest pipeline: a copy the cache has not brought up to
	// date yet (the last observation's write, the reconciler's reading of a gateway it replaces,
	// another leader's just before a failover) would count from an older one. On a conflict the
	// observation is written without them; the next reading, of the newer copy, carries them.
	err = o.Status().Patch(ctx, sp, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
	if !apierrors.IsConflict(err) {
		return err
	}
	sp.Status.Departure, sp.Status.Replan = before.Status.Departure, before.Status.Replan
	keepSeries(sp.Status.Observed, before.Status.Observed)
	return o.Status().Patch(ctx, sp, client.MergeFrom(before))
}

// keepSeries sets obs's series counts to prev's (none when prev is nil), so that a patch from
// prev leaves them as they are.
func keepSeries(obs, prev *v1beta1.Observed) {
	if obs == nil {
		return
	}
	if prev == nil {
		prev = &v1beta1.Observed{}
	}
	obs.SeriesCompleted, obs.SeriesIncomplete = prev.SeriesCompleted, prev.SeriesIncomplete
	obs.SeriesByPod, obs.SeriesBeforePods = prev.SeriesByPod, prev.SeriesBeforePods
}

// considerReplan: when the compression ratio the gateway sees has departed from the one the plan
// assumed (replan.Departure) in replan.Confirm readings in a row (counted in status.departure,
// so a new leader goes on counting), the observed facts go into
// status.replan, where the reconciler plans from them (and records the change). Not for
// pipelines with spec.replan off, pass-through streams (no codec work to re-plan), or while the
// last re-plan is not applied yet.
func (o *Observer) considerReplan(sp *v1beta1.StreamPipeline, obs *v1beta1.Observed) {
	if sp.Spec.Replan == ReplanOff || passThrough(sp) || sp.Status.Plan == nil {
		sp.Status.Departure = nil
		return
	}
	if rp := sp.Status.Replan; rp != nil && !rp.Applied {
		return
	}
	w := watchOf(sp.Status.Departure)
	// One reading per rate window: readings closer together repeat the same window's ratio.
	now := time.Now()
	if now.Sub(w.LastReading) < observe.MinRateWindow {
		return
	}
	observed, _ := strconv.ParseFloat(obs.Ratio, 64)
	if observed <= 0 {
		// No ratio over a window yet (a new leader's first reading has nothing to take a rate
		// from, or nothing flowed): neither a departure nor a return to the plan.
		return
	}
	why := replan.Departure(assumedRatio(sp), observed)
	w, replanNow := w.Observe(why != "", observed, now)
	sp.Status.Departure = departureOf(w)
	if !replanNow {
		return
	}
	sp.Status.Replan = &v1beta1.Replan{Ratio: obs.Ratio, DecompressMBps: obs.DecompressMBps, Reason: why,
		ObservedAt: metav1.Now()}
}

// watchOf / departureOf: the re-plan watch as status keeps it.
func watchOf(d *v1beta1.Departure) replan.Watch {
	var w replan.Watch
	if d == nil {
		return w
	}
	w.Readings = int(d.Readings)
	w.First, _ = strconv.ParseFloat(d.FirstRatio, 64)
	if d.LastReadingAt != nil {
		w.LastReading = d.LastReadingAt.Time
	}
	if d.LastReplanAt != nil {
		w.LastReplan = d.LastReplanAt.Time
	}
	return w
}

func departureOf(w replan.Watch) *v1beta1.Departure {
	d := &v1beta1.Departure{Readings: int32(w.Readings), FirstRatio: strconv.FormatFloat(w.First, 'f', 4, 64)}
	if !w.LastReading.IsZero() {
		d.LastReadingAt = &metav1.MicroTime{Time: w.LastReading}
	}
	if !w.LastReplan.IsZero() {
		d.LastReplanAt = &metav1.MicroTime{Time: w.LastReplan}
	}
	return d
}
