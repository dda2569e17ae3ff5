package nodedaemon

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/numastream/numastream/internal/deviceplugin/fakekubelet"
	"github.com/numastream/numastream/internal/nodelabels"
	"github.com/numastream/numastream/internal/testenv"
)

func agentPath(t *testing.T) string { return testenv.Agent(t) }

// sysfsCopy copies an agent fixture tree so a test can change it.
func sysfsCopy(t *testing.T, fixture string) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	src := filepath.Join(filepath.Dir(file), "..", "..", "agent", "tests", "fixtures", fixture)
	dst := t.TempDir()
	if out, err := exec.Command("cp", "-r", src+"/.", dst).CombinedOutput(); err != nil {
		t.Fatalf("copy fixture: %v %s", err, out)
	}
	return dst
}

func fixedBench() *nodelabels.AgentBench {
	b := &nodelabels.AgentBench{}
	b.Codec.CompressMBps, b.Codec.DecompressMBps = 440, 1600
	return b
}

func TestFeaturesFileFollowsTheTopology(t *testing.T) {
	sys := sysfsCopy(t, "paper-gateway")
	dir := t.TempDir()
	d := &Daemon{Agent: Agent{Path: agentPath(t), SysfsRoot: sys}, Publishers: []Publisher{FeaturesDir{Dir: dir}}, Log: logr.Discard()}
	ctx := context.Background()
	if err := d.Once(ctx, fixedBench()); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "numastream"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"numastream.io/nic.ens1f0.numa-node=1\n", "numastream.io/numa1-cpus=16\n", "numastream.io/lz4-compress-mb-per-s=440\n"} {
		if !strings.Contains(string(data), want) {
			t.Errorf("features file lacks %q:\n%s", want, data)
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("temporary files left behind: %v", entries)
	}
	// The NIC moves to NUMA node 0 (firmware setting, hot-plug): the next pass republishes.
	if err := os.WriteFile(filepath.Join(sys, "class/net/ens1f0/device/numa_node"), []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := d.Once(ctx, fixedBench()); err != nil {
		t.Fatal(err)
	}
	data, _ = os.ReadFile(filepath.Join(dir, "numastream"))
	if !strings.Contains(string(data), "numastream.io/nic.ens1f0.numa-node=0\n") {
		t.Errorf("not republished:\n%s", data)
	}
	if err := d.Unpublish(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "numastream")); !os.IsNotExist(err) {
		t.Error("uninstall left the features file")
	}
}

func TestRealBenchCalibrates(t *testing.T) {
	b, err := Agent{Path: agentPath(t), BenchRounds: 1}.Bench(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if b.Codec.CompressMBps < 50 || b.Codec.DecompressMBps < b.Codec.CompressMBps {
		t.Errorf("implausible speeds %+v", b.Codec)
	}
}

func TestAgentFailureIsReported(t *testing.T) {
	_, err := Agent{Path: agentPath(t), SysfsRoot: "/nonexistent"}.Topology(context.Background())
	if err == nil || !strings.Contains(err.Error(), "/nonexistent") {
		t.Fatalf("got %v", err)
	}
}

// The NodeFeature object, against a real kube-apiserver: created with the labels, updated when
// they change, owned by the DaemonSet, deleted on uninstall.
func TestNodeFeatureObject(t *testing.T) {
	testenv.Envtest(t)
	env := &envtest.Environment{CRDDirectoryPaths: []string{"testdata"}, ErrorIfCRDPathMissing: true}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer env.Stop()
	scheme := k8sruntime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "numastream-system"}}
	if err := c.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	owner := &metav1.OwnerReference{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "numastream-node", UID: "ds-uid", Controller: ptr.To(true)}
	pub := NodeFeatureAPI{Client: c, Namespace: ns.Name, Node: "lynx-1", Owner: owner}
	get := func() *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(NodeFeatureGVK)
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns.Name, Name: ObjectName("lynx-1")}, u); err != nil {
			return nil
		}
		return u
	}
	if err := pub.Publish(ctx, map[string]string{"numastream.io/numa-nodes": "2", "numastream.io/nic.ens1f0.numa-node": "1"}); err != nil {
		t.Fatal(err)
	}
	u := get()
	if u == nil {
		t.Fatal("no NodeFeature")
	}
	labels, _, _ := unstructured.NestedStringMap(u.Object, "spec", "labels")
	if labels["numastream.io/nic.ens1f0.numa-node"] != "1" || u.GetLabels()["nfd.node.kubernetes.io/node-name"] != "lynx-1" {
		t.Errorf("object %v", u.Object)
	}
	if refs := u.GetOwnerReferences(); len(refs) != 1 || refs[0].Kind != "DaemonSet" {
		t.Errorf("owner %v", refs)
	}
	// A label disappears (the NIC went away): it must disappear from the object too.
	if err := pub.Publish(ctx, map[string]string{"numastream.io/numa-nodes": "2"}); err != nil {
		t.Fatal(err)
	}
	labels, _, _ = unstructured.NestedStringMap(get().Object, "spec", "labels")
	if _, ok := labels["numastream.io/nic.ens1f0.numa-node"]; ok || len(labels) != 1 {
		t.Errorf("stale label kept: %v", labels)
	}
	if err := pub.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	if get() != nil {
		t.Error("uninstall left the NodeFeature")
	}
	if err := pub.Remove(ctx); err != nil {
		t.Errorf("removing twice: %v", err)
	}
}

// The daemon serves a locality resource for each NIC with a known NUMA node.
func TestDaemonServesNICDevicePlugins(t *testing.T) {
	pluginDir, err := os.MkdirTemp("/tmp", "nd-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(pluginDir)
	got := make(chan *pluginapi.RegisterRequest, 8)
	k, err := fakekubelet.Start(pluginDir, got)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Stop()
	d := &Daemon{Agent: Agent{Path: agentPath(t), SysfsRoot: sysfsCopy(t, "paper-gateway")},
		Publishers: []Publisher{FeaturesDir{Dir: t.TempDir()}}, Tokens: 8, PluginDir: pluginDir, Log: logr.Discard(),
		plugins: map[string]context.CancelFunc{}}
	ctx, cancel := context.WithCancel(context.Background())
	defer func() {
		cancel()
		d.stopPlugins()
	}()
	if err := d.Once(ctx, fixedBench()); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for len(seen) < 2 {
		r := k.Next(10 * time.Second)
		if r == nil {
			t.Fatalf("registrations so far: %v", seen)
		}
		seen[r.ResourceName] = true
	}
	if !seen["numastream.io/nic-ens1f0"] || !seen["numastream.io/nic-eno1"] {
		t.Errorf("resources %v", seen)
	}
}
