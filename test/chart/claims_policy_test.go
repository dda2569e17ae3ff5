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

// The operator reads a pipeline's agents by their labels and sends each gateway the agents'
// metrics token; the PodMonitor scrapes every pod labelled with a role, with the same token; a
// gateway's Service sends the data to pods with its labels. A tenant's pod wearing them would
// be sent the token (which opens every agent's metrics and preview) and a share of the data.
// With the chart's policy on a real API server, only the job controller makes a pod with those
// labels, for a Job the operator made; a tenant's pod, Job, CronJob or Deployment wearing them
// is refused naming the label, and so is relabelling a pod; the agents' own pods, and a tenant's
// pods without those labels, are admitted.
func TestOnlyTheOperatorsJobsMakePodsWithItsAgentsLabels(t *testing.T) {
	env, admin := withPolicy(t, "claims")
	ctx := context.Background()
	ns := "beamline"
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	tenant := impersonating(t, env, "alice")
	jobController := impersonating(t, env, "system:serviceaccount:kube-system:job-controller")
	operator := impersonating(t, env, "system:serviceaccount:numastream-system:numastream-operator")
	agent := map[string]string{"numastream.io/pipeline": "legit", "numastream.io/role": "gateway", "numastream.io/stream": "0"}
	spec := corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "c", Image: "busybox",
		Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9100}}}}}
	jobOwner := []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "legit-gateway-0", UID: "1234", Controller: ptrTo(true)}}
	pod := func(name string, labels map[string]string, owners []metav1.OwnerReference) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels, OwnerReferences: owners}, Spec: spec}
	}
	template := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"numastream.io/role": "gateway", "app": "x"}}, Spec: spec}
	job := func(name string, own map[string]string, tmpl corev1.PodTemplateSpec) *batchv1.Job {
		return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: own}, Spec: batchv1.JobSpec{Template: tmpl}}
	}
	one := int32(1)
	always := template
	always.Spec.RestartPolicy = corev1.RestartPolicyAlways
	refused := []struct {
		what, label string
		c           client.Client
		obj         client.Object
	}{
		{"a tenant's pod wearing a gateway's labels", "numastream.io/pipeline", tenant, pod("impostor", agent, nil)},
		{"a tenant's pod wearing a role and a forged Job owner", "numastream.io/role", tenant, pod("forged", map[string]string{"numastream.io/role": "sender"}, jobOwner)},
		{"a pod the job controller made without a Job owning it", "numastream.io/role", jobController, pod("orphan", agent, nil)},
		{"a tenant's Job whose pods wear a role", "numastream.io/role", tenant, job("mine", nil, template)},
		{"a tenant's Job labelled with a pipeline", "numastream.io/pipeline", tenant,
			job("mine-2", map[string]string{"numastream.io/pipeline": "legit"}, corev1.PodTemplateSpec{Spec: spec})},
		{"a tenant's CronJob whose pods wear a role", "numastream.io/role", tenant, &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Name: "nightly", Namespace: ns},
			Spec: batchv1.CronJobSpec{Schedule: "0 0 * * *", JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: template}}}}},
		{"a tenant's Deployment whose pods wear a role", "numastream.io/role", tenant, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "reader", Namespace: ns},
			Spec: appsv1.DeploymentSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}, Template: always}}},
	}
	testenv.Eventually(t, "the claims policy in force", 30*time.Second, 200*time.Millisecond, func() (bool, string) {
		err := tenant.Create(ctx, pod("probe", agent, nil), client.DryRunAll)
		return err != nil, "a tenant's pod wearing an agent's labels is still admitted"
	})
	for _, r := range refused {
		err := r.c.Create(ctx, r.obj.DeepCopyObject().(client.Object))
		if err == nil || !strings.Contains(err.Error(), r.label) || !strings.Contains(err.Error(), "metrics token") {
			t.Errorf("%s: %v, want refused naming %s and why", r.what, err, r.label)
		}
	}
	mine := pod("mine", map[string]string{"app.kubernetes.io/name": "numastream"}, nil)
	admitted := []struct {
		what string
		c    client.Client
		obj  client.Object
	}{
		{"the agent pod the job controller made for the operator's Job", jobController, pod("legit-gateway-0-x", agent, jobOwner)},
		{"the operator's Job", operator, job("legit-gateway-0", map[string]string{"numastream.io/pipeline": "legit"}, template)},
		{"a tenant's pod without the agents' labels", tenant, mine},
	}
	for _, a := range admitted {
		if err := a.c.Create(ctx, a.obj.DeepCopyObject().(client.Object)); err != nil {
			t.Errorf("%s refused: %v", a.what, err)
		}
	}
	// Labels can change on a live pod: the agents' may not be added to one, nor changed or
	// removed on one; other labels may.
	relabel := func(c client.Client, name string, change func(map[string]string)) error {
		var p corev1.Pod
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &p); err != nil {
			t.Fatal(err)
		}
		if p.Labels == nil {
			p.Labels = map[string]string{}
		}
		change(p.Labels)
		return c.Update(ctx, &p)
	}
	for what, err := range map[string]error{
		"a tenant adding a role to its pod":                relabel(tenant, "mine", func(l map[string]string) { l["numastream.io/role"] = "gateway" }),
		"a tenant moving an agent pod to another pipeline": relabel(tenant, "legit-gateway-0-x", func(l map[string]string) { l["numastream.io/pipeline"] = "other" }),
		"a tenant taking an agent pod's role away":         relabel(tenant, "legit-gateway-0-x", func(l map[string]string) { delete(l, "numastream.io/role") }),
	} {
		if err == nil || !strings.Contains(err.Error(), "cannot be added or changed") {
			t.Errorf("%s: %v, want refused", what, err)
		}
	}
	if err := relabel(tenant, "mine", func(l map[string]string) { l["team"] = "mx" }); err != nil {
		t.Errorf("a tenant labelling its pod otherwise: %v", err)
	}
	if err := relabel(jobController, "legit-gateway-0-x", func(l map[string]string) { l["batch.kubernetes.io/job-tracking"] = "" }); err != nil {
		t.Errorf("the job controller updating an agent pod, its labels kept: %v", err)
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
