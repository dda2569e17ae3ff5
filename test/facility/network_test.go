package facility

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/numastream/numastream/internal/render"
)

// Who reaches a gateway, with the pipeline's NetworkPolicy enforced by a real implementation
// (kube-network-policies, hack/facility.sh) on the pod network and Multus' namespace isolation on
// the data network:
//   - a pod of another namespace reaches neither the gateway's data port nor its metrics ports,
//     from the gateway's own node (bridged) or the other node (routed), and cannot join the data
//     network at all;
//   - the operator's namespace reaches the metrics ports, not the data port;
//   - the address block the chart admits (the host, where an outside Prometheus would scrape
//     from) reaches the metrics ports, not the data port;
//   - a pod the policy names as the pipeline's sender reaches the data port: the gateway listens
//     there, so the other refusals are the policy's, not a closed port.
func TestAnotherNamespaceCannotReachAGateway(t *testing.T) {
	const outsider = "tenant-b"
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: outsider}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// Paced and long (about 12 minutes at 1 Gbit/s, verified and counted, no file): the gateway
	// runs for the whole test, and is deleted with the pipeline at its end.
	sp := start(t, paced(pipeline(t, ns, "netpol", 8000, "")))
	gw, _ := flowing(t, sp, "the stream flowing", 2)

	var np networkingv1.NetworkPolicy
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: sp.Name + "-gateway"}, &np); err != nil {
		t.Fatalf("the pipeline's NetworkPolicy: %v", err)
	}
	if len(np.Spec.Ingress) == 0 || len(np.Spec.Ingress[0].Ports) == 0 {
		t.Fatalf("NetworkPolicy without data ports: %+v", np.Spec)
	}
	ip := gw.Status.PodIP
	data := net.JoinHostPort(ip, np.Spec.Ingress[0].Ports[0].Port.String())
	metrics := net.JoinHostPort(ip, strconv.Itoa(render.MetricsPort))
	dxMetrics := net.JoinHostPort(ip, strconv.Itoa(render.DecompressMetricsPort))
	targets := []string{data, metrics, dxMetrics}

	want := func(from string, got map[string]string, expect ...string) {
		t.Helper()
		for i, target := range targets {
			if got[target] != expect[i] {
				t.Errorf("from %s to %s: %s, want %s", from, target, got[target], expect[i])
			}
		}
		t.Logf("from %s: data %s, metrics %s and %s", from, got[data], got[metrics], got[dxMetrics])
	}
	// The probe pods run side by side; each tries its targets at once.
	sender := map[string]string{render.LabelPipeline: sp.Name, render.LabelRole: render.RoleSender}
	bridged := startProbe(t, outsider, gateway, nil, targets)
	routed := startProbe(t, outsider, detector, nil, targets)
	operator := startProbe(t, "numastream-system", detector, nil, targets)
	named := startProbe(t, ns, detector, sender, targets)
	want("the host (operator.metricsFrom 10.212.0.1/32)", dialAll(targets), "dropped", "open", "open")
	want(outsider+" on "+gateway+" (bridged)", probeResult(t, bridged, len(targets)), "dropped", "dropped", "dropped")
	want(outsider+" on "+detector+" (routed)", probeResult(t, routed, len(targets)), "dropped", "dropped", "dropped")
	want("the operator's namespace", probeResult(t, operator, len(targets)), "dropped", "open", "open")
	want("a pod the policy names as the pipeline's sender", probeResult(t, named, len(targets)), "open", "dropped", "dropped")

	// Every answer above came from the one gateway pod, still running.
	if cur := running(t, sp, render.RoleGateway); cur == nil || cur.Name != gw.Name || cur.Status.PodIP != ip {
		t.Fatalf("the gateway pod %s (%s) is no longer the running one: %v", gw.Name, ip, cur)
	}

	// The data network: Multus attaches a pod only to its own namespace's attachments.
	p := probePod(t, outsider, detector, nil, []string{"true"})
	p.Name = "join-data-network"
	p.Annotations = map[string]string{"k8s.v1.cni.cncf.io/networks": "default/data-detector"}
	if err := k8s.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	defer k8s.Delete(ctx, p, client.GracePeriodSeconds(0)) //nolint:errcheck
	eventually(t, "a pod of "+outsider+" refused the data network of default", 90*time.Second, func() (bool, string) {
		var evs corev1.EventList
		if err := k8s.List(ctx, &evs, client.InNamespace(outsider)); err != nil {
			return false, err.Error()
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.UID == p.UID && e.Reason == "FailedCreatePodSandBox" && strings.Contains(e.Message, "namespace isolation") {
				t.Logf("Multus refused it: ...%s", e.Message[strings.Index(e.Message, "namespace isolation"):])
				return true, ""
			}
		}
		cur := &corev1.Pod{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(p), cur); err == nil && cur.Status.Phase != corev1.PodPending {
			return false, "the pod started: " + string(cur.Status.Phase)
		}
		return false, fmt.Sprintf("%d events, none a namespace-isolation refusal", len(evs.Items))
	})
}

// probePod runs cmd in the installed agent image (bash) on a node, as Pod Security restricted
// allows.
func probePod(t *testing.T, namespace, node string, labels map[string]string, cmd []string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-", Namespace: namespace, Labels: labels},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			NodeSelector:  map[string]string{corev1.LabelHostname: node},
			SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To(int64(agentUID)),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Containers: []corev1.Container{{
				Name: "probe", Command: cmd,
				SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
			}},
		},
	}
	runsInstalledAgentImage(t, p)
	return p
}

// startProbe starts a pod of the namespace on the node that connects to each host:port at once
// and says, for each, "open" (connected), "refused" (nothing listens) or "dropped" (no answer
// within 3 s: a policy); probeResult waits for it and reads what it said. A probe wearing an
// agent's labels runs as the operator's agents do, from a Job the operator's identity makes (the
// chart's policy refuses any other pod wearing them).
func startProbe(t *testing.T, namespace, node string, labels map[string]string, targets []string) *corev1.Pod {
	t.Helper()
	// kube-network-policies (without NRI) learns a new pod's address from the API server: the
	// probe waits for the kubelet's report of it to get there, or it would be judged as no pod.
	const script = `sleep 3
for t in "$@"; do
  (timeout 3 bash -c "exec 3<>/dev/tcp/${t%:*}/${t##*:}"
  case $? in 0) r=open ;; 124) r=dropped ;; *) r=refused ;; esac
  echo "probe $t $r") &
done
wait`
	p := probePod(t, namespace, node, labels, append([]string{"bash", "-c", script, "probe"}, targets...))
	if len(labels) > 0 {
		return asOperatorsJob(t, p)
	}
	if err := k8s.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k8s.Delete(ctx, p, client.GracePeriodSeconds(0)) }) //nolint:errcheck
	return p
}

// asOperatorsJob runs pod p from a Job the operator's identity makes, and returns the pod the job
// controller made for it.
func asOperatorsJob(t *testing.T, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{GenerateName: p.GenerateName, Namespace: p.Namespace},
		Spec: batchv1.JobSpec{BackoffLimit: ptr.To(int32(0)),
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: p.Labels}, Spec: p.Spec}}}
	if err := asOperator.Create(ctx, job); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k8s.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationBackground)) }) //nolint:errcheck
	var made corev1.Pod
	eventually(t, "the pod of Job "+job.Name, 60*time.Second, func() (bool, string) {
		var pods corev1.PodList
		if err := k8s.List(ctx, &pods, client.InNamespace(job.Namespace), client.MatchingLabels{batchv1.JobNameLabel: job.Name}); err != nil || len(pods.Items) == 0 {
			return false, fmt.Sprint("no pod yet ", err)
		}
		made = pods.Items[0]
		return true, ""
	})
	return &made
}

func probeResult(t *testing.T, p *corev1.Pod, targets int) map[string]string {
	t.Helper()
	eventually(t, "probe pod "+p.Namespace+"/"+p.Name+" finished", 90*time.Second, func() (bool, string) {
		cur := &corev1.Pod{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(p), cur); err != nil {
			return false, err.Error()
		}
		return cur.Status.Phase == corev1.PodSucceeded || cur.Status.Phase == corev1.PodFailed, string(cur.Status.Phase)
	})
	b, err := cs.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "probe" {
			got[f[1]] = f[2]
		}
	}
	if len(got) != targets {
		t.Fatalf("probe pod %s/%s on %s printed:\n%s", p.Namespace, p.Name, p.Spec.NodeSelector[corev1.LabelHostname], b)
	}
	return got
}

// dialAll is a probe from this process (on the host, 10.212.0.1).
func dialAll(targets []string) map[string]string {
	got := map[string]string{}
	for _, target := range targets {
		c, err := net.DialTimeout("tcp", target, 3*time.Second)
		var ne net.Error
		switch {
		case err == nil:
			c.Close()
			got[target] = "open"
		case errors.As(err, &ne) && ne.Timeout(), errors.Is(err, os.ErrDeadlineExceeded):
			got[target] = "dropped"
		default:
			got[target] = "refused (" + err.Error() + ")"
		}
	}
	return got
}
