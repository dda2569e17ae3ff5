// Package realnode tests numastream on a REAL kubelet (hack/real-node.sh, `make test-e2e-real`):
// the node daemon's device plugin registered with it, a receiving agent in a real pod with an
// exclusive CPU from the static CPU manager, and verified bytes from a sender on the host.
//
// The kubelet sees two NUMA nodes (hack/real-node.sh numa_view: CPU 0 on node 0, CPU 1 on node 1,
// the data NICs nsreal0 on node 1 and nsreal1 on node 0): the machine's own CPUs, so the cpusets
// are real; its memory is one real node, split in the view, so memory binding is not checked.
//
// What this machine cannot show: a whole StreamPipeline on real pods. The static CPU manager
// keeps at least one CPU for the system, so a 2-CPU host offers one exclusive CPU, and the
// smallest pipeline needs four (a sender pod with one compressing and one sending core, a gateway
// pod with a receiving and a decompressing container). The pod here is the gateway's receiving
// container on its own.
package realnode

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/numastream/numastream/internal/testenv"
)

var (
	cs      *kubernetes.Clientset
	ctx     = context.Background()
	node    = os.Getenv("NUMASTREAM_REAL_NODE")
	nodeDir = os.Getenv("NUMASTREAM_REAL_NODE_DIR")
)

func TestMain(m *testing.M) {
	kubeconfig := os.Getenv("NUMASTREAM_SIM_KUBECONFIG")
	if kubeconfig == "" || node == "" {
		fmt.Fprintln(os.Stderr, "skipping the real-node tests: no real node (run `make test-e2e-real` as root)")
		os.Exit(0)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		panic(err)
	}
	if cs, err = kubernetes.NewForConfig(cfg); err != nil {
		panic(err)
	}
	os.Exit(m.Run())
}

// The data NICs of the node's sysfs view (hack/real-node.sh numa_view): nsreal0 on NUMA node 1,
// nsreal1 on node 0. The kubelet's view puts CPU 0 (reserved for the system) on node 0 and CPU 1
// on node 1.
const (
	nicNode1 = "nsreal0"
	nicNode0 = "nsreal1"
)

// nicResource is the NIC-locality resource the device plugin advertises for `nic` on the node.
func nicResource(t *testing.T, nic string) corev1.ResourceName {
	n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	name := corev1.ResourceName("numastream.io/nic-" + nic)
	if q, ok := n.Status.Allocatable[name]; !ok || q.IsZero() {
		t.Fatalf("node %s advertises no %s: %v", node, name, n.Status.Allocatable)
	}
	return name
}

// sysView mounts the node's sysfs view (the kubelet's) into a pod at /host-sys, for the agent's
// --sysfs-root: the agent then places and reports its threads on the NUMA nodes the kubelet
// placed its container by.
func sysView(pod *corev1.Pod) {
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "sysview", VolumeSource: corev1.VolumeSource{
		HostPath: &corev1.HostPathVolumeSource{Path: filepath.Join(nodeDir, "sysroot")}}})
	for i := range pod.Spec.Containers {
		pod.Spec.Containers[i].VolumeMounts = append(pod.Spec.Containers[i].VolumeMounts,
			corev1.VolumeMount{Name: "sysview", MountPath: "/host-sys", ReadOnly: true})
	}
}

func runPod(t *testing.T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	pod.Namespace = "default"
	pod.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
	pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	pod.Spec.HostNetwork = true
	_ = cs.CoreV1().Pods("default").Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	testenv.Eventually(t, "old pod gone", 30*time.Second, 250*time.Millisecond, func() (bool, string) {
		_, err := cs.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
		return err != nil, "still there"
	})
	created, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.CoreV1().Pods("default").Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	})
	return created
}

func phase(t *testing.T, name string) (corev1.PodPhase, *corev1.Pod) {
	p, err := cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p.Status.Phase, p
}

func logs(t *testing.T, name string) string {
	b, err := cs.CoreV1().Pods("default").GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("kubectl logs %s: %v", name, err)
	}
	return string(b)
}

// cpuManagerState is the kubelet's record of exclusive CPUs: pod UID -> container -> cpuset.
func cpuManagerState(t *testing.T) (string, map[string]map[string]string) {
	var st struct {
		DefaultCPUSet string                       `json:"defaultCpuSet"`
		Entries       map[string]map[string]string `json:"entries"`
	}
	b, err := os.ReadFile(filepath.Join(nodeDir, "kubelet-root", "cpu_manager_state"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	return st.DefaultCPUSet, st.Entries
}

// The device plugin, registered with the real kubelet, is what a container that requests the
// NIC resource gets its environment from.
func TestDevicePluginAllocatesTheNICToARealContainer(t *testing.T) {
	nic := nicNode1
	res := nicResource(t, nic)
	one := resource.MustParse("1")
	runPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "nic-env"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "env", Image: "local.numastream/busybox:1", ImagePullPolicy: corev1.PullNever,
			Command:   []string{"/bin/sh", "-c", "env | grep ^NUMASTREAM_ | sort"},
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{res: one}, Limits: corev1.ResourceList{res: one}},
		}}},
	})
	testenv.Eventually(t, "the pod ran", 60*time.Second, 250*time.Millisecond, func() (bool, string) {
		p, _ := phase(t, "nic-env")
		return p == corev1.PodSucceeded || p == corev1.PodFailed, string(p)
	})
	out := logs(t, "nic-env")
	t.Logf("container environment from the device plugin:\n%s", out)
	if !strings.Contains(out, "NUMASTREAM_NIC="+nic) || !strings.Contains(out, "NUMASTREAM_NIC_NUMA_NODE=1") {
		t.Errorf("the container did not get the plugin's environment:\n%s", out)
	}
}

// A Guaranteed receiving container with the NIC resource gets an exclusive CPU from the static
// CPU manager, on the NIC's NUMA node as Topology Manager aligns it (CPU 1: node 1, nsreal0's);
// the agent, reading the same two-node view, pins every thread inside it, reports them on node 1
// and NIC-local, and verifies every chunk a sender on the host streams to it; deleting the pod
// gives the CPU back.
func TestAgentPinsInsideItsExclusiveCPUsetAndVerifiesTheStream(t *testing.T) {
	agent := testenv.Agent(t)
	res := nicResource(t, nicNode1)
	port := testenv.FreePort(t)
	rl := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("512Mi"),
		res: resource.MustParse("1")}
	spec := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "receive-real"},
		Spec: corev1.PodSpec{
			SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65532)},
			Containers: []corev1.Container{{
				Name: "receive", Image: "numastream/agent:real", ImagePullPolicy: corev1.PullNever,
				Args: []string{"receive", "--endpoint", "tcp://127.0.0.1:" + port, "--chunk-bytes", "1048576",
					"--idle-timeout", "60", "--threads", "decompress=1", "--sysfs-root", "/host-sys", "--nic", nicNode1},
				Resources: corev1.ResourceRequirements{Requests: rl, Limits: rl.DeepCopy()},
			}},
		},
	}
	sysView(spec)
	pod := runPod(t, spec)
	testenv.Eventually(t, "the receiving pod runs", 60*time.Second, 250*time.Millisecond, func() (bool, string) {
		p, got := phase(t, pod.Name)
		return p == corev1.PodRunning, string(p) + " " + got.Status.Reason + " " + got.Status.Message
	})
	_, running := phase(t, pod.Name)
	if running.Status.QOSClass != corev1.PodQOSGuaranteed {
		t.Fatalf("QoS %s", running.Status.QOSClass)
	}
	shared, entries := cpuManagerState(t)
	exclusive := entries[string(pod.UID)]["receive"]
	if exclusive == "" || strings.Contains(shared, exclusive) {
		t.Fatalf("no exclusive CPU for the container: shared %q, entries %v", shared, entries)
	}
	if exclusive != "1" {
		t.Errorf("the kubelet gave CPU %q, not CPU 1 on the NIC's NUMA node 1", exclusive)
	}
	allowed := cpusAllowed(t, "tcp://127.0.0.1:"+port)
	t.Logf("exclusive cpuset %s (shared pool %s); the agent process has Cpus_allowed_list %s", exclusive, shared, allowed)
	if allowed != exclusive {
		t.Errorf("the agent runs on %q, the CPU manager gave %q", allowed, exclusive)
	}

	out, err := exec.Command(agent, "send", "--endpoint", "tcp://127.0.0.1:"+port, "--chunk-bytes", "1048576",
		"--chunks", "300").CombinedOutput()
	if err != nil {
		t.Fatalf("sender: %v\n%s", err, out)
	}
	testenv.Eventually(t, "the receiver finished", 60*time.Second, 250*time.Millisecond, func() (bool, string) {
		p, _ := phase(t, pod.Name)
		return p == corev1.PodSucceeded || p == corev1.PodFailed, string(p)
	})
	if p, _ := phase(t, pod.Name); p != corev1.PodSucceeded {
		t.Fatalf("receiver pod %s:\n%s", p, logs(t, pod.Name))
	}
	var summary struct {
		Chunks, Lost, Corrupt int
		Complete              bool
		Placement             struct {
			AllowedCPUs string `json:"allowed_cpus"`
			NICLocal    *bool  `json:"nic_local"`
			Threads     []struct {
				Stage    string
				CPU      int
				NUMANode int `json:"numa_node"`
				Pinned   bool
			}
		}
	}
	lines := strings.Split(strings.TrimSpace(logs(t, pod.Name)), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &summary); err != nil {
		t.Fatalf("summary: %v\n%s", err, lines[len(lines)-1])
	}
	t.Logf("receiver (kubectl logs): %d chunks verified, lost %d, corrupt %d; placement %+v",
		summary.Chunks, summary.Lost, summary.Corrupt, summary.Placement)
	if summary.Chunks != 300 || summary.Lost != 0 || summary.Corrupt != 0 || !summary.Complete {
		t.Errorf("summary %+v", summary)
	}
	if summary.Placement.AllowedCPUs != exclusive {
		t.Errorf("the agent saw allowed CPUs %q, the container's cpuset is %q", summary.Placement.AllowedCPUs, exclusive)
	}
	for _, th := range summary.Placement.Threads {
		if th.Stage != "io" && (!th.Pinned || fmt.Sprint(th.CPU) != exclusive || th.NUMANode != 1) {
			t.Errorf("thread %+v is not pinned inside the exclusive cpuset %s on NUMA node 1", th, exclusive)
		}
	}
	if summary.Placement.NICLocal == nil || !*summary.Placement.NICLocal {
		t.Errorf("the agent does not report its receiving threads NIC-local: %+v", summary.Placement)
	}

	if err := cs.CoreV1().Pods("default").Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the CPU back in the shared pool", 60*time.Second, 500*time.Millisecond, func() (bool, string) {
		shared, entries := cpuManagerState(t)
		_, held := entries[string(pod.UID)]
		return !held && strings.Contains(shared, exclusive), fmt.Sprintf("shared %s, entries %v", shared, entries)
	})
}

// cpusAllowed is Cpus_allowed_list of the process whose command line names `endpoint`.
func cpusAllowed(t *testing.T, endpoint string) string {
	var found string
	testenv.Eventually(t, "the agent process", 20*time.Second, 200*time.Millisecond, func() (bool, string) {
		dirs, _ := filepath.Glob("/proc/[0-9]*")
		for _, d := range dirs {
			cmd, err := os.ReadFile(filepath.Join(d, "cmdline"))
			if err != nil || !strings.Contains(string(cmd), endpoint) || !strings.Contains(string(cmd), "receive") {
				continue
			}
			f, err := os.Open(filepath.Join(d, "status"))
			if err != nil {
				continue
			}
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				if v, ok := strings.CutPrefix(sc.Text(), "Cpus_allowed_list:"); ok {
					found = strings.TrimSpace(v)
				}
			}
			f.Close()
			return found != "", found
		}
		return false, "not found"
	})
	return found
}

// A container asking for an exclusive CPU and the NIC on NUMA node 0 (nsreal1), where the only
// CPU (0) is the system's: the real kubelet's Topology Manager (restricted, and again with
// single-numa-node: make test-e2e-realnode restarts the kubelet with it) refuses it, and says so
// in the pod's status -- what the operator reads to re-plan (controllers: TopologyAffinityError).
func TestTheKubeletRefusesAContainerWhoseNICIsOnANodeWithoutAFreeCPU(t *testing.T) {
	res := nicResource(t, nicNode0)
	rl := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("64Mi"),
		res: resource.MustParse("1")}
	pod := runPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "receive-misaligned"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "receive", Image: "local.numastream/busybox:1", ImagePullPolicy: corev1.PullNever,
			Command:   []string{"/bin/sh", "-c", "sleep 30"},
			Resources: corev1.ResourceRequirements{Requests: rl, Limits: rl.DeepCopy()},
		}}},
	})
	var got *corev1.Pod
	testenv.Eventually(t, "the kubelet's verdict", 60*time.Second, 250*time.Millisecond, func() (bool, string) {
		var p corev1.PodPhase
		p, got = phase(t, pod.Name)
		return p == corev1.PodFailed || p == corev1.PodRunning, string(p)
	})
	t.Logf("topologyManagerPolicy %s: pod %s: phase %s, reason %q, message %q", topologyPolicy(), pod.Name, got.Status.Phase,
		got.Status.Reason, got.Status.Message)
	if got.Status.Phase != corev1.PodFailed || got.Status.Reason != "TopologyAffinityError" {
		t.Errorf("want the kubelet to refuse it with TopologyAffinityError, got %s %q: %s", got.Status.Phase,
			got.Status.Reason, got.Status.Message)
	}
	if _, entries := cpuManagerState(t); entries[string(pod.UID)] != nil {
		t.Errorf("a refused container holds CPUs: %v", entries[string(pod.UID)])
	}
}

// topologyPolicy is the Topology Manager policy the node's kubelet runs with (hack/real-node.sh
// topology-policy), as make test-e2e-realnode says.
func topologyPolicy() string {
	if p := os.Getenv("NUMASTREAM_TOPOLOGY_POLICY"); p != "" {
		return p
	}
	return "restricted"
}
