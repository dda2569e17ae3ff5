package observe

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/render"
)

// parseFile parses a metrics page a real agent served (testdata).
func parseFile(t *testing.T, path string) []Sample {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	samples, err := Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	return samples
}

// testdata/receiver-metrics.txt is what a real receiving agent served on /metrics.
func TestParseRealAgentMetrics(t *testing.T) {
	samples := parseFile(t, "testdata/receiver-metrics.txt")
	r := FromSamples(samples)
	if r.Delivered != 172 || r.RawBytes != 180355072 || r.Lost != 0 || r.Corrupt != 0 {
		t.Fatalf("%+v", r)
	}
	if r.NICLocal == nil || !*r.NICLocal {
		t.Fatalf("nic local %v", r.NICLocal)
	}
	found := false
	for _, s := range samples {
		if s.Name == "numastream_thread_info" && s.Labels["stage"] == "receive" {
			found = s.Labels["cpu"] == "0" && s.Labels["numa_node"] == "0"
		}
	}
	if !found {
		t.Error("thread_info labels not parsed")
	}
}

// The series a gateway completed, as its agent writes the count (obs/metric_catalog.hpp), and
// as its summary says it once the container has exited.
func TestCompletedSeriesAreCounted(t *testing.T) {
	samples, err := Parse(strings.NewReader("# HELP numastream_stream2_series_completed_total Stream V2 series a gateway's sink completed.\n" +
		"# TYPE numastream_stream2_series_completed_total counter\n" +
		`numastream_stream2_series_completed_total{role="receive"} 3` + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	if r := FromSamples(samples); r.SeriesCompleted != 3 {
		t.Fatalf("series completed %v", r.SeriesCompleted)
	}
	var s exitSummary
	if err := json.Unmarshal([]byte(`{"role":"receive","stream2_series_completed":2}`), &s); err != nil || s.SeriesCompleted != 2 {
		t.Fatalf("%+v %v", s, err)
	}
}

// testdata/receiver-stream2-incomplete-metrics.txt is what a real gateway (hdf5 sink) served after
// its detector-sim was killed 27 images into a series.
func TestIncompleteSeriesAreReadWithTheirNames(t *testing.T) {
	r := FromSamples(parseFile(t, "testdata/receiver-stream2-incomplete-metrics.txt"))
	if r.SeriesIncomplete != 1 || len(r.IncompleteSeries) != 1 ||
		!strings.Contains(r.IncompleteSeries[0], "series 1 (detector-sim-") ||
		!strings.Contains(r.IncompleteSeries[0], "disconnected after 27 images, before its end message") {
		t.Fatalf("%d %q", int(r.SeriesIncomplete), r.IncompleteSeries)
	}
}

// testdata/receiver-spill-gap-metrics.txt is what a real gateway served while its sender's full
// spill refused chunks 20-140 of a paced source (and declared them, reason spill_full).
func TestDeclaredGapsAreReadWithTheirNames(t *testing.T) {
	r := FromSamples(parseFile(t, "testdata/receiver-spill-gap-metrics.txt"))
	if r.Lost != 135 || r.DeclaredMissing != 121 || len(r.Gaps) != 1 || r.Gaps[0] != "stream 0: chunks 20-140 (spill_full)" {
		t.Fatalf("lost %v, declared %v, gaps %q", r.Lost, r.DeclaredMissing, r.Gaps)
	}
}

func TestParseRejectsMalformedLines(t *testing.T) {
	for _, bad := range []string{"novalue", `m{a="x" 1`, `m{a=x} 1`, "m{} abc"} {
		if _, err := Parse(strings.NewReader(bad + "\n")); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
	s, err := Parse(strings.NewReader(`m{a="x,y",b="q\"z"} 2.5` + "\n"))
	if err != nil || s[0].Labels["a"] != "x,y" || s[0].Labels["b"] != `q"z` || s[0].Value != 2.5 {
		t.Errorf("%+v %v", s, err)
	}
}

func agentMetrics(raw, wire, delivered, lost float64, nicLocal int) string {
	return strings.Join([]string{
		`# TYPE numastream_raw_bytes_total counter`,
		`numastream_raw_bytes_total{role="receive"} ` + ftoa(raw),
		`numastream_wire_bytes_total{role="receive"} ` + ftoa(wire),
		`numastream_chunks_delivered_total{role="receive"} ` + ftoa(delivered),
		`numastream_chunks_lost{role="receive"} ` + ftoa(lost),
		`numastream_chunks_corrupt_total{role="receive"} 0`,
		`numastream_nic_local{role="receive",stage="receive"} ` + ftoa(float64(nicLocal)),
		`numastream_raw_bytes_total{role="send"} 999`,
		// the decompressing stage: its raw bytes out and the thread-seconds it worked (1.6 GB/s per thread)
		`numastream_stage_bytes_total{role="receive",stage="decompress",direction="out"} ` + ftoa(raw),
		`numastream_stage_bytes_total{role="receive",stage="decompress",direction="in"} ` + ftoa(wire),
		`numastream_stage_busy_seconds_total{role="receive",stage="decompress"} ` + ftoa(raw/1.6e9),
	}, "\n") + "\n"
}

func ftoa(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// relayMetrics is what a gateway pod's receiving (relaying) container reports: its own counts,
// under role "relay" (never summed as deliveries), and the NIC locality.
func relayMetrics(nicLocal int) string {
	return strings.Join([]string{
		`numastream_raw_bytes_total{role="relay"} 5e12`,
		`numastream_chunks_delivered_total{role="relay"} 77777`,
		`numastream_nic_local{role="relay",stage="receive"} ` + ftoa(float64(nicLocal)),
	}, "\n") + "\n"
}

// The observer reads every running gateway pod (both containers of a two-container gateway
// pod), sums the integrity counts, turns byte counters into rates between two readings, and
// reports NIC locality.
func TestObserverAgainstAgentShapedServers(t *testing.T) {
	var phase atomic.Int32
	srvA := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if phase.Load() == 0 {
			w.Write([]byte(agentMetrics(0, 0, 0, 0, -1)))
		} else {
			w.Write([]byte(agentMetrics(10e9, 5e9, 900, 2, -1)))
		}
	}))
	defer srvA.Close()
	srvRelay := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(relayMetrics(1)))
	}))
	defer srvRelay.Close()
	srvB := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(agentMetrics(0, 0, 100, 0, 0)))
	}))
	defer srvB.Close()
	urls := map[string]string{"a/9100": srvRelay.URL, "a/9101": srvA.URL, "b/9100": srvB.URL}
	clock := time.Unix(1000, 0)
	o := NewObserver(time.Second)
	o.URL = func(p *corev1.Pod, port int32) string { return urls[p.Name+"/"+strconv.Itoa(int(port))] + "/metrics" }
	o.now = func() time.Time { return clock }
	pod := func(name, role, stream string, phase corev1.PodPhase) corev1.Pod {
		return corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name),
				Labels: map[string]string{render.LabelRole: role, render.LabelStream: stream}},
			Status: corev1.PodStatus{Phase: phase, PodIP: "10.0.0.1"},
		}
	}
	twoContainers := pod("a", render.RoleGateway, "0", corev1.PodRunning)
	twoContainers.Spec.Containers = []corev1.Container{
		{Name: render.ReceiveContainer, Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9100}, {Name: "data-0", ContainerPort: 5000}}},
		{Name: render.DecompressContainer, Ports: []corev1.ContainerPort{{Name: "metrics-decompress", ContainerPort: 9101}}},
	}
	pods := []corev1.Pod{twoContainers, pod("b", render.RoleGateway, "1", corev1.PodRunning),
		pod("c", render.RoleSender, "0", corev1.PodRunning), pod("d", render.RoleGateway, "2", corev1.PodPending)}
	sp := &v1beta1.StreamPipeline{}
	if _, err := o.Observe(context.Background(), sp, pods); err != nil {
		t.Fatal(err)
	}
	phase.Store(1)
	clock = clock.Add(10 * time.Second)
	obs, err := o.Observe(context.Background(), sp, pods)
	if err != nil {
		t.Fatal(err)
	}
	if obs.RawGbps != "8.00" || obs.WireGbps != "4.00" {
		t.Errorf("rates %s / %s, want 8.00 / 4.00", obs.RawGbps, obs.WireGbps)
	}
	if obs.ChunksDelivered != 1000 || obs.ChunksLost != 2 {
		t.Errorf("counts %+v", obs)
	}
	if obs.NICLocal == nil || *obs.NICLocal {
		t.Errorf("one receiver is remote: nicLocal must be false, got %v", obs.NICLocal)
	}
	// What the planner is fed: the ratio over the window, and the decompressing threads' speed.
	if obs.Ratio != "2.00" || obs.DecompressMBps != "1600" {
		t.Errorf("ratio %q, decompression %q MB/s per thread; want 2.00 and 1600", obs.Ratio, obs.DecompressMBps)
	}
}

// A stream whose gateway pod was replaced (a drain, a lost pod) counts what every pod of it
// delivered exactly once: the newest pod reports what the earlier ones delivered
// (delivered_before, from the resuming sender), and the earlier pod's summary is not added again.
// A replaced gateway of stream 0: the earlier pod exited leaving `summary`; the newest runs, its
// agents serving 50 chunks delivered and `before` delivered before. The observer reads the latter
// from a test server (closed with the test).
func replacedGateway(t *testing.T, summary string, before int, lost ...float64) (*Observer, corev1.Pod, corev1.Pod) {
	newestLost := 0.0
	if len(lost) > 0 {
		newestLost = lost[0]
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(agentMetrics(50*11059200, 25*11059200, 50, newestLost, 1) +
			fmt.Sprintf("numastream_chunks_delivered_before{role=\"receive\"} %d\n", before)))
	}))
	t.Cleanup(srv.Close)
	o := NewObserver(time.Second)
	o.URL = func(*corev1.Pod, int32) string { return srv.URL + "/metrics" }
	labels := map[string]string{render.LabelRole: render.RoleGateway, render.LabelStream: "0"}
	old := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "gw-old", UID: "old", Labels: labels, CreationTimestamp: metav1.Unix(100, 0)},
		Status: corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{{Name: render.DecompressContainer,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 143, Message: summary}}}}},
	}
	cur := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "gw-new", UID: "new", Labels: labels, CreationTimestamp: metav1.Unix(200, 0)},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.2"},
	}
	return o, old, cur
}

func TestObserverCountsAResumedStreamOnce(t *testing.T) {
	o, old, cur := replacedGateway(t, `{"role":"receive","chunks":24,"delivered_before":0,"lost":0,"corrupt":0}`, 24)
	obs, err := o.Observe(context.Background(), &v1beta1.StreamPipeline{}, []corev1.Pod{old, cur})
	if err != nil {
		t.Fatal(err)
	}
	if obs == nil || obs.ChunksDelivered != 74 {
		t.Fatalf("delivered %+v, want 24 + 50 = 74", obs)
	}
	// Only the old pod left (the new one not started yet): its final figures stay.
	obs, _ = o.Observe(context.Background(), &v1beta1.StreamPipeline{}, []corev1.Pod{old})
	if obs == nil || obs.ChunksDelivered != 24 {
		t.Fatalf("delivered %+v, want 24", obs)
	}
}

// A stream reading a live detector whose gateway was replaced (a key rotation): the new sender
// reads the detector afresh and reports nothing delivered before, so the newest pod alone says
// 50 of the 74 delivered. The pipeline counts what each pod delivered itself: 74 while the old
// pod is there, and still 74 once it is gone with its Job (as status recorded it).
func TestObserverCountsWhatEachGatewayOfALiveDetectorDelivered(t *testing.T) {
	o, old, cur := replacedGateway(t, `{"role":"receive","chunks":24,"delivered_before":0,"lost":0,"corrupt":0}`, 0)
	sp := &v1beta1.StreamPipeline{Spec: v1beta1.StreamPipelineSpec{Senders: []v1beta1.Sender{{Node: "det"}}}} // stream 0
	obs, err := o.Observe(context.Background(), sp, []corev1.Pod{old, cur})
	if err != nil || obs == nil || obs.ChunksDelivered != 74 {
		t.Fatalf("both pods there: delivered %+v, %v; want 24 + 50 = 74", obs, err)
	}
	sp.Status.Observed = obs
	if obs, _ = o.Observe(context.Background(), sp, []corev1.Pod{cur}); obs == nil || obs.ChunksDelivered != 74 {
		t.Fatalf("the old pod gone: delivered %+v, want 74", obs)
	}
}

// A sender removed from the pipeline takes its stream's deliveries with it once its gateway
// pods are gone: the pipeline counts the streams it has (as before each pod's deliveries were
// kept), and delivered never passes what they expect.
func TestARemovedStreamsDeliveriesLeaveWithItsPods(t *testing.T) {
	o, old, cur := replacedGateway(t, `{"role":"receive","chunks":24,"delivered_before":0,"lost":0,"corrupt":0}`, 0)
	removed := old
	removed.Name, removed.UID = "gw-removed-stream", "removed"
	removed.Labels = map[string]string{render.LabelRole: render.RoleGateway, render.LabelStream: "1"}
	sp := &v1beta1.StreamPipeline{Spec: v1beta1.StreamPipelineSpec{Senders: []v1beta1.Sender{{Node: "det"}}}} // stream 0 only now
	obs, err := o.Observe(context.Background(), sp, []corev1.Pod{removed, old, cur})
	if err != nil || obs == nil || obs.ChunksDelivered != 98 {
		t.Fatalf("the removed stream's pod still there: delivered %+v, %v; want 24 + 24 + 50", obs, err)
	}
	sp.Status.Observed = obs
	if obs, _ = o.Observe(context.Background(), sp, []corev1.Pod{cur}); obs == nil || obs.ChunksDelivered != 74 {
		t.Fatalf("the removed stream's and the replaced pod gone: delivered %+v, want stream 0's 74", obs)
	}
}

// A gateway restarted after it discarded two corrupt chunks and one its sink could not keep: it
// named them to the sender as discarded, the sender declared them gone to the new pod, which
// reports them missing (lost 3). They are counted once, from the newest pod: the earlier pod's
// summary (which a pod killed without one would not have left) is not added again.
func TestObserverCountsAnEarlierPodsLossesOnceFromTheNewestPod(t *testing.T) {
	o, old, cur := replacedGateway(t, `{"role":"receive","chunks":27,"delivered_before":0,"lost":1,"unwritten":1,"corrupt":2}`, 27, 3)
	obs, err := o.Observe(context.Background(), &v1beta1.StreamPipeline{}, []corev1.Pod{old, cur})
	if err != nil {
		t.Fatal(err)
	}
	if obs == nil || obs.ChunksLost != 3 || obs.ChunksCorrupt != 0 {
		t.Fatalf("observed %+v, want the 3 chunks the newest pod names missing, counted once", obs)
	}
}

// A gateway replaced mid-acquisition (a key rotation, an upgrade) completed series of its own; the
// new pod counts only its own. The pipeline's series count keeps both: while the old pod is there
// (from its summary), once it is gone (as status last recorded it), and across an observer with
// no memory (a new leader: status is all it has).
func TestSeriesOfAReplacedGatewayStayCounted(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(agentMetrics(50*11059200, 25*11059200, 50, 0, 1) +
			"numastream_stream2_series_completed_total{role=\"receive\"} 1\n" +
			"numastream_stream2_series_incomplete_total{role=\"receive\"} 1\n"))
	}))
	t.Cleanup(srv.Close)
	newObserver := func() *Observer {
		o := NewObserver(time.Second)
		o.URL = func(*corev1.Pod, int32) string { return srv.URL + "/metrics" }
		return o
	}
	labels := map[string]string{render.LabelRole: render.RoleGateway, render.LabelStream: "0"}
	old := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "gw-old", UID: "old", Labels: labels, CreationTimestamp: metav1.Unix(100, 0)},
		Status: corev1.PodStatus{Phase: corev1.PodSucceeded, ContainerStatuses: []corev1.ContainerStatus{{Name: render.DecompressContainer,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				Message: `{"role":"receive","chunks":84,"stream2_series_completed":2}`}}}}},
	}
	cur := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "gw-new", UID: "new", Labels: labels, CreationTimestamp: metav1.Unix(200, 0)},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.2"},
	}
	sp := &v1beta1.StreamPipeline{}
	observe := func(o *Observer, pods ...corev1.Pod) {
		t.Helper()
		obs, err := o.Observe(context.Background(), sp, pods)
		if err != nil || obs == nil {
			t.Fatalf("%v %v", obs, err)
		}
		sp.Status.Observed = obs
	}
	want := func(when string, completed, incomplete int64) {
		t.Helper()
		if o := sp.Status.Observed; o.SeriesCompleted != completed || o.SeriesIncomplete != incomplete {
			t.Errorf("%s: series completed %d, incomplete %d; want %d and %d (by pod %+v, gone %+v)", when,
				o.SeriesCompleted, o.SeriesIncomplete, completed, incomplete, o.SeriesByPod, o.SeriesBeforePods)
		}
	}
	o := newObserver()
	observe(o, old)
	want("the first gateway finished", 2, 0)
	observe(o, old, cur)
	want("both pods there", 3, 1)
	observe(o, cur)
	want("the old pod deleted with its Job", 3, 1)
	observe(newObserver(), cur)
	want("read by a new leader", 3, 1)
	if obs, err := o.Observe(context.Background(), sp, nil); obs != nil || err != nil {
		t.Fatalf("no pod left: %v %v, want nothing read (status kept)", obs, err)
	}
	// A third pod, and the second gone too: each counted once.
	third := cur
	third.Name, third.UID, third.CreationTimestamp = "gw-third", "third", metav1.Unix(300, 0)
	observe(o, third)
	want("the second pod gone, a third running", 4, 2)
	if n := len(sp.Status.Observed.SeriesByPod); n != 1 {
		t.Errorf("%d pods recorded, want the one there: %+v", n, sp.Status.Observed.SeriesByPod)
	}
	// A replaced pod still draining is read from its agents (one series each here).
	draining := cur
	draining.Name, draining.UID, draining.CreationTimestamp = "gw-draining", "draining", metav1.Unix(100, 0)
	sp = &v1beta1.StreamPipeline{}
	observe(newObserver(), draining, cur)
	want("the replaced pod draining beside the new one", 2, 2)
	// Its summary once it exits says less (an agent that leaves no series counts in it): the
	// counts read while it ran stand.
	draining.Status = corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{{Name: render.DecompressContainer,
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Message: `{"role":"receive","chunks":50}`}}}}}
	observe(newObserver(), draining, cur)
	want("the replaced pod exited without series in its summary", 2, 2)
}

func TestObserverWithoutRunningGatewaysReportsNothing(t *testing.T) {
	o := NewObserver(time.Second)
	obs, err := o.Observe(context.Background(), &v1beta1.StreamPipeline{}, nil)
	if obs != nil || err != nil {
		t.Fatalf("%v %v", obs, err)
	}
}

func TestObserverNamesTheUnreachableAgent(t *testing.T) {
	o := NewObserver(200 * time.Millisecond)
	o.URL = func(*corev1.Pod, int32) string { return "http://127.0.0.1:1/metrics" }
	pods := []corev1.Pod{{ObjectMeta: metav1.ObjectMeta{Name: "gw-0", Labels: map[string]string{render.LabelRole: render.RoleGateway}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1"}}}
	_, err := o.Observe(context.Background(), &v1beta1.StreamPipeline{}, pods)
	if err == nil || !strings.Contains(err.Error(), "gw-0") {
		t.Fatalf("got %v", err)
	}
}

// A gateway pod whose agents have exited cannot be scraped: its figures come from the summary
// its verifying container left as the termination message, with the run's mean rates.
func TestObserverReadsAnExitedGatewayFromItsSummary(t *testing.T) {
	o := NewObserver(time.Second)
	o.URL = func(*corev1.Pod, int32) string { t.Fatal("an exited pod must not be scraped"); return "" }
	term := func(name, msg string) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: name, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Message: msg}}}
	}
	done := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "gw", Labels: map[string]string{render.LabelRole: render.RoleGateway}},
		Status: corev1.PodStatus{Phase: corev1.PodSucceeded, ContainerStatuses: []corev1.ContainerStatus{
			term(render.ReceiveContainer, `{"role":"relay","chunks":150,"nic_local":true}`),
			term(render.DecompressContainer, `{"role":"receive","chunks":150,"lost":0,"corrupt":1,"raw_bytes":1.6e9,"wire_bytes":8e8,"raw_gbps":1.93,"wire_gbps":0.96,"nic_local":null}`),
		}},
	}
	obs, err := o.Observe(context.Background(), &v1beta1.StreamPipeline{}, []corev1.Pod{done})
	if err != nil {
		t.Fatal(err)
	}
	if obs == nil || obs.ChunksDelivered != 150 || obs.ChunksCorrupt != 1 || obs.RawGbps != "1.93" || obs.WireGbps != "0.96" {
		t.Fatalf("observed %+v", obs)
	}
	if obs.NICLocal == nil || !*obs.NICLocal {
		t.Errorf("NIC locality comes from the receiving container: %v", obs.NICLocal)
	}
	// Without a summary (an agent killed before it wrote one) there is nothing to report.
	done.Status.ContainerStatuses = nil
	if obs, err := o.Observe(context.Background(), &v1beta1.StreamPipeline{}, []corev1.Pod{done}); obs != nil || err != nil {
		t.Fatalf("%v %v", obs, err)
	}
}

// What the operator reads from an agent's metrics port is bounded in size and in time: a pod
// answering with more than MaxMetricsBytes, or too slowly, is refused with an error naming it.
func TestObserverReadsMetricsBoundedInSizeAndTime(t *testing.T) {
	huge := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		line := []byte("numastream_up{role=\"receive\"} 1\n")
		for n := 0; n <= MaxMetricsBytes; n += len(line) {
			if _, err := w.Write(line); err != nil {
				return
			}
		}
	}))
	defer huge.Close()
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	}))
	defer slow.Close()
	labels := map[string]string{render.LabelRole: render.RoleGateway, render.LabelStream: "0"}
	pod := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "gw", UID: "gw", Labels: labels},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.2"},
	}
	for _, c := range []struct {
		url, want string
	}{{huge.URL, "more than"}, {slow.URL, "Timeout"}} {
		o := NewObserver(300 * time.Millisecond)
		o.URL = func(*corev1.Pod, int32) string { return c.url + "/metrics" }
		start := time.Now()
		_, err := o.Observe(context.Background(), &v1beta1.StreamPipeline{}, []corev1.Pod{pod})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one saying %q", c.url, err, c.want)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("%s: the read took %s", c.url, d)
		}
	}
}

// The agents' own report of where their threads run (numastream_thread_info) becomes the status'
// placement table, next to the plan: the relaying container's receiving threads on the NIC's node
// (1, planned "nic"), the decompressing container's threads on node 1 where the plan put them on
// node 0 -- off plan, named; the sender's stages (planned "any") on plan wherever they run; an
// adaptive spare worker's CPU is shown with its stage's, and does not put the stage off plan.
func TestObserverSetsWhereEachStageRunsBesideThePlan(t *testing.T) {
	thread := func(role, stage string, i, cpu, node int) string {
		return fmt.Sprintf(`numastream_thread_info{role=%q,stage=%q,thread="%d",cpu="%d",numa_node="%d",pinned="true",nic_local="%v"} 1`,
			role, stage, i, cpu, node, node == 1)
	}
	// An adaptive runtime's spare worker, on another node's CPU by design: counted, not judged.
	spare := `numastream_thread_info{role="relay",stage="receive",thread="2",cpu="5",numa_node="0",pinned="true",nic_local="false",adaptive="true"} 1`
	relay := strings.Join([]string{relayMetrics(1), thread("relay", "receive", 0, 16, 1), thread("relay", "receive", 1, 17, 1),
		thread("relay", "io", 0, 16, 1), spare}, "\n") + "\n"
	dx := strings.Join([]string{agentMetrics(0, 0, 10, 0, -1), thread("receive", "receive", 0, 20, 1),
		thread("receive", "decompress", 0, 20, 1), thread("receive", "decompress", 1, 21, 1)}, "\n") + "\n"
	sender := strings.Join([]string{thread("send", "compress", 0, 2, 0), thread("send", "compress", 1, 3, 0),
		thread("send", "send", 0, 1, 0)}, "\n") + "\n"
	serve := func(body string) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(body)) }))
	}
	srvRelay, srvDx, srvSender := serve(relay), serve(dx), serve(sender)
	defer srvRelay.Close()
	defer srvDx.Close()
	defer srvSender.Close()
	urls := map[string]string{"gw/9100": srvRelay.URL, "gw/9101": srvDx.URL, "tx/9100": srvSender.URL}
	o := NewObserver(time.Second)
	o.URL = func(p *corev1.Pod, port int32) string { return urls[p.Name+"/"+strconv.Itoa(int(port))] + "/metrics" }
	gw := runningGateway("0")
	tx := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "tx", UID: "uid-tx", Labels: map[string]string{render.LabelRole: render.RoleSender, render.LabelStream: "0"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9100}}}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.2"},
	}
	zero := int32(0)
	sp := &v1beta1.StreamPipeline{Status: v1beta1.StreamPipelineStatus{Plan: &v1beta1.Plan{NICNUMANode: 1, Nodes: []v1beta1.NodePlan{
		{Node: "det", Role: "sender", StreamID: &zero, Stages: []v1beta1.StagePlan{{Stage: "compress", Threads: 2, NUMA: "any"}, {Stage: "send", Threads: 2, NUMA: "any"}}},
		{Node: "gw", Role: "gateway", Stages: []v1beta1.StagePlan{{Stage: "receive", Threads: 2, NUMA: "nic"}, {Stage: "decompress", Threads: 2, NUMA: "0"}}},
	}}}}
	obs, err := o.Observe(context.Background(), sp, []corev1.Pod{gw, tx})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]v1beta1.StagePlacement{}
	for _, r := range obs.Placement {
		got[r.Role+"/"+r.Agent+"/"+r.Stage] = r
	}
	want := map[string]v1beta1.StagePlacement{
		"sender/send/compress":       {Stream: 0, Role: "sender", Agent: "send", Stage: "compress", Threads: 2, CPUs: "2-3", NUMANodes: "0", Planned: "any", OnPlan: true},
		"sender/send/send":           {Stream: 0, Role: "sender", Agent: "send", Stage: "send", Threads: 1, CPUs: "1", NUMANodes: "0", Planned: "any", OnPlan: true},
		"gateway/relay/receive":      {Stream: 0, Role: "gateway", Agent: "relay", Stage: "receive", Threads: 3, CPUs: "5,16-17", NUMANodes: "0,1", Planned: "1", OnPlan: true},
		"gateway/receive/receive":    {Stream: 0, Role: "gateway", Agent: "receive", Stage: "receive", Threads: 1, CPUs: "20", NUMANodes: "1", Planned: "0", OnPlan: false},
		"gateway/receive/decompress": {Stream: 0, Role: "gateway", Agent: "receive", Stage: "decompress", Threads: 2, CPUs: "20-21", NUMANodes: "1", Planned: "0", OnPlan: false},
	}
	if len(got) != len(want) {
		t.Errorf("placement rows %+v, want %d", obs.Placement, len(want))
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: %+v, want %+v", k, got[k], w)
		}
	}
	if obs.Placement[0].Role != "sender" {
		t.Errorf("the sender's rows come first: %+v", obs.Placement)
	}
	// Once no agent runs (the pipeline finished: the gateway's final summary in its termination
	// message), status keeps where they ran.
	sp.Status.Observed = obs
	gw.Status.Phase, tx.Status.Phase = corev1.PodSucceeded, corev1.PodSucceeded
	gw.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: render.DecompressContainer, State: corev1.ContainerState{
		Terminated: &corev1.ContainerStateTerminated{Message: `{"role":"receive","chunks":10,"raw_bytes":100,"wire_bytes":50}`}}}}
	after, err := o.Observe(context.Background(), sp, []corev1.Pod{gw, tx})
	if err != nil {
		t.Fatal(err)
	}
	if len(after.Placement) != len(obs.Placement) || after.Placement[0] != obs.Placement[0] {
		t.Errorf("placement with no agent running: %+v, want the last reported %+v", after.Placement, obs.Placement)
	}
	if obs.NICLocalStreams != "1/1" {
		t.Errorf("NIC-local streams %q, want 1/1", obs.NICLocalStreams)
	}
}

// A gateway with several consumers (spec.sinks): each one's counts (numastream_consumer_*) are
// in status under its name, per stream: the files all of it, the live view's chunks passed over,
// the re-emit's backlog.
func TestObserverSaysWhatEachConsumerGot(t *testing.T) {
	consumer := func(name string, i int, kind, guarantee string, v float64) string {
		return fmt.Sprintf(`%s{role="receive",consumer="%d",kind=%q,guarantee=%q} %g`, name, i, kind, guarantee, v)
	}
	dx := strings.Join([]string{agentMetrics(0, 0, 500, 0, -1),
		consumer("numastream_consumer_chunks_total", 0, "hdf5", "lossless", 500),
		consumer("numastream_consumer_passed_over_total", 0, "hdf5", "lossless", 0),
		consumer("numastream_consumer_behind", 0, "hdf5", "lossless", 0),
		consumer("numastream_consumer_chunks_total", 1, "stream2", "lossless", 480),
		consumer("numastream_consumer_passed_over_total", 1, "stream2", "lossless", 0),
		consumer("numastream_consumer_behind", 1, "stream2", "lossless", 20),
		consumer("numastream_consumer_spill_bytes", 1, "stream2", "lossless", 3<<30),
		consumer("numastream_consumer_chunks_total", 2, "zmq", "latest", 310),
		consumer("numastream_consumer_passed_over_total", 2, "zmq", "latest", 190),
		consumer("numastream_consumer_behind", 2, "zmq", "latest", 1),
	}, "\n") + "\n"
	srvRelay := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(relayMetrics(1))) }))
	srvDx := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(dx)) }))
	defer srvRelay.Close()
	defer srvDx.Close()
	o := NewObserver(time.Second)
	o.URL = func(p *corev1.Pod, port int32) string {
		if port == 9101 {
			return srvDx.URL + "/metrics"
		}
		return srvRelay.URL + "/metrics"
	}
	gw := runningGateway("3")
	sp := &v1beta1.StreamPipeline{Spec: v1beta1.StreamPipelineSpec{Sinks: []v1beta1.Consumer{
		{Name: "files", Sink: v1beta1.Sink{HDF5: &v1beta1.HDF5Dataset{Root: "archive", Path: "x.h5"}}},
		{Name: "analysis", Sink: v1beta1.Sink{Stream2: &v1beta1.Stream2Sink{}}},
		{Name: "live", Guarantee: v1beta1.GuaranteeLatest, Sink: v1beta1.Sink{ZMQ: &v1beta1.ZMQEndpoint{Endpoint: "tcp://viewer:7000"}}},
	}}}
	obs, err := o.Observe(context.Background(), sp, []corev1.Pod{gw})
	if err != nil {
		t.Fatal(err)
	}
	want := []v1beta1.ConsumerStatus{
		{Stream: 3, Name: "files", Kind: "hdf5", Guarantee: "lossless", Chunks: 500},
		{Stream: 3, Name: "analysis", Kind: "stream2", Guarantee: "lossless", Chunks: 480, Behind: 20, SpillBytes: 3 << 30},
		{Stream: 3, Name: "live", Kind: "zmq", Guarantee: "latest", Chunks: 310, PassedOver: 190, Behind: 1},
	}
	if !reflect.DeepEqual(obs.Consumers, want) {
		t.Errorf("consumers %+v\nwant %+v", obs.Consumers, want)
	}
}

// runningGateway is a running gateway pod "gw" of `stream`: its relaying container's metrics on
// port 9100, its decompressing container's on 9101.
func runningGateway(stream string) corev1.Pod {
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "gw", UID: "uid-gw", Labels: map[string]string{render.LabelRole: render.RoleGateway, render.LabelStream: stream}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{
			{Name: render.ReceiveContainer, Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9100}}},
			{Name: render.DecompressContainer, Ports: []corev1.ContainerPort{{Name: "metrics-decompress", ContainerPort: 9101}}},
		}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1"},
	}
}
