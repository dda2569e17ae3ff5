package controllers

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/render"
)

// A sweep reads many pipelines at once, never more than Parallel, each planned one exactly once:
// agents that do not answer (a read waits for its timeout) hold one reader each, not the sweep.
func TestASweepReadsPipelinesInParallelEachOnce(t *testing.T) {
	scheme := testScheme(t)
	var objs []client.Object
	const pipelines = 40
	for i := 0; i < pipelines; i++ {
		sp := &v1beta1.StreamPipeline{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%02d", i), Namespace: "beamline"}}
		if i%10 != 9 { // every tenth not planned: not read
			meta.SetStatusCondition(&sp.Status.Conditions, metav1.Condition{Type: v1beta1.ConditionPlanned,
				Status: metav1.ConditionTrue, Reason: "Planned"})
		}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: sp.Name + "-gateway", Namespace: "beamline",
			Labels: map[string]string{render.LabelPipeline: sp.Name}}}
		objs = append(objs, sp, pod)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).
		WithStatusSubresource(&v1beta1.StreamPipeline{}).Build()
	var inFlight, most atomic.Int32
	var mu sync.Mutex
	read := map[string]int{}
	o := &Observer{Client: c, Every: time.Minute, Parallel: 8,
		Read: func(_ context.Context, sp *v1beta1.StreamPipeline, _ []corev1.Pod) (*v1beta1.Observed, error) {
			n := inFlight.Add(1)
			defer inFlight.Add(-1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); {
				m = most.Load()
			}
			mu.Lock()
			read[sp.Name]++
			mu.Unlock()
			time.Sleep(50 * time.Millisecond) // an agent slow to answer
			return nil, nil
		}}
	o.observeAll(context.Background())
	if len(read) != pipelines-pipelines/10 {
		t.Errorf("read %d pipelines, want the %d planned ones", len(read), pipelines-pipelines/10)
	}
	for name, n := range read {
		if n != 1 {
			t.Errorf("%s read %d times in one sweep", name, n)
		}
	}
	if m := most.Load(); m < 2 || m > 8 {
		t.Errorf("at most %d reads at once, want between 2 and Parallel (8)", m)
	}
	t.Logf("one sweep: %d pipelines read, at most %d at once", len(read), most.Load())
}

// An observation made on a copy of the pipeline the cache has not brought up to date (the
// reading another leader counted just before a failover, or this observer's own last write)
// does not count a reading from it: the departure count would go on from the older reading (on
// the facility a new leader's count went 1, 2, 1, 2), and the series a replaced gateway pod
// completed (read by the reconciler as it replaced it) would be forgotten. The observation
// itself is written.
func TestAnObservationOfAStaleCopyDoesNotCountFromIt(t *testing.T) {
	scheme := testScheme(t)
	sp := &v1beta1.StreamPipeline{ObjectMeta: metav1.ObjectMeta{Name: "tomo", Namespace: "beamline"}}
	sp.Spec.ExpectedRatio = "2.0"
	sp.Spec.Senders = []v1beta1.Sender{{Node: "det-a", Source: v1beta1.Source{Synthetic: &v1beta1.SyntheticSource{Chunks: 100}}}}
	sp.Status.Plan = &v1beta1.Plan{}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "tomo-gateway", Namespace: "beamline",
		Labels: map[string]string{render.LabelPipeline: sp.Name}}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(sp, pod).
		WithStatusSubresource(&v1beta1.StreamPipeline{}).Build()
	ctx := context.Background()
	stale := &v1beta1.StreamPipeline{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(sp), stale); err != nil {
		t.Fatal(err)
	}
	// Another leader counted two departing readings since.
	latest := stale.DeepCopy()
	long := metav1.NewMicroTime(time.Now().Add(-time.Hour))
	latest.Status.Departure = &v1beta1.Departure{Readings: 2, FirstRatio: "3.5000", LastReadingAt: &long}
	gone := &v1beta1.PodSeries{Completed: 2}
	latest.Status.Observed = &v1beta1.Observed{SeriesCompleted: 2, SeriesBeforePods: gone}
	if err := c.Status().Update(ctx, latest); err != nil {
		t.Fatal(err)
	}
	o := &Observer{Client: c, Read: func(context.Context, *v1beta1.StreamPipeline, []corev1.Pod) (*v1beta1.Observed, error) {
		// What a reading carries on from the stale copy: a replaced pod's series as last read.
		return &v1beta1.Observed{Ratio: "3.50", DecompressMBps: "900", SeriesCompleted: 1, SeriesBeforePods: &v1beta1.PodSeries{Completed: 1}}, nil
	}}
	if err := o.observe(ctx, stale); err != nil {
		t.Fatal(err)
	}
	got := &v1beta1.StreamPipeline{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(sp), got); err != nil {
		t.Fatal(err)
	}
	if d := got.Status.Departure; d == nil || d.Readings != 2 {
		t.Errorf("departure %+v after an observation of a stale copy, want the 2 readings counted", d)
	}
	if got.Status.Observed == nil || got.Status.Observed.Ratio != "3.50" {
		t.Errorf("the observation itself was not written: %+v", got.Status.Observed)
	} else if o := got.Status.Observed; o.SeriesCompleted != 2 || o.SeriesBeforePods == nil || *o.SeriesBeforePods != *gone {
		t.Errorf("series %d (%+v) after an observation of a stale copy, want the 2 the latest holds", o.SeriesCompleted, o.SeriesBeforePods)
	}
	// The next observation, of the latest copy, counts the third reading: the re-plan.
	if err := o.observe(ctx, got); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(sp), got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Replan == nil || got.Status.Replan.Ratio != "3.50" {
		t.Errorf("the third departing reading did not re-plan: departure %+v, replan %+v", got.Status.Departure, got.Status.Replan)
	}
}

// testScheme holds the core types and the pipelines, for a fake client.
func testScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1beta1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	return scheme
}
