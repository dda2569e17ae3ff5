// Package realnode tests numastream on a REAL kubelet (hack/real-node.sh, `make test-e2e-real`):
// the node daemon's device plugin registered with it, a receiving agent in a real pod with an
// exclusive CPU from the static CPU manager, and verified bytes from a sender on the host.
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

// nicResource is the NIC-locality resource the device plugin advertises on the node.
func nicResource(t *testing.T) (corev1.ResourceName, string) {
	n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for name, q := range n.Status.Allocatable {
		if strings.HasPrefix(string(name), "numastream.io/nic-") && !q.IsZero() {
			return name, strings.TrimPrefix(string(name), "numastream.io/nic-")
		}
	}
	t.Fatalf("node %s advertises no NIC-locality resource: %v", node, n.Status.Allocatable)
	return "", ""
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
	res, nic := nicResource(t)
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
	if !strings.Contains(out, "NUMASTREAM_NIC="+nic) || !strings.Contains(out, "NUMASTREAM_NIC_NUMA_NODE=") {
		t.Errorf("the container did not get the plugin's environment:\n%s", out)
	}
}

// A Guaranteed receiving container with the NIC resource gets an exclusive CPU from the static
// CPU manager; the agent pins every thread inside it and verifies every chunk a sender on the
// host streams to it; deleting the pod gives the CPU back.
func TestAgentPinsInsideItsExclusiveCPUsetAndVerifiesTheStream(t *testing.T) {
	agent := testenv.Agent(t)
	res, _ := nicResource(t)
	port := testenv.FreePort(t)
	rl := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("512Mi"),
		res: resource.MustParse("1")}
	pod := runPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "receive-real"},
		Spec: corev1.PodSpec{
			SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65532)},
			Containers: []corev1.Container{{
				Name: "receive", Image: "numastream/agent:real", ImagePullPolicy: corev1.PullNever,
				Args: []string{"receive", "--endpoint", "tcp://127.0.0.1:" + port, "--chunk-bytes", "1048576",
					"--idle-timeout", "60", "--threads", "decompress=1"},
				Resources: corev1.ResourceRequirements{Requests: rl, Limits: rl.DeepCopy()},
			}},
		},
	})
	testenv.Eventually(t, "the receiving pod runs", 60*time.Second, 250*time.Millisecond, func() (bool, string) {
		p, _ := phase(t, pod.Name)
		return p == corev1.PodRunning, string(p)
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
			Threads     []struct {
				Stage  string
				CPU    int
				Pinned bool
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
		if th.Stage != "io" && (!th.Pinned || fmt.Sprint(th.CPU) != exclusive) {
			t.Errorf("thread %+v is not pinned inside the exclusive cpuset %s", th, exclusive)
		}
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
