package chart

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/numastream/numastream/internal/testenv"
)

// A tenant's pod in a pipeline's namespace mounting the claim the operator made for that
// pipeline's storage reached the whole StorageRoot. With the chart's ValidatingAdmissionPolicy on
// a real API server: only a pod the job controller made for a Job, labelled with the claim's
// pipeline, mounts it; a bare pod, another pipeline's pod, a Job that is not the operator's and a
// Deployment are refused naming the claim; a claim of the tenant's own is not the policy's.
func TestOnlyAPipelinesOwnAgentPodsMountItsClaims(t *testing.T) {
	env, admin := withPolicy(t, "claims")
	ctx := context.Background()
	ns := "beamline"
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	as := func(user string) client.Client { return impersonating(t, env, user) }
	tenant := as("alice")
	jobController := as("system:serviceaccount:kube-system:job-controller")
	operator := as("system:serviceaccount:numastream-system:numastream-operator")

	const claim = "legit-storage-0123456789"
	spec := func(claimName string) corev1.PodSpec {
		return corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "c", Image: "busybox"}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claimName}}}}}
	}
	jobOwner := []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "legit-gateway-0", UID: "1234", Controller: ptrTo(true)}}
	pod := func(name, pipeline, claimName string, owners []metav1.OwnerReference) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, OwnerReferences: owners}, Spec: spec(claimName)}
		if pipeline != "" {
			p.Labels = map[string]string{"numastream.io/pipeline": pipeline}
		}
		return p
	}
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "copy", Namespace: ns},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: spec(claim)}}}
	one := int32(1)
	always := spec(claim)
	always.RestartPolicy = corev1.RestartPolicyAlways
	deployment := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "reader", Namespace: ns},
		Spec: appsv1.DeploymentSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "reader"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "reader"}}, Spec: always}}}

	refused := []struct {
		what string
		c    client.Client
		obj  client.Object
	}{
		{"a tenant's bare pod", tenant, pod("peek", "", claim, nil)},
		{"a tenant's pod labelled as the pipeline's", tenant, pod("forged", "legit", claim, jobOwner)},
		{"another pipeline's agent pod", jobController, pod("other-gateway-0-x", "other", claim, jobOwner)},
		{"a pod the job controller made without a Job owning it", jobController, pod("orphan", "legit", claim, nil)},
		{"a tenant's Job", tenant, job},
		{"a tenant's Deployment", tenant, deployment},
	}
	// The policy is in force once the API server has loaded it (it reads policies asynchronously).
	testenv.Eventually(t, "the claims policy in force", 30*time.Second, 200*time.Millisecond, func() (bool, string) {
		err := tenant.Create(ctx, pod("probe", "", claim, nil), client.DryRunAll)
		return err != nil, "a bare pod mounting the claim is still admitted"
	})
	for _, r := range refused {
		err := r.c.Create(ctx, r.obj.DeepCopyObject().(client.Object))
		if err == nil || !strings.Contains(err.Error(), claim) {
			t.Errorf("%s: %v, want refused naming %s", r.what, err, claim)
		}
	}
	admitted := []struct {
		what string
		c    client.Client
		obj  client.Object
	}{
		{"the pipeline's agent pod, made by the job controller for its Job", jobController, pod("legit-gateway-0-x", "legit", claim, jobOwner)},
		{"the operator's Job", operator, &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "legit-gateway-0", Namespace: ns}, Spec: job.Spec}},
		{"a tenant's pod on a claim of its own", tenant, pod("mine", "", "my-scratch", nil)},
	}
	for _, a := range admitted {
		if err := a.c.Create(ctx, a.obj.DeepCopyObject().(client.Object)); err != nil {
			t.Errorf("%s refused: %v", a.what, err)
		}
	}
}

func ptrTo[T any](v T) *T { return &v }

// withPolicy starts a real API server with the chart's ValidatingAdmissionPolicy (and binding)
// whose name ends in `suffix`, rendered with `args`; it returns the server and its admin.
func withPolicy(t *testing.T, suffix string, args ...string) (*envtest.Environment, client.Client) {
	t.Helper()
	testenv.Envtest(t)
	objs, err := render(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	env := &envtest.Environment{}
	admin := apiServer(t, env)
	for _, kind := range []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		o := find(objs, kind, suffix)
		if o == nil {
			t.Fatalf("the chart renders no %s named *%s", kind, suffix)
		}
		if err := admin.Create(context.Background(), o); err != nil {
			t.Fatal(err)
		}
	}
	return env, admin
}

// impersonating is a client of env acting as `user` (authorized as system:masters, so only the
// admission policies decide).
func impersonating(t *testing.T, env *envtest.Environment, user string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:masters"}}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The operator may make PersistentVolumes cluster-wide: with operator.hostPathPrefixes set, a
// token taken from it makes host-path volumes under those prefixes (and the senders' state root)
// only, on a real API server; another identity's volumes are not the policy's.
func TestTheOperatorsVolumesStayUnderTheAllowedHostPaths(t *testing.T) {
	env, admin := withPolicy(t, "volumes", "--set", "operator.hostPathPrefixes={/data/beamline,/scratch}")
	ctx := context.Background()
	operator := impersonating(t, env, "system:serviceaccount:numastream-system:numastream-operator")
	n := 0
	pv := func(path string, source *corev1.PersistentVolumeSource) *corev1.PersistentVolume {
		n++
		if source == nil {
			source = &corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path}}
		}
		return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-" + strconv.Itoa(n)},
			Spec: corev1.PersistentVolumeSpec{Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, PersistentVolumeSource: *source}}
	}
	testenv.Eventually(t, "the volumes policy in force", 30*time.Second, 200*time.Millisecond, func() (bool, string) {
		return operator.Create(ctx, pv("/", nil), client.DryRunAll) != nil, "the operator may still make a volume of /"
	})
	for _, path := range []string{"/", "/etc/kubernetes/manifests", "/data", "/data/beamline2", "/scratchy"} {
		if err := operator.Create(ctx, pv(path, nil)); err == nil || !strings.Contains(err.Error(), "operator.hostPathPrefixes") {
			t.Errorf("the operator's volume of %s: %v, want refused", path, err)
		}
	}
	nfs := &corev1.PersistentVolumeSource{NFS: &corev1.NFSVolumeSource{Server: "10.0.0.1", Path: "/"}}
	if err := operator.Create(ctx, pv("", nfs)); err == nil || !strings.Contains(err.Error(), "not a host path") {
		t.Errorf("the operator's NFS volume: %v, want refused", err)
	}
	for _, path := range []string{"/data/beamline", "/data/beamline/tomo", "/scratch/a", "/var/lib/numastream/streams/ns/p-uid"} {
		if err := operator.Create(ctx, pv(path, nil)); err != nil {
			t.Errorf("the operator's volume of %s refused: %v", path, err)
		}
	}
	if err := admin.Create(ctx, pv("/", nil)); err != nil {
		t.Errorf("the admin's own volume of / refused: the policy is the operator's: %v", err)
	}
}
