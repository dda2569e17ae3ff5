package observe

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
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

func TestBottleneckRule(t *testing.T) {
	for _, c := range []struct {
		loads map[string]Load
		want  string
	}{
		{map[string]Load{"send/compress": {Busy: 0.95}, "receive/decompress": {Busy: 0.85}}, "compress"},
		{map[string]Load{"send/compress": {Busy: 0.5}, "receive/decompress": {Busy: 0.9}}, "decompress"},
		{map[string]Load{"receive/sink": {Busy: 0.97}, "send/send": {Out: 0.9}}, "sink"},
		{map[string]Load{"send/compress": {Busy: 0.4}, "send/send": {Out: 0.7}, "relay/receive": {Busy: 0.2}}, "network"},
		{map[string]Load{"send/send": {Out: 0.7}, "relay/receive": {Busy: 0.9}}, ""}, // the receivers are the limit: no stage rule names them
		{map[string]Load{"send/compress": {Busy: 0.2, In: 0.75}, "send/send": {Out: 0.1}}, "source"},
		{map[string]Load{"send/compress": {Busy: 0.5, In: 0.2}}, ""},
		{nil, ""},
	} {
		got, why := Bottleneck(c.loads)
		if got != c.want || (got != "" && why == "") {
			t.Errorf("Bottleneck(%v) = %q (%q), want %q", c.loads, got, why, c.want)
		}
	}
}

// stageMetrics is what an agent says of one stage: its counters and its threads.
func stageMetrics(role, stage string, threads int, busy, in, out float64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "numastream_stage_busy_seconds_total{role=%q,stage=%q} %g\n", role, stage, busy)
	fmt.Fprintf(&b, "numastream_stage_blocked_seconds_total{role=%q,stage=%q,cause=\"input\"} %g\n", role, stage, in)
	fmt.Fprintf(&b, "numastream_stage_blocked_seconds_total{role=%q,stage=%q,cause=\"output\"} %g\n", role, stage, out)
	for i := 0; i < threads; i++ {
		fmt.Fprintf(&b, "numastream_thread_info{role=%q,stage=%q,thread=\"%d\",cpu=\"0\",numa_node=\"0\",pinned=\"true\",nic_local=\"unknown\"} 1\n", role, stage, i)
	}
	return b.String()
}

// The observer reads the senders too: it names the stage that limits the stream from the
// stages' busy and blocked times between two readings (here two compressing threads busy 95% of
// a 10 s window: the adaptive runtime had grown the stage to 2 active threads), and reports what
// the senders' spills hold and lost.
func TestObserverNamesTheBottleneckFromTheSendersAndTheGateway(t *testing.T) {
	var reading atomic.Int32
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		k := float64(reading.Load())
		fmt.Fprint(w, agentMetrics(k*1e9, k*5e8, k*100, 0, 1))
		fmt.Fprint(w, stageMetrics("receive", "receive", 1, k*0.2, k*0.8, 0))
	}))
	defer gw.Close()
	tx := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		k := float64(reading.Load())
		fmt.Fprint(w, stageMetrics("send", "compress", 1, k*1.9, k*0.05, k*0.05))
		fmt.Fprint(w, "numastream_adaptive_active_threads{role=\"send\",stage=\"compress\"} 2\n")
		fmt.Fprint(w, stageMetrics("send", "send", 1, k*0.1, k*0.9, 0))
		fmt.Fprint(w, "numastream_spill_bytes{role=\"send\"} 7340032\nnumastream_spill_lost_chunks_total{role=\"send\"} 3\n")
	}))
	defer tx.Close()
	clock := time.Unix(1000, 0)
	o := NewObserver(time.Second)
	o.now = func() time.Time { return clock }
	o.URL = func(p *corev1.Pod, _ int32) string {
		if p.Labels[render.LabelRole] == render.RoleSender {
			return tx.URL + "/metrics"
		}
		return gw.URL + "/metrics"
	}
	pod := func(name, role string) corev1.Pod {
		return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(name),
			Labels: map[string]string{render.LabelRole: role, render.LabelStream: "0"}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1"}}
	}
	pods := []corev1.Pod{pod("g", render.RoleGateway), pod("s", render.RoleSender)}
	sp := &v1beta1.StreamPipeline{}
	for i := 0; i < 2; i++ {
		reading.Store(int32(i * 10))
		obs, err := o.Observe(context.Background(), sp, pods)
		if err != nil {
			t.Fatal(err)
		}
		clock = clock.Add(10 * time.Second)
		if i == 1 && (obs.Bottleneck != "compress" || !strings.Contains(obs.BottleneckDetail, "compress threads busy 95%")) {
			t.Errorf("bottleneck %q (%s), want compress at 95%%", obs.Bottleneck, obs.BottleneckDetail)
		}
		if obs.SpillBytes != 7340032 || obs.SpillLost != 3 {
			t.Errorf("spill %d bytes, %d lost; want the sender's 7340032 and 3", obs.SpillBytes, obs.SpillLost)
		}
	}
}
