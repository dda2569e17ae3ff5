// Package e2e runs the operator binary against the simulated facility cluster of
// hack/sim-cluster.sh (real etcd, kube-apiserver, scheduler and controller-manager; kwok nodes).
// `make test-e2e` starts the cluster, runs this, and stops it.
package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/render"
	"github.com/numastream/numastream/internal/testenv"
)

var (
	k8s client.Client
	ctx = context.Background()
)

func TestMain(m *testing.M) {
	kubeconfig := os.Getenv("NUMASTREAM_SIM_KUBECONFIG")
	if kubeconfig == "" {
		fmt.Fprintln(os.Stderr, "skipping the end-to-end suite: NUMASTREAM_SIM_KUBECONFIG is not set (run `make test-e2e`)")
		if os.Getenv("NUMASTREAM_REQUIRE_E2E") != "" {
			os.Exit(1)
		}
		os.Exit(0)
	}
	var err error
	if k8s, _, err = testenv.ClusterClient(kubeconfig); err != nil {
		panic(err)
	}
	// The operator runs as a process, as it would in its pod; the samples' StorageRoot is under
	// /scratch, where pipelines get directories of their own.
	op := exec.Command(os.Getenv("NUMASTREAM_OPERATOR"), "--kubeconfig", kubeconfig,
		"--metrics-bind-address=0", "--health-probe-bind-address=0", "--agent-image=numastream/agent:e2e", "--observe-every=0s",
		"--storage-prefixes=/scratch")
	logf, _ := os.Create(filepath.Join(os.TempDir(), "numastream-e2e-operator.log"))
	op.Stdout, op.Stderr = logf, logf
	if err := op.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "cannot start the operator:", err)
		os.Exit(1)
	}
	code := m.Run()
	_ = op.Process.Signal(os.Interrupt)
	_ = op.Wait()
	os.Exit(code)
}

func eventually(t *testing.T, what string, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	testenv.Eventually(t, what, timeout, 250*time.Millisecond, cond)
}

func namespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-"}}
	if err := k8s.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	// The KCM's serviceaccount controller must create "default" before pods can be created.
	eventually(t, "default service account", 30*time.Second, func() (bool, string) {
		return k8s.Get(ctx, client.ObjectKey{Namespace: ns.Name, Name: "default"}, &corev1.ServiceAccount{}) == nil, ""
	})
	return ns.Name
}

func sample(t *testing.T, file, ns string) *v1beta1.StreamPipeline {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "config", "samples", file))
	if err != nil {
		t.Fatal(err)
	}
	sp := &v1beta1.StreamPipeline{}
	if err := yaml.UnmarshalStrict(data, sp); err != nil {
		t.Fatal(err)
	}
	sp.Namespace = ns
	return sp
}

func waitCondition(t *testing.T, sp *v1beta1.StreamPipeline, ctype string, status metav1.ConditionStatus, reason string) *v1beta1.StreamPipeline {
	t.Helper()
	return testenv.Condition(ctx, t, k8s, sp, ctype, status, reason, 60*time.Second, 250*time.Millisecond)
}

func pods(t *testing.T, ns, pipeline string) []corev1.Pod {
	t.Helper()
	var list corev1.PodList
	if err := k8s.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{render.LabelPipeline: pipeline}); err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// reportDataAddresses annotates every gateway pod of the pipeline, once kwok runs it, with a
// Multus network-status on the pipeline's attachment.
func reportDataAddresses(t *testing.T, ns string, sp *v1beta1.StreamPipeline) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	done := map[string]bool{}
	for len(done) < len(sp.Spec.Senders) {
		if time.Now().After(deadline) {
			t.Fatalf("gateway pods running: %d of %d", len(done), len(sp.Spec.Senders))
		}
		for _, p := range pods(t, ns, sp.Name) {
			if p.Labels[render.LabelRole] != render.RoleGateway || done[p.Name] ||
				(p.Status.Phase != corev1.PodRunning && p.Status.Phase != corev1.PodSucceeded) {
				continue
			}
			status := fmt.Sprintf(`[{"name":"%s/%s","interface":"net1","ips":["10.215.0.%d"]}]`,
				ns, sp.Spec.Gateway.Network.Attachment, 100+len(done))
			patch := client.MergeFrom(p.DeepCopy())
			if p.Annotations == nil {
				p.Annotations = map[string]string{}
			}
			p.Annotations["k8s.v1.cni.cncf.io/network-status"] = status
			if err := k8s.Patch(ctx, &p, patch); err != nil {
				t.Fatal(err)
			}
			done[p.Name] = true
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// The paper's 4-detector sample lands as planned on the simulated facility.
func TestPaperSampleRunsOnTheFacility(t *testing.T) {
	ns := namespace(t)
	sp := sample(t, "paper-4-detectors.yaml", ns)
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	// kwok runs no CNI: play Multus's part and report each gateway pod's data-network address,
	// which the senders wait for (the real Multus does this on the facility in a box).
	reportDataAddresses(t, ns, sp)
	// kwok runs the pods and, for Job pods, completes them: Ready is Running or Completed.
	cur := waitCondition(t, sp, v1beta1.ConditionReady, metav1.ConditionTrue, "")
	if cur.Status.Plan == nil || cur.Status.Plan.Connections != 4 || cur.Status.Bottleneck != "decompress" || cur.Status.PredictedGbps != "204.8" {
		t.Errorf("plan %+v %s %s", cur.Status.Plan, cur.Status.Bottleneck, cur.Status.PredictedGbps)
	}
	all := pods(t, ns, sp.Name)
	if len(all) != 8 {
		t.Fatalf("%d pods", len(all))
	}
	for _, p := range all {
		role := p.Labels[render.LabelRole]
		if p.Status.QOSClass != corev1.PodQOSGuaranteed {
			t.Errorf("%s is %s, not Guaranteed", p.Name, p.Status.QOSClass)
		}
		if p.Status.Phase != corev1.PodRunning && p.Status.Phase != corev1.PodSucceeded {
			t.Errorf("%s is %s", p.Name, p.Status.Phase)
		}
		if role == render.RoleGateway {
			if p.Spec.NodeName != "lynxdtn" {
				t.Errorf("gateway pod %s on %s", p.Name, p.Spec.NodeName)
			}
			if _, ok := p.Spec.Containers[0].Resources.Limits["numastream.io/nic-ens1f0"]; !ok || p.Spec.Containers[0].Name != render.ReceiveContainer {
				t.Errorf("%s: its receiving container does not request the NIC resource", p.Name)
			}
			if len(p.Spec.Containers) != 2 || p.Spec.Containers[1].Name != render.DecompressContainer {
				t.Errorf("%s: want a receiving and a decompressing container, got %d", p.Name, len(p.Spec.Containers))
			}
			if p.Annotations[render.MultusAnnotation] != "hsn-200g" {
				t.Errorf("%s lacks the Multus annotation", p.Name)
			}
		} else if !strings.HasPrefix(p.Spec.NodeName, "updraft") && !strings.HasPrefix(p.Spec.NodeName, "polaris") {
			t.Errorf("sender pod %s on %s", p.Name, p.Spec.NodeName)
		}
	}
	// Deleting the pipeline deletes everything it owns (the controller-manager's garbage collector).
	if err := k8s.Delete(ctx, cur); err != nil {
		t.Fatal(err)
	}
	eventually(t, "garbage collection", 60*time.Second, func() (bool, string) {
		var jobs batchv1.JobList
		var cms corev1.ConfigMapList
		var svcs corev1.ServiceList
		_ = k8s.List(ctx, &jobs, client.InNamespace(ns))
		_ = k8s.List(ctx, &cms, client.InNamespace(ns), client.MatchingLabels{render.LabelPipeline: sp.Name})
		_ = k8s.List(ctx, &svcs, client.InNamespace(ns))
		left := len(jobs.Items) + len(cms.Items) + len(svcs.Items) + len(pods(t, ns, sp.Name))
		return left == 0, fmt.Sprintf("%d objects left", left)
	})
}

// Four single-stream pipelines split gateway-2's NIC-local cores; a fifth is refused.
func TestFourPipelinesShareAGatewayAndTheFifthIsRefused(t *testing.T) {
	ns := namespace(t)
	mk := func(i int) *v1beta1.StreamPipeline {
		sp := sample(t, "single-stream.yaml", ns)
		sp.Name = fmt.Sprintf("beam-%d", i)
		sp.Spec.Gateway.Node = "gateway-2"
		sp.Spec.Sink = nil
		sp.Spec.Senders[0].Node = fmt.Sprintf("detector-%d", i%4+1)
		sp.Spec.Connections = ptr.To[int32](4)
		// 4 x 3 decompressing cores fit the 14 left off the NIC's node (2 of 32 are reserved).
		sp.Spec.Threads = &v1beta1.StageThreads{Compress: ptr.To[int32](3), Decompress: ptr.To[int32](3)}
		return sp
	}
	for i := 0; i < 4; i++ {
		sp := mk(i)
		if err := k8s.Create(ctx, sp); err != nil {
			t.Fatal(err)
		}
		waitCondition(t, sp, v1beta1.ConditionPlanned, metav1.ConditionTrue, "Planned")
		time.Sleep(1100 * time.Millisecond)
	}
	for i := 0; i < 4; i++ {
		waitCondition(t, mk(i), v1beta1.ConditionReady, metav1.ConditionTrue, "")
	}
	fifth := mk(4)
	if err := k8s.Create(ctx, fifth); err != nil {
		t.Fatal(err)
	}
	cur := waitCondition(t, fifth, v1beta1.ConditionPlanned, metav1.ConditionFalse, "NoCapacity")
	msg := meta.FindStatusCondition(cur.Status.Conditions, v1beta1.ConditionPlanned).Message
	if !strings.Contains(msg, "gateway-2") || !strings.Contains(msg, "NUMA node 1") {
		t.Errorf("reason %q", msg)
	}
	if n := len(pods(t, ns, fifth.Name)); n != 0 {
		t.Errorf("the refused pipeline has %d pods", n)
	}
}

// The first pipeline a user applies runs on nodes configured as the static CPU manager requires:
// 2 of detector-1's and gateway-1's 32 CPUs are reserved for the system (allocatable 30), and
// the sample's pods are sized from what the kubelet can give, so the scheduler places them.
func TestSampleSchedulesOnNodesWithReservedCPUs(t *testing.T) {
	ns := namespace(t)
	sp := sample(t, "single-stream.yaml", ns)
	node := &corev1.Node{}
	if err := k8s.Get(ctx, client.ObjectKey{Name: "detector-1"}, node); err != nil {
		t.Fatal(err)
	}
	alloc, capacity := node.Status.Allocatable[corev1.ResourceCPU], node.Status.Capacity[corev1.ResourceCPU]
	if alloc.Cmp(capacity) >= 0 {
		t.Fatalf("detector-1: allocatable %s, capacity %s: the test needs reserved CPUs", alloc.String(), capacity.String())
	}
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	cur := waitCondition(t, sp, v1beta1.ConditionReady, metav1.ConditionTrue, "")
	for _, p := range pods(t, ns, sp.Name) {
		var cpus int64
		for _, c := range p.Spec.Containers {
			cpus += c.Resources.Requests.Cpu().Value()
		}
		t.Logf("%s on %s: %d CPUs requested, %s", p.Name, p.Spec.NodeName, cpus, p.Status.Phase)
		if cpus > 30 {
			t.Errorf("%s asks for %d CPUs of the 30 allocatable", p.Name, cpus)
		}
	}
	t.Logf("Ready %s; predicted %s Gbit/s, bottleneck %s", meta.FindStatusCondition(cur.Status.Conditions, v1beta1.ConditionReady).Reason,
		cur.Status.PredictedGbps, cur.Status.Bottleneck)
}

// Deleting the gateway node: the pipeline says so instead of waiting silently.
func TestGatewayNodeDeletedIsReported(t *testing.T) {
	ns := namespace(t)
	sp := sample(t, "single-stream.yaml", ns)
	sp.Name = "orphan"
	sp.Spec.Gateway.Node = "gateway-3"
	sp.Spec.Senders[0].Node = "detector-4"
	sp.Spec.Threads = &v1beta1.StageThreads{Compress: ptr.To[int32](2)}
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, sp, v1beta1.ConditionPlanned, metav1.ConditionTrue, "Planned")
	if err := k8s.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gateway-3"}}); err != nil {
		t.Fatal(err)
	}
	cur := waitCondition(t, sp, v1beta1.ConditionPlanned, metav1.ConditionFalse, "NodeNotFound")
	if msg := meta.FindStatusCondition(cur.Status.Conditions, v1beta1.ConditionPlanned).Message; !strings.Contains(msg, "gateway-3") {
		t.Errorf("message %q", msg)
	}
}
