package chart

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/testenv"
)

// The previous release, as a user has it: the chart numastream 0.1.0 packaged from its commit
// (3e86843), and the samples its users applied (numastream.io/v1alpha1, the only version then).
const (
	previousChart   = "testdata/numastream-0.1.0.tgz"
	previousSamples = "testdata/samples-0.1.0.yaml"
)

// helmOn runs helm against the API server of kubeconfig and fails the test with helm's output.
func helmOn(t *testing.T, kubeconfig string, args ...string) string {
	t.Helper()
	cmd := exec.Command(helm(t), append(args, "--kubeconfig", kubeconfig, "--namespace", "numastream-system")...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// storedAPIVersion is the apiVersion etcd holds for a custom resource: what the API server wrote
// there, read through etcd's own JSON gateway (/v3/kv/range), not through the API server (which
// would convert it).
func storedAPIVersion(t *testing.T, env *envtest.Environment, resource, namespace, name string) string {
	t.Helper()
	key := "/registry/numastream.io/" + resource + "/" + namespace + "/" + name
	body, _ := json.Marshal(map[string]string{"key": base64.StdEncoding.EncodeToString([]byte(key))})
	resp, err := http.Post(env.ControlPlane.Etcd.URL.String()+"/v3/kv/range", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		KVs []struct{ Value string } `json:"kvs"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.KVs) != 1 {
		t.Fatalf("etcd %s: %d values (%v)", key, len(out.KVs), err)
	}
	raw, err := base64.StdEncoding.DecodeString(out.KVs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	var obj struct {
		APIVersion string `json:"apiVersion"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		t.Fatalf("etcd %s holds %.80q: %v", key, raw, err)
	}
	return obj.APIVersion
}

// `helm upgrade` from the previous release with pipelines in place, as docs/upgrade.md says to run
// it: the 0.1.0 chart installs the CRD of numastream.io/v1alpha1 and users apply its samples
// (with a status, as the 0.1.0 operator wrote it); the upgrade to this chart installs v1beta1 as
// the storage version and keeps serving v1alpha1, deprecated. Every pipeline is then read in
// both versions with every field it had, a v1alpha1 manifest still applies, and the storage
// migration docs/upgrade.md gives (rewrite every object, then drop v1alpha1 from the CRD's
// storedVersions) leaves etcd holding v1beta1 only.
func TestAHelmUpgradeFrom010KeepsEveryPipeline(t *testing.T) {
	testenv.Envtest(t)
	env := &envtest.Environment{}
	c := apiServer(t, env)
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme, v1beta1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	c, err := client.New(env.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	admin, err := env.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := admin.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	helmOn(t, kubeconfig, "install", "numastream", previousChart, "--set", "operator.leaderElect=true")
	crd := &apiextensionsv1.CustomResourceDefinition{}
	testenv.Eventually(t, "the 0.1.0 CRD established", 30*time.Second, 200*time.Millisecond, func() (bool, string) {
		if err := c.Get(ctx, types.NamespacedName{Name: "streampipelines.numastream.io"}, crd); err != nil {
			return false, err.Error()
		}
		for _, cond := range crd.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				return true, ""
			}
		}
		return false, "not established"
	})
	if len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Name != "v1alpha1" {
		t.Fatalf("the 0.1.0 chart's CRD serves %+v", crd.Spec.Versions)
	}
	if err := c.Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": "beamline"}}}); err != nil {
		t.Fatal(err)
	}
	samples, err := os.ReadFile(previousSamples)
	if err != nil {
		t.Fatal(err)
	}
	before := map[string]*unstructured.Unstructured{}
	for _, o := range decode(t, samples) {
		o.SetNamespace("beamline")
		if err := c.Create(ctx, o); err != nil {
			t.Fatalf("0.1.0 sample %s: %v", o.GetName(), err)
		}
		// The status the 0.1.0 operator wrote: streams, prediction, a condition.
		o.Object["status"] = map[string]any{"streams": int64(1), "predictedGbps": "12.5", "bottleneck": "send",
			"conditions": []any{map[string]any{"type": "Ready", "status": "True", "reason": "Completed",
				"message": "every stream completed", "lastTransitionTime": "2026-11-24T11:00:00Z"}}}
		if err := c.Status().Update(ctx, o); err != nil {
			t.Fatalf("0.1.0 status of %s: %v", o.GetName(), err)
		}
		before[o.GetName()] = o.DeepCopy()
	}
	if len(before) != 3 {
		t.Fatalf("%d samples", len(before))
	}

	// The upgrade, as docs/upgrade.md says (the user's values of 0.1.0 kept; this chart's
	// defaults for everything 0.1.0 did not have).
	out := helmOn(t, kubeconfig, "upgrade", "numastream", chartDir, "--reset-then-reuse-values")
	t.Logf("helm upgrade from 0.1.0: %s", strings.SplitN(out, "\n", 2)[0])
	if !strings.Contains(out, "WARNING: operator.hostPathPrefixes is empty") {
		t.Errorf("without operator.hostPathPrefixes, the notes do not warn that each pipeline's volume is its whole root:\n%s", out)
	}
	testenv.Eventually(t, "the CRD serving v1beta1", 30*time.Second, 200*time.Millisecond, func() (bool, string) {
		if err := c.Get(ctx, types.NamespacedName{Name: "streampipelines.numastream.io"}, crd); err != nil {
			return false, err.Error()
		}
		return slices.Contains(crd.Status.StoredVersions, "v1beta1") || len(crd.Spec.Versions) == 2, fmt.Sprint(crd.Status.StoredVersions)
	})
	served := map[string]string{}
	for _, v := range crd.Spec.Versions {
		served[v.Name] = fmt.Sprintf("served=%v storage=%v deprecated=%v", v.Served, v.Storage, v.Deprecated)
	}
	if served["v1beta1"] != "served=true storage=true deprecated=false" || served["v1alpha1"] != "served=true storage=false deprecated=true" {
		t.Errorf("versions after the upgrade: %v", served)
	}
	if values := helmOn(t, kubeconfig, "get", "values", "numastream"); !strings.Contains(values, "leaderElect: true") {
		t.Errorf("the user's value operator.leaderElect=true was not kept:\n%s", values)
	}

	// Every pipeline, read as v1beta1 (typed, as the operator reads it) and as v1alpha1: the same
	// spec and status it had.
	for name, old := range before {
		var sp v1beta1.StreamPipeline
		if err := c.Get(ctx, types.NamespacedName{Namespace: "beamline", Name: name}, &sp); err != nil {
			t.Fatalf("%s as v1beta1: %v", name, err)
		}
		var asBeta map[string]any
		testenv.Convert(t, sp, &asBeta)
		for _, part := range []string{"spec", "status"} {
			for _, d := range lost(part, plain(t, old.Object[part]), plain(t, asBeta[part])) {
				t.Errorf("%s as v1beta1: %s", name, d)
			}
		}
		alpha := &unstructured.Unstructured{}
		alpha.SetAPIVersion("numastream.io/v1alpha1")
		alpha.SetKind("StreamPipeline")
		if err := c.Get(ctx, types.NamespacedName{Namespace: "beamline", Name: name}, alpha); err != nil {
			t.Fatalf("%s as v1alpha1: %v", name, err)
		}
		for _, d := range lost("spec", plain(t, old.Object["spec"]), plain(t, alpha.Object["spec"])) {
			t.Errorf("%s as v1alpha1 after the upgrade: %s", name, d)
		}
		if v := storedAPIVersion(t, env, "streampipelines", "beamline", name); v != "numastream.io/v1alpha1" {
			t.Errorf("%s is stored as %s before any write", name, v)
		}
	}
	// A v1alpha1 manifest written after the upgrade is accepted (with the API server's warning)
	// and stored as v1beta1.
	late := decode(t, samples)[1] // paper-4-detectors: no sink (0.1.0 sinks took host paths, refused now)
	late.SetNamespace("beamline")
	late.SetName("applied-after-the-upgrade")
	if err := c.Create(ctx, late); err != nil {
		t.Fatalf("a v1alpha1 manifest after the upgrade: %v", err)
	}
	if v := storedAPIVersion(t, env, "streampipelines", "beamline", late.GetName()); v != "numastream.io/v1beta1" {
		t.Errorf("a pipeline created as v1alpha1 after the upgrade is stored as %s", v)
	}

	// The storage migration of docs/upgrade.md: rewrite every pipeline unchanged (kubectl get -o
	// json | kubectl replace -f -), then tell the CRD v1alpha1 is no longer stored.
	var all v1beta1.StreamPipelineList
	if err := c.List(ctx, &all); err != nil {
		t.Fatal(err)
	}
	for i := range all.Items {
		if err := c.Update(ctx, &all.Items[i]); err != nil {
			t.Errorf("rewriting %s unchanged: %v", all.Items[i].Name, err)
		}
	}
	for name := range before {
		if v := storedAPIVersion(t, env, "streampipelines", "beamline", name); v != "numastream.io/v1beta1" {
			t.Errorf("%s is stored as %s after the migration", name, v)
		}
	}
	if err := c.Get(ctx, types.NamespacedName{Name: "streampipelines.numastream.io"}, crd); err != nil {
		t.Fatal(err)
	}
	crd.Status.StoredVersions = []string{"v1beta1"}
	if err := c.Status().Update(ctx, crd); err != nil {
		t.Fatalf("dropping v1alpha1 from storedVersions: %v", err)
	}
	t.Logf("after the upgrade: %d pipelines of 0.1.0 read unchanged as v1beta1 and v1alpha1; versions %v; migrated to v1beta1 in etcd", len(before), served)

	// helm rollback to 0.1.0 (docs/upgrade.md says it is not supported): 0.1.0's CRD serves
	// v1alpha1 alone, and the API server refuses a CRD that drops a version etcd has stored. The
	// rollback fails on it, and a helm upgrade to this chart puts the release back, every
	// pipeline still readable.
	versions := func() map[string]string {
		var deployments appsv1.DeploymentList
		if err := c.List(ctx, &deployments, client.InNamespace("numastream-system")); err != nil {
			t.Fatal(err)
		}
		v := map[string]string{}
		for _, d := range deployments.Items {
			v[d.Name] = d.Labels["app.kubernetes.io/version"] + " " + d.Spec.Template.Spec.Containers[0].Image
		}
		return v
	}
	upgraded := versions()
	rollback := exec.Command(helm(t), "rollback", "numastream", "1", "--kubeconfig", kubeconfig, "--namespace", "numastream-system")
	out2, err := rollback.CombinedOutput()
	if err == nil {
		t.Fatalf("helm rollback to 0.1.0 succeeded; docs/upgrade.md says the API server refuses it:\n%s", out2)
	}
	if !strings.Contains(string(out2), "storedVersions") {
		t.Errorf("helm rollback to 0.1.0 failed, but not on the CRD's stored versions:\n%s", out2)
	}
	t.Logf("helm rollback to 0.1.0: %s", strings.TrimSpace(string(out2)))
	// Helm does not stop at the refusal: the operator's Deployment is 0.1.0's by then (what
	// docs/upgrade.md warns of). helm upgrade to this chart again puts everything back.
	t.Logf("the release's deployments after the refused rollback: %v", versions())
	out = helmOn(t, kubeconfig, "upgrade", "numastream", chartDir, "--reset-then-reuse-values", "--set", "operator.hostPathPrefixes={/data}")
	if strings.Contains(out, "hostPathPrefixes is empty") {
		t.Errorf("with operator.hostPathPrefixes set, the notes still warn:\n%s", out)
	}
	if now := versions(); fmt.Sprint(now) != fmt.Sprint(upgraded) {
		t.Errorf("the release's deployments after the upgrade again: %v; after the first upgrade: %v", now, upgraded)
	}
	for name := range before {
		var sp v1beta1.StreamPipeline
		if err := c.Get(ctx, types.NamespacedName{Namespace: "beamline", Name: name}, &sp); err != nil {
			t.Errorf("%s after the refused rollback and the upgrade again: %v", name, err)
		}
	}
}

// plain is v as JSON values (maps, slices, strings, float64, bools).
func plain(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// lost lists every value of old that now is missing or different (the schema's defaults may
// add fields; none may go or change).
func lost(path string, old, now any) []string {
	switch o := old.(type) {
	case map[string]any:
		n, ok := now.(map[string]any)
		if !ok {
			return []string{fmt.Sprintf("%s: was an object, now %v", path, now)}
		}
		var out []string
		for k, v := range o {
			out = append(out, lost(path+"."+k, v, n[k])...)
		}
		return out
	case []any:
		n, ok := now.([]any)
		if !ok || len(n) != len(o) {
			return []string{fmt.Sprintf("%s: was %v, now %v", path, o, now)}
		}
		var out []string
		for i := range o {
			out = append(out, lost(fmt.Sprintf("%s[%d]", path, i), o[i], n[i])...)
		}
		return out
	default:
		if fmt.Sprint(old) != fmt.Sprint(now) {
			return []string{fmt.Sprintf("%s: was %v, now %v", path, old, now)}
		}
		return nil
	}
}
