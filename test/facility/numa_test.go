package facility

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/conditions"
	"github.com/numastream/numastream/internal/render"
)

// gw-numa (hack/facility.sh): its kubelet, node daemon and containers see two NUMA nodes
// (CPU 0 on node 0, CPU 1 on node 1), fab0 on node 1 and fab1 on node 0; the static CPU manager
// reserves CPU 0 and Topology Manager (restricted, container scope) aligns CPUs with the NIC.
const numaGateway = "gw-numa"

// numaPipeline is an endless stream from detector-a to gw-numa's `nic`.
func numaPipeline(t *testing.T, name, nic string) *v1beta1.StreamPipeline {
	t.Helper()
	return pipelineTo(t, ns, name, 0, "", numaGateway, nic)
}

// agentThreads is, for every agent process of pod `pod` (a container's HOSTNAME is its pod's
// name), each stage's CPUs as the kernel allows its threads (Cpus_allowed_list of
// /proc/<pid>/task/<tid>/status; a thread is named "<stage>-<index>" by the agent), keyed
// "<agent>/<stage>" with the agent's metrics role: "relay" for a gateway's relay configuration,
// "receive" for its decompressing one, "send" for a sender.
func agentThreads(t *testing.T, pod string) map[string]map[int]bool {
	t.Helper()
	out := map[string]map[int]bool{}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		cmd, err := os.ReadFile(filepath.Join(p, "cmdline"))
		if err != nil || !strings.Contains(string(cmd), "numastream-agent") {
			continue
		}
		env, err := os.ReadFile(filepath.Join(p, "environ"))
		if err != nil || !strings.Contains("\x00"+string(env)+"\x00", "\x00HOSTNAME="+pod+"\x00") {
			continue
		}
		agent := "send"
		switch args := string(cmd); {
		case strings.Contains(args, "-relay.json"):
			agent = "relay"
		case strings.Contains(args, "receive"):
			agent = "receive"
		}
		tasks, _ := filepath.Glob(filepath.Join(p, "task", "[0-9]*"))
		for _, task := range tasks {
			comm, err := os.ReadFile(filepath.Join(task, "comm"))
			if err != nil {
				continue
			}
			name := strings.TrimSpace(string(comm))
			dash := strings.LastIndex(name, "-")
			if dash < 0 {
				continue
			}
			if _, err := strconv.Atoi(name[dash+1:]); err != nil || name[:dash] == "io" {
				continue
			}
			key := agent + "/" + name[:dash]
			if out[key] == nil {
				out[key] = map[int]bool{}
			}
			for c := range parseCPUList(t, allowedCPUs(t, task)) {
				out[key][c] = true
			}
		}
	}
	return out
}

// allowedCPUs is Cpus_allowed_list of a task's status.
func allowedCPUs(t *testing.T, task string) string {
	f, err := os.Open(filepath.Join(task, "status"))
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Cpus_allowed_list:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func parseCPUList(t *testing.T, s string) map[int]bool {
	t.Helper()
	out := map[int]bool{}
	for _, part := range strings.Split(s, ",") {
		if part == "" {
			continue
		}
		lo, hi, found := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			t.Fatalf("cpulist %q", s)
		}
		b := a
		if found {
			if b, err = strconv.Atoi(hi); err != nil {
				t.Fatalf("cpulist %q", s)
			}
		}
		for c := a; c <= b; c++ {
			out[c] = true
		}
	}
	return out
}

func cpuSetString(m map[int]bool) string {
	var ids []int
	for c := range m {
		ids = append(ids, c)
	}
	sort.Ints(ids)
	return fmt.Sprint(ids)
}

// cpuManagerState is the kubelet's own record of the exclusive CPUs it gave containers
// (cpu_manager_state in its root directory): the default (shared) set and, per pod UID and
// container, the exclusive cpuset.
func cpuManagerState(t *testing.T, node string) (string, map[string]map[string]string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(facilityDir(), node, "var-lib-kubelet", "cpu_manager_state"))
	if err != nil {
		t.Fatalf("the kubelet's CPU manager state: %v", err)
	}
	var st struct {
		PolicyName    string                       `json:"policyName"`
		DefaultCPUSet string                       `json:"defaultCpuSet"`
		Entries       map[string]map[string]string `json:"entries"`
	}
	if err := json.Unmarshal(b, &st); err != nil || st.PolicyName != "static" {
		t.Fatalf("cpu_manager_state %s: %v", b, err)
	}
	return st.DefaultCPUSet, st.Entries
}

func facilityDir() string {
	if d := os.Getenv("FACILITY_DIR"); d != "" {
		return d
	}
	return "/tmp/numastream-facility"
}

// A whole pipeline onto a gateway whose real kubelet sees two NUMA nodes: the node daemon
// publishes both nodes and the NICs' (fab0 on 1) from the view; the operator plans the receiving
// container onto the NIC's node with a whole CPU and decompression in the shared pool (the static
// CPU manager keeps CPU 0 for itself: 1.9 allocatable); the kubelet's CPU manager gives the
// receiving container CPU 1 exclusively (its own state file says so) and Topology Manager admits
// it; the stream flows verified; and status.observed.placement -- the agents' own report, next to
// the plan -- is what the kernel allows the agents' threads (/proc/<pid>/task/*/status), agent by
// agent and stage by stage, on the gateway and the sender, every stage on its planned node.
func TestAGatewayOnTwoNUMANodesReceivesOnTheNICsCPUAndStatusShowsWhere(t *testing.T) {
	node := &corev1.Node{}
	if err := k8s.Get(ctx, client.ObjectKey{Name: numaGateway}, node); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{"numastream.io/numa-nodes": "2", "numastream.io/numa0-cpus": "1", "numastream.io/numa1-cpus": "1",
		"numastream.io/nic.fab0.numa-node": "1", "numastream.io/nic.fab1.numa-node": "0"} {
		if got := node.Labels[k]; got != want {
			t.Errorf("%s label %s=%q, want %q (the node daemon reads the two-NUMA view)", numaGateway, k, got, want)
		}
	}
	alloc := node.Status.Allocatable[corev1.ResourceCPU]
	t.Logf("%s: allocatable cpu %s, nic-fab0 %s, nic-fab1 %s", numaGateway, alloc.String(),
		ptrQ(node.Status.Allocatable, "numastream.io/nic-fab0"), ptrQ(node.Status.Allocatable, "numastream.io/nic-fab1"))
	if alloc.MilliValue() != 1900 {
		t.Errorf("allocatable cpu %s, want 1900m (kubeReserved 100m)", alloc.String())
	}

	sp := numaPipeline(t, "numa", "fab0")
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	defer deleteAndCheckGone(t, sp)
	gw, _ := flowing(t, sp, "the stream flows through the two-NUMA gateway", 20)
	cur := get(t, sp)
	plan := cur.Status.Plan
	var gwPlan *v1beta1.NodePlan
	for i := range plan.Nodes {
		if plan.Nodes[i].Role == "gateway" {
			gwPlan = &plan.Nodes[i]
		}
	}
	if plan.NICNUMANode != 1 || gwPlan == nil || gwPlan.CPUs != 1 || gwPlan.SharedMilliCPU < 250 {
		t.Fatalf("plan: NIC node %d, gateway %+v: want the NIC on node 1, 1 whole CPU and a share of the pool", plan.NICNUMANode, gwPlan)
	}
	t.Logf("plan: gateway %d CPU + %dm shared; %s", gwPlan.CPUs, gwPlan.SharedMilliCPU, cur.Status.PredictedGbps)

	// The kubelet's CPU manager: CPU 1 (node 1, the NIC's) is the receiving container's alone.
	shared, entries := cpuManagerState(t, numaGateway)
	if got := entries[string(gw.UID)][render.ReceiveContainer]; got != "1" {
		t.Errorf("the kubelet gave the receiving container %q, want CPU 1 (entries %v)", got, entries)
	}
	if _, ok := entries[string(gw.UID)][render.DecompressContainer]; ok || shared != "0" {
		t.Errorf("decompressing container exclusive %v, shared pool %q: want it in the pool, CPU 0", entries[string(gw.UID)], shared)
	}
	t.Logf("kubelet cpu_manager_state: receive %q exclusive, shared pool %q", entries[string(gw.UID)][render.ReceiveContainer], shared)

	var rows []v1beta1.StagePlacement
	eventually(t, "status.observed.placement of the sender and the gateway", 90*time.Second, func() (bool, string) {
		o := get(t, sp).Status.Observed
		if o == nil {
			return false, "no observed status"
		}
		agents := map[string]bool{}
		for _, r := range o.Placement {
			agents[r.Role+"/"+r.Agent] = true
		}
		rows = o.Placement
		return agents["sender/send"] && agents["gateway/relay"] && agents["gateway/receive"], fmt.Sprintf("placement %+v", o.Placement)
	})
	for _, r := range rows {
		t.Logf("stream %d %-7s %-7s %-10s %d threads on CPUs %-4s NUMA %s (planned %s, on plan %v)",
			r.Stream, r.Role, r.Agent, r.Stage, r.Threads, r.CPUs, r.NUMANodes, r.Planned, r.OnPlan)
		if !r.OnPlan {
			t.Errorf("%s %s %s runs on NUMA %s, planned %s", r.Role, r.Agent, r.Stage, r.NUMANodes, r.Planned)
		}
		if r.Role == "gateway" && r.Agent == "relay" && r.Stage == "receive" && (r.CPUs != "1" || r.NUMANodes != "1") {
			t.Errorf("receiving threads on CPUs %s NUMA %s, want CPU 1 on node 1 (the NIC's)", r.CPUs, r.NUMANodes)
		}
	}
	if o := get(t, sp).Status.Observed; o == nil || o.NICLocalStreams != "1/1" {
		t.Errorf("NIC-local streams %+v, want 1/1", o)
	}
	// What a person sees: the NIC-Local column, and the placement table in kubectl describe.
	out, err := exec.Command(kubectl, "--kubeconfig", kubeconfig, "-n", ns, "get", "streampipeline", sp.Name).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "NIC-LOCAL") || !strings.Contains(string(out), "1/1") {
		t.Errorf("kubectl get: %v\n%s", err, out)
	}
	t.Logf("kubectl get:\n%s", out)
	out, err = exec.Command(kubectl, "--kubeconfig", kubeconfig, "-n", ns, "describe", "streampipeline", sp.Name).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Placement:") || !strings.Contains(string(out), "Numa Nodes:") ||
		!strings.Contains(string(out), "On Plan:") {
		t.Errorf("kubectl describe shows no placement: %v\n%s", err, out)
	}
	for _, role := range []string{render.RoleGateway, render.RoleSender} {
		pod := running(t, sp, role)
		if pod == nil {
			t.Fatalf("no running %s pod", role)
		}
		kernel := agentThreads(t, pod.Name)
		status := map[string]map[int]bool{}
		for _, r := range rows {
			if r.Role != role {
				continue
			}
			key := r.Agent + "/" + r.Stage
			if status[key] == nil {
				status[key] = map[int]bool{}
			}
			for c := range parseCPUList(t, r.CPUs) {
				status[key][c] = true
			}
		}
		if len(status) == 0 || len(kernel) == 0 {
			t.Errorf("%s %s: status %v, threads found in /proc %v", role, pod.Name, status, kernel)
			continue
		}
		for key, cpus := range status {
			if got := cpuSetString(kernel[key]); got != cpuSetString(cpus) {
				t.Errorf("%s %s %s: status says CPUs %s, the kernel allows its threads %s", role, pod.Name, key, cpuSetString(cpus), got)
			} else {
				t.Logf("%s %s %s: status CPUs %s = the threads' Cpus_allowed_list", role, pod.Name, key, got)
			}
		}
		for key := range kernel {
			if status[key] == nil {
				t.Errorf("%s %s: threads of %s run (CPUs %s) but status has no row for them", role, pod.Name, key, cpuSetString(kernel[key]))
			}
		}
	}
}

func ptrQ(l corev1.ResourceList, name string) string {
	q, ok := l[corev1.ResourceName(name)]
	if !ok {
		return "none"
	}
	return q.String()
}

// A gateway whose NIC is on the NUMA node the static CPU manager keeps for itself (fab1, node 0:
// CPU 0 is reserved): the plan asks a receiving CPU next to fab1, the real kubelet's Topology
// Manager cannot align one and refuses the pod (TopologyAffinityError, as the kubelet writes it),
// and the operator's re-plan follows: with one receiving core per stream already the least, the
// pipeline is not planned, Stalled, saying why -- no pod left failing, nothing started elsewhere.
func TestTheRealKubeletsTopologyAffinityErrorIsReplanned(t *testing.T) {
	sp := numaPipeline(t, "numa-tae", "fab1")
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	defer deleteAndCheckGone(t, sp)
	var refused corev1.Pod
	eventually(t, "the kubelet refuses the gateway pod", 120*time.Second, func() (bool, string) {
		for _, p := range pods(t, sp, render.RoleGateway) {
			if p.Status.Phase == corev1.PodFailed && p.Status.Reason == "TopologyAffinityError" {
				refused = p
				return true, ""
			}
		}
		return false, fmt.Sprintf("gateway pods %d", len(pods(t, sp, render.RoleGateway)))
	})
	t.Logf("kubelet: pod %s %s: %s", refused.Name, refused.Status.Reason, refused.Status.Message)
	var cur *v1beta1.StreamPipeline
	eventually(t, "the re-plan: not planned, with the Topology Manager's reason", 120*time.Second, func() (bool, string) {
		cur = get(t, sp)
		c := meta.FindStatusCondition(cur.Status.Conditions, v1beta1.ConditionPlanned)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == "TopologyAffinityError", fmt.Sprintf("Planned %+v", c)
	})
	stalled := meta.FindStatusCondition(cur.Status.Conditions, conditions.Stalled)
	if stalled == nil || stalled.Status != metav1.ConditionTrue || !strings.Contains(stalled.Message, "even with 1 receiving core") ||
		!strings.Contains(stalled.Message, refused.Name) {
		t.Errorf("Stalled: %+v", stalled)
	} else {
		t.Logf("Stalled: %s", stalled.Message)
	}
	var evs corev1.EventList
	if err := k8s.List(ctx, &evs, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	replan := false
	for _, e := range evs.Items {
		if e.InvolvedObject.Name == sp.Name && e.Reason == "TopologyAffinityError" && strings.Contains(e.Message, refused.Name) &&
			strings.Contains(e.Message, "no plan can align one with the NIC") {
			replan = true
			t.Logf("event: %s", e.Message)
		}
	}
	if !replan {
		t.Errorf("no TopologyAffinityError event naming the re-plan on %s", refused.Name)
	}
	eventually(t, "no gateway pod left", 60*time.Second, func() (bool, string) {
		n := 0
		for _, p := range pods(t, sp, render.RoleGateway) {
			if p.DeletionTimestamp == nil {
				n++
			}
		}
		return n == 0, fmt.Sprintf("%d gateway pods", n)
	})
}
