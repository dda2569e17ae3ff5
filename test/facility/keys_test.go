package facility

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/render"
)

// A pipeline that says nothing about security streams over CURVE; its keys rotated mid-stream
// (on demand) replace its agents, which drain and resume with the new keys: the file ends with
// every chunk, once, and the status counts none lost.
func TestAKeyRotationMidStreamLosesNothing(t *testing.T) {
	const chunks = 120
	dir := sinkDir(t, "rotate")
	sp := pipeline(t, ns, "rotate", chunks, "  sink: {file: {root: "+storageRoot+", path: \"rotate/rotate-{stream}.raw\"}}")
	sp.Spec.Senders[0].Source.Synthetic.RateGbps = ptrInt32(1) // paced, so the rotation lands mid-stream
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	defer deleteAndCheckGone(t, sp)
	secret := func() string {
		var sec corev1.Secret
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "rotate-curve-keys"}, &sec); err != nil {
			return ""
		}
		return string(sec.Data["gateway.public"])
	}
	gw, n := flowing(t, sp, "the stream flowing over CURVE", 10)
	before := secret()
	if before == "" || gw.Annotations[render.AnnotationKeys] == "" {
		t.Fatalf("no CURVE keys by default: Secret %q, pod annotations %v", before, gw.Annotations)
	}
	rotateKeys(t, sp)
	t.Logf("keys rotated after %s delivered %.0f of %d chunks", gw.Name, n, chunks)

	cur := completed(t, sp, chunks, "Ready=True Completed after the rotation")
	if after := secret(); after == before || after == "" {
		t.Errorf("the gateway's key did not change: %q", after)
	}
	var renewed string
	for _, p := range pods(t, sp, render.RoleGateway) {
		if k := p.Annotations[render.AnnotationKeys]; k != "" && k != gw.Annotations[render.AnnotationKeys] && p.Status.Phase == corev1.PodSucceeded {
			renewed = p.Name
		}
	}
	if renewed == "" {
		t.Error("no gateway pod finished the stream with the new keys")
	}
	size := wholeAndNothingLost(t, cur, filepath.Join(dir, "rotate-0.raw"), chunks)
	t.Logf("after the rotation: Completed, %d chunks delivered, lost %d; rotate-0.raw holds %d bytes; gateway pod %s finished with the new keys",
		cur.Status.Observed.ChunksDelivered, cur.Status.Observed.ChunksLost, size, renewed)
}

// A key rotation in the middle of a live detector's series (Stream V2, the detector waits for
// nobody): the old sender reads the detector on until it pauses, and its gateway, replaced only
// after it, takes all of it; then the new gateway and sender run with the new keys. Both series
// are whole, nothing lost. (Before, both were replaced at once: the gateway stopped taking data
// while the sender drained into it, and the rest of the series was lost.)
func TestAKeyRotationMidSeriesFromALiveDetectorLosesNothing(t *testing.T) {
	dir := sinkDir(t, "stream2-rotate")
	// Two series of 50 images at 10 messages/s: the detector pauses 10 s after the first image.
	det := detectorPod(t, "eiger-sim-rotate", 50, 10)
	defer func() { _ = k8s.Delete(ctx, det, client.GracePeriodSeconds(0)) }()
	sp := stream2Pipeline(t, "stream2-rotate", det, dir)
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	defer deleteAndCheckGone(t, sp)
	first, second := filepath.Join(dir, "eiger-1.h5"), filepath.Join(dir, "eiger-2.h5")
	eventually(t, "series 1 under way on gateway-a", 240*time.Second, func() (bool, string) {
		_, err := os.Stat(first + ".part")
		return err == nil, fmt.Sprint(err)
	})
	gw := running(t, sp, render.RoleGateway)
	if gw == nil || gw.Annotations[render.AnnotationKeys] == "" {
		t.Fatalf("no gateway running with keys: %v", gw)
	}
	time.Sleep(time.Second) // mid-series
	rotateKeys(t, sp)
	rotated := time.Now()
	eventually(t, "both series published complete", 120*time.Second, func() (bool, string) {
		_, err1 := os.Stat(first)
		_, err2 := os.Stat(second)
		return err1 == nil && err2 == nil, fmt.Sprint(listDir(dir))
	})
	whole := time.Since(rotated)
	var renewed *corev1.Pod
	eventually(t, "a gateway running with the new keys", 120*time.Second, func() (bool, string) {
		renewed = running(t, sp, render.RoleGateway)
		return renewed != nil && renewed.Annotations[render.AnnotationKeys] != gw.Annotations[render.AnnotationKeys], fmt.Sprint(renewed != nil)
	})
	// Every message of both series delivered (each series: a start, 50 images, an end), and both
	// series counted complete, whichever gateway pod completed them (the one the rotation
	// replaced is gone with its Job by then).
	var o *v1beta1.Observed
	eventually(t, "status.observed.chunksDelivered 104, seriesCompleted 2", 60*time.Second, func() (bool, string) {
		o = get(t, sp).Status.Observed
		return o != nil && o.ChunksDelivered >= 104 && o.SeriesCompleted >= 2, fmt.Sprintf("observed %+v", o)
	})
	if o.ChunksDelivered != 104 || o.ChunksLost != 0 || o.ChunksCorrupt != 0 || o.SeriesCompleted != 2 || o.SeriesIncomplete != 0 {
		t.Errorf("observed %+v", o)
	}
	// Once the replaced gateway pod is gone, its series stay counted.
	eventually(t, "the replaced gateway pod gone", 90*time.Second, func() (bool, string) {
		for _, p := range pods(t, sp, render.RoleGateway) {
			if p.UID == gw.UID {
				return false, string(p.Status.Phase)
			}
		}
		return true, ""
	})
	gone := time.Now()
	eventually(t, "a reading after it went", 30*time.Second, func() (bool, string) {
		o = get(t, sp).Status.Observed
		return o != nil && o.UpdatedAt != nil && o.UpdatedAt.After(gone.Add(time.Second)), fmt.Sprintf("observed %+v", o)
	})
	if o.SeriesCompleted != 2 || o.SeriesIncomplete != 0 {
		t.Errorf("after the replaced gateway pod went: series completed %d, incomplete %d; want 2 and 0 (%+v, %+v)",
			o.SeriesCompleted, o.SeriesIncomplete, o.SeriesByPod, o.SeriesBeforePods)
	}
	t.Logf("series counted by gateway pod: %+v, by pods gone: %+v", o.SeriesByPod, o.SeriesBeforePods)
	verifySeriesFile(t, first, 50)
	verifySeriesFile(t, second, 50)
	t.Logf("keys rotated 1 s into series 1: both series whole %.1f s later; gateway %s runs the new keys; observed %d delivered, %d lost",
		whole.Seconds(), renewed.Name, o.ChunksDelivered, o.ChunksLost)
}

// rotateKeys asks for a rotation of the pipeline's keys now (its annotation, on demand).
func rotateKeys(t *testing.T, sp *v1beta1.StreamPipeline) {
	t.Helper()
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := get(t, sp)
		metav1.SetMetaDataAnnotation(&cur.ObjectMeta, v1beta1.AnnotationRotateKeys, time.Now().Format(time.RFC3339))
		return k8s.Update(ctx, cur)
	}); err != nil {
		t.Fatal(err)
	}
}

// wholeAndNothingLost checks that a completed pipeline's status counts nothing lost or corrupt and
// that its file holds every chunk once (chunks of 11059200 bytes); it returns the file's size.
func wholeAndNothingLost(t *testing.T, cur *v1beta1.StreamPipeline, file string, chunks int64) int64 {
	t.Helper()
	if o := cur.Status.Observed; o.ChunksLost != 0 || o.ChunksCorrupt != 0 {
		t.Errorf("observed %+v", o)
	}
	st, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() != chunks*11059200 {
		t.Errorf("%s holds %d bytes, want %d chunks of 11059200, each once", file, st.Size(), chunks)
	}
	return st.Size()
}

func ptrInt32(v int32) *int32 { return &v }

func ptrTo[T any](v T) *T { return &v }
