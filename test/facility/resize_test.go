package facility

import (
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/numastream/numastream/internal/render"
)

// A gateway pod resized in place while its stream runs, as a person (or a re-plan) would: the
// receiving container gives up half a CPU and the decompressing container takes it (1 -> 1.5
// CPUs). The real kubelet rewrites the containers' cgroups under the running agents; the
// decompressing agent reads its new quota within seconds, starts another decompressing thread
// on it, and the stream loses nothing.
//
// The gateway is detector-b, a node with QoS cgroups: gateway-a runs without them (its view of
// 4 CPUs, hack/facility.sh), and kubelet 1.36.4 cannot resize a pod in place there (it panics in
// doPodResizeAction, which expects a pod-level cgroup). (Up, beyond what the plan gave the pod,
// is not possible: the node has the host's 2 CPUs and the gateway pod holds both. Half a CPU
// moves between the containers instead.)
func TestAGatewayResizedInPlaceUsesItsNewCpuBudget(t *testing.T) {
	sp := pipeline(t, ns, "resize", 0, "")
	sp.Spec.Gateway.Node = detectorB
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	defer deleteAndCheckGone(t, sp)
	gw, n := flowing(t, sp, "the stream flows", 20)
	before := decompressMetrics(t, gw)
	t.Logf("1. streaming on %s: %.0f delivered; decompress: %s active threads, budget %s CPUs", gw.Name, n,
		before["numastream_adaptive_active_threads"], before["numastream_cpu_budget_cpus"])

	resize(t, gw, render.ReceiveContainer, "500m")
	resize(t, gw, render.DecompressContainer, "1500m")
	start := time.Now()
	var after map[string]string
	eventually(t, "the decompressing agent uses its new budget", 60*time.Second, func() (bool, string) {
		after = decompressMetrics(t, gw)
		return after["grow/cpu_budget"] == "1", fmt.Sprintf("%v", after)
	})
	took := time.Since(start)
	cur := &corev1.Pod{}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(gw), cur); err != nil {
		t.Fatal(err)
	}
	for _, cs := range cur.Status.ContainerStatuses {
		if cs.Resources != nil {
			t.Logf("   container %s: the kubelet reports cpu limit %s", cs.Name, cs.Resources.Limits.Cpu())
		}
	}
	t.Logf("2. resized in place (receive 1 -> 0.5 CPU, decompress 1 -> 1.5): %.1f s after the request the agent runs %s decompressing threads (was %s)",
		took.Seconds(), after["numastream_adaptive_active_threads"], before["numastream_adaptive_active_threads"])
	if a, _ := strconv.Atoi(after["numastream_adaptive_active_threads"]); a < 2 {
		t.Errorf("active decompressing threads %v after the budget grew", after["numastream_adaptive_active_threads"])
	}
	_, n = flowing(t, sp, "the stream keeps flowing", n+20)

	final := follow(t, gw, render.DecompressContainer)
	setSuspend(t, sp, true)
	s := await(t, "the resized gateway pod", final)
	ad, _ := s["adaptive"].(map[string]any)
	t.Logf("3. suspended: delivered %.0f, lost %.0f, duplicates %.0f, corrupt %.0f; budget %v", num(s, "chunks"), num(s, "lost"),
		num(s, "duplicates"), num(s, "corrupt"), ad["cpu_budget"])
	if num(s, "lost") != 0 || num(s, "duplicates") != 0 || num(s, "corrupt") != 0 || num(s, "chunks") < n {
		t.Errorf("gateway summary %v", s)
	}
	if b, _ := ad["cpu_budget"].(string); !strings.Contains(b, "quota 1.50 CPUs") {
		t.Errorf("the agent's last budget %q, want the 1.5 CPUs' quota", b)
	}
}

// resize asks the kubelet to give a container of a running pod `cpu` (requests = limits: the
// pod stays Guaranteed), through the pod's resize subresource.
func resize(t *testing.T, p *corev1.Pod, container, cpu string) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"containers":[{"name":%q,"resources":{"requests":{"cpu":%q},"limits":{"cpu":%q}}}]}}`,
		container, cpu, cpu)
	out, err := exec.Command(kubectl, "--kubeconfig", kubeconfig, "-n", p.Namespace, "patch", "pod", p.Name,
		"--subresource", "resize", "--type", "strategic", "-p", patch).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl patch --subresource resize %s/%s: %v\n%s", p.Name, container, err, out)
	}
}

// decompressMetrics reads the adaptive figures of a gateway pod's decompressing agent.
func decompressMetrics(t *testing.T, p *corev1.Pod) map[string]string {
	t.Helper()
	samples, err := agentSamples(t, p, render.DecompressMetricsPort)
	if err != nil {
		return map[string]string{"error": err.Error()}
	}
	out := map[string]string{}
	for _, s := range samples {
		v := strconv.FormatFloat(s.Value, 'f', -1, 64)
		switch s.Name {
		case "numastream_adaptive_active_threads", "numastream_cpu_budget_cpus", "numastream_cpu_budget_changes_total":
			out[s.Name] = v
		case "numastream_adaptive_changes_total":
			out[s.Labels["move"]+"/"+s.Labels["reason"]] = v
		}
	}
	return out
}
