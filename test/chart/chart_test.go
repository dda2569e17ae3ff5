// Package chart tests the Helm chart and the kustomize tree: lint, rendering with several value
// sets, and a server-side dry run of everything they produce against a real kube-apiserver.
package chart

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/numastream/numastream/internal/testenv"
)

const chartDir = "../../charts/numastream"

func helm(t *testing.T) string { return testenv.Helm(t) }

func render(t *testing.T, args ...string) ([]*unstructured.Unstructured, error) {
	t.Helper()
	cmd := exec.Command(helm(t), append([]string{"template", "numastream", chartDir, "--namespace", "numastream-system"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, errors.New(stderr.String())
	}
	return decode(t, out), nil
}

// apiServer starts env (a real kube-apiserver and etcd, stopped when the test ends) and makes
// the release's namespace in it.
func apiServer(t *testing.T, env *envtest.Environment) client.Client {
	t.Helper()
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Create(context.Background(), &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": "numastream-system"}}}); err != nil {
		t.Fatal(err)
	}
	return c
}

func decode(t *testing.T, data []byte) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return objs
			}
			t.Fatal(err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}

func find(objs []*unstructured.Unstructured, kind, nameSuffix string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && strings.HasSuffix(o.GetName(), nameSuffix) {
			return o
		}
	}
	return nil
}

func podSpec(t *testing.T, o *unstructured.Unstructured) corev1.PodSpec {
	t.Helper()
	m, _, _ := unstructured.NestedMap(o.Object, "spec", "template", "spec")
	var spec corev1.PodSpec
	if err := runtimeConvert(m, &spec); err != nil {
		t.Fatal(err)
	}
	return spec
}

func hostPathsOf(spec corev1.PodSpec) []string {
	var out []string
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			out = append(out, v.HostPath.Path)
		}
	}
	return out
}

func TestDefaultRender(t *testing.T) {
	objs, err := render(t)
	if err != nil {
		t.Fatal(err)
	}
	crd := find(objs, "CustomResourceDefinition", "streampipelines.numastream.io")
	if crd == nil || crd.GetAnnotations()["helm.sh/resource-policy"] != "keep" {
		t.Fatalf("CRD missing or not kept: %v", crd)
	}
	ds := podSpec(t, find(objs, "DaemonSet", "node-daemon"))
	if hostPaths := hostPathsOf(ds); strings.Join(hostPaths, ",") != "/sys,/var/lib/kubelet/device-plugins,/var/lib/numastream/streams" {
		t.Errorf("the node daemon mounts %v; only /sys, the device-plugin directory and the sender state root are allowed", hostPaths)
	}
	if !ds.HostNetwork || !strings.Contains(strings.Join(ds.Containers[0].Args, " "), "--publish-addresses=true --state-root=/host/streams") {
		t.Errorf("node daemon: hostNetwork %v, args %v", ds.HostNetwork, ds.Containers[0].Args)
	}
	for _, c := range ds.Containers {
		if len(c.Ports) > 0 {
			t.Errorf("the host-network node daemon listens on %v", c.Ports)
		}
	}
	for _, m := range ds.Containers[0].VolumeMounts {
		if m.Name == "sys" && !m.ReadOnly {
			t.Error("/sys is mounted writable")
		}
	}
	c := ds.Containers[0].SecurityContext
	if *c.AllowPrivilegeEscalation || !*c.ReadOnlyRootFilesystem || len(c.Capabilities.Drop) != 1 || c.Capabilities.Drop[0] != "ALL" ||
		strings.Join(capNames(c.Capabilities.Add), ",") != "CHOWN,DAC_OVERRIDE,FOWNER" {
		t.Errorf("node daemon security context %+v: every capability dropped but CHOWN, FOWNER (the pipelines' state directories, made for their users) and DAC_OVERRIDE (removing them)", c)
	}
	// Probed without a port: the daemon's own binary reads back its health record.
	nd := ds.Containers[0]
	for name, p := range map[string]*corev1.Probe{"startup": nd.StartupProbe, "liveness": nd.LivenessProbe, "readiness": nd.ReadinessProbe} {
		if p == nil || p.Exec == nil || p.Exec.Command[0] != "/usr/local/bin/node-daemon" ||
			!strings.Contains(strings.Join(p.Exec.Command, " "), "--health-file=/run/numastream/health") {
			t.Errorf("node daemon %s probe %+v: the daemon's --probe on its health record", name, p)
		}
	}
	if !strings.Contains(strings.Join(nd.Args, " "), "--health-file=/run/numastream/health") {
		t.Errorf("node daemon args %v: no health record for its probes", nd.Args)
	}
	if cpu := nd.Resources.Requests.Cpu(); cpu.MilliValue() > 100 {
		t.Errorf("node daemon requests %s CPU on every node: the planner leaves that to it (it idles between rounds)", cpu)
	}
	op := podSpec(t, find(objs, "Deployment", "operator"))
	if !*op.SecurityContext.RunAsNonRoot || !*op.Containers[0].SecurityContext.ReadOnlyRootFilesystem {
		t.Error("operator is not restricted")
	}
	if args := strings.Join(op.Containers[0].Args, " "); !strings.Contains(args, "--agent-image=ghcr.io/numastream/agent:0.2.0") ||
		!strings.Contains(args, "--metrics-from=numastream-system ") {
		t.Errorf("operator args %v: the gateways' metrics ports open to the operator's namespace only", op.Containers[0].Args)
	}
	role := find(objs, "ClusterRole", "operator")
	rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
	if len(rules) < 5 {
		t.Errorf("operator rules %v", rules)
	}
	if find(objs, "ValidatingAdmissionPolicy", "own-node") == nil {
		t.Error("no policy restricting the daemon to its own node's NodeFeature")
	}
	if find(objs, "ServiceMonitor", "") != nil {
		t.Error("ServiceMonitor rendered by default")
	}
	nodeRole := find(objs, "Role", "node-daemon")
	if nodeRole.GetNamespace() != "numastream-system" {
		t.Error("node daemon permissions are not namespaced")
	}
}

func capNames(cs []corev1.Capability) []string {
	var out []string
	for _, c := range cs {
		out = append(out, string(c))
	}
	return out
}

func TestValueSets(t *testing.T) {
	objs, err := render(t, "--set", "nodeDaemon.publish=features-d", "--set", "nodeDaemon.tokensPerNic=0",
		"--set", "crds.enabled=false", "--set", "metrics.serviceMonitor.enabled=true", "--set", "operator.replicas=2",
		"--set", "operator.metricsFrom={monitoring,10.1.2.3/32}")
	if err != nil {
		t.Fatal(err)
	}
	if args := strings.Join(podSpec(t, find(objs, "Deployment", "operator")).Containers[0].Args, " "); !strings.Contains(args, "--metrics-from=numastream-system,monitoring,10.1.2.3/32 ") {
		t.Errorf("operator args %s: metricsFrom adds a monitoring namespace and an address block", args)
	}
	// The schema refuses what is neither a namespace nor an address block.
	for _, bad := range []string{"Monitoring", "10.1.2.3", "mon/itoring"} {
		if _, err := render(t, "--set", "operator.metricsFrom={"+bad+"}"); err == nil || !strings.Contains(err.Error(), "metricsFrom") {
			t.Errorf("metricsFrom %q: %v", bad, err)
		}
	}
	if find(objs, "CustomResourceDefinition", "") != nil {
		t.Error("crds.enabled=false still renders the CRD")
	}
	// A private registry: the operator's and node daemon's pods pull with the chart's secrets.
	pulled, err := render(t, "--set", "imagePullSecrets[0].name=regcred")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []*unstructured.Unstructured{find(pulled, "Deployment", "operator"), find(pulled, "DaemonSet", "node-daemon")} {
		if s := podSpec(t, o).ImagePullSecrets; len(s) != 1 || s[0].Name != "regcred" {
			t.Errorf("%s %s: imagePullSecrets %v, want regcred", o.GetKind(), o.GetName(), s)
		}
	}
	if _, err := render(t, "--set", "imagePullSecrets[0].secret=regcred"); err == nil || !strings.Contains(err.Error(), "imagePullSecrets") {
		t.Errorf("an imagePullSecrets entry without a name: %v", err)
	}
	// Images pinned by digest: the operator's pod, the node daemon's and the agent pods the
	// operator makes (its --agent-image) all name the digest, not a tag.
	agentDigest, operatorDigest := "sha256:"+strings.Repeat("a", 64), "sha256:"+strings.Repeat("b", 64)
	pinned, err := render(t, "--set", "agentImage.digest="+agentDigest, "--set", "operator.image.digest="+operatorDigest)
	if err != nil {
		t.Fatal(err)
	}
	op := podSpec(t, find(pinned, "Deployment", "operator")).Containers[0]
	if op.Image != "ghcr.io/numastream/operator@"+operatorDigest || !strings.Contains(strings.Join(op.Args, " "), "--agent-image=ghcr.io/numastream/agent@"+agentDigest) {
		t.Errorf("operator image %s, args %v: want both by digest", op.Image, op.Args)
	}
	if img := podSpec(t, find(pinned, "DaemonSet", "node-daemon")).Containers[0].Image; img != "ghcr.io/numastream/agent@"+agentDigest {
		t.Errorf("node daemon image %s, want the agent image by digest", img)
	}
	if _, err := render(t, "--set", "agentImage.digest=latest"); err == nil || !strings.Contains(err.Error(), "digest") {
		t.Errorf("a digest that is not sha256:<64 hex>: %v", err)
	}
	if find(objs, "ServiceMonitor", "operator") == nil {
		t.Error("no ServiceMonitor")
	}
	ds := podSpec(t, find(objs, "DaemonSet", "node-daemon"))
	if hostPaths := hostPathsOf(ds); strings.Join(hostPaths, ",") != "/sys,/var/lib/numastream/streams,/etc/kubernetes/node-feature-discovery/features.d" {
		t.Errorf("features-d mode mounts %v", hostPaths)
	}
	if find(objs, "Role", "node-daemon") != nil {
		t.Error("features-d mode grants NodeFeature permissions")
	}
	// Every mode reads StreamPipelines, and nothing else cluster-wide: their senders' state
	// directories are the daemon's to make (and with operator.hostPathPrefixes, their own
	// directories of StorageRoots: it reads those too).
	rules, _, _ := unstructured.NestedSlice(find(objs, "ClusterRole", "node-daemon-pipelines").Object, "rules")
	if len(rules) != 1 || fmt.Sprint(rules[0]) != "map[apiGroups:[numastream.io] resources:[streampipelines] verbs:[list watch]]" {
		t.Errorf("node daemon cluster rules %v", rules)
	}
	objs, err = render(t, "--set", "crds.keep=false", "--set", "nodeDaemon.enabled=false")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := find(objs, "CustomResourceDefinition", "").GetAnnotations()["helm.sh/resource-policy"]; ok {
		t.Error("crds.keep=false still keeps the CRD")
	}
	if find(objs, "DaemonSet", "") != nil {
		t.Error("nodeDaemon.enabled=false renders the DaemonSet")
	}
	// Without leader election an upgrade stops the old operator before the new one starts;
	// with it, the new one waits for the lease, so the Deployment may roll.
	for elect, want := range map[string]string{"false": "Recreate", "true": "RollingUpdate"} {
		objs, err := render(t, "--set", "operator.leaderElect="+elect)
		if err != nil {
			t.Fatal(err)
		}
		if got, _, _ := unstructured.NestedString(find(objs, "Deployment", "operator").Object, "spec", "strategy", "type"); got != want {
			t.Errorf("leaderElect=%s: the operator's Deployment strategy is %q, want %q", elect, got, want)
		}
		// Recreate says rollingUpdate: null, so an upgrade from leader election drops the
		// rolling settings the API server gave the Deployment (it refuses Recreate with them).
		if v, found, _ := unstructured.NestedFieldNoCopy(find(objs, "Deployment", "operator").Object, "spec", "strategy", "rollingUpdate"); (want == "Recreate") != (found && v == nil) {
			t.Errorf("leaderElect=%s: strategy.rollingUpdate %v (set: %v)", elect, v, found)
		}
	}
}

func TestSchemaRefusesBadValues(t *testing.T) {
	for _, bad := range [][]string{
		{"--set", "nodeDaemon.publish=labels"},
		{"--set", "nodeDaemon.tokensPerNic=-1"},
		{"--set", "nodeDaemon.maxUnavailable=0"},
		{"--set", "nodeDaemon.maxUnavailable=150%"},
		{"--set", "operator.imagee.tag=x"},
		{"--set", "agentImage.pullPolicy=Sometimes"},
	} {
		if _, err := render(t, bad...); err == nil || !strings.Contains(err.Error(), "values don't meet the specifications of the schema") {
			t.Errorf("%v accepted (%v)", bad, err)
		}
	}
}

func TestLintStrict(t *testing.T) {
	out, err := exec.Command(helm(t), "lint", "--strict", chartDir).CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}

// helm template and kustomize config/default produce manifests a real API server accepts.
func TestServerSideDryRun(t *testing.T) {
	testenv.Envtest(t)
	helmObjs, err := render(t)
	if err != nil {
		t.Fatal(err)
	}
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	resmap, err := k.Run(filesys.MakeFsOnDisk(), filepath.Join("..", "..", "config", "default"))
	if err != nil {
		t.Fatal(err)
	}
	kyaml, err := resmap.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	kustomizeObjs := decode(t, kyaml)

	c := apiServer(t, &envtest.Environment{})
	ctx := context.Background()
	for name, objs := range map[string][]*unstructured.Unstructured{"helm template": helmObjs, "kustomize config/default": kustomizeObjs} {
		accepted := 0
		for _, o := range objs {
			if o.GetKind() == "Namespace" {
				continue
			}
			if err := c.Create(ctx, o.DeepCopy(), client.DryRunAll); err != nil {
				t.Errorf("%s: %s %s refused: %v", name, o.GetKind(), o.GetName(), err)
				continue
			}
			accepted++
		}
		if accepted < 12 {
			t.Errorf("%s: only %d objects", name, accepted)
		}
	}
	// The two install paths install the same objects.
	key := func(o *unstructured.Unstructured) string { return o.GetKind() + "/" + o.GetName() }
	seen := map[string]bool{}
	for _, o := range helmObjs {
		seen[key(o)] = true
	}
	for _, o := range kustomizeObjs {
		if o.GetKind() != "Namespace" && !seen[key(o)] {
			t.Errorf("kustomize installs %s that the chart does not", key(o))
		}
		delete(seen, key(o))
	}
	for k := range seen {
		t.Errorf("the chart installs %s that kustomize does not", k)
	}
}

// A namespace-scoped install: the operator writes (Jobs, Secrets, claims, status...) only in the
// namespaces it watches, through a Role in each; cluster-wide it only reads nodes, pods and
// pipelines and makes StorageRoots' volumes. Between them the two grant every permission the
// reconciler's markers ask for, and nothing else cluster-wide.
func TestNamespaceScopedInstallWritesOnlyInItsNamespaces(t *testing.T) {
	objs, err := render(t, "--set", "operator.watchNamespaces={beamline-7,beamline-8}")
	if err != nil {
		t.Fatal(err)
	}
	if args := strings.Join(podSpec(t, find(objs, "Deployment", "operator")).Containers[0].Args, " "); !strings.Contains(args, "--watch-namespaces=beamline-7,beamline-8") {
		t.Errorf("operator args %s", args)
	}
	type grant struct{ group, resource, verb string }
	grants := func(o *unstructured.Unstructured) map[grant]bool {
		out := map[grant]bool{}
		rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
		for _, r := range rules {
			m := r.(map[string]any)
			for _, g := range m["apiGroups"].([]any) {
				for _, res := range m["resources"].([]any) {
					for _, v := range m["verbs"].([]any) {
						out[grant{g.(string), res.(string), v.(string)}] = true
					}
				}
			}
		}
		return out
	}
	cluster := grants(find(objs, "ClusterRole", "numastream-operator"))
	for g := range cluster {
		write := g.verb != "get" && g.verb != "list" && g.verb != "watch"
		if (write && g.resource != "persistentvolumes") || g.resource == "secrets" {
			t.Errorf("cluster-wide: %s %s/%s", g.verb, g.group, g.resource)
		}
	}
	roles := map[string]map[grant]bool{}
	for _, o := range objs {
		if o.GetKind() == "Role" && o.GetName() == "numastream-operator" {
			roles[o.GetNamespace()] = grants(o)
		}
	}
	bindings := 0
	for _, o := range objs {
		if o.GetKind() == "RoleBinding" && o.GetName() == "numastream-operator" {
			bindings++
		}
	}
	if len(roles) != 2 || bindings != 2 || !roles["beamline-7"][grant{"", "secrets", "get"}] {
		t.Fatalf("roles %v, %d bindings", roles, bindings)
	}
	all, err := render(t)
	if err != nil {
		t.Fatal(err)
	}
	// PersistentVolumes of host directories are the operator's most powerful grant: it applies
	// (create, patch) and deletes its own, and never updates one.
	for _, role := range []map[grant]bool{cluster, grants(find(all, "ClusterRole", "numastream-operator"))} {
		for _, v := range []string{"update", "deletecollection", "*"} {
			if role[grant{"", "persistentvolumes", v}] {
				t.Errorf("the operator may %s PersistentVolumes", v)
			}
		}
	}
	clusterScoped := map[string]bool{"nodes": true, "persistentvolumes": true, "storageroots": true}
	for g := range grants(find(all, "ClusterRole", "numastream-operator")) {
		if clusterScoped[g.resource] && !cluster[g] {
			t.Errorf("the namespace-scoped install lacks %s %s/%s", g.verb, g.group, g.resource)
		}
		for ns, r := range roles {
			if !clusterScoped[g.resource] && !r[g] {
				t.Errorf("%s lacks %s %s/%s", ns, g.verb, g.group, g.resource)
			}
		}
	}
}

// The chart's README documents every value a user can set (each key of values.yaml, to the
// second level).
func TestTheReadmeNamesEveryValue(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := sigsyaml.Unmarshal(raw, &values); err != nil {
		t.Fatal(err)
	}
	for top, v := range values {
		keys := []string{top}
		if m, ok := v.(map[string]any); ok && len(m) > 0 {
			keys = nil
			for k := range m {
				keys = append(keys, top+"."+k)
			}
		}
		for _, k := range keys {
			if !strings.Contains(string(readme), "`"+k+"`") {
				t.Errorf("charts/numastream/README.md does not document %s", k)
			}
		}
	}
}

// A facility's umbrella chart carries numastream as a dependency and passes `global` values to
// every subchart: Helm itself builds the dependency and renders the whole, and the schema takes
// the globals (before, it refused them: "additional properties 'global' not allowed").
func TestTheChartRendersAsAnUmbrellaChartsDependencyWithGlobals(t *testing.T) {
	umbrella := t.TempDir()
	abs, err := filepath.Abs(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	chart := "apiVersion: v2\nname: facility\nversion: 1.0.0\ndependencies:\n  - name: numastream\n    version: \">=0.0.0-0\"\n    repository: file://" + abs + "\n"
	values := "global:\n  imageRegistry: registry.facility.example\n  storageClass: fast\nnumastream:\n  operator:\n    replicas: 1\n"
	for name, text := range map[string]string{"Chart.yaml": chart, "values.yaml": values} {
		if err := os.WriteFile(filepath.Join(umbrella, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	env := append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	dep := exec.Command(helm(t), "dependency", "build", umbrella)
	dep.Env = env
	if out, err := dep.CombinedOutput(); err != nil {
		t.Fatalf("helm dependency build: %v\n%s", err, out)
	}
	tmpl := exec.Command(helm(t), "template", "facility", umbrella, "--namespace", "numastream-system")
	tmpl.Env = env
	var stderr bytes.Buffer
	tmpl.Stderr = &stderr
	out, err := tmpl.Output()
	if err != nil {
		t.Fatalf("helm template of the umbrella chart: %v\n%s", err, stderr.String())
	}
	objs := decode(t, out)
	if find(objs, "Deployment", "operator") == nil || find(objs, "DaemonSet", "node-daemon") == nil {
		t.Errorf("the umbrella chart rendered %d objects without numastream's operator and node daemon", len(objs))
	}
}

// With operator.hostPathPrefixes, the node daemon mounts each (made where a node lacks it)
// where it makes pipelines' own directories, and both it and the operator know them; without,
// neither mounts nor names any.
func TestTheNodeDaemonMountsTheHostPathPrefixes(t *testing.T) {
	objs, err := render(t, "--set", "operator.hostPathPrefixes={/data/beamline,/scratch}")
	if err != nil {
		t.Fatal(err)
	}
	daemon := podSpec(t, find(objs, "DaemonSet", "node-daemon"))
	mounts := map[string]string{}
	for _, m := range daemon.Containers[0].VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	for i, p := range []string{"/data/beamline", "/scratch"} {
		name := fmt.Sprintf("storage-%d", i)
		var hostPath string
		for _, v := range daemon.Volumes {
			if v.Name == name && v.HostPath != nil && *v.HostPath.Type == "DirectoryOrCreate" {
				hostPath = v.HostPath.Path
			}
		}
		if hostPath != p || mounts[name] != "/host/storage"+p || mounts[name] == "" {
			t.Errorf("%s: host %q mounted at %q, want %s at /host/storage%s", name, hostPath, mounts[name], p, p)
		}
	}
	if args := strings.Join(daemon.Containers[0].Args, " "); !strings.Contains(args, "--storage-prefixes=/data/beamline,/scratch --host-storage=/host/storage") {
		t.Errorf("node daemon args %s", args)
	}
	if args := strings.Join(podSpec(t, find(objs, "Deployment", "operator")).Containers[0].Args, " "); !strings.Contains(args, "--storage-prefixes=/data/beamline,/scratch ") {
		t.Errorf("operator args %s", args)
	}
	rules, _, _ := unstructured.NestedSlice(find(objs, "ClusterRole", "node-daemon-pipelines").Object, "rules")
	if len(rules) != 1 || fmt.Sprint(rules[0]) != "map[apiGroups:[numastream.io] resources:[storageroots streampipelines] verbs:[list watch]]" {
		t.Errorf("node daemon cluster rules %v", rules)
	}
	objs, err = render(t)
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"DaemonSet", "Deployment"} {
		if args := strings.Join(podSpec(t, find(objs, kind, "")).Containers[0].Args, " "); strings.Contains(args, "storage-prefixes") {
			t.Errorf("%s without prefixes: %s", kind, args)
		}
	}
	// Whole roots as volumes only when the admin says so.
	for set, want := range map[string]string{"": "--whole-root-volumes=false", "operator.wholeRootVolumes=true": "--whole-root-volumes=true"} {
		args := []string{}
		if set != "" {
			args = append(args, "--set", set)
		}
		if objs, err = render(t, args...); err != nil {
			t.Fatal(err)
		}
		if got := podSpec(t, find(objs, "Deployment", "operator")).Containers[0].Args; !slices.Contains(got, want) {
			t.Errorf("operator args with %q: %v, want %s", set, got, want)
		}
	}
}

// The user roles aggregate into Kubernetes' admin and edit (pipelines and far sites, never their
// status) and view (read only); userRoles.aggregate=false leaves them out.
func TestTheUserRolesAggregateIntoEditAndView(t *testing.T) {
	objs, err := render(t)
	if err != nil {
		t.Fatal(err)
	}
	edit, view := find(objs, "ClusterRole", "numastream-edit"), find(objs, "ClusterRole", "numastream-view")
	if edit == nil || view == nil {
		t.Fatal("no numastream-edit or numastream-view ClusterRole")
	}
	for o, labels := range map[*unstructured.Unstructured][]string{edit: {"aggregate-to-admin", "aggregate-to-edit"}, view: {"aggregate-to-view"}} {
		for _, l := range labels {
			if o.GetLabels()["rbac.authorization.k8s.io/"+l] != "true" {
				t.Errorf("%s lacks %s: %v", o.GetName(), l, o.GetLabels())
			}
		}
		rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
		for _, r := range rules {
			for _, res := range r.(map[string]any)["resources"].([]any) {
				if strings.Contains(res.(string), "/") {
					t.Errorf("%s grants %s", o.GetName(), res)
				}
			}
			for _, v := range r.(map[string]any)["verbs"].([]any) {
				if o == view && v != "get" && v != "list" && v != "watch" {
					t.Errorf("the view role may %s", v)
				}
			}
		}
	}
	off, err := render(t, "--set", "userRoles.aggregate=false")
	if err != nil {
		t.Fatal(err)
	}
	if find(off, "ClusterRole", "numastream-edit") != nil || find(off, "ClusterRole", "numastream-view") != nil {
		t.Error("userRoles.aggregate=false still renders the user roles")
	}
}
