package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	ctrlfake "sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/render"
)

func pipelineWith(chunks int64, delivered, lost int64, reason string) *v1beta1.StreamPipeline {
	sp := &v1beta1.StreamPipeline{ObjectMeta: metav1.ObjectMeta{Name: "tomo", Namespace: "beamline"}}
	sp.Spec.ChunkBytes = 1 << 20
	sp.Spec.Senders = []v1beta1.Sender{{Node: "det", Source: v1beta1.Source{Synthetic: &v1beta1.SyntheticSource{Chunks: chunks}}}}
	sp.Status.PredictedGbps = "2.00"
	sp.Status.Plan = &v1beta1.Plan{Connections: 2, Bottleneck: "network", NICNUMANode: 1, Nodes: []v1beta1.NodePlan{
		{Node: "det", Role: "sender", CPUs: 2, Stages: []v1beta1.StagePlan{{Stage: "compress", Threads: 2, NUMA: "0", RateMbps: 2400}}},
		{Node: "gw-numa", Role: "gateway", CPUs: 1, SharedMilliCPU: 900, Stages: []v1beta1.StagePlan{{Stage: "receive", Threads: 1, NUMA: "1"}}},
	}}
	sp.Status.Observed = &v1beta1.Observed{ChunksDelivered: delivered, ChunksLost: lost, RawGbps: "1.50",
		Placement: []v1beta1.StagePlacement{{Stream: 0, Role: "gateway", Agent: "relay", Stage: "receive", Threads: 1, CPUs: "1", NUMANodes: "1", Planned: "1", OnPlan: true}},
		Consumers: []v1beta1.ConsumerStatus{{Stream: 0, Name: "hpc", Kind: "numastream", Guarantee: "lossless", Chunks: delivered, SpillBytes: 3 << 20}},
	}
	sp.Status.Conditions = []metav1.Condition{{Type: v1beta1.ConditionReady, Status: metav1.ConditionTrue, Reason: reason, Message: "streaming"}}
	return sp
}

func env(t *testing.T, objs ...runtime.Object) (Env, *bytes.Buffer) {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := v1beta1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	return Env{Client: ctrlfake.NewClientBuilder().WithScheme(scheme).WithRuntimeObjects(objs...).Build(),
		Pods: fake.NewClientset(), Namespace: "beamline", Out: &out}, &out
}

func TestStatusShowsThePlanNextToWhereTheAgentsRun(t *testing.T) {
	sp := pipelineWith(100, 40, 2, "Running")
	sp.Spec.Sinks = []v1beta1.Consumer{{Name: "hpc", Sink: v1beta1.Sink{Onward: &v1beta1.OnwardSink{Site: "hpc-dtn"}}}}
	sp.Status.Plan.Onward = []v1beta1.OnwardPlan{{Consumer: "hpc", StreamID: 0, Connections: 2, PredictedMbps: 400, Security: "curve"}}
	listed := metav1.NewTime(time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC))
	sp.Status.GatewayKey = &v1beta1.GatewayKey{Public: "current-key", Next: "next-key", NextSince: &listed}
	e, out := env(t, sp)
	if err := Status(context.Background(), e, "tomo"); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, want := range []string{
		"streampipeline beamline/tomo: Ready=True (Running)",
		"plan: 2 connection(s); predicted 2.00 Gbit/s raw, bottleneck network; gateway NIC on NUMA node 1",
		"gw-numa", "1+900m", "receive x1 @1", "compress x2 @0 (2400 Mbit/s)",
		"placement (as the agents report it):", "relay",
		"observed: 40 chunks delivered, 2 lost, 0 corrupt; raw 1.50 Gbit/s (75% of the 2.00 predicted)",
		"hpc", "lossless", "3.0 MiB",
		"onward hop hpc (stream 0) to RemoteSite hpc-dtn: 2 connection(s), predicted 400 Mbit/s, curve",
		"gateway key (far sites admit it): current-key", "next key, listed since 2026-11-30T10:00:00Z for a rotation: next-key",
		"Ready", "streaming",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("status lacks %q:\n%s", want, text)
		}
	}
	// The placement table's columns line up under its header.
	var header, row string
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, "ON-PLAN") {
			header = line
		} else if header != "" && row == "" {
			row = line
		}
	}
	if i := strings.Index(header, "ON-PLAN"); i < 0 || len(row) <= i || row[i:] != "yes" {
		t.Errorf("placement row %q not under its header %q", row, header)
	}
}

func TestStatusOfAPipelineThatIsNotThereNamesIt(t *testing.T) {
	e, _ := env(t)
	err := Status(context.Background(), e, "absent")
	if err == nil || !strings.Contains(err.Error(), "streampipeline beamline/absent") {
		t.Fatalf("error %v", err)
	}
}

func TestProgressReachesAHundredPercentWhenTheStreamIsWhole(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	mid := Progress(pipelineWith(100, 40, 2, "Running"), now)
	// 58 chunks of 1 MiB at 1.5 Gbit/s: 0.32 s.
	if want := "[12:00:00] tomo: 42/100 chunks (42%), 1.50 Gbit/s of 2.00 planned, ETA <1s, lost 2; Running"; mid != want {
		t.Errorf("progress\n got %q\nwant %q", mid, want)
	}
	sp := pipelineWith(100, 100, 0, "Completed")
	if got := Progress(sp, now); !strings.Contains(got, "100/100 chunks (100%)") || strings.Contains(got, "ETA") {
		t.Errorf("final progress %q", got)
	}
	if !Finished(sp) {
		t.Error("a Completed pipeline is not finished")
	}
	endless := pipelineWith(0, 7, 0, "Running")
	if got := Progress(endless, now); !strings.Contains(got, " 7 chunks,") || strings.Contains(got, "%") {
		t.Errorf("an endless stream's progress %q", got)
	}
}

func TestWatchPrintsUntilThePipelineCompletes(t *testing.T) {
	e, out := env(t, pipelineWith(10, 10, 0, "Completed"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := Watch(ctx, e, "tomo", 10*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Count(out.String(), "\n"); lines != 1 || !strings.Contains(out.String(), "(100%)") {
		t.Errorf("watch of a completed pipeline: %q", out.String())
	}
}

func TestLogsPrefixesEachLineWithItsPodAndContainer(t *testing.T) {
	e, out := env(t, pipelineWith(10, 0, 0, "Running"))
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "tomo-gateway-0-x", Namespace: "beamline",
		Labels: map[string]string{render.LabelPipeline: "tomo"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "receive"}, {Name: "decompress"}}}}
	e.Pods = fake.NewClientset(pod)
	if err := Logs(context.Background(), e, "tomo", 0); err != nil {
		t.Fatal(err)
	}
	// The fake clientset answers every log with "fake logs".
	for _, want := range []string{"tomo-gateway-0-x/receive: fake logs", "tomo-gateway-0-x/decompress: fake logs"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("logs lack %q:\n%s", want, out.String())
		}
	}
}

func TestPreviewOpensTheNewestRunningGatewayOfTheStreamOnItsPreviewPort(t *testing.T) {
	sp := pipelineWith(10, 0, 0, "Running")
	e, _ := env(t, sp)
	if _, _, err := PreviewPod(context.Background(), e, "tomo", 0); err == nil || !strings.Contains(err.Error(), "spec.preview") {
		t.Errorf("a pipeline without a preview: %v, want the field named", err)
	}
	sp = pipelineWith(10, 0, 0, "Running")
	sp.Spec.Preview = &v1beta1.Preview{}
	e, _ = env(t, sp)
	hostNetwork := false
	gateway := func(name string, age time.Duration, phase corev1.PodPhase, port int32) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "beamline",
			CreationTimestamp: metav1.NewTime(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC).Add(-age)),
			Labels:            map[string]string{render.LabelPipeline: "tomo", render.LabelRole: render.RoleGateway, render.LabelStream: "0"}},
			Spec: corev1.PodSpec{HostNetwork: hostNetwork, Containers: []corev1.Container{{Name: render.DecompressContainer,
				Ports: []corev1.ContainerPort{{Name: "metrics-dx", ContainerPort: port}}}}},
			Status: corev1.PodStatus{Phase: phase}}
	}
	pods := func() {
		e.Pods = fake.NewClientset(gateway("old", time.Hour, corev1.PodRunning, 9101), gateway("new", time.Minute, corev1.PodRunning, 5557),
			gateway("failed", 0, corev1.PodFailed, 9101))
	}
	pods()
	pod, port, err := PreviewPod(context.Background(), e, "tomo", 0)
	if err != nil || pod.Name != "new" || port != render.PreviewPort {
		t.Errorf("preview pod %v port %d (%v), want the newest running one, new, on its loopback preview port %d", pod, port, err, render.PreviewPort)
	}
	// With host networking, on its decoding container's metrics port (its own per stream).
	hostNetwork = true
	pods()
	if pod, port, err = PreviewPod(context.Background(), e, "tomo", 0); err != nil || pod.Name != "new" || port != 5557 {
		t.Errorf("host network: preview pod %v port %d (%v), want new on its metrics-dx port 5557", pod, port, err)
	}
	if _, _, err := PreviewPod(context.Background(), e, "tomo", 1); err == nil || !strings.Contains(err.Error(), "stream 1") {
		t.Errorf("a stream without a gateway pod: %v", err)
	}
}
