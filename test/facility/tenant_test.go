package facility

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/render"
	"github.com/numastream/numastream/internal/storage"
)

// A tenant's namespace enforces Pod Security "restricted": the tenant's pipeline runs to
// completion there (no root step, no host path in its pods), its files on the gateway belong to
// the user and group it asked for, within what the admin's StorageRoot admits, with the mode it
// asked for; the host's /etc/kubernetes/manifests is out of its reach whichever way it asks.
func TestATenantPipelineRunsUnderPodSecurityRestricted(t *testing.T) {
	const tenant, uid, gid = "tenant-a", 2345, 2400
	nsObj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tenant, Labels: map[string]string{
		"pod-security.kubernetes.io/enforce":         "restricted",
		"pod-security.kubernetes.io/enforce-version": "latest",
	}}}
	// hack/facility.sh makes it (the operator's install watches it); the labels are checked here.
	if err := k8s.Create(ctx, nsObj); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	cur := &corev1.Namespace{}
	if err := k8s.Get(ctx, client.ObjectKey{Name: tenant}, cur); err != nil || cur.Labels["pod-security.kubernetes.io/enforce"] != "restricted" {
		t.Fatalf("namespace %s does not enforce restricted: %v %v", tenant, cur.Labels, err)
	}
	// The admin's part: the tenant's directory on the gateway, and a root admitting only this
	// namespace, with the experiment's range of users and groups.
	hostDir := "/var/tmp/numastream-facility-tenant-a"
	if err := os.RemoveAll(hostDir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(hostDir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(hostDir, uid, gid); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(hostDir) })
	root := &v1beta1.StorageRoot{ObjectMeta: metav1.ObjectMeta{Name: "tenant-a-data"}, Spec: v1beta1.StorageRootSpec{
		Path: hostDir, NodeRoles: []string{v1beta1.StorageRoleGateway},
		Access: []v1beta1.StorageAccess{{Namespaces: []string{tenant},
			Users: []v1beta1.IDRange{{Min: 2000, Max: 2999}}, Groups: []v1beta1.IDRange{{Min: 2000, Max: 2999}}}},
	}}
	if err := k8s.Create(ctx, root); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(ctx, root) })

	tenantPipeline := func(name, sink string) *v1beta1.StreamPipeline {
		sp := pipeline(t, tenant, name, 20, sink+fmt.Sprintf("\n  files: {user: %d, group: %d, mode: \"0640\"}", uid, gid))
		return sp
	}

	// The manifests directory: refused by the API server as a path, and no pod as a root.
	abs := tenantPipeline("manifests-path", "  sink: {file: {root: tenant-a-data, path: \"/etc/kubernetes/manifests/x-{stream}.yaml\"}}")
	if err := k8s.Create(ctx, abs); err == nil || !strings.Contains(err.Error(), "spec.sink.file.path") {
		t.Fatalf("an absolute sink path: %v", err)
	}
	escape := tenantPipeline("manifests-escape", "  sink: {file: {root: tenant-a-data, path: \"../../../etc/kubernetes/manifests/x-{stream}.yaml\"}}")
	if err := k8s.Create(ctx, escape); err == nil || !strings.Contains(err.Error(), "spec.sink.file.path") {
		t.Fatalf("a sink path escaping its root: %v", err)
	}
	noRoot := tenantPipeline("manifests-root", "  sink: {file: {root: etc-kubernetes-manifests, path: \"x-{stream}.yaml\"}}")
	if err := k8s.Create(ctx, noRoot); err != nil {
		t.Fatal(err)
	}
	defer deleteAndCheckGone(t, noRoot)

	sp := tenantPipeline("scan", "  sink: {file: {root: tenant-a-data, path: \"run-1/scan-{stream}.raw\"}}")
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	defer deleteAndCheckGone(t, sp)
	completed(t, sp, 20, "the tenant's pipeline Ready=True Completed under Pod Security restricted")
	file := filepath.Join(hostDir, "run-1", "scan-0.raw")
	st, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	sys := st.Sys().(*syscall.Stat_t)
	t.Logf("%s: %d bytes, owner %d:%d, mode %v", file, st.Size(), sys.Uid, sys.Gid, st.Mode().Perm())
	if sys.Uid != uid || sys.Gid != gid || st.Mode().Perm() != 0o640 || st.Size() != 20*11059200 {
		t.Errorf("%s: owner %d:%d mode %v size %d; want %d:%d 0640 %d", file, sys.Uid, sys.Gid, st.Mode().Perm(), st.Size(), uid, gid, 20*11059200)
	}
	if d, err := os.Stat(filepath.Dir(file)); err != nil || d.Mode().Perm() != 0o750 || d.Sys().(*syscall.Stat_t).Uid != uid {
		t.Errorf("the run directory the node daemon made: %v %v, want the pipeline's, 0750", d.Mode().Perm(), err)
	}
	var pods corev1.PodList
	if err := k8s.List(ctx, &pods, client.InNamespace(tenant), client.MatchingLabels{render.LabelPipeline: sp.Name}); err != nil {
		t.Fatal(err)
	}
	var claim string
	for _, p := range pods.Items {
		for _, v := range p.Spec.Volumes {
			if v.HostPath != nil {
				t.Errorf("pod %s mounts the host's %s", p.Name, v.HostPath.Path)
			}
			if c := v.PersistentVolumeClaim; c != nil && strings.Contains(c.ClaimName, "-storage-") {
				claim = c.ClaimName
			}
		}
	}
	// Another pod of the namespace mounting the pipeline's storage claim is refused by the
	// chart's admission policy, naming the claim; and behind the claim is the pipeline's own
	// directory of the root (the root is under operator.hostPathPrefixes), never the whole root.
	if claim == "" {
		t.Fatal("no storage claim on the tenant pipeline's pods")
	}
	var bound corev1.PersistentVolumeClaim
	var pv corev1.PersistentVolume
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: tenant, Name: claim}, &bound); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Get(ctx, client.ObjectKey{Name: bound.Spec.VolumeName}, &pv); err != nil {
		t.Fatal(err)
	}
	if hp := pv.Spec.HostPath; hp == nil || hp.Path != filepath.Join(hostDir, "run-1") {
		t.Errorf("claim %s is bound to %+v, want the pipeline's directory %s/run-1", claim, hp, hostDir)
	} else {
		t.Logf("claim %s holds %s", claim, hp.Path)
	}
	peek := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "peek", Namespace: tenant}, Spec: corev1.PodSpec{
		RestartPolicy:   corev1.RestartPolicyNever,
		SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: ptrTo(true), RunAsUser: ptrTo(int64(12345)), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
		Containers: []corev1.Container{{Name: "peek", Image: "local.numastream/busybox:1", SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptrTo(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}}},
		Volumes: []corev1.Volume{{Name: "root", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}},
	}}
	if err := k8s.Create(ctx, peek); err == nil || !strings.Contains(err.Error(), claim) {
		_ = k8s.Delete(ctx, peek)
		t.Errorf("a tenant's pod mounting the pipeline's claim %s: %v, want refused naming it", claim, err)
	} else {
		t.Logf("a tenant's pod mounting %s: %v", claim, err)
	}
	// A pod wearing the gateway's labels would be sent the agents' metrics token by the operator
	// and by Prometheus: refused, naming the label; and so is moving a live agent pod to another
	// pipeline.
	impostor := peek.DeepCopy()
	impostor.Name, impostor.Spec.Volumes = "impostor", nil
	impostor.Labels = map[string]string{render.LabelPipeline: sp.Name, render.LabelRole: render.RoleGateway, render.LabelStream: "0"}
	impostor.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9100}}
	if err := k8s.Create(ctx, impostor); err == nil || !strings.Contains(err.Error(), render.LabelPipeline) {
		_ = k8s.Delete(ctx, impostor)
		t.Errorf("a pod wearing the gateway's labels: %v, want refused naming %s", err, render.LabelPipeline)
	}
	moved := pods.Items[0].DeepCopy()
	moved.Labels[render.LabelPipeline] = "other"
	if err := k8s.Update(ctx, moved); err == nil || !strings.Contains(err.Error(), "cannot be added or changed") {
		t.Errorf("relabelling agent pod %s: %v, want refused", moved.Name, err)
	}

	// The root that does not exist: refused with the field named, and never a pod.
	got := get(t, noRoot)
	planned := meta.FindStatusCondition(got.Status.Conditions, v1beta1.ConditionPlanned)
	if planned == nil || planned.Reason != storage.ReasonNotAllowed || !strings.HasPrefix(planned.Message, "spec.sink.file.root: ") {
		t.Errorf("a root the admin did not make: Planned %v", planned)
	}
	if err := k8s.List(ctx, &pods, client.InNamespace(tenant), client.MatchingLabels{render.LabelPipeline: noRoot.Name}); err != nil || len(pods.Items) != 0 {
		t.Errorf("a refused pipeline has pods: %d %v", len(pods.Items), err)
	}
	if _, err := os.Stat("/etc/kubernetes/manifests/x-0.yaml"); err == nil {
		t.Error("a file appeared in /etc/kubernetes/manifests")
	}

	// The operator is installed for default and tenant-a only (values.yaml watchNamespaces): a
	// pipeline in another namespace is left alone, and its Roles would not let it write there.
	other := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tenant-b"}}
	if err := k8s.Create(ctx, other); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	stray := pipeline(t, "tenant-b", "stray", 5, "")
	stray.Spec.Gateway.Network.Attachment, stray.Spec.Gateway.Network.SenderAttachment = "default/data-gateway", "default/data-detector"
	if err := k8s.Create(ctx, stray); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = k8s.Delete(ctx, stray) }()
	time.Sleep(10 * time.Second)
	got = get(t, stray)
	if err := k8s.List(ctx, &pods, client.InNamespace("tenant-b"), client.MatchingLabels{render.LabelPipeline: stray.Name}); err != nil || len(pods.Items) != 0 || len(got.Status.Conditions) != 0 {
		t.Errorf("a pipeline outside the watched namespaces was driven: %d pods, conditions %v (%v)", len(pods.Items), got.Status.Conditions, err)
	}
}

// The box installs the chart with operator.hostPathPrefixes [/var/tmp] (and whole roots not
// allowed): a pipeline on an admin's StorageRoot elsewhere gets no volume (the operator refuses
// it; the chart's admission policy would refuse the volume), says so in Ready, naming the root's
// path and the value to set, and runs no pod.
func TestAStorageRootOutsideTheAllowedHostPathsGetsNoVolume(t *testing.T) {
	const dir = "/opt/numastream-facility-outside"
	if err := ensureStorageRoot("outside", dir, []string{ns}, agentUID); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = k8s.Delete(ctx, &v1beta1.StorageRoot{ObjectMeta: metav1.ObjectMeta{Name: "outside"}})
		_ = os.RemoveAll(dir)
	})
	sp := start(t, pipeline(t, ns, "outside", 5, "  sink: {file: {root: outside, path: \"x-{stream}.raw\"}}"))
	var msg string
	eventually(t, "Ready=False naming the refused volume", 60*time.Second, func() (bool, string) {
		ready := meta.FindStatusCondition(get(t, sp).Status.Conditions, v1beta1.ConditionReady)
		if ready == nil {
			return false, "no Ready condition"
		}
		msg = ready.Message
		return ready.Status == metav1.ConditionFalse && strings.Contains(msg, "operator.hostPathPrefixes") && strings.Contains(msg, dir),
			ready.Reason + ": " + msg
	})
	if p := pods(t, sp, render.RoleGateway); len(p) != 0 {
		t.Errorf("a pipeline whose volume was refused has gateway pods: %d", len(p))
	}
	t.Logf("Ready: %s", msg)
}
