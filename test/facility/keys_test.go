package facility

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
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
// nobody), with the gateway carrying every message on to an HPC site across the WAN (a
// RemoteSite whose far receiver admits the keys the site's status lists, kept in step by kubectl
// numastream site-keys --follow): the gateway's next key is listed for the far site before the gateway uses it; the old
// sender reads the detector on until it pauses, and its gateway, replaced only after it, takes
// all of it; then the new gateway and sender run with the new keys, and the hop resumes with the
// key the far site admitted. Both series are whole at the facility, the far site holds every
// message byte for byte as the facility's file does, nothing lost. (Before, the sender and
// gateway were replaced at once and the rest of the series was lost; and a far site learnt the
// gateway's new key only once the gateway had been refused with it.) The operator crashes
// half-way through the rotation and the one that replaces it finishes it.
func TestAKeyRotationMidSeriesFromALiveDetectorWithAnOnwardHopLosesNothing(t *testing.T) {
	agent := wan(t)
	dir := sinkDir(t, "stream2-rotate")
	far := hpcSite{dir: t.TempDir()}
	run(t, agent, "keygen", "--out", filepath.Join(far.dir, "far"))
	site := &v1beta1.RemoteSite{ObjectMeta: metav1.ObjectMeta{Name: "hpc-rotate", Namespace: ns}, Spec: v1beta1.RemoteSiteSpec{
		Endpoint:       fmt.Sprintf("tcp://%s:%d", wanFar, farPort),
		ServerKey:      strings.TrimSpace(read(t, filepath.Join(far.dir, "far.public"))),
		Link:           &v1beta1.OnwardLink{BandwidthMbps: wanMbit, RoundTrip: &metav1.Duration{Duration: wanRTT}},
		KeyPropagation: &metav1.Duration{Duration: 3 * time.Second}}}
	if err := k8s.Create(ctx, site); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = k8s.Delete(ctx, site) }()
	admitted := followSite(t, site, filepath.Join(far.dir, "allowed"))
	// Two series of 50 images at 10 messages/s: the detector pauses 10 s after the first image.
	det := detectorPod(t, "eiger-sim-rotate", 50, 10)
	defer func() { _ = k8s.Delete(ctx, det, client.GracePeriodSeconds(0)) }()
	sp := stream2Pipeline(t, "stream2-rotate", det, dir)
	nxmx := sp.Spec.Sink.HDF5
	sp.Spec.Sink = nil
	sp.Spec.Sinks = []v1beta1.Consumer{{Name: "nxmx", Sink: v1beta1.Sink{HDF5: nxmx}},
		{Name: "raw", Sink: v1beta1.Sink{File: &v1beta1.FileSource{Root: storageRoot, Path: filepath.Base(dir) + "/messages.raw"}}},
		{Name: "hpc", Sink: v1beta1.Sink{Onward: &v1beta1.OnwardSink{Site: site.Name}}}}
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	defer deleteAndCheckGone(t, sp)
	hop := onwardPlan(t, sp)
	eventually(t, "the far site admitting the gateway's key", 60*time.Second, func() (bool, string) {
		return len(admitted()) == 1, fmt.Sprint(admitted())
	})
	inHPC(t, nil, agent, far.receiverArgs(hop.Connections)...)
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
	eventually(t, "the gateway's next key admitted beside the current one", 30*time.Second, func() (bool, string) {
		return len(admitted()) == 2, fmt.Sprint(admitted())
	})
	if now := running(t, sp, render.RoleGateway); now == nil || now.UID != gw.UID {
		t.Errorf("the gateway was replaced before the far site admitted its next key")
	}
	// The operator crashes mid-rotation (the next key listed, no agent replaced yet): the one
	// that takes its place finishes the rotation from what the cluster holds.
	killOperator(t)
	if now := running(t, sp, render.RoleGateway); now == nil || now.UID != gw.UID {
		t.Logf("the gateway was replaced while the operator restarted")
	} else {
		t.Logf("the operator restarted mid-rotation: the first gateway %s still running", gw.Name)
	}
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
	// The far site admits the key the new gateway runs with, and only it.
	if g := get(t, sp).Status.GatewayKey; g == nil || g.Next != "" || len(admitted()) != 1 || admitted()[0] != g.Public {
		t.Errorf("after the rotation: the pipeline's gateway key %+v, the far site admits %v", g, admitted())
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
	if o.SeriesCompleted != 2 || o.SeriesIncomplete != 0 || o.ChunksDelivered != 104 {
		t.Errorf("after the replaced gateway pod went: series completed %d, incomplete %d, chunks delivered %d; want 2, 0 and 104 (%+v, %+v)",
			o.SeriesCompleted, o.SeriesIncomplete, o.ChunksDelivered, o.SeriesByPod, o.SeriesBeforePods)
	}
	t.Logf("series and chunks counted by gateway pod: %+v, by pods gone: %+v", o.SeriesByPod, o.SeriesBeforePods)
	verifySeriesFile(t, first, 50)
	verifySeriesFile(t, second, 50)
	// Both sites whole: the far site's file holds the facility's, byte for byte (every message
	// of both series, in the detector's order, once).
	here, there := filepath.Join(dir, "messages.raw.part"), filepath.Join(far.dir, "there-0.raw.part")
	var a, b []byte
	eventually(t, "the far site's file as the facility's", 60*time.Second, func() (bool, string) {
		a, _ = os.ReadFile(here)
		b, _ = os.ReadFile(there)
		return len(a) > 0 && bytes.Equal(a, b), fmt.Sprintf("facility %d bytes, far site %d", len(a), len(b))
	})
	t.Logf("keys rotated 1 s into series 1 (the next key listed for the far site first): both series whole %.1f s later; gateway %s runs the new keys; observed %d delivered, %d lost; the far site holds the facility's %d bytes",
		whole.Seconds(), renewed.Name, o.ChunksDelivered, o.ChunksLost, len(b))
}

// followSite keeps file as the far site's allowed-keys file as a far site does: kubectl
// numastream site-keys --follow, reading the RemoteSite's status; until the test ends. It
// returns the keys the file holds.
func followSite(t *testing.T, site *v1beta1.RemoteSite, file string) func() []string {
	t.Helper()
	var out lockedBuffer
	cmd := plugin(t, &out, "site-keys", site.Name, "--follow", file, "--interval", "500ms")
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		t.Logf("kubectl numastream site-keys --follow said:\n%s", out.String())
	})
	return func() []string {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil
		}
		return strings.Fields(string(b))
	}
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

// killOperator kills the operator's pod at once (no grace: a crash) and waits for the one its
// Deployment makes in its place to be ready.
func killOperator(t *testing.T) {
	t.Helper()
	const nsName = "numastream-system"
	list := func() []corev1.Pod {
		var pods corev1.PodList
		if err := k8s.List(ctx, &pods, client.InNamespace(nsName), client.MatchingLabels{"app.kubernetes.io/component": "operator"}); err != nil {
			t.Fatal(err)
		}
		return pods.Items
	}
	killed := map[string]bool{}
	for _, p := range list() {
		killed[string(p.UID)] = true
		if err := k8s.Delete(ctx, &p, client.GracePeriodSeconds(0)); err != nil {
			t.Fatal(err)
		}
	}
	if len(killed) == 0 {
		t.Fatal("no operator pod to kill")
	}
	eventually(t, "another operator pod ready", 120*time.Second, func() (bool, string) {
		for _, p := range list() {
			if killed[string(p.UID)] || p.DeletionTimestamp != nil {
				continue
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					return true, ""
				}
			}
		}
		return false, fmt.Sprint(len(list()), " operator pods")
	})
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
