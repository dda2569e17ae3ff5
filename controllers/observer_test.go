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
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1beta1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
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
