package facility

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/render"
	"github.com/numastream/numastream/internal/testenv"
)

// The second detector node of the facility in a box.
const detectorB = "detector-b"

const chunkBytes = 11059200

// twoDetectors is pipeline() with a second sender on detector-b (seed 8; detector-a's is 7).
func twoDetectors(t *testing.T, name string, chunks int64, sink string) *v1beta1.StreamPipeline {
	t.Helper()
	sp := pipeline(t, ns, name, chunks, sink)
	second := *sp.Spec.Senders[0].DeepCopy()
	second.Node = detectorB
	second.Source.Synthetic.Seed = 8
	sp.Spec.Senders = append(sp.Spec.Senders, second)
	return sp
}

// streamJobs are the pipeline's Jobs of a stream, by name, with their UIDs.
func streamJobs(t *testing.T, sp *v1beta1.StreamPipeline, stream int) map[string]types.UID {
	t.Helper()
	var jobs batchv1.JobList
	if err := k8s.List(ctx, &jobs, client.InNamespace(sp.Namespace),
		client.MatchingLabels{render.LabelPipeline: sp.Name, render.LabelStream: strconv.Itoa(stream)}); err != nil {
		t.Fatal(err)
	}
	out := map[string]types.UID{}
	for _, j := range jobs.Items {
		if j.DeletionTimestamp == nil {
			out[j.Name] = j.UID
		}
	}
	return out
}

// streamGateway is the running gateway pod of one stream, or nil.
func streamGateway(t *testing.T, sp *v1beta1.StreamPipeline, stream int) *corev1.Pod {
	t.Helper()
	for _, p := range pods(t, sp, render.RoleGateway) {
		if p.Labels[render.LabelStream] == strconv.Itoa(stream) && p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil && p.Status.PodIP != "" {
			return &p
		}
	}
	return nil
}

// synthFrames are the synthetic source's distinct projections of a seed, as the agent makes them
// (`numastream-agent synth`): chunk i of the stream is frame i mod 4.
func synthFrames(t *testing.T, seed int) [][]byte {
	t.Helper()
	out := filepath.Join(t.TempDir(), fmt.Sprintf("seed-%d.raw", seed))
	if b, err := exec.Command(testenv.Agent(t), "synth", "--out", out, "--chunk-bytes", strconv.Itoa(chunkBytes),
		"--frames", "4", "--seed", strconv.Itoa(seed)).CombinedOutput(); err != nil {
		t.Fatalf("synth: %v\n%s", err, b)
	}
	data, err := os.ReadFile(out)
	if err != nil || len(data) != 4*chunkBytes {
		t.Fatalf("synth wrote %d bytes (%v)", len(data), err)
	}
	return [][]byte{data[:chunkBytes], data[chunkBytes : 2*chunkBytes], data[2*chunkBytes : 3*chunkBytes], data[3*chunkBytes:]}
}

// onlyFrom checks that every chunk of a stream's file is the chunk of its own detector (the frame
// its sequence names, of its seed) and none of the other's; it returns the number of chunks.
func onlyFrom(t *testing.T, file string, own, other [][]byte) int {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if len(data)%chunkBytes != 0 {
		t.Errorf("%s holds %d bytes: not whole chunks", file, len(data))
	}
	n := len(data) / chunkBytes
	for i := 0; i < n; i++ {
		chunk := data[i*chunkBytes : (i+1)*chunkBytes]
		switch {
		case bytes.Equal(chunk, own[i%4]):
		case bytes.Equal(chunk, other[i%4]):
			t.Errorf("%s chunk %d is the other detector's: two detectors' data mixed in one file", file, i)
			return n
		default:
			t.Errorf("%s chunk %d is neither detector's frame %d", file, i, i%4)
			return n
		}
	}
	return n
}

// Removing the first of two senders mid-stream (a GitOps edit of spec.senders): the removed
// detector's stream stops and its Jobs go; the remaining detector's stream keeps its id, its keys
// and its file, which ends with every one of its chunks once and nothing of the other
// detector's; the removed stream's file stays .part with what arrived, all of it its own
// detector's. On this gateway the two streams shared the cores and the link, so the one left is
// planned again with what the other freed (more decompressing threads, a larger share of the
// link): its Jobs are replaced once (drained, resumed where they stopped). Where the remaining
// streams' plans do not change, their Jobs are kept (TestDecideActsOnEveryEditOfARunningPipeline).
func TestRemovingTheFirstOfTwoSendersMidStreamKeepsTheOtherStreamWhole(t *testing.T) {
	const chunks = 240
	dir := sinkDir(t, "senders")
	sp := start(t, paced(twoDetectors(t, "senders", chunks, "  sink: {file: {root: "+storageRoot+", path: \"senders/senders-{stream}.raw\"}}")))
	var n0, n1 float64
	eventually(t, "both streams flowing", 180*time.Second, func() (bool, string) {
		g0, g1 := streamGateway(t, sp, 0), streamGateway(t, sp, 1)
		if g0 == nil || g1 == nil {
			return false, fmt.Sprintf("running gateway pods: stream 0 %v, stream 1 %v", g0 != nil, g1 != nil)
		}
		n0, _, _ = delivered(t, g0)
		n1, _, _ = delivered(t, g1)
		return n0 > 5 && n1 > 5, fmt.Sprintf("delivered: stream 0 %.0f, stream 1 %.0f", n0, n1)
	})
	kept := streamJobs(t, sp, 1)
	if len(kept) != 2 {
		t.Fatalf("stream 1's Jobs: %v", kept)
	}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := get(t, sp)
		if cur.Spec.Senders[0].Node != detector {
			return fmt.Errorf("senders %v", cur.Spec.Senders)
		}
		cur.Spec.Senders = cur.Spec.Senders[1:]
		return k8s.Update(ctx, cur)
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("removed sender %s after %.0f (stream 0) and %.0f (stream 1) of %d chunks", detector, n0, n1, chunks)
	eventually(t, "stream 0's Jobs deleted", 120*time.Second, func() (bool, string) {
		left := streamJobs(t, sp, 0)
		return len(left) == 0, fmt.Sprint(left)
	})
	cur := completed(t, sp, chunks, "Ready=True Completed with the remaining stream's every chunk")
	replanned := "kept"
	if now := streamJobs(t, sp, 1); fmt.Sprint(now) != fmt.Sprint(kept) {
		replanned = "replaced, re-planned with what the other stream freed:"
		for _, n := range cur.Status.Plan.Nodes {
			replanned += fmt.Sprintf(" %s %d CPUs;", n.Role, n.CPUs)
		}
	}
	if len(cur.Status.Senders) != 1 || cur.Status.Senders[0].Node != detectorB || cur.Status.Senders[0].Stream != 1 {
		t.Errorf("status.senders %+v: want detector-b keeping stream 1", cur.Status.Senders)
	}
	seed7, seed8 := synthFrames(t, 7), synthFrames(t, 8)
	wholeAndNothingLost(t, cur, filepath.Join(dir, "senders-1.raw"), chunks)
	kept1 := onlyFrom(t, filepath.Join(dir, "senders-1.raw"), seed8, seed7)
	stopped0 := onlyFrom(t, filepath.Join(dir, "senders-0.raw.part"), seed7, seed8)
	if stopped0 == 0 || stopped0 >= chunks {
		t.Errorf("the removed stream's file holds %d chunks: want what arrived before the edit, fewer than %d", stopped0, chunks)
	}
	if _, err := os.Stat(filepath.Join(dir, "senders-0.raw")); err == nil {
		t.Error("the removed stream's file was published complete")
	}
	t.Logf("after the edit: Completed; senders-1.raw holds all %d chunks of detector-b (seed 8) and nothing else; its Jobs %s; senders-0.raw.part keeps %d chunks, all detector-a's",
		kept1, replanned, stopped0)
}

// Two host-network streams into one gateway, next to a node-exporter holding 9100 and 9101 on the
// gateway node: each stream's gateway pod gets its own block of host ports (data and metrics),
// none shared with the other stream or the node-exporter; both complete, every chunk once.
func TestTwoHostNetworkStreamsIntoOneGateway(t *testing.T) {
	const chunks = 120
	// node-exporter's ports, held on the gateway node for the test's length.
	exporter := exec.Command("bash", filepath.Join("..", "..", "hack", "facility.sh"), "exec", gateway,
		"python3", "-c", `import socket,time
s=[socket.socket() for _ in range(2)]
[x.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1) or x.bind(("0.0.0.0", p)) or x.listen() for x, p in zip(s, (9100, 9101))]
print("listening", flush=True)
time.sleep(3600)`)
	exporter.Env = append(os.Environ(), "SIM_DIR="+filepath.Dir(kubeconfig))
	exporter.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // killed with nsenter and python below
	stdout, err := exporter.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	exporter.Stderr = os.Stderr
	if err := exporter.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Kill(-exporter.Process.Pid, syscall.SIGKILL); _ = exporter.Wait() }()
	line := make([]byte, 10)
	if _, err := stdout.Read(line); err != nil || string(line[:9]) != "listening" {
		t.Fatalf("the node-exporter stand-in on %s: %q %v", gateway, line, err)
	}

	dir := sinkDir(t, "hostnet2")
	sp := twoDetectors(t, "hostnet2", chunks, "  sink: {file: {root: "+storageRoot+", path: \"hostnet2/hostnet2-{stream}.raw\"}}")
	sp.Spec.HostNetwork = true
	sp.Spec.Gateway.Network.Attachment, sp.Spec.Gateway.Network.SenderAttachment = "", ""
	start(t, sp)
	ports := map[int]string{9100: "node-exporter", 9101: "node-exporter"}
	eventually(t, "both host-network gateway pods running", 180*time.Second, func() (bool, string) {
		return streamGateway(t, sp, 0) != nil && streamGateway(t, sp, 1) != nil, "waiting"
	})
	for stream := 0; stream < 2; stream++ {
		gw := streamGateway(t, sp, stream)
		if !gw.Spec.HostNetwork {
			t.Fatalf("gateway pod %s is not on the host network", gw.Name)
		}
		for _, c := range gw.Spec.Containers {
			for _, p := range c.Ports {
				owner := fmt.Sprintf("stream %d %s/%s", stream, c.Name, p.Name)
				if other, ok := ports[int(p.ContainerPort)]; ok {
					t.Errorf("host port %d: %s and %s", p.ContainerPort, owner, other)
				}
				ports[int(p.ContainerPort)] = owner
			}
		}
	}
	cur := completed(t, sp, 2*chunks, "Ready=True Completed, both streams")
	seed7, seed8 := synthFrames(t, 7), synthFrames(t, 8)
	for stream, frames := range [][][]byte{seed7, seed8} {
		file := filepath.Join(dir, fmt.Sprintf("hostnet2-%d.raw", stream))
		wholeAndNothingLost(t, cur, file, chunks)
		onlyFrom(t, file, frames, [][][]byte{seed7, seed8}[1-stream])
	}
	t.Logf("two host-network streams into %s beside a node-exporter on 9100/9101: host ports %v; Completed, %d chunks delivered, %d lost, each file its own detector's",
		gateway, ports, cur.Status.Observed.ChunksDelivered, cur.Status.Observed.ChunksLost)
}

// streamImages is the agent image of each stream's Jobs ("" while it has none, "mixed" while its
// sender and gateway differ), prefixed "done@" once every Job of the stream has completed.
func streamImages(t *testing.T, sp *v1beta1.StreamPipeline) map[int]string {
	t.Helper()
	var jobs batchv1.JobList
	if err := k8s.List(ctx, &jobs, client.InNamespace(sp.Namespace), client.MatchingLabels{render.LabelPipeline: sp.Name}); err != nil {
		t.Fatal(err)
	}
	out, running := map[int]string{}, map[int]bool{}
	for _, j := range jobs.Items {
		if j.DeletionTimestamp != nil {
			continue
		}
		stream, _ := strconv.Atoi(j.Labels[render.LabelStream])
		img := j.Spec.Template.Spec.Containers[0].Image
		if cur, ok := out[stream]; ok && cur != img {
			img = "mixed"
		}
		out[stream] = img
		complete := slices.ContainsFunc(j.Status.Conditions, func(c batchv1.JobCondition) bool {
			return c.Type == batchv1.JobComplete && c.Status == corev1.ConditionTrue
		})
		running[stream] = running[stream] || !complete
	}
	for stream, img := range out {
		if !running[stream] {
			out[stream] = "done@" + img
		}
	}
	return out
}

// `helm upgrade` to a new agent image with two streams running rolls them one at a time
// (spec.rollout.maxStreams, default 1): stream 0 is replaced first while stream 1 streams on its
// old pods, then stream 1 — or, should it finish before its turn, it is left finished (a finished
// stream is never run again); both files end with every chunk once, nothing of the other's.
// Stream 0 is the longer one, so that it still runs when the new operator takes over however long
// `helm upgrade --wait` takes (a stream finished before the upgrade is never replaced, which let
// stream 1 go first in a CI run: the order this test holds the operator to is among running
// streams).
func TestAHelmUpgradeRollsTwoStreamsOneAtATime(t *testing.T) {
	newImage := agentImageTagged("rolled")
	chunks := []int64{800, 400} // the two share the gateway's link: stream 0 runs ~110 s, stream 1 ~70 s
	dir := sinkDir(t, "roll2")
	sp := twoDetectors(t, "roll2", chunks[0], "  sink: {file: {root: "+storageRoot+", path: \"roll2/roll2-{stream}.raw\"}}")
	sp.Spec.Senders[1].Source.Synthetic.Chunks = chunks[1]
	start(t, paced(sp))
	eventually(t, "both streams flowing", 180*time.Second, func() (bool, string) {
		g0, g1 := streamGateway(t, sp, 0), streamGateway(t, sp, 1)
		if g0 == nil || g1 == nil {
			return false, "gateway pods not running"
		}
		n0, _, _ := delivered(t, g0)
		n1, _, _ := delivered(t, g1)
		return n0 > 5 && n1 > 5, fmt.Sprintf("delivered %.0f and %.0f", n0, n1)
	})
	old := streamImages(t, sp)
	if old[0] != old[1] || old[0] == newImage {
		t.Fatalf("images before the upgrade: %v", old)
	}
	// The streams' Job images while the upgrade runs, until the pipeline completes.
	done := make(chan []string)
	go func() {
		var seen []string
		last := ""
		for i := 0; i < 3000; i++ { // 300 s
			imgs := streamImages(t, sp)
			state := fmt.Sprintf("0:%s 1:%s", imgs[0], imgs[1])
			if state != last {
				seen, last = append(seen, state), state
			}
			var cur v1beta1.StreamPipeline
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(sp), &cur); err == nil && cur.Status.Observed != nil &&
				cur.Status.Observed.ChunksDelivered == chunks[0]+chunks[1] {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		done <- seen
	}()
	out := facilityScript(t, "upgrade-agent", "rolled")
	defer facilityScript(t, "upgrade-agent", "facility")
	seen := <-done
	t.Logf("helm upgrade: %s; the streams' Job images, in the order seen: %v", strings.TrimSpace(out), seen)
	// One at a time: a state with stream 0 replaced (or being replaced) while stream 1 runs (or
	// finished on) its old image, and none with stream 1 off its old image while stream 0 still
	// runs its own.
	oneAtATime, rolled1 := false, false
	for _, state := range seen {
		var s0, s1 string
		fmt.Sscanf(state, "0:%s 1:%s", &s0, &s1)
		onOld := func(s string, stream int) bool { return s == old[stream] || s == "done@"+old[stream] }
		if !onOld(s0, 0) && onOld(s1, 1) {
			oneAtATime = true
		}
		if s0 == old[0] && !onOld(s1, 1) {
			t.Errorf("stream 1 replaced while stream 0 still ran its old image: %s", state)
		}
		rolled1 = rolled1 || strings.HasSuffix(s1, newImage)
	}
	if !oneAtATime {
		t.Errorf("never saw stream 0 rolled while stream 1 ran its old image: %v", seen)
	}
	cur := completed(t, sp, chunks[0]+chunks[1], "Ready=True Completed, both streams, after the roll")
	seed7, seed8 := synthFrames(t, 7), synthFrames(t, 8)
	for stream, frames := range [][][]byte{seed7, seed8} {
		file := filepath.Join(dir, fmt.Sprintf("roll2-%d.raw", stream))
		wholeAndNothingLost(t, cur, file, chunks[stream])
		onlyFrom(t, file, frames, [][][]byte{seed7, seed8}[1-stream])
	}
	t.Logf("after the roll (stream 1 rolled too: %v, else it had finished first): Completed, %d chunks delivered, %d lost; each file its own detector's, whole",
		rolled1, cur.Status.Observed.ChunksDelivered, cur.Status.Observed.ChunksLost)
}
