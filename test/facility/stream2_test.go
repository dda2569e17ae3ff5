package facility

import (
	"bytes"
	"encoding/json"
	"fmt"
	"image/color"
	"image/png"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/conditions"
	"github.com/numastream/numastream/internal/planner"
	"github.com/numastream/numastream/internal/render"
)

// A simulated EIGER2 as a pod on detector-a (the agent image's detector-sim, as in
// test/facility/detector-sim.yaml): two series of `images` synthetic images at `rate` messages/s.
func detectorPod(t *testing.T, name string, images, rate int) *corev1.Pod {
	t.Helper()
	return detectorPodOn(t, name, detector, 2, images, rate)
}

// detectorPodOn is detectorPod on `node`, with `series` series.
func detectorPodOn(t *testing.T, name, node string, series, images, rate int) *corev1.Pod {
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
	p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": node}
	runsInstalledAgentImage(t, p)
	p.Spec.Containers[0].Args = []string{"detector-sim", "--endpoint", "tcp://*:31001", "--synthetic", "--series", fmt.Sprint(series),
		"--images", fmt.Sprint(images), "--shape", "514x1030", "--channels", "threshold_1,threshold_2",
		"--rate-hz", fmt.Sprint(rate), "--linger-s", "300"}
	if err := k8s.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the detector pod has an address", 120*time.Second, func() (bool, string) {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
			return false, err.Error()
		}
		why := string(p.Status.Phase)
		for _, c := range p.Status.Conditions {
			if c.Status != corev1.ConditionTrue && c.Message != "" {
				why += "; " + string(c.Type) + ": " + c.Message
			}
		}
		if p.Status.PodIP == "" {
			// What the kubelet says (a sandbox that does not start, an image it cannot use).
			if ev, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name}); err == nil {
				for _, e := range ev.Items {
					if e.Type != corev1.EventTypeNormal {
						why += "; event " + e.Reason + ": " + e.Message
					}
				}
			}
		}
		return p.Status.PodIP != "", why
	})
	return p
}

// stream2Pipeline is test/facility/pipeline-stream2.yaml named `name`, reading detector pod det
// and writing its series files in dir (a sinkDir) of the tests' StorageRoot; not yet created.
func stream2Pipeline(t *testing.T, name string, det *corev1.Pod, dir string) *v1beta1.StreamPipeline {
	t.Helper()
	doc, err := os.ReadFile("pipeline-stream2.yaml")
	if err != nil {
		t.Fatal(err)
	}
	sp := &v1beta1.StreamPipeline{}
	text := strings.ReplaceAll(string(doc), "DETECTOR_IP", det.Status.PodIP)
	text = strings.ReplaceAll(text, "root: facility-box", "root: "+storageRoot)
	text = strings.ReplaceAll(text, "path: nxmx/eiger-", "path: "+filepath.Base(dir)+"/eiger-")
	if err := yaml.UnmarshalStrict([]byte(text), sp); err != nil {
		t.Fatal(err)
	}
	sp.Name, sp.Namespace = name, ns
	return sp
}

// Detector data as beamlines produce it, as real pods: a detector's Stream V2 series cross the
// facility link into one HDF5 file per series; when the detector goes away mid-series, the
// StreamPipeline's status names the series left incomplete.
func TestDetectorSeriesCrossTheFacilityIntoHdf5FilesAndAnUnfinishedOneIsNamed(t *testing.T) {
	dir := sinkDir(t, "stream2")
	// Series 1 (40 images) completes at 8 messages/s in ~5 s; series 2 is cut short 1.5 s in.
	det := detectorPod(t, "eiger-sim-e2e", 40, 8)
	defer func() { _ = k8s.Delete(ctx, det, client.GracePeriodSeconds(0)) }()
	sp := stream2Pipeline(t, "stream2-e2e", det, dir)
	sp.Spec.Sink.HDF5.IO = "direct" // the series files past the page cache, from a real kubelet's pod
	sp.Spec.Preview = &v1beta1.Preview{MaxSide: ptrInt32(128)}
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	defer deleteAndCheckGone(t, sp)

	// The gateway's live view, opened as the people at the experiment open it (kubectl numastream
	// preview) once the gateway runs; read while series 2 runs.
	var gw *corev1.Pod
	eventually(t, "the gateway pod running", 120*time.Second, func() (bool, string) {
		gw = streamGateway(t, sp, 0)
		return gw != nil, "none yet"
	})
	page, _, stop := openPreview(t, sp)
	defer stop()
	first := filepath.Join(dir, "eiger-1.h5")
	eventually(t, "series 1 published complete on gateway-a", 240*time.Second, func() (bool, string) {
		_, err := os.Stat(first)
		return err == nil, fmt.Sprint(err)
	})
	if p := get(t, sp).Status.Plan; p == nil {
		t.Fatal("no plan")
	}
	// The page, the streams it lists and the latest frame, a PNG of at most maxSide a side.
	began := time.Now()
	previewOfGateway(t, page, gw, 128)
	// The detector goes away in the middle of series 2.
	time.Sleep(1500*time.Millisecond - time.Since(began))
	if err := k8s.Delete(ctx, det, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	stop()
	var cur *v1beta1.StreamPipeline
	eventually(t, "Degraded=True SeriesIncomplete naming series 2", 120*time.Second, func() (bool, string) {
		cur = get(t, sp)
		c := meta.FindStatusCondition(cur.Status.Conditions, v1beta1.ConditionDegraded)
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != conditions.ReasonSeriesIncomplete {
			return false, fmt.Sprintf("Degraded %v, observed %+v", c, cur.Status.Observed)
		}
		return strings.Contains(c.Message, "series 2 (") && strings.Contains(c.Message, "disconnected after"), c.Message
	})
	o := cur.Status.Observed
	t.Logf("status: Degraded %s; observed %d delivered, %d lost, %d corrupt, seriesIncomplete %d %q",
		meta.FindStatusCondition(cur.Status.Conditions, v1beta1.ConditionDegraded).Message,
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
	gw = running(t, sp, render.RoleGateway)
	if gw == nil {
		t.Fatal("no running gateway")
	}
	if b, err = cs.CoreV1().Pods(ns).GetLogs(gw.Name, &corev1.PodLogOptions{Container: "decompress"}).DoRaw(ctx); err != nil {
		t.Fatal(err)
	}
	if opened := regexp.MustCompile(`hdf5 sink: series 1 .*`).FindString(string(b)); !strings.Contains(opened, "(direct I/O: past the page cache)") {
		t.Errorf("spec.sink.hdf5.io: direct, but the gateway did not say it writes series 1 past the page cache:\n%s", b)
	}
	verifySeriesFile(t, first, 40)
}

// The sender's node is drained in the middle of a series (kubectl drain: the sender pod is
// evicted, SIGTERM): the sender reads the detector on until it pauses (this detector sends its two
// series back to back: after the second) and has every message acknowledged before it exits; the
// series file is complete. The sender's own account (its summary) is kept from its log. After
// uncordon the next sender resumes the stream and carries the next series. (The detector is a pod
// on gateway-a here, so that the drain leaves it running, as a beamline's detector would be.)
func TestAStream2SenderNodeDrainedMidSeriesLeavesTheSeriesComplete(t *testing.T) {
	dir := sinkDir(t, "stream2-drain")
	// Series 1 and 2: 60 images each at 10 messages/s (~6 s each), the second after the first.
	det := detectorPodOn(t, "eiger-sim-drain", gateway, 2, 60, 10)
	defer func() { _ = k8s.Delete(ctx, det, client.GracePeriodSeconds(0)) }()
	sp := stream2Pipeline(t, "stream2-drain", det, dir)
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	defer deleteAndCheckGone(t, sp)
	first, second := filepath.Join(dir, "eiger-1.h5"), filepath.Join(dir, "eiger-2.h5")
	eventually(t, "series 1 under way on gateway-a", 240*time.Second, func() (bool, string) {
		_, err := os.Stat(first + ".part")
		return err == nil, fmt.Sprint(err)
	})
	// The sender's own account of the drain (its summary), kept while its pod is evicted.
	tx := running(t, sp, render.RoleSender)
	if tx == nil {
		t.Fatal("no running sender pod")
	}
	txSummary := follow(t, tx, planner.ContainerAgent)
	time.Sleep(2 * time.Second) // mid-series
	start := time.Now()
	drain := exec.Command(kubectl, "--kubeconfig", kubeconfig, "drain", detector, "--ignore-daemonsets",
		"--delete-emptydir-data", "--timeout=120s")
	out, err := drain.CombinedOutput()
	defer func() {
		if out, err := exec.Command(kubectl, "--kubeconfig", kubeconfig, "uncordon", detector).CombinedOutput(); err != nil {
			t.Errorf("kubectl uncordon: %v\n%s", err, out)
		}
	}()
	if err != nil {
		t.Fatalf("kubectl drain: %v\n%s", err, out)
	}
	drained := time.Since(start)
	// The evicted sender read on to the end of series 1 before it exited: the file is complete.
	txEnd := await(t, "the drained sender", txSummary)
	defer func() { // runs before the pipeline's deletion: what each agent did, when a check failed
		if t.Failed() {
			t.Logf("the drained sender's log:\n%s", txEnd[logTailKey])
			logPods(t, sp)
		}
	}()
	if _, err := os.Stat(first); err != nil {
		logPods(t, sp)
		t.Fatalf("series 1 is not complete after the drain (%v); the directory holds %v; the sender read %v messages, "+
			"%v acknowledged, paused %v", err, listDir(dir), txEnd["chunks"], txEnd["acknowledged"], txEnd["paused"])
	}
	series2 := "after uncordon"
	if _, err := os.Stat(second); err == nil {
		series2 = "when the drain returned too (the sender read on through it)"
	}
	if out, err := exec.Command(kubectl, "--kubeconfig", kubeconfig, "uncordon", detector).CombinedOutput(); err != nil {
		t.Fatalf("kubectl uncordon: %v\n%s", err, out)
	}
	eventually(t, "series 2 published complete after uncordon", 240*time.Second, func() (bool, string) {
		_, err := os.Stat(second)
		return err == nil, fmt.Sprint(listDir(dir))
	})
	cur := get(t, sp)
	if c := meta.FindStatusCondition(cur.Status.Conditions, v1beta1.ConditionDegraded); c != nil && c.Status == metav1.ConditionTrue {
		t.Errorf("Degraded: %s %s", c.Reason, c.Message)
	}
	o := cur.Status.Observed
	if o.ChunksLost != 0 || o.ChunksCorrupt != 0 || o.SeriesIncomplete != 0 {
		t.Errorf("observed %+v", o)
	}
	// Both series published whole: the count status shows (kubectl get's Series column).
	eventually(t, "status.observed.seriesCompleted 2", 60*time.Second, func() (bool, string) {
		o := get(t, sp).Status.Observed
		return o != nil && o.SeriesCompleted >= 2, fmt.Sprintf("observed %+v", o)
	})
	verifySeriesFile(t, first, 60)
	verifySeriesFile(t, second, 60)
	t.Logf("%s drained %.1f s after series 1 began on the gateway (kubectl drain took %.1f s; the evicted sender read %v "+
		"messages, all acknowledged: %v): series 1 complete when the drain returned, series 2 complete %s; "+
		"observed %d delivered, %d lost", detector, 2.0, drained.Seconds(), txEnd["chunks"],
		txEnd["acknowledged"] == txEnd["chunks"], series2, o.ChunksDelivered, o.ChunksLost)
}

func listDir(dir string) []string {
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
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

// previewOfGateway reads the /preview (spec.preview) of gateway pod gw's stream 0 at page (as
// kubectl numastream preview printed it): the page names stream 0, streams.json lists it with
// its frame's shape, and its PNG decodes (Go's image/png, not ours) to a picture of at most
// maxSide a side with more than one colour in it.
func previewOfGateway(t *testing.T, page string, gw *corev1.Pod, maxSide int) {
	t.Helper()
	base := strings.TrimSuffix(page, "/preview")
	c := http.Client{Timeout: 5 * time.Second}
	get := func(path string) (string, []byte) {
		resp, err := c.Get(base + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %v: %s", path, resp.StatusCode, err, body)
		}
		return resp.Header.Get("Content-Type"), body
	}
	if _, page := get("/preview"); !strings.Contains(string(page), "live preview") {
		t.Fatalf("/preview is not the preview page: %.200s", page)
	}
	_, list := get("/preview/streams.json")
	var streams []struct {
		Stream, Rows, Cols, Width, Height int
		Frames                            int64
		Error                             *string
	}
	if err := json.Unmarshal(list, &streams); err != nil || len(streams) != 1 || streams[0].Stream != 0 {
		t.Fatalf("streams.json: %v: %s", err, list)
	}
	s := streams[0]
	kind, pic := get("/preview/stream/0.png")
	img, err := png.Decode(bytes.NewReader(pic))
	if err != nil || kind != "image/png" {
		t.Fatalf("stream 0's picture (%s, %d bytes) does not decode as a PNG: %v", kind, len(pic), err)
	}
	w, h := img.Bounds().Dx(), img.Bounds().Dy()
	colours := map[color.RGBA]bool{}
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			r, g, b, a := img.At(x, y).RGBA()
			colours[color.RGBA{uint8(r >> 8), uint8(g >> 8), uint8(b >> 8), uint8(a >> 8)}] = true
		}
	}
	if w == 0 || h == 0 || w > maxSide || h > maxSide || w != s.Width || h != s.Height || len(colours) < 2 || s.Error != nil {
		t.Fatalf("stream 0's picture is %d x %d with %d colours; streams.json says %+v (maxSide %d)", w, h, len(colours), s, maxSide)
	}
	t.Logf("preview of %s: the page, stream 0's %d x %d frame as a %d x %d PNG of %d colours, after %d chunks",
		gw.Name, s.Rows, s.Cols, w, h, len(colours), s.Frames)
}
