package facility

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/numastream/numastream/api/v1alpha1"
	"github.com/numastream/numastream/internal/conditions"
	"github.com/numastream/numastream/internal/render"
)

// A simulated EIGER2 as a pod on detector-a (the agent image's detector-sim, as in
// test/facility/detector-sim.yaml): two series of `images` synthetic images at `rate` messages/s.
func detectorPod(t *testing.T, name string, images, rate int) *corev1.Pod {
	t.Helper()
	doc, err := os.ReadFile("detector-sim.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p := &corev1.Pod{}
	if err := yaml.UnmarshalStrict(doc, p); err != nil {
		t.Fatal(err)
	}
	p.Name, p.Namespace = name, ns
	p.Spec.Containers[0].Args = []string{"detector-sim", "--endpoint", "tcp://*:31001", "--synthetic", "--series", "2",
		"--images", fmt.Sprint(images), "--shape", "514x1030", "--channels", "threshold_1,threshold_2",
		"--rate-hz", fmt.Sprint(rate), "--linger-s", "300"}
	if err := k8s.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the detector pod has an address", 120*time.Second, func() (bool, string) {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
			return false, err.Error()
		}
		return p.Status.PodIP != "", string(p.Status.Phase)
	})
	return p
}

// Detector data as beamlines produce it, as real pods: a detector's Stream V2 series cross the
// facility link into one HDF5 file per series; when the detector goes away mid-series, the
// StreamPipeline's status names the series left incomplete.
func TestDetectorSeriesCrossTheFacilityIntoHdf5FilesAndAnUnfinishedOneIsNamed(t *testing.T) {
	dir := sinkDir(t, "stream2")
	// Series 1 (40 images) completes at 8 messages/s in ~5 s; series 2 is cut short 1.5 s in.
	det := detectorPod(t, "eiger-sim-e2e", 40, 8)
	defer func() { _ = k8s.Delete(ctx, det, client.GracePeriodSeconds(0)) }()
	doc, err := os.ReadFile("pipeline-stream2.yaml")
	if err != nil {
		t.Fatal(err)
	}
	sp := &v1alpha1.StreamPipeline{}
	text := strings.ReplaceAll(string(doc), "DETECTOR_IP", det.Status.PodIP)
	text = strings.ReplaceAll(text, "/var/tmp/numastream-facility/", dir+"/")
	if err := yaml.UnmarshalStrict([]byte(text), sp); err != nil {
		t.Fatal(err)
	}
	sp.Name, sp.Namespace = "stream2-e2e", ns
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	defer deleteAndCheckGone(t, sp)

	first := filepath.Join(dir, "eiger-1.h5")
	eventually(t, "series 1 published complete on gateway-a", 240*time.Second, func() (bool, string) {
		_, err := os.Stat(first)
		return err == nil, fmt.Sprint(err)
	})
	if p := get(t, sp).Status.Plan; p == nil {
		t.Fatal("no plan")
	}
	// The detector goes away in the middle of series 2.
	time.Sleep(1500 * time.Millisecond)
	if err := k8s.Delete(ctx, det, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	var cur *v1alpha1.StreamPipeline
	eventually(t, "Degraded=True SeriesIncomplete naming series 2", 120*time.Second, func() (bool, string) {
		cur = get(t, sp)
		c := meta.FindStatusCondition(cur.Status.Conditions, v1alpha1.ConditionDegraded)
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != conditions.ReasonSeriesIncomplete {
			return false, fmt.Sprintf("Degraded %v, observed %+v", c, cur.Status.Observed)
		}
		return strings.Contains(c.Message, "series 2 (") && strings.Contains(c.Message, "disconnected after"), c.Message
	})
	o := cur.Status.Observed
	t.Logf("status: Degraded %s; observed %d delivered, %d lost, %d corrupt, seriesIncomplete %d %q",
		meta.FindStatusCondition(cur.Status.Conditions, v1alpha1.ConditionDegraded).Message,
		o.ChunksDelivered, o.ChunksLost, o.ChunksCorrupt, o.SeriesIncomplete, o.IncompleteSeries)
	if o.SeriesIncomplete != 1 || o.ChunksLost != 0 || o.ChunksCorrupt != 0 {
		t.Errorf("observed %+v", o)
	}
	if _, err := os.Stat(filepath.Join(dir, "eiger-2.h5")); err == nil {
		t.Error("series 2 was published as complete")
	}
	if _, err := os.Stat(filepath.Join(dir, "eiger-2.h5.part")); err != nil {
		t.Errorf("series 2's file: %v", err)
	}
	snd := running(t, sp, render.RoleSender)
	if snd == nil {
		t.Fatal("no running sender")
	}
	b, err := cs.CoreV1().Pods(ns).GetLogs(snd.Name, &corev1.PodLogOptions{Container: "agent"}).DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"series 1 (detector-sim-", "ended after 40 images", "series 2 is INCOMPLETE"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("the sender's log lacks %q:\n%s", want, b)
		}
	}
	verifySeriesFile(t, first, 40)
}

// verifySeriesFile reads a series file with h5py + hdf5plugin (the oracle environment): both
// channels hold `images` images equal to the detector simulator's pixels.
func verifySeriesFile(t *testing.T, path string, images int) {
	t.Helper()
	py := os.Getenv("NUMASTREAM_PYTHON")
	if py == "" {
		t.Log("NUMASTREAM_PYTHON is not set: the file's pixels are not read back here (make test-e2e-real sets it)")
		return
	}
	agent := os.Getenv("NUMASTREAM_AGENT")
	src := filepath.Join(t.TempDir(), "src.raw")
	frames := images + 5
	if out, err := runCmd(agent, "synth", "--out", src, "--chunk-bytes", fmt.Sprint(514*1030*2), "--width", "1030",
		"--frames", fmt.Sprint(frames), "--seed", "7"); err != nil {
		t.Fatalf("synth: %v\n%s", err, out)
	}
	script := fmt.Sprintf(`
import h5py, hdf5plugin, numpy as np
src = np.fromfile(%q, dtype="<u2").reshape(%d, 514, 1030)
with h5py.File(%q, "r") as f:
    for c, name in enumerate(("threshold_1", "threshold_2")):
        ds = f["/entry/data/" + name]
        assert ds.shape == (%d, 514, 1030), ds.shape
        for i in range(ds.shape[0]):
            assert np.array_equal(ds[i], src[i + 5 * c]), (name, i)
print("ok")
`, src, frames, path, images)
	if out, err := runCmd(py, "-c", script); err != nil || !strings.Contains(out, "ok") {
		t.Errorf("h5py on %s: %v\n%s", path, err, out)
	}
}

func runCmd(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	return string(out), err
}
