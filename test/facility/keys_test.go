package facility

import (
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
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := get(t, sp)
		metav1.SetMetaDataAnnotation(&cur.ObjectMeta, v1beta1.AnnotationRotateKeys, time.Now().Format(time.RFC3339))
		return k8s.Update(ctx, cur)
	}); err != nil {
		t.Fatal(err)
	}
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
