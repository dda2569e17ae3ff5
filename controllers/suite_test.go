package controllers

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap/zapcore"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/conditions"
	"github.com/numastream/numastream/internal/curvekeys"
	"github.com/numastream/numastream/internal/observe"
	"github.com/numastream/numastream/internal/render"
	"github.com/numastream/numastream/internal/storage"
	"github.com/numastream/numastream/internal/testenv"
	"github.com/numastream/numastream/internal/topology"
)

// The suite runs against a real kube-apiserver and etcd (envtest), built from the Go module
// proxy by hack/build-k8s-bins.sh; `make test-operator` sets KUBEBUILDER_ASSETS.
var (
	k8s    client.Client
	cached client.Client // the manager's: reads from its informers' caches, as the reconciler does
	ctx    context.Context
	cancel context.CancelFunc
	// agentURL maps a gateway pod to the metrics URL the observer reads (a local server in tests).
	agentURL atomic.Value // func(*corev1.Pod) string
)

// observeEvery is the observer's interval in the suite.
const observeEvery = 500 * time.Millisecond

func TestMain(m *testing.M) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		if os.Getenv("NUMASTREAM_REQUIRE_ENVTEST") != "" {
			fmt.Fprintln(os.Stderr, "KUBEBUILDER_ASSETS is not set: run `make test-operator`")
			os.Exit(1)
		}
		// The table tests (Decide, keys, requests) need no API server: they run; the envtest
		// ones skip (needEnvtest).
		fmt.Fprintln(os.Stderr, "skipping the envtest suite: KUBEBUILDER_ASSETS is not set (run `make test-operator`)")
		os.Exit(m.Run())
	}
	ctrl.SetLogger(zap.New(zap.UseDevMode(true), zap.Level(zapcore.ErrorLevel)))
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "envtest:", err)
		os.Exit(1)
	}
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(v1beta1.AddToScheme(scheme))
	k8s, err = client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		panic(err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}})
	if err != nil {
		panic(err)
	}
	cached = mgr.GetClient()
	ctx, cancel = context.WithCancel(context.Background())
	observer := observe.NewObserver(2 * time.Second)
	agentURL.Store(func(*corev1.Pod) string { return "http://127.0.0.1:1/metrics" })
	observer.URL = func(p *corev1.Pod, _ int32) string { return agentURL.Load().(func(*corev1.Pod) string)(p) }
	r := &StreamPipelineReconciler{
		Client: mgr.GetClient(), Scheme: scheme, Recorder: mgr.GetEventRecorder("numastream-operator"),
		Render:    render.Options{AgentImage: "numastream/agent:test", NetworkPolicy: true, WholeRootVolumes: true},
		APIReader: mgr.GetAPIReader(),
		Final:     observer.Observe,
	}
	if err := r.SetupWithManager(ctx, mgr); err != nil {
		panic(err)
	}
	if err := (&RemoteSiteReconciler{Client: mgr.GetClient()}).SetupWithManager(mgr); err != nil {
		panic(err)
	}
	if err := mgr.Add(&Observer{Client: mgr.GetClient(), Read: observer.Observe, Every: observeEvery}); err != nil {
		panic(err)
	}
	go func() {
		if err := mgr.Start(ctx); err != nil {
			panic(err)
		}
	}()
	code := m.Run()
	cancel()
	_ = env.Stop()
	os.Exit(code)
}

// ---- fixtures ----

type nodeOption func(*corev1.Node)

func facilityNode(name string, numaCPUs []int, nic string, nicNUMA int, speedMbit int, opts ...nodeOption) *corev1.Node {
	labels := map[string]string{
		corev1.LabelHostname:         name,
		topology.LabelNUMANodes:      fmt.Sprint(len(numaCPUs)),
		topology.LabelCompressMBps:   "440",
		topology.LabelDecompressMBps: "1600",
		topology.NICNUMALabel(nic):   fmt.Sprint(nicNUMA),
		topology.NICSpeedLabel(nic):  fmt.Sprint(speedMbit),
	}
	total := 0
	for i, c := range numaCPUs {
		labels[topology.NUMACPUsLabel(i)] = fmt.Sprint(c)
		total += c
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	for _, o := range opts {
		o(n)
	}
	return n
}

func withoutLabel(key string) nodeOption { return func(n *corev1.Node) { delete(n.Labels, key) } }

type spOption func(*v1beta1.StreamPipeline)

func withSenders(nodes ...string) spOption {
	return func(sp *v1beta1.StreamPipeline) {
		sp.Spec.Senders = nil
		for _, n := range nodes {
			sp.Spec.Senders = append(sp.Spec.Senders, v1beta1.Sender{Node: n, Source: v1beta1.Source{Synthetic: &v1beta1.SyntheticSource{Chunks: 1000}}})
		}
	}
}
func withGateway(node string) spOption {
	return func(sp *v1beta1.StreamPipeline) { sp.Spec.Gateway.Node = node }
}
func withConnections(n int32) spOption {
	return func(sp *v1beta1.StreamPipeline) { sp.Spec.Connections = &n }
}

// withSecurity sets the pipeline's security mode (tests whose subject is CPU arithmetic run
// plain: with curve the planner also budgets cipher cores).
func withSecurity(m v1beta1.SecurityMode) spOption {
	return func(sp *v1beta1.StreamPipeline) { sp.Spec.Security = &v1beta1.Security{Mode: m} }
}
func withDecompress(n int32) spOption {
	return func(sp *v1beta1.StreamPipeline) { sp.Spec.Threads = &v1beta1.StageThreads{Decompress: &n} }
}

func pipeline(ns, name string, opts ...spOption) *v1beta1.StreamPipeline {
	sp := &v1beta1.StreamPipeline{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1beta1.StreamPipelineSpec{
			Gateway: v1beta1.Gateway{Node: "lynx-1", Network: v1beta1.DataNetwork{NIC: "ens1f0", Attachment: "hsn-200g",
				// envtest runs no pods, so no network-status: the gateway's data address is given.
				Address: "10.215.0.100"}},
		},
	}
	withSenders("updraft-1")(sp)
	for _, o := range opts {
		o(sp)
	}
	return sp
}

// needEnvtest skips a test that needs the API server when TestMain started none.
func needEnvtest(t *testing.T) {
	t.Helper()
	if k8s == nil {
		t.Skip("envtest: KUBEBUILDER_ASSETS is not set (make test-operator runs it)")
	}
}

func namespace(t *testing.T) string {
	t.Helper()
	needEnvtest(t)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "sp-"}}
	if err := k8s.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

func ensureNode(t *testing.T, n *corev1.Node) {
	t.Helper()
	needEnvtest(t)
	cur := &corev1.Node{}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(n), cur); err == nil {
		cur.Labels = n.Labels
		if err := k8s.Update(ctx, cur); err != nil {
			t.Fatal(err)
		}
		return
	}
	if err := k8s.Create(ctx, n); err != nil {
		t.Fatal(err)
	}
}

// updateSpec changes a pipeline's spec as a user would, on the latest version: the operator
// writes its status meanwhile, so a conflict is retried.
func updateSpec(t *testing.T, sp *v1beta1.StreamPipeline, change func(*v1beta1.StreamPipeline)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &v1beta1.StreamPipeline{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(sp), cur); err != nil {
			return err
		}
		change(cur)
		return k8s.Update(ctx, cur)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// eventually polls cond for up to 20 s.
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	testenv.Eventually(t, what, 20*time.Second, 100*time.Millisecond, cond)
}

func condition(t *testing.T, sp *v1beta1.StreamPipeline, ctype string, status metav1.ConditionStatus, reason string) *v1beta1.StreamPipeline {
	t.Helper()
	return testenv.Condition(ctx, t, k8s, sp, ctype, status, reason, 20*time.Second, 100*time.Millisecond)
}

// ---- tests ----

// gatewayAndSenders labels the four senders and a gateway of the test's own, so that tests do
// not share gateway cores.
func gatewayAndSenders(t *testing.T, gateway string) {
	ensureNode(t, facilityNode(gateway, []int{16, 16}, "ens1f0", 1, 200000))
	for _, n := range []string{"updraft-1", "updraft-2", "polaris-1", "polaris-2"} {
		ensureNode(t, facilityNode(n, []int{16, 16}, "ens1f0", 1, 100000))
	}
}

func TestPlansRendersAndReportsAPipeline(t *testing.T) {
	gatewayAndSenders(t, "lynx-9")
	ns := namespace(t)
	sp := pipeline(ns, "tomo", withGateway("lynx-9"), withSenders("updraft-1", "updraft-2", "polaris-1", "polaris-2"))
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	cur := condition(t, sp, v1beta1.ConditionPlanned, metav1.ConditionTrue, ReasonPlanned)
	if cur.Status.Plan == nil || cur.Status.Plan.Connections != 4 || cur.Status.Bottleneck != "decompress" {
		t.Fatalf("plan %+v bottleneck %s", cur.Status.Plan, cur.Status.Bottleneck)
	}
	if cur.Status.PredictedGbps != "204.8" || cur.Status.Streams != 4 || cur.Status.ExpectedChunks != 4000 {
		t.Errorf("predicted %s streams %d expected chunks %d", cur.Status.PredictedGbps, cur.Status.Streams, cur.Status.ExpectedChunks)
	}
	if cur.Status.ObservedGeneration != cur.Generation {
		t.Errorf("observedGeneration %d != %d", cur.Status.ObservedGeneration, cur.Generation)
	}
	// Status shows where each sender connects: the static data address, each stream's ports.
	eventually(t, "endpoints in status", func() (bool, string) {
		_ = k8s.Get(ctx, client.ObjectKeyFromObject(sp), cur)
		return len(cur.Status.Endpoints) == 4 && cur.Status.Endpoints[0].Endpoint == "tcp://10.215.0.100:5555" &&
			cur.Status.Endpoints[1].Endpoint == "tcp://10.215.0.100:5559", fmt.Sprintf("%+v", cur.Status.Endpoints)
	})
	// Defaults from the schema.
	if cur.Spec.Codec != "lz4" || cur.Spec.ChunkBytes != 11059200 || cur.Spec.Port != 5555 || cur.Spec.Placement != v1beta1.PlacementNUMAAware {
		t.Errorf("defaults %+v", cur.Spec)
	}
	var jobs batchv1.JobList
	eventually(t, "8 jobs", func() (bool, string) {
		_ = k8s.List(ctx, &jobs, client.InNamespace(ns))
		return len(jobs.Items) == 8, fmt.Sprint(len(jobs.Items))
	})
	for _, j := range jobs.Items {
		c := j.Spec.Template.Spec.Containers[0]
		if !metav1.IsControlledBy(&j, cur) {
			t.Errorf("%s not owned by the pipeline", j.Name)
		}
		if j.Labels[render.LabelRole] == render.RoleGateway {
			// One container per stage group: receiving (NIC token, 4 receive cores) and
			// decompressing (4 cores, no NIC token).
			cs := j.Spec.Template.Spec.Containers
			if len(cs) != 2 || cs[0].Name != render.ReceiveContainer || cs[1].Name != render.DecompressContainer {
				t.Fatalf("%s containers %v", j.Name, cs)
			}
			if q := c.Resources.Limits["numastream.io/nic-ens1f0"]; q.Cmp(resource.MustParse("1")) != 0 {
				t.Errorf("%s lacks the NIC token", j.Name)
			}
			if _, ok := cs[1].Resources.Limits["numastream.io/nic-ens1f0"]; ok {
				t.Errorf("%s: the decompressing container holds the NIC token", j.Name)
			}
			if j.Spec.Template.Annotations[render.MultusAnnotation] != "hsn-200g" {
				t.Errorf("%s lacks the Multus annotation", j.Name)
			}
			rx, dx := cs[0].Resources.Limits[corev1.ResourceCPU], cs[1].Resources.Limits[corev1.ResourceCPU]
			if rx.Value() != 4 || dx.Value() != 4 {
				t.Errorf("%s cpus %s + %s, want 4 receive + 4 decompress", j.Name, rx.String(), dx.String())
			}
		}
	}
	var cm corev1.ConfigMap
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "tomo-agent"}, &cm); err != nil {
		t.Fatal(err)
	}
	// Stream 2's receiving container listens on its own ports; its decompressing container reads
	// the pod's IPC socket.
	if !strings.Contains(cm.Data["gateway-2-relay.json"], `"endpoint": "tcp://0.0.0.0:5563"`) {
		t.Errorf("gateway-2 relay config %s", cm.Data["gateway-2-relay.json"])
	}
	if !strings.Contains(cm.Data["gateway-2.json"], `"endpoint": "`+render.RelaySocket+`"`) {
		t.Errorf("gateway-2 config %s", cm.Data["gateway-2.json"])
	}
	var svcs corev1.ServiceList
	_ = k8s.List(ctx, &svcs, client.InNamespace(ns))
	if len(svcs.Items) != 4 {
		t.Errorf("%d services", len(svcs.Items))
	}
	// No pods run in envtest: Ready stays False with the Jobs named.
	condition(t, sp, v1beta1.ConditionReady, metav1.ConditionFalse, ReasonPending)
}

func TestBadManifestsAreRefusedNamingTheField(t *testing.T) {
	ns := namespace(t)
	cases := map[string]struct {
		mutate func(*v1beta1.StreamPipeline)
		want   string
	}{
		"two sources": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Senders[0].Source.File = &v1beta1.FileSource{Root: "scratch", Path: "data"}
		}, "exactly one of synthetic, file, zmq, hdf5 or stream2"},
		"no source": {func(sp *v1beta1.StreamPipeline) { sp.Spec.Senders[0].Source = v1beta1.Source{} }, "exactly one of synthetic, file, zmq, hdf5 or stream2"},
		"synthetic and hdf5": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Senders[0].Source.HDF5 = &v1beta1.HDF5Dataset{Root: "scratch", Path: "data/tomo.h5"}
		}, "exactly one of synthetic, file, zmq, hdf5 or stream2"},
		"relative dataset": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Senders[0].Source = v1beta1.Source{HDF5: &v1beta1.HDF5Dataset{Root: "scratch", Path: "data/tomo.h5", Dataset: "exchange/data"}}
		}, "spec.senders[0].source.hdf5.dataset"},
		"direct I/O asked of a source": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Senders[0].Source = v1beta1.Source{HDF5: &v1beta1.HDF5Dataset{Root: "scratch", Path: "data/tomo.h5", IO: "direct"}}
		}, "hdf5.io is how a gateway writes a sink's files"},
		"nxmx asked of a source": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Senders[0].Source = v1beta1.Source{HDF5: &v1beta1.HDF5Dataset{Root: "scratch", Path: "data/tomo.h5", NXmx: &v1beta1.NXmxFiles{}}}
		}, "hdf5.nxmx is how a gateway writes a sink's series"},
		"nxmx files of frames, not series": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sink = &v1beta1.Sink{HDF5: &v1beta1.HDF5Dataset{Root: "archive", Path: "scan.h5", NXmx: &v1beta1.NXmxFiles{}}}
		}, "sink.hdf5.nxmx writes Stream V2 series: every sender's source must be stream2"},
		"nxmx data files of too many images": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Senders[0].Source = v1beta1.Source{Stream2: &v1beta1.ZMQEndpoint{Endpoint: "tcp://dcu:31001"}}
			sp.Spec.Sink = &v1beta1.Sink{HDF5: &v1beta1.HDF5Dataset{Root: "archive", Path: "{series}.h5", NXmx: &v1beta1.NXmxFiles{FramesPerFile: 2000000}}}
		}, "spec.sink.hdf5.nxmx.framesPerFile"},
		"unknown sink io": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sink = &v1beta1.Sink{HDF5: &v1beta1.HDF5Dataset{Root: "archive", Path: "scan.h5", IO: "o_direct"}}
		}, "spec.sink.hdf5.io"},
		"several senders into one hdf5 file": {func(sp *v1beta1.StreamPipeline) {
			withSenders("updraft-1", "updraft-2")(sp)
			sp.Spec.Sink = &v1beta1.Sink{HDF5: &v1beta1.HDF5Dataset{Root: "archive", Path: "scan.h5"}}
		}, "sink.hdf5.path must contain {stream}"},
		"stream2 sink without a stream2 source": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sink = &v1beta1.Sink{Stream2: &v1beta1.Stream2Sink{}}
		}, "every sender's source must be stream2"},
		"stream2 sink for two detectors": {func(sp *v1beta1.StreamPipeline) {
			withSenders("updraft-1", "updraft-2")(sp)
			for i := range sp.Spec.Senders {
				sp.Spec.Senders[i].Source = v1beta1.Source{Stream2: &v1beta1.ZMQEndpoint{Endpoint: "tcp://dcu:31001"}}
			}
			sp.Spec.Sink = &v1beta1.Sink{Stream2: &v1beta1.Stream2Sink{}}
		}, "one sender per StreamPipeline"},
		"no senders":       {func(sp *v1beta1.StreamPipeline) { sp.Spec.Senders = nil }, "spec.senders"},
		"zero connections": {func(sp *v1beta1.StreamPipeline) { sp.Spec.Connections = ptr.To[int32](0) }, "spec.connections"},
		"hostNetwork with an attachment": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.HostNetwork = true
			sp.Spec.Gateway.Network.Attachment = "hsn-200g"
		}, "leave gateway.network.attachment unset"},
		"too many threads": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Threads = &v1beta1.StageThreads{Compress: ptr.To[int32](5000)}
		}, "spec.threads.compress"},
		"port out of range": {func(sp *v1beta1.StreamPipeline) { sp.Spec.Port = 70000 }, "spec.port"},
		"ports run past 65535": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Port = 65530
			sp.Spec.Connections = ptr.To[int32](10)
		}, "port + connections must not run past 65535"},
		"chunk too small": {func(sp *v1beta1.StreamPipeline) { sp.Spec.ChunkBytes = 100 }, "spec.chunkBytes"},
		"unknown codec":   {func(sp *v1beta1.StreamPipeline) { sp.Spec.Codec = "zstd" }, "spec.codec"},
		// Storage: a root or a claim, never both or neither, and a relative path that stays under it:
		// no absolute path, no ".." or "." segment, no empty one.
		"a path with neither root nor claim": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sink = &v1beta1.Sink{File: &v1beta1.FileSource{Path: "x.raw"}}
		}, "name exactly one of root (a StorageRoot) or claim"},
		"a path with a root and a claim": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sink = &v1beta1.Sink{HDF5: &v1beta1.HDF5Dataset{Root: "archive", Claim: "gpfs", Path: "x.h5"}}
		}, "name exactly one of root (a StorageRoot) or claim"},
		"a bad claim name": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sink = &v1beta1.Sink{File: &v1beta1.FileSource{Claim: "../gpfs", Path: "x.raw"}}
		}, "spec.sink.file.claim"},
		"absolute sink path": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sink = &v1beta1.Sink{File: &v1beta1.FileSource{Root: "archive", Path: "/etc/kubernetes/manifests/x-{stream}.yaml"}}
		}, "spec.sink.file.path"},
		"sink path at the host's root": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sink = &v1beta1.Sink{File: &v1beta1.FileSource{Root: "archive", Path: "/x-{stream}"}}
		}, "spec.sink.file.path"},
		"sink path escaping with ..": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sink = &v1beta1.Sink{File: &v1beta1.FileSource{Root: "archive", Path: "../etc/kubernetes/manifests/x.yaml"}}
		}, "spec.sink.file.path"},
		"hdf5 sink path ending in ..": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sink = &v1beta1.Sink{HDF5: &v1beta1.HDF5Dataset{Root: "archive", Path: "run/../../.."}}
		}, "spec.sink.hdf5.path"},
		"hdf5 sink path of .. alone": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sink = &v1beta1.Sink{HDF5: &v1beta1.HDF5Dataset{Root: "archive", Path: ".."}}
		}, "spec.sink.hdf5.path"},
		"sink path with a . segment": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sink = &v1beta1.Sink{File: &v1beta1.FileSource{Root: "archive", Path: "./x"}}
		}, "spec.sink.file.path"},
		"sink path with an empty segment": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sink = &v1beta1.Sink{File: &v1beta1.FileSource{Root: "archive", Path: "run//x"}}
		}, "spec.sink.file.path"},
		"sink path ending in /": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sink = &v1beta1.Sink{File: &v1beta1.FileSource{Root: "archive", Path: "run/"}}
		}, "spec.sink.file.path"},
		"empty sink path": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sink = &v1beta1.Sink{File: &v1beta1.FileSource{Root: "archive", Path: ""}}
		}, "spec.sink.file.path"},
		"absolute source path": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Senders[0].Source = v1beta1.Source{File: &v1beta1.FileSource{Root: "scratch", Path: "/scratch/data"}}
		}, "spec.senders[0].source.file.path"},
		"source path escaping with ..": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Senders[0].Source = v1beta1.Source{File: &v1beta1.FileSource{Root: "scratch", Path: "../../root/.ssh"}}
		}, "spec.senders[0].source.file.path"},
		"hdf5 source path escaping with ..": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Senders[0].Source = v1beta1.Source{HDF5: &v1beta1.HDF5Dataset{Root: "scratch", Path: "scan/../../etc/shadow"}}
		}, "spec.senders[0].source.hdf5.path"},
		"absolute spill path": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Spill = &v1beta1.Spill{MaxBytes: 1 << 30, Root: "nvme", Path: "/var/lib/kubelet"}
		}, "spec.spill.path"},
		"spill path escaping with ..": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Spill = &v1beta1.Spill{MaxBytes: 1 << 30, Root: "nvme", Path: "spill/../../var/lib/kubelet"}
		}, "spec.spill.path"},
		"a spill path without a root": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Spill = &v1beta1.Spill{MaxBytes: 1 << 30, Path: "spill"}
		}, "spill.path is relative to spill.root"},
		"keys rotated too often": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Security = &v1beta1.Security{RotateEvery: &metav1.Duration{Duration: 30 * time.Second}}
		}, "rotateEvery must be at least 1m"},
		"a keysSecret rotated by the operator": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Security = &v1beta1.Security{KeysSecret: "mine", RotateEvery: &metav1.Duration{Duration: time.Hour}}
		}, "rotate a keysSecret of your own yourself"},
		"allowFrom not an address block": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Security = &v1beta1.Security{AllowFrom: []string{"10.40.0.0/24", "detector-1.beamline"}}
		}, "spec.security.allowFrom[1]"},
		"allowFrom prefix past the address": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Security = &v1beta1.Security{AllowFrom: []string{"10.40.0.0/33"}}
		}, "spec.security.allowFrom[0]"},
		"allowFrom host bits past the prefix": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Security = &v1beta1.Security{AllowFrom: []string{"10.40.0.7/8"}}
		}, "no bits set past its prefix"},
		"allowFrom a bare address": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Security = &v1beta1.Security{AllowFrom: []string{"fd00::7"}}
		}, "spec.security.allowFrom[0]"},
		"files as root": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Files = &v1beta1.Files{User: ptr.To[int64](0)}
		}, "spec.files.user"},
		"files as group root": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Files = &v1beta1.Files{Group: ptr.To[int64](0)}
		}, "spec.files.group"},
		"files others may write":       {func(sp *v1beta1.StreamPipeline) { sp.Spec.Files = &v1beta1.Files{Mode: "0666"} }, "spec.files.mode"},
		"files the owner cannot write": {func(sp *v1beta1.StreamPipeline) { sp.Spec.Files = &v1beta1.Files{Mode: "0440"} }, "spec.files.mode"},
		"executable files":             {func(sp *v1beta1.StreamPipeline) { sp.Spec.Files = &v1beta1.Files{Mode: "0750"} }, "spec.files.mode"},
		"bad endpoint": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Senders[0].Source = v1beta1.Source{ZMQ: &v1beta1.ZMQEndpoint{Endpoint: "udp://x"}}
		}, "spec.senders[0].source.zmq.endpoint"},
		"bad NIC name": {func(sp *v1beta1.StreamPipeline) { sp.Spec.Gateway.Network.NIC = "ens1f0; rm" }, "spec.gateway.network.nic"},
		"two sinks": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sink = &v1beta1.Sink{File: &v1beta1.FileSource{Root: "archive", Path: "a"}, ZMQ: &v1beta1.ZMQEndpoint{Endpoint: "tcp://h:1"}}
		}, "at most one of file, zmq, hdf5 or stream2"},
		"file and hdf5 sinks": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sink = &v1beta1.Sink{File: &v1beta1.FileSource{Root: "archive", Path: "a"}, HDF5: &v1beta1.HDF5Dataset{Root: "archive", Path: "b.h5"}}
		}, "at most one of file, zmq, hdf5 or stream2"},
		"duplicate sender": {func(sp *v1beta1.StreamPipeline) { sp.Spec.Senders = append(sp.Spec.Senders, sp.Spec.Senders[0]) }, "spec.senders[1]"},
		"bad ratio":        {func(sp *v1beta1.StreamPipeline) { sp.Spec.ExpectedRatio = "two" }, "spec.expectedRatio"},
		"bad placement":    {func(sp *v1beta1.StreamPipeline) { sp.Spec.Placement = "pinned" }, "spec.placement"},
		"several senders into one file": {func(sp *v1beta1.StreamPipeline) {
			withSenders("updraft-1", "updraft-2")(sp)
			sp.Spec.Sink = &v1beta1.Sink{File: &v1beta1.FileSource{Root: "archive", Path: "scan.raw"}}
		}, "sink.file.path must contain {stream}"},
		"sink and sinks": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sink = &v1beta1.Sink{File: &v1beta1.FileSource{Root: "archive", Path: "a.raw"}}
			sp.Spec.Sinks = []v1beta1.Consumer{{Name: "live", Sink: v1beta1.Sink{ZMQ: &v1beta1.ZMQEndpoint{Endpoint: "tcp://viewer:7000"}}}}
		}, "give sink (one) or sinks (several consumers at once), not both"},
		"no lossless consumer": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sinks = []v1beta1.Consumer{{Name: "live", Guarantee: v1beta1.GuaranteeLatest, Sink: v1beta1.Sink{ZMQ: &v1beta1.ZMQEndpoint{Endpoint: "tcp://viewer:7000"}}}}
		}, "at least one must be lossless"},
		"a latest-only file": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sinks = []v1beta1.Consumer{{Name: "files", Guarantee: v1beta1.GuaranteeLatest, Sink: v1beta1.Sink{File: &v1beta1.FileSource{Root: "archive", Path: "a.raw"}}},
				{Name: "live", Sink: v1beta1.Sink{ZMQ: &v1beta1.ZMQEndpoint{Endpoint: "tcp://viewer:7000"}}}}
		}, "latest-only is for a live zmq consumer"},
		"a consumer of two kinds": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sinks = []v1beta1.Consumer{{Name: "both", Sink: v1beta1.Sink{File: &v1beta1.FileSource{Root: "archive", Path: "a.raw"},
				ZMQ: &v1beta1.ZMQEndpoint{Endpoint: "tcp://viewer:7000"}}}}
		}, "a consumer is exactly one of file, zmq, hdf5, stream2 or onward"},
		"a consumer of no kind": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sinks = []v1beta1.Consumer{{Name: "none"}}
		}, "a consumer is exactly one of file, zmq, hdf5, stream2 or onward"},
		"two consumers of one name": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sinks = []v1beta1.Consumer{{Name: "a", Sink: v1beta1.Sink{File: &v1beta1.FileSource{Root: "archive", Path: "a.raw"}}},
				{Name: "a", Sink: v1beta1.Sink{ZMQ: &v1beta1.ZMQEndpoint{Endpoint: "tcp://viewer:7000"}}}}
		}, "Duplicate value"},
		"a consumer name that is not a DNS label": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sinks = []v1beta1.Consumer{{Name: "../x", Sink: v1beta1.Sink{File: &v1beta1.FileSource{Root: "archive", Path: "a.raw"}}}}
		}, "spec.sinks[0].name"},
		"nine consumers": {func(sp *v1beta1.StreamPipeline) {
			for i := 0; i < 9; i++ {
				sp.Spec.Sinks = append(sp.Spec.Sinks, v1beta1.Consumer{Name: fmt.Sprintf("z%d", i),
					Sink: v1beta1.Sink{ZMQ: &v1beta1.ZMQEndpoint{Endpoint: fmt.Sprintf("tcp://viewer:%d", 7000+i)}}})
			}
		}, "spec.sinks: Too many"},
		"a stream2 consumer of a synthetic source": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sinks = []v1beta1.Consumer{{Name: "again", Sink: v1beta1.Sink{Stream2: &v1beta1.Stream2Sink{}}}}
		}, "a stream2 consumer re-emits the series of one detector"},
		"two stream2 consumers": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Senders[0].Source = v1beta1.Source{Stream2: &v1beta1.ZMQEndpoint{Endpoint: "tcp://dcu:31001"}}
			sp.Spec.Sinks = []v1beta1.Consumer{{Name: "a", Sink: v1beta1.Sink{Stream2: &v1beta1.Stream2Sink{Port: 31001}}},
				{Name: "b", Sink: v1beta1.Sink{Stream2: &v1beta1.Stream2Sink{Port: 31002}}}}
		}, "one stream2 re-emit per pipeline"},
		"nxmx consumer of frames": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sinks = []v1beta1.Consumer{{Name: "mx", Sink: v1beta1.Sink{HDF5: &v1beta1.HDF5Dataset{Root: "archive", Path: "scan.h5", NXmx: &v1beta1.NXmxFiles{}}}}}
		}, "hdf5.nxmx writes Stream V2 series"},
		"several senders into one consumer's file": {func(sp *v1beta1.StreamPipeline) {
			withSenders("updraft-1", "updraft-2")(sp)
			sp.Spec.Sinks = []v1beta1.Consumer{{Name: "raw", Sink: v1beta1.Sink{File: &v1beta1.FileSource{Root: "archive", Path: "scan.raw"}}}}
		}, "path must contain {stream} when there are several senders"},
		"an onward hop as the only sink": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sink = &v1beta1.Sink{Onward: &v1beta1.OnwardSink{Endpoint: "tcp://dtn:7000", ServerKey: farKey}}
		}, "the onward hop is one of spec.sinks"},
		"an encrypted onward hop without the far receiver's key": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sinks = []v1beta1.Consumer{{Name: "hpc", Sink: v1beta1.Sink{Onward: &v1beta1.OnwardSink{Endpoint: "tcp://dtn:7000"}}}}
		}, "sinks[].onward.serverKey: the far receiver's public key is required"},
		"a hop on a plain pipeline without the far receiver's key": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Security = &v1beta1.Security{Mode: v1beta1.SecurityNone}
			sp.Spec.Sinks = []v1beta1.Consumer{{Name: "hpc", Sink: v1beta1.Sink{Onward: &v1beta1.OnwardSink{Endpoint: "tcp://dtn:7000"}}}}
		}, "whatever spec.security.mode says"},
		"a far receiver's key on an insecure-plaintext hop": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sinks = []v1beta1.Consumer{{Name: "hpc", Sink: v1beta1.Sink{Onward: &v1beta1.OnwardSink{Endpoint: "tcp://dtn:7000", ServerKey: farKey, InsecurePlaintext: true}}}}
		}, "unless insecurePlaintext is true; not both"},
		"a far receiver's key that is not one": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sinks = []v1beta1.Consumer{{Name: "hpc", Sink: v1beta1.Sink{Onward: &v1beta1.OnwardSink{Endpoint: "tcp://dtn:7000", ServerKey: "short\"key"}}}}
		}, "spec.sinks[0].onward.serverKey"},
		"an onward hop naming a site and an endpoint": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sinks = []v1beta1.Consumer{{Name: "hpc", Sink: v1beta1.Sink{Onward: &v1beta1.OnwardSink{Site: "dtn", Endpoint: "tcp://dtn:7000"}}}}
		}, "name the far site (site, a RemoteSite) or describe it (endpoint): one of the two"},
		"an onward hop naming a site with a key of its own": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sinks = []v1beta1.Consumer{{Name: "hpc", Sink: v1beta1.Sink{Onward: &v1beta1.OnwardSink{Site: "dtn", ServerKey: farKey}}}}
		}, "the RemoteSite holds the far site's key and link"},
		"seventeen onward connections": {func(sp *v1beta1.StreamPipeline) {
			n := int32(17)
			sp.Spec.Sinks = []v1beta1.Consumer{{Name: "hpc", Sink: v1beta1.Sink{Onward: &v1beta1.OnwardSink{Endpoint: "tcp://dtn:7000", ServerKey: farKey, Connections: &n}}}}
		}, "spec.sinks[0].onward.connections"},
		"a loss over 100 percent": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sinks = []v1beta1.Consumer{{Name: "hpc", Sink: v1beta1.Sink{Onward: &v1beta1.OnwardSink{Endpoint: "tcp://dtn:7000", ServerKey: farKey,
				Link: &v1beta1.OnwardLink{LossPercent: "250"}}}}}
		}, "spec.sinks[0].onward.link.lossPercent"},
		"a spill for a latest-only consumer": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sinks = []v1beta1.Consumer{{Name: "files", Sink: v1beta1.Sink{File: &v1beta1.FileSource{Root: "archive", Path: "a.raw"}}},
				{Name: "live", Guarantee: v1beta1.GuaranteeLatest, Spill: &v1beta1.ConsumerSpill{MaxBytes: 1 << 30, Root: "nvme"},
					Sink: v1beta1.Sink{ZMQ: &v1beta1.ZMQEndpoint{Endpoint: "tcp://viewer:7000"}}}}
		}, "a latest-only consumer passes chunks over instead: a spill is for a lossless one"},
		"a consumer spill on no root (an emptyDir would lose acknowledged chunks)": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sinks = []v1beta1.Consumer{{Name: "files", Spill: &v1beta1.ConsumerSpill{MaxBytes: 1 << 30},
				Sink: v1beta1.Sink{File: &v1beta1.FileSource{Root: "archive", Path: "a.raw"}}}}
		}, "spec.sinks[0].spill.root"},
		"a consumer spill under a megabyte": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sinks = []v1beta1.Consumer{{Name: "files", Spill: &v1beta1.ConsumerSpill{MaxBytes: 4096, Root: "nvme"},
				Sink: v1beta1.Sink{File: &v1beta1.FileSource{Root: "archive", Path: "a.raw"}}}}
		}, "spec.sinks[0].spill.maxBytes"},
		"a consumer spill path leaving its root": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sinks = []v1beta1.Consumer{{Name: "files", Spill: &v1beta1.ConsumerSpill{MaxBytes: 1 << 30, Root: "nvme", Path: "a/../../etc"},
				Sink: v1beta1.Sink{File: &v1beta1.FileSource{Root: "archive", Path: "a.raw"}}}}
		}, "spec.sinks[0].spill.path"},
		"pods pick their own node": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Pods = &v1beta1.PodSettings{NodeSelector: map[string]string{"kubernetes.io/hostname": "elsewhere"}}
		}, "kubernetes.io/hostname is set by the plan"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			sp := pipeline(ns, "bad-"+strings.ReplaceAll(strings.ReplaceAll(name, " ", "-"), "+", ""))
			tc.mutate(sp)
			err := k8s.Create(ctx, sp)
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error does not name %q: %v", tc.want, err)
			}
		})
	}
}

func TestGatewayIsImmutable(t *testing.T) {
	gatewayAndSenders(t, "lynx-1")
	ns := namespace(t)
	sp := pipeline(ns, "moving")
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	// A patch, not an update: the operator writes the pipeline's status meanwhile.
	moved := sp.DeepCopy()
	moved.Spec.Gateway.Node = "lynx-2"
	err := k8s.Patch(ctx, moved, client.MergeFrom(sp))
	if err == nil || !strings.Contains(err.Error(), "gateway is immutable") {
		t.Fatalf("got %v", err)
	}
}

func TestMissingLabelThenLabelledNodeReplans(t *testing.T) {
	gatewayAndSenders(t, "lynx-2")
	ensureNode(t, facilityNode("bare-gw", []int{8, 8}, "ens2", 0, 100000, withoutLabel(topology.LabelDecompressMBps)))
	ns := namespace(t)
	sp := pipeline(ns, "waiting", withGateway("bare-gw"))
	sp.Spec.Gateway.Network.NIC = "ens2"
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	cur := condition(t, sp, v1beta1.ConditionPlanned, metav1.ConditionFalse, ReasonMissingNodeLabels)
	c := meta.FindStatusCondition(cur.Status.Conditions, v1beta1.ConditionPlanned)
	if !strings.Contains(c.Message, topology.LabelDecompressMBps) || !strings.Contains(c.Message, "bare-gw") {
		t.Errorf("message does not name the label: %s", c.Message)
	}
	// The node daemon publishes the label: the operator re-plans by itself.
	ensureNode(t, facilityNode("bare-gw", []int{8, 8}, "ens2", 0, 100000))
	cur = condition(t, sp, v1beta1.ConditionPlanned, metav1.ConditionTrue, ReasonPlanned)
	if cur.Status.Plan.NICNUMANode != 0 {
		t.Errorf("NIC node %d", cur.Status.Plan.NICNUMANode)
	}
	// The NIC moves to node 1 (a label change): a new plan, and the gateway Job is replaced.
	var before batchv1.Job
	eventually(t, "gateway job", func() (bool, string) {
		err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "waiting-gateway-0"}, &before)
		return err == nil, fmt.Sprint(err)
	})
	ensureNode(t, facilityNode("bare-gw", []int{8, 8}, "ens2", 1, 100000))
	eventually(t, "re-plan onto NUMA node 1", func() (bool, string) {
		_ = k8s.Get(ctx, client.ObjectKeyFromObject(sp), cur)
		return cur.Status.Plan != nil && cur.Status.Plan.NICNUMANode == 1, fmt.Sprint(cur.Status.Plan)
	})
	eventually(t, "gateway job replaced", func() (bool, string) {
		var after batchv1.Job
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "waiting-gateway-0"}, &after); err != nil {
			return false, err.Error()
		}
		return after.UID != before.UID && after.Annotations[render.AnnotationPlanHash] != before.Annotations[render.AnnotationPlanHash], "same job"
	})
}

func TestFourPipelinesShareAGatewayAndTheFifthIsRefused(t *testing.T) {
	gatewayAndSenders(t, "shared-gw")
	ns := namespace(t)
	for i := 0; i < 4; i++ {
		sp := pipeline(ns, fmt.Sprintf("beam-%d", i), withGateway("shared-gw"), withConnections(4), withDecompress(4))
		if err := k8s.Create(ctx, sp); err != nil {
			t.Fatal(err)
		}
		condition(t, sp, v1beta1.ConditionPlanned, metav1.ConditionTrue, ReasonPlanned)
		time.Sleep(1100 * time.Millisecond) // distinct creation timestamps: age decides
	}
	fifth := pipeline(ns, "beam-4", withGateway("shared-gw"), withConnections(4))
	if err := k8s.Create(ctx, fifth); err != nil {
		t.Fatal(err)
	}
	cur := condition(t, fifth, v1beta1.ConditionPlanned, metav1.ConditionFalse, ReasonNoCapacity)
	msg := meta.FindStatusCondition(cur.Status.Conditions, v1beta1.ConditionPlanned).Message
	for _, want := range []string{"shared-gw", "NUMA node 1", "ens1f0", "0 free cores", "hold 16"} {
		if !strings.Contains(msg, want) {
			t.Errorf("reason %q lacks %q", msg, want)
		}
	}
	// The older four keep their plans.
	for i := 0; i < 4; i++ {
		condition(t, pipeline(ns, fmt.Sprintf("beam-%d", i)), v1beta1.ConditionPlanned, metav1.ConditionTrue, ReasonPlanned)
	}
	// Deleting one frees its cores: the fifth fits.
	if err := k8s.Delete(ctx, pipeline(ns, "beam-0")); err != nil {
		t.Fatal(err)
	}
	condition(t, fifth, v1beta1.ConditionPlanned, metav1.ConditionTrue, ReasonPlanned)
}

func TestTopologyAffinityErrorReplansWithFewerReceivingCores(t *testing.T) {
	gatewayAndSenders(t, "lynx-3")
	ns := namespace(t)
	sp := pipeline(ns, "rejected", withGateway("lynx-3"))
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	cur := condition(t, sp, v1beta1.ConditionPlanned, metav1.ConditionTrue, ReasonPlanned)
	asked := cur.Status.Plan.Connections
	if asked < 2 {
		t.Fatalf("the first plan asks for %d receiving cores; the test needs at least 2", asked)
	}
	// What the kubelet leaves behind when Topology Manager refuses a pod.
	reject := func(name string) *corev1.Pod {
		t.Helper()
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
				Labels: map[string]string{render.LabelPipeline: "rejected", render.LabelRole: render.RoleGateway, render.LabelStream: "0"}},
			Spec: corev1.PodSpec{NodeName: "lynx-3", Containers: []corev1.Container{{Name: "agent", Image: "x"}}},
		}
		if err := k8s.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
		pod.Status = corev1.PodStatus{Phase: corev1.PodFailed, Reason: "TopologyAffinityError",
			Message: "Pod was rejected: Resources cannot be allocated with Topology locality"}
		if err := k8s.Status().Update(ctx, pod); err != nil {
			t.Fatal(err)
		}
		return pod
	}
	pod := reject("rejected-gateway-0-abcde")
	cur = condition(t, sp, v1beta1.ConditionDegraded, metav1.ConditionTrue, ReasonTopologyAffinity)
	msg := meta.FindStatusCondition(cur.Status.Conditions, v1beta1.ConditionDegraded).Message
	if !strings.Contains(msg, pod.Name) || !strings.Contains(msg, "lynx-3") {
		t.Errorf("message %q", msg)
	}
	// Never the same plan again: one receiving core fewer, and the rejected pod deleted so the
	// Job makes a new one with it.
	eventually(t, "a plan with fewer receiving cores", func() (bool, string) {
		_ = k8s.Get(ctx, client.ObjectKeyFromObject(sp), cur)
		return cur.Status.Plan.Connections == asked-1, fmt.Sprintf("plan %d connections, rejection %+v", cur.Status.Plan.Connections, cur.Status.TopologyRejection)
	})
	eventually(t, "rejected pod deleted", func() (bool, string) {
		err := k8s.Get(ctx, client.ObjectKeyFromObject(pod), &corev1.Pod{})
		return err != nil, "still there"
	})
	// Refused down to nothing: the pipeline is not planned, stalled, saying why.
	for i := int32(1); i < asked; i++ {
		reject(fmt.Sprintf("rejected-gateway-0-r%d", i))
		want := asked - 1 - i
		eventually(t, fmt.Sprintf("cap %d", want), func() (bool, string) {
			_ = k8s.Get(ctx, client.ObjectKeyFromObject(sp), cur)
			tr := cur.Status.TopologyRejection
			return tr != nil && tr.ReceiveCores == want, fmt.Sprintf("%+v", tr)
		})
	}
	cur = condition(t, sp, v1beta1.ConditionPlanned, metav1.ConditionFalse, ReasonTopologyAffinity)
	if c := meta.FindStatusCondition(cur.Status.Conditions, conditions.Stalled); c == nil || c.Status != metav1.ConditionTrue ||
		!strings.Contains(c.Message, "even with 1 receiving core") {
		t.Errorf("Stalled: %+v", c)
	}
	// A changed spec plans afresh.
	updateSpec(t, sp, func(s *v1beta1.StreamPipeline) { s.Spec.ExpectedRatio = "2.5" })
	condition(t, sp, v1beta1.ConditionPlanned, metav1.ConditionTrue, ReasonPlanned)
}

// What stops a pipeline's pods shows up as a condition with its reason: the scheduler's
// refusal, and an admission refusal that leaves a Job without a pod (envtest runs no scheduler
// and no Job controller: the test writes what they would).
func TestUnschedulableAndRefusedPodsStallWithTheirReason(t *testing.T) {
	gatewayAndSenders(t, "lynx-13")
	ns := namespace(t)
	sp := pipeline(ns, "stuck", withGateway("lynx-13"))
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	condition(t, sp, v1beta1.ConditionPlanned, metav1.ConditionTrue, ReasonPlanned)
	var jobs batchv1.JobList
	eventually(t, "2 jobs", func() (bool, string) {
		_ = k8s.List(ctx, &jobs, client.InNamespace(ns))
		return len(jobs.Items) == 2, fmt.Sprint(len(jobs.Items))
	})
	var sender, gateway *batchv1.Job
	for i := range jobs.Items {
		if jobs.Items[i].Labels[render.LabelRole] == render.RoleGateway {
			gateway = &jobs.Items[i]
		} else {
			sender = &jobs.Items[i]
		}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: sender.Name + "-x", Namespace: ns, Labels: map[string]string{
			render.LabelPipeline: "stuck", render.LabelRole: render.RoleSender, batchv1.JobNameLabel: sender.Name}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: "x"}}},
	}
	if err := k8s.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status.Phase = corev1.PodPending
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
		Reason: corev1.PodReasonUnschedulable, Message: "0/14 nodes are available: 1 Insufficient cpu"}}
	if err := k8s.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	cur := condition(t, sp, v1beta1.ConditionReady, metav1.ConditionFalse, conditions.ReasonUnschedulable)
	if c := meta.FindStatusCondition(cur.Status.Conditions, v1beta1.ConditionReady); !strings.Contains(c.Message, "Insufficient cpu") {
		t.Errorf("Ready message %q lacks the scheduler's", c.Message)
	}
	condition(t, sp, conditions.Stalled, metav1.ConditionTrue, conditions.ReasonUnschedulable)

	// Scheduled after all; the gateway's Job cannot create its pod.
	if err := k8s.Delete(ctx, pod); err != nil {
		t.Fatal(err)
	}
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: gateway.Name + ".1", Namespace: ns},
		InvolvedObject: corev1.ObjectReference{Kind: "Job", Namespace: ns, Name: gateway.Name, UID: gateway.UID, APIVersion: "batch/v1"},
		Reason:         "FailedCreate", Type: corev1.EventTypeWarning, LastTimestamp: metav1.Now(),
		Message: `Error creating: pods "` + gateway.Name + `-q" is forbidden: violates PodSecurity "restricted:latest": hostPath volumes`,
	}
	if err := k8s.Create(ctx, ev); err != nil {
		t.Fatal(err)
	}
	cur = condition(t, sp, v1beta1.ConditionReady, metav1.ConditionFalse, conditions.ReasonAdmission)
	if c := meta.FindStatusCondition(cur.Status.Conditions, v1beta1.ConditionReady); !strings.Contains(c.Message, "PodSecurity") {
		t.Errorf("Ready message %q", c.Message)
	}
	var evs corev1.EventList
	eventually(t, "a Warning event", func() (bool, string) {
		_ = k8s.List(ctx, &evs, client.InNamespace(ns))
		for _, e := range evs.Items {
			if e.InvolvedObject.Kind == "StreamPipeline" && e.Reason == conditions.ReasonAdmission && e.Type == corev1.EventTypeWarning {
				return true, ""
			}
		}
		return false, fmt.Sprint(len(evs.Items), " events")
	})
}

// The observer reads the agents at its interval, apart from Reconcile; what it writes (rates,
// timestamps) does not make the pipeline reconcile again, so a running pipeline is reconciled a
// handful of times in a quarter of a minute at most, not once per reading.
func TestObserverReadsAtItsIntervalWithoutReconcileLoops(t *testing.T) {
	gatewayAndSenders(t, "lynx-14")
	ns := namespace(t)
	sp := pipeline(ns, "quiet", withGateway("lynx-14"))
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	var scrapes atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		d := scrapes.Add(1) * 10
		fmt.Fprintf(w, "numastream_raw_bytes_total{role=\"receive\"} %d\n", d*11059200)
		fmt.Fprintf(w, "numastream_wire_bytes_total{role=\"receive\"} %d\n", d*5529600)
		fmt.Fprintf(w, "numastream_chunks_delivered_total{role=\"receive\"} %d\n", d)
		fmt.Fprintf(w, "numastream_chunks_lost{role=\"receive\"} 0\nnumastream_chunks_corrupt_total{role=\"receive\"} 0\n")
		fmt.Fprintf(w, "numastream_nic_local{role=\"receive\",stage=\"receive\"} 1\n")
	}))
	defer srv.Close()
	agentsServedBy(t, ns, srv.URL)
	runAgents(t, ns, "quiet", "lynx-14")
	condition(t, sp, v1beta1.ConditionReady, metav1.ConditionTrue, ReasonRunning)
	condition(t, sp, v1beta1.ConditionNICLocal, metav1.ConditionTrue, ReasonReceiversNICLocal)

	count := func(c *prometheus.CounterVec) float64 { return counter(t, c, ns) } // the namespace has this one pipeline
	r0, s0 := count(reconciles), scrapes.Load()
	// 30 readings: a reconcile per reading would be 30 reconciles, five times the bound below.
	const window = 15 * time.Second
	time.Sleep(window)
	r1, s1 := count(reconciles), scrapes.Load()
	readings := float64(s1 - s0)
	t.Logf("over %s: %.0f reconciles, %.0f readings of the agent (interval %s)", window, r1-r0, readings, observeEvery)
	if most := 1.1 * float64(window/observeEvery); readings > most || readings < 0.5*float64(window/observeEvery) {
		t.Errorf("%.0f readings in %s at an interval of %s", readings, window, observeEvery)
	}
	if r1-r0 > 6 {
		t.Errorf("%.0f reconciles of a pipeline whose spec and agents did not change", r1-r0)
	}
	cur := &v1beta1.StreamPipeline{}
	_ = k8s.Get(ctx, client.ObjectKeyFromObject(sp), cur)
	if o := cur.Status.Observed; o == nil || o.ChunksDelivered < int64(10*readings/2) || o.RawGbps == "0.00" {
		t.Errorf("observed %+v", o)
	}
}

// A pass applies only what changed: once a pipeline's objects hold what it would apply, the
// passes its agents' pods and Jobs cause apply nothing (1000 pipelines re-applying every object
// on every pass loaded the API server for nothing); an object someone edits is still put back.
func TestAPassAppliesOnlyWhatChangedAndPutsBackEdits(t *testing.T) {
	gatewayAndSenders(t, "lynx-16")
	ns := namespace(t)
	sp := pipeline(ns, "steady", withGateway("lynx-16"))
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	count := func(c *prometheus.CounterVec, labels ...string) float64 {
		return counter(t, c, append([]string{ns}, labels...)...)
	}
	runAgents(t, ns, "steady", "lynx-16")
	condition(t, sp, v1beta1.ConditionReady, metav1.ConditionTrue, ReasonRunning)
	// Passes caused by the agents' pod: each finds every object as it would apply it.
	settled := func() (float64, float64, float64) {
		return count(applies, "applied"), count(applies, "unchanged"), count(reconciles)
	}
	var a0, u0, r0 float64
	eventually(t, "the objects as applied in the cache", func() (bool, string) {
		a0, u0, r0 = settled()
		pod := &corev1.Pod{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "steady-gateway-0-xyz"}, pod); err != nil {
			return false, err.Error()
		}
		pod.Status.Message = fmt.Sprint("pass ", r0)
		if err := k8s.Status().Update(ctx, pod); err != nil {
			return false, err.Error()
		}
		var a1, u1, r1 float64
		eventually(t, "a pass", func() (bool, string) {
			a1, u1, r1 = settled()
			return r1 > r0, fmt.Sprint(r1)
		})
		return a1 == a0 && u1 > u0, fmt.Sprintf("a pass applied %.0f and left %.0f unchanged", a1-a0, u1-u0)
	})
	// An edit of what the operator set is put back; so is a label someone removed.
	cm := &corev1.ConfigMap{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "steady-agent"}, cm); err != nil {
		t.Fatal(err)
	}
	want := maps.Clone(cm.Data)
	for k := range cm.Data {
		cm.Data[k] = "{}"
	}
	if err := k8s.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the ConfigMap put back", func() (bool, string) {
		_ = k8s.Get(ctx, client.ObjectKeyFromObject(cm), cm)
		return maps.Equal(cm.Data, want), fmt.Sprint(len(cm.Data))
	})
	var svcs corev1.ServiceList
	if err := k8s.List(ctx, &svcs, client.InNamespace(ns)); err != nil || len(svcs.Items) == 0 {
		t.Fatalf("services: %v %d", err, len(svcs.Items))
	}
	svc := &svcs.Items[0]
	delete(svc.Labels, render.LabelPipeline)
	if err := k8s.Update(ctx, svc); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the Service's label put back", func() (bool, string) {
		_ = k8s.Get(ctx, client.ObjectKeyFromObject(svc), svc)
		return svc.Labels[render.LabelPipeline] == "steady", fmt.Sprint(svc.Labels)
	})
	if a := count(applies, "applied"); a < a0+2 {
		t.Errorf("%.0f applies put back two edits", a-a0)
	}
}

// counter is the value of one of the operator's counters.
func counter(t *testing.T, c *prometheus.CounterVec, labels ...string) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.WithLabelValues(labels...).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// agentsServedBy points the observer at `url` for the agents of the pods in namespace ns until
// the test ends (every other pod's agent cannot be reached).
func agentsServedBy(t *testing.T, ns, url string) {
	t.Helper()
	agentURL.Store(func(p *corev1.Pod) string {
		if p.Namespace == ns {
			return url + "/metrics"
		}
		return "http://127.0.0.1:1/metrics"
	})
	t.Cleanup(func() { agentURL.Store(func(*corev1.Pod) string { return "http://127.0.0.1:1/metrics" }) })
}

// runAgents plays the kubelet for a pipeline: its Jobs report a ready pod, and its gateway pod
// runs on 127.0.0.1.
func runAgents(t *testing.T, ns, name, gateway string) {
	t.Helper()
	var jobs batchv1.JobList
	eventually(t, "2 jobs", func() (bool, string) {
		_ = k8s.List(ctx, &jobs, client.InNamespace(ns))
		return len(jobs.Items) == 2, fmt.Sprint(len(jobs.Items))
	})
	for i := range jobs.Items {
		j := &jobs.Items[i]
		j.Status.Ready = ptr.To[int32](1)
		j.Status.Active = 1
		j.Status.StartTime = &metav1.Time{Time: time.Now()}
		if err := k8s.Status().Update(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-gateway-0-xyz", Namespace: ns,
			Labels: map[string]string{render.LabelPipeline: name, render.LabelRole: render.RoleGateway, render.LabelStream: "0"}},
		Spec: corev1.PodSpec{NodeName: gateway, Containers: []corev1.Container{{Name: "agent", Image: "x"}}},
	}
	if err := k8s.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1"}
	if err := k8s.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
}

// The pods already on a node that are not the pipeline's (the node daemon, system agents, other
// jobs) keep their CPUs: the sender is sized from allocatable less their requests. A pod that
// arrives once the sender runs does not shrink the running plan.
func TestOtherPodsOnANodeAreNotPlanned(t *testing.T) {
	gatewayAndSenders(t, "lynx-15")
	ensureNode(t, facilityNode("updraft-9", []int{16, 16}, "ens1f0", 1, 100000))
	node := &corev1.Node{}
	if err := k8s.Get(ctx, client.ObjectKey{Name: "updraft-9"}, node); err != nil {
		t.Fatal(err)
	}
	node.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("30"), corev1.ResourceMemory: resource.MustParse("64Gi")}
	node.Status.Capacity = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("32"), corev1.ResourceMemory: resource.MustParse("64Gi")}
	if err := k8s.Status().Update(ctx, node); err != nil {
		t.Fatal(err)
	}
	ns := namespace(t)
	other := func(name, cpu string) {
		t.Helper()
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: corev1.PodSpec{NodeName: "updraft-9", Containers: []corev1.Container{{Name: "c", Image: "x",
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}}}}}}
		if err := k8s.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	other("node-daemon-x", "1")
	other("log-shipper", "500m")
	sp := pipeline(ns, "crowded", withGateway("lynx-15"), withSenders("updraft-9"), withSecurity(v1beta1.SecurityNone))
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	cur := condition(t, sp, v1beta1.ConditionPlanned, metav1.ConditionTrue, ReasonPlanned)
	if n := cur.Status.Plan.Nodes[0]; n.Node != "updraft-9" || n.CPUs != 28 {
		t.Fatalf("sender plan %+v: 30 allocatable less 1.5 requested by others leaves 28 CPUs", n)
	}
	// The sender runs; then another pod lands on the node.
	var jobs batchv1.JobList
	eventually(t, "sender job", func() (bool, string) {
		_ = k8s.List(ctx, &jobs, client.InNamespace(ns), client.MatchingLabels{render.LabelRole: render.RoleSender})
		return len(jobs.Items) == 1, fmt.Sprint(len(jobs.Items))
	})
	hash := jobs.Items[0].Annotations[render.AnnotationPlanHash]
	time.Sleep(1100 * time.Millisecond) // creation timestamps have a resolution of one second
	mine := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "crowded-sender-0-x", Namespace: ns, Labels: map[string]string{
		render.LabelPipeline: "crowded", render.LabelRole: render.RoleSender, render.LabelStream: "0", batchv1.JobNameLabel: jobs.Items[0].Name}},
		Spec: corev1.PodSpec{NodeName: "updraft-9", Containers: []corev1.Container{{Name: "agent", Image: "x"}}}}
	if err := k8s.Create(ctx, mine); err != nil {
		t.Fatal(err)
	}
	other("late-batch-job", "2")
	mine.Status.Phase = corev1.PodRunning
	if err := k8s.Status().Update(ctx, mine); err != nil { // a pod event: the pipeline reconciles
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	_ = k8s.Get(ctx, client.ObjectKeyFromObject(sp), cur)
	if cur.Status.Plan.Nodes[0].CPUs != 28 {
		t.Errorf("a pod that came after the sender changed its plan to %d CPUs", cur.Status.Plan.Nodes[0].CPUs)
	}
	_ = k8s.List(ctx, &jobs, client.InNamespace(ns), client.MatchingLabels{render.LabelRole: render.RoleSender})
	if len(jobs.Items) != 1 || jobs.Items[0].Annotations[render.AnnotationPlanHash] != hash {
		t.Error("the running sender's Job was replaced")
	}
}

func TestSuspendStopsTheAgents(t *testing.T) {
	gatewayAndSenders(t, "lynx-4")
	ns := namespace(t)
	sp := pipeline(ns, "paused", withGateway("lynx-4"))
	sp.Spec.Suspend = true
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	condition(t, sp, v1beta1.ConditionReady, metav1.ConditionFalse, ReasonSuspended)
	var jobs batchv1.JobList
	eventually(t, "suspended jobs", func() (bool, string) {
		_ = k8s.List(ctx, &jobs, client.InNamespace(ns))
		if len(jobs.Items) != 2 {
			return false, fmt.Sprint(len(jobs.Items))
		}
		for _, j := range jobs.Items {
			if !ptr.Deref(j.Spec.Suspend, false) {
				return false, j.Name + " not suspended"
			}
		}
		return true, ""
	})
}

// A stream's identity is its sender, not its position in spec.senders (a GitOps edit removes or
// reorders them): removing the first sender removes its stream's Jobs and keys; the other keeps
// its stream id, Job names, keys and source (nothing of one detector goes into another's stream);
// a sender added later gets an id no sender had.
func TestRemovingTheFirstSenderKeepsTheOtherStream(t *testing.T) {
	gatewayAndSenders(t, "lynx-5")
	ns := namespace(t)
	sp := pipeline(ns, "shrink", withGateway("lynx-5"), withSenders("updraft-1", "updraft-2"))
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	jobsNow := func() []string {
		var jobs batchv1.JobList
		_ = k8s.List(ctx, &jobs, client.InNamespace(ns))
		names := []string{}
		for _, j := range jobs.Items {
			if j.DeletionTimestamp == nil {
				names = append(names, j.Name)
			}
		}
		sort.Strings(names)
		return names
	}
	waitJobs := func(want ...string) {
		t.Helper()
		eventually(t, strings.Join(want, ","), func() (bool, string) {
			got := jobsNow()
			return slices.Equal(got, want), strings.Join(got, ",")
		})
	}
	waitJobs("shrink-gateway-0", "shrink-gateway-1", "shrink-sender-0", "shrink-sender-1")
	uids := func() map[string]types.UID {
		out := map[string]types.UID{}
		for _, name := range []string{"shrink-gateway-1", "shrink-sender-1"} {
			j := &batchv1.Job{}
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, j); err != nil {
				t.Fatal(err)
			}
			out[name] = j.UID
		}
		return out
	}
	before := uids()
	updateSpec(t, sp, withSenders("updraft-2"))
	waitJobs("shrink-gateway-1", "shrink-sender-1")
	senderConfig := func(stream int) render.AgentConfig {
		t.Helper()
		var cfg render.AgentConfig
		eventually(t, "the sender's configuration", func() (bool, string) {
			cm := &corev1.ConfigMap{}
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "shrink-agent"}, cm); err != nil {
				return false, err.Error()
			}
			text := cm.Data[fmt.Sprintf("sender-%d.json", stream)]
			keys := []string{}
			for k := range cm.Data {
				keys = append(keys, k)
			}
			return json.Unmarshal([]byte(text), &cfg) == nil && cfg.StreamID != nil && *cfg.StreamID == stream, strings.Join(keys, ",") + ": " + text
		})
		return cfg
	}
	senderConfig(1)
	job := &batchv1.Job{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "shrink-sender-1"}, job); err != nil {
		t.Fatal(err)
	}
	if node := job.Spec.Template.Spec.NodeSelector[corev1.LabelHostname]; node != "updraft-2" {
		t.Errorf("stream 1's sender runs on %s, want updraft-2 (its own detector)", node)
	}
	cur := &v1beta1.StreamPipeline{}
	eventually(t, "status names the remaining stream", func() (bool, string) {
		_ = k8s.Get(ctx, client.ObjectKeyFromObject(sp), cur)
		return reflect.DeepEqual(cur.Status.Senders, []v1beta1.SenderStream{{Node: "updraft-2", Stream: 1, Slot: new(int32(1))}}) && cur.Status.NextStream == 2,
			fmt.Sprintf("%+v next %d", cur.Status.Senders, cur.Status.NextStream)
	})
	// The remaining stream's Jobs were never replaced: same ports, same keys, same pods.
	if after := uids(); !maps.Equal(before, after) {
		t.Errorf("the remaining stream's Jobs were replaced: %v -> %v", before, after)
	}
	sec := &corev1.Secret{}
	eventually(t, "keys of stream 1 only", func() (bool, string) {
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "shrink-curve-keys"}, sec); err != nil {
			return false, err.Error()
		}
		_, has1 := sec.Data[render.SenderPublicKey(1)]
		return has1, fmt.Sprint(len(sec.Data))
	})
	// A sender added now gets stream 2, never 0: stream 0's files and keys were another detector's.
	updateSpec(t, sp, withSenders("polaris-1", "updraft-2"))
	waitJobs("shrink-gateway-1", "shrink-gateway-2", "shrink-sender-1", "shrink-sender-2")
	senderConfig(2)
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "shrink-sender-2"}, job); err != nil {
		t.Fatal(err)
	}
	if node := job.Spec.Template.Spec.NodeSelector[corev1.LabelHostname]; node != "polaris-1" {
		t.Errorf("stream 2's sender runs on %s, want polaris-1", node)
	}
}

// The samples in config/samples are valid StreamPipelines (the API server's own validation).
func TestSamplesAreAccepted(t *testing.T) {
	ns := namespace(t)
	files, err := filepath.Glob(filepath.Join("..", "config", "samples", "*.yaml"))
	if err != nil || len(files) < 2 {
		t.Fatalf("samples: %v %v", files, err)
	}
	accepted := 0
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var obj client.Object = &v1beta1.StreamPipeline{}
		if strings.Contains(string(data), "\nkind: StorageRoot\n") {
			obj = &v1beta1.StorageRoot{} // cluster-scoped: the admin's
		}
		if strings.Contains(string(data), "\nkind: RemoteSite\n") {
			obj = &v1beta1.RemoteSite{}
		}
		if err := yaml.UnmarshalStrict(data, obj); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if _, cluster := obj.(*v1beta1.StorageRoot); !cluster {
			obj.SetNamespace(ns)
		}
		if err := k8s.Create(ctx, obj, client.DryRunAll); err != nil {
			t.Errorf("%s refused: %v", f, err)
		}
		accepted++
	}
	if accepted < 2 {
		t.Errorf("only %d samples", accepted)
	}
}

// Once the agents run, the operator reads the receiving agent's metrics and writes the observed
// rate, the integrity counts and the agent's own NIC-locality report into status. envtest runs
// no kubelet, so the test plays it: Job status ready, a Running gateway pod, and an HTTP server
// serving agent-shaped metrics.
func TestObservedFiguresAndNICLocalityFromTheAgents(t *testing.T) {
	gatewayAndSenders(t, "lynx-6")
	ns := namespace(t)
	sp := pipeline(ns, "observed", withGateway("lynx-6"))
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	condition(t, sp, v1beta1.ConditionPlanned, metav1.ConditionTrue, ReasonPlanned)
	var delivered atomic.Int64
	nicLocal := atomic.Int32{}
	nicLocal.Store(1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		d := delivered.Add(100)
		fmt.Fprintf(w, "numastream_raw_bytes_total{role=\"receive\"} %d\n", d*11059200)
		fmt.Fprintf(w, "numastream_wire_bytes_total{role=\"receive\"} %d\n", d*5529600)
		fmt.Fprintf(w, "numastream_chunks_delivered_total{role=\"receive\"} %d\n", d)
		fmt.Fprintf(w, "numastream_chunks_lost{role=\"receive\"} 0\nnumastream_chunks_corrupt_total{role=\"receive\"} 0\n")
		fmt.Fprintf(w, "numastream_nic_local{role=\"receive\",stage=\"receive\"} %d\n", nicLocal.Load())
	}))
	defer srv.Close()
	agentURL.Store(func(*corev1.Pod) string { return srv.URL + "/metrics" })
	defer agentURL.Store(func(*corev1.Pod) string { return "http://127.0.0.1:1/metrics" })

	runAgents(t, ns, "observed", "lynx-6")
	condition(t, sp, v1beta1.ConditionReady, metav1.ConditionTrue, ReasonRunning)
	cur := condition(t, sp, v1beta1.ConditionNICLocal, metav1.ConditionTrue, ReasonReceiversNICLocal)
	eventually(t, "observed rate", func() (bool, string) {
		_ = k8s.Get(ctx, client.ObjectKeyFromObject(sp), cur)
		o := cur.Status.Observed
		return o != nil && o.ChunksDelivered >= 200 && o.RawGbps != "0.00" && o.ChunksLost == 0, fmt.Sprintf("%+v", o)
	})
	// The agent reports a receiving thread off the NIC's node: NICLocal turns False, saying why.
	nicLocal.Store(0)
	cur = condition(t, sp, v1beta1.ConditionNICLocal, metav1.ConditionFalse, ReasonReceiversRemote)
	if !strings.Contains(meta.FindStatusCondition(cur.Status.Conditions, v1beta1.ConditionNICLocal).Message, "Topology Manager") {
		t.Error("the message should point at the Topology Manager policy")
	}
}

// With security mode curve the operator creates the pipeline's key Secret (owned by it, a key
// pair per sender and for the gateway, keys consistent), mounts it, and every pipeline gets a
// NetworkPolicy for its gateway's data ports. A keysSecret that does not exist is reported.
func TestCurveKeysSecretAndNetworkPolicy(t *testing.T) {
	gatewayAndSenders(t, "lynx-12")
	ns := namespace(t)
	// No spec.security: CURVE, with keys the operator makes. All streams at once: envtest runs
	// no pods for a roll to wait for (TestNewKeysRollOneStreamAtATime rolls).
	sp := pipeline(ns, "secure", withGateway("lynx-12"), withSenders("updraft-1", "updraft-2"),
		func(sp *v1beta1.StreamPipeline) { sp.Spec.Rollout = &v1beta1.Rollout{MaxStreams: ptr.To[int32](0)} })
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	condition(t, sp, v1beta1.ConditionPlanned, metav1.ConditionTrue, ReasonPlanned)
	var sec corev1.Secret
	eventually(t, "the keys Secret", func() (bool, string) {
		err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "secure-curve-keys"}, &sec)
		return err == nil, fmt.Sprint(err)
	})
	if len(sec.Data) != 6 || !metav1.IsControlledBy(&sec, sp) {
		t.Fatalf("secret keys %d, owners %v", len(sec.Data), sec.OwnerReferences)
	}
	for _, who := range []string{"gateway", "sender-0", "sender-1"} {
		pub, err := curvekeys.PublicOf(strings.TrimSpace(string(sec.Data[who+".secret"])))
		if err != nil || pub != strings.TrimSpace(string(sec.Data[who+".public"])) {
			t.Errorf("%s key pair inconsistent: %v", who, err)
		}
	}
	first := string(sec.Data["gateway.secret"])
	var job batchv1.Job
	eventually(t, "the gateway job", func() (bool, string) {
		err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "secure-gateway-1"}, &job)
		return err == nil, fmt.Sprint(err)
	})
	found := false
	for _, v := range job.Spec.Template.Spec.Volumes {
		found = found || (v.Secret != nil && v.Secret.SecretName == "secure-curve-keys")
	}
	if !found {
		t.Error("the gateway job does not mount the keys")
	}
	var np networkingv1.NetworkPolicy
	eventually(t, "the NetworkPolicy", func() (bool, string) {
		err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "secure-gateway"}, &np)
		return err == nil, fmt.Sprint(err)
	})
	// Keys rotated on demand: all pairs new, and every agent's Job replaced by one whose pods
	// carry the new keys (each stream drains and resumes); the next reconcile keeps them.
	before := job.Spec.Template.Annotations[render.AnnotationKeys]
	if before == "" {
		t.Fatal("the gateway's pods do not say which keys they hold")
	}
	askRotation(t, sp, "2026-11-25")
	eventually(t, "new keys in the Secret and in every Job's pods", func() (bool, string) {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(&sec), &sec); err != nil {
			return false, err.Error()
		}
		if string(sec.Data["gateway.secret"]) == first || string(sec.Data["sender-1.public"]) == "" {
			return false, "the Secret holds the old keys"
		}
		for _, name := range []string{"secure-gateway-0", "secure-gateway-1", "secure-sender-0", "secure-sender-1"} {
			var j batchv1.Job
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &j); err != nil {
				return false, name + ": " + err.Error()
			}
			if got := j.Spec.Template.Annotations[render.AnnotationKeys]; got == before || got == "" {
				return false, name + " still runs the old keys"
			}
		}
		return true, ""
	})
	if sec.Annotations[AnnotationKeysRotatedFor] != "2026-11-25" {
		t.Errorf("Secret annotations %v", sec.Annotations)
	}
	first = string(sec.Data["gateway.secret"])
	// Reconciling again keeps the keys.
	updateSpec(t, sp, func(s *v1beta1.StreamPipeline) { s.Spec.Suspend = true })
	condition(t, sp, v1beta1.ConditionReady, metav1.ConditionFalse, ReasonSuspended)
	_ = k8s.Get(ctx, client.ObjectKeyFromObject(&sec), &sec)
	if string(sec.Data["gateway.secret"]) != first {
		t.Error("the gateway key changed on a reconcile")
	}

	named := pipeline(ns, "named", withGateway("lynx-12"), withSenders("polaris-1"))
	named.Spec.Security = &v1beta1.Security{Mode: v1beta1.SecurityCurve, KeysSecret: "beamline-keys"}
	if err := k8s.Create(ctx, named); err != nil {
		t.Fatal(err)
	}
	got := condition(t, named, v1beta1.ConditionPlanned, metav1.ConditionFalse, ReasonKeys)
	for _, c := range got.Status.Conditions {
		if c.Type == v1beta1.ConditionPlanned && !strings.Contains(c.Message, "beamline-keys") {
			t.Errorf("message %q does not name the Secret", c.Message)
		}
	}
}

// The agents see a compression ratio of 3.5 where the spec assumed 2.0, and decompression slower
// than the gateway's label: after replan.Confirm readings the operator plans from what it saw
// (status.replan), records the change in the plan history and a Replanned event, and re-creates
// the agents' Jobs with the new plan. Within the cooldown it does not re-plan again; with
// spec.replan off it never does.
func TestAnObservedRatioThatDepartsFromThePlanReplans(t *testing.T) {
	// Two gateways: pipelines sharing one split its cores, and the second would re-plan the first.
	gatewayAndSenders(t, "lynx-20")
	gatewayAndSenders(t, "lynx-23")
	ns, ns2 := namespace(t), namespace(t)
	sp := pipeline(ns, "replan", withGateway("lynx-20"))
	still := pipeline(ns2, "fixed", withGateway("lynx-23"), withSenders("updraft-2"),
		func(sp *v1beta1.StreamPipeline) { sp.Spec.Replan = ReplanOff; sp.Spec.Port = 6555 })
	for _, p := range []*v1beta1.StreamPipeline{sp, still} {
		if err := k8s.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	var delivered atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		d := delivered.Add(100)
		raw := d * 11059200
		fmt.Fprintf(w, "numastream_raw_bytes_total{role=\"receive\"} %d\n", raw)
		fmt.Fprintf(w, "numastream_wire_bytes_total{role=\"receive\"} %d\n", raw*2/7)
		fmt.Fprintf(w, "numastream_chunks_delivered_total{role=\"receive\"} %d\n", d)
		fmt.Fprintf(w, "numastream_chunks_lost{role=\"receive\"} 0\nnumastream_chunks_corrupt_total{role=\"receive\"} 0\n")
		fmt.Fprintf(w, "numastream_stage_bytes_total{role=\"receive\",stage=\"decompress\",direction=\"out\"} %d\n", raw)
		fmt.Fprintf(w, "numastream_stage_busy_seconds_total{role=\"receive\",stage=\"decompress\"} %g\n", float64(raw)/800e6)
	}))
	defer srv.Close()
	agentURL.Store(func(p *corev1.Pod) string {
		if p.Namespace == ns || p.Namespace == ns2 {
			return srv.URL + "/metrics"
		}
		return "http://127.0.0.1:1/metrics"
	})
	defer agentURL.Store(func(*corev1.Pod) string { return "http://127.0.0.1:1/metrics" })
	condition(t, sp, v1beta1.ConditionPlanned, metav1.ConditionTrue, ReasonPlanned)
	var before batchv1.Job
	eventually(t, "sender job", func() (bool, string) {
		err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "replan-sender-0"}, &before)
		return err == nil, fmt.Sprint(err)
	})
	first := &v1beta1.StreamPipeline{}
	_ = k8s.Get(ctx, client.ObjectKeyFromObject(sp), first)
	runAgents(t, ns, "replan", "lynx-20")
	runAgents(t, ns2, "fixed", "lynx-23")

	cur := &v1beta1.StreamPipeline{}
	eventually(t, "a re-plan in the history", func() (bool, string) {
		_ = k8s.Get(ctx, client.ObjectKeyFromObject(sp), cur)
		return len(cur.Status.PlanHistory) == 1 && cur.Status.Replan != nil && cur.Status.Replan.Applied,
			fmt.Sprintf("%+v %+v", cur.Status.Replan, cur.Status.PlanHistory)
	})
	rp, h := cur.Status.Replan, cur.Status.PlanHistory[0]
	if rp.Ratio != "3.50" || rp.DecompressMBps != "800" {
		t.Errorf("replan inputs %+v, want ratio 3.50 and 800 MB/s per decompressing thread", rp)
	}
	if !strings.Contains(h.Reason, "observed compression ratio 3.50, the plan assumed 2.00 (+75%)") {
		t.Errorf("reason %q", h.Reason)
	}
	if h.From != describePlan(first.Status.Plan) || h.To != describePlan(cur.Status.Plan) || h.From == h.To || h.Applied != "re-created" {
		t.Errorf("history %+v\nfirst plan %s", h, describePlan(first.Status.Plan))
	}
	t.Logf("re-plan: %s\n  from %s\n  to   %s", h.Reason, h.From, h.To)
	eventually(t, "sender job re-created with the new plan", func() (bool, string) {
		var after batchv1.Job
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "replan-sender-0"}, &after); err != nil {
			return false, err.Error()
		}
		return after.UID != before.UID && after.Annotations[render.AnnotationPlanHash] != before.Annotations[render.AnnotationPlanHash], "same job"
	})
	var evs eventsv1.EventList
	eventually(t, "a Replanned event", func() (bool, string) {
		_ = k8s.List(ctx, &evs, client.InNamespace(ns))
		for _, e := range evs.Items {
			if e.Regarding.Name == "replan" && e.Reason == "Replanned" && strings.Contains(e.Note, "-> ") {
				return true, ""
			}
		}
		return false, fmt.Sprint(len(evs.Items), " events")
	})
	// The same departure keeps being read: within the cooldown, no second re-plan.
	time.Sleep(3 * time.Second)
	_ = k8s.Get(ctx, client.ObjectKeyFromObject(sp), cur)
	if len(cur.Status.PlanHistory) != 1 {
		t.Errorf("re-planned again inside the cooldown: %+v", cur.Status.PlanHistory)
	}
	fixed := &v1beta1.StreamPipeline{}
	_ = k8s.Get(ctx, client.ObjectKeyFromObject(still), fixed)
	if fixed.Status.Replan != nil || len(fixed.Status.PlanHistory) != 0 || fixed.Status.Observed == nil || fixed.Status.Observed.Ratio != "3.50" {
		t.Errorf("spec.replan off: %+v %+v (observed %+v)", fixed.Status.Replan, fixed.Status.PlanHistory, fixed.Status.Observed)
	}
}

// The real agents stream frames whose compressibility changes halfway (the synthetic beam drops
// from 10 to 0.55 counts: lz4 ratio ~2, then ~3.5). While the ratio is what the spec expects, the
// plan stays; once it changes, the observer reads the new ratio from the receiving agent's metrics
// and the operator re-plans from it: the plan, its bottleneck and its history follow the stream.
func TestAStreamWhoseCompressibilityChangesHalfwayIsReplanned(t *testing.T) {
	agentBin := testenv.Agent(t)
	gatewayAndSenders(t, "lynx-21")
	ns := namespace(t)
	sp := pipeline(ns, "beam", withGateway("lynx-21"))
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	data, metrics, txMetrics := testenv.FreePort(t), testenv.FreePort(t), testenv.FreePort(t)
	run := func(args ...string) *exec.Cmd {
		var out bytes.Buffer
		c := exec.Command(agentBin, args...)
		c.Stdout, c.Stderr = &out, &out
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = c.Process.Signal(os.Interrupt)
			_ = c.Wait()
			if t.Failed() {
				t.Logf("%s:\n%s", args[0], out.String())
			}
		})
		return c
	}
	run("receive", "--endpoint", "tcp://127.0.0.1:"+data, "--chunk-bytes", "1048576", "--idle-timeout", "0",
		"--metrics-listen", "127.0.0.1:"+metrics)
	// 0.3 Gbit/s of 1 MiB chunks: ~36 a second; the beam changes at chunk 360, ~10 s in.
	run("send", "--endpoint", "tcp://127.0.0.1:"+data, "--chunk-bytes", "1048576", "--chunks", "0",
		"--rate-gbps", "0.3", "--set", `source.change={"at_chunk":360,"flat_field":0.55}`, "--metrics-listen", "127.0.0.1:"+txMetrics)
	agentURL.Store(func(p *corev1.Pod) string {
		switch {
		case p.Namespace == ns && p.Labels[render.LabelRole] == render.RoleSender:
			return "http://127.0.0.1:" + txMetrics + "/metrics"
		case p.Namespace == ns:
			return "http://127.0.0.1:" + metrics + "/metrics"
		}
		return "http://127.0.0.1:1/metrics"
	})
	defer agentURL.Store(func(*corev1.Pod) string { return "http://127.0.0.1:1/metrics" })
	condition(t, sp, v1beta1.ConditionPlanned, metav1.ConditionTrue, ReasonPlanned)
	runAgents(t, ns, "beam", "lynx-21")
	// The sender agent as its pod: the observer reads its stages too.
	tx := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "beam-sender-0-xyz", Namespace: ns,
			Labels: map[string]string{render.LabelPipeline: "beam", render.LabelRole: render.RoleSender, render.LabelStream: "0"}},
		Spec: corev1.PodSpec{NodeName: "updraft-1", Containers: []corev1.Container{{Name: "agent", Image: "x"}}},
	}
	if err := k8s.Create(ctx, tx); err != nil {
		t.Fatal(err)
	}
	tx.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1"}
	if err := k8s.Status().Update(ctx, tx); err != nil {
		t.Fatal(err)
	}
	first := &v1beta1.StreamPipeline{}
	_ = k8s.Get(ctx, client.ObjectKeyFromObject(sp), first)

	cur := &v1beta1.StreamPipeline{}
	eventually(t, "the observed ratio of the first frames", func() (bool, string) {
		_ = k8s.Get(ctx, client.ObjectKeyFromObject(sp), cur)
		o := cur.Status.Observed
		return o != nil && o.Ratio != "", fmt.Sprintf("%+v", o)
	})
	if r, _ := strconv.ParseFloat(cur.Status.Observed.Ratio, 64); r < 1.7 || r > 2.4 || len(cur.Status.PlanHistory) != 0 {
		t.Fatalf("before the change: ratio %s (want ~2), plan history %+v", cur.Status.Observed.Ratio, cur.Status.PlanHistory)
	}
	testenv.Eventually(t, "a re-plan after the beam changed", 40*time.Second, 200*time.Millisecond, func() (bool, string) {
		_ = k8s.Get(ctx, client.ObjectKeyFromObject(sp), cur)
		return len(cur.Status.PlanHistory) == 1 && cur.Status.Replan != nil && cur.Status.Replan.Applied,
			fmt.Sprintf("observed %+v", cur.Status.Observed)
	})
	h := cur.Status.PlanHistory[0]
	ratio, _ := strconv.ParseFloat(cur.Status.Replan.Ratio, 64)
	if ratio < 3.0 || ratio > 4.0 || !strings.Contains(h.Reason, "the plan assumed 2.00") {
		t.Errorf("re-planned from ratio %s: %q", cur.Status.Replan.Ratio, h.Reason)
	}
	// The plan assumed a detector as fast as the hardware; the agents show the detector's pace is
	// the limit: the compressing threads wait for the source.
	if o := cur.Status.Observed; o.Bottleneck != "source" {
		t.Errorf("observed bottleneck %q (%s), want source: the sender is paced at 0.3 Gbit/s", o.Bottleneck, o.BottleneckDetail)
	}
	if h.From == h.To || cur.Status.Plan.Connections >= first.Status.Plan.Connections {
		t.Errorf("the plan should carry the same raw rate on fewer connections: %+v", h)
	}
	t.Logf("observed %s, then %s: %s\n  from %s\n  to   %s\n  observed bottleneck %q (%s)", "~2", cur.Status.Replan.Ratio,
		h.Reason, h.From, h.To, cur.Status.Observed.Bottleneck, cur.Status.Observed.BottleneckDetail)
}

// runJobPods plays the kubelet for a pipeline's Jobs: a running pod from each Job's template.
func runJobPods(t *testing.T, ns string) map[string]*corev1.Pod {
	t.Helper()
	var jobs batchv1.JobList
	eventually(t, "2 jobs", func() (bool, string) {
		_ = k8s.List(ctx, &jobs, client.InNamespace(ns))
		return len(jobs.Items) == 2, fmt.Sprint(len(jobs.Items))
	})
	var names []string
	for _, j := range jobs.Items {
		names = append(names, j.Name)
	}
	return runPodsOf(t, ns, names...)
}

// A re-plan that changes only the CPUs the agents need (the connections are fixed by the spec)
// is applied in place: the running pods are resized through pods/resize to the new plan's
// containers, the Jobs stay (marked with the new plan), and the history says "in place". When
// the kubelet then reports a resize Infeasible, the operator falls back to re-creating the Job.
func TestAReplanThatOnlyChangesCpusResizesThePodsInPlace(t *testing.T) {
	gatewayAndSenders(t, "lynx-22")
	// The API server checks a resize against the node's allocatable resources.
	for _, name := range []string{"lynx-22", "updraft-1"} {
		node := &corev1.Node{}
		if err := k8s.Get(ctx, client.ObjectKey{Name: name}, node); err != nil {
			t.Fatal(err)
		}
		node.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("32"),
			corev1.ResourceMemory: resource.MustParse("256Gi"), corev1.ResourcePods: resource.MustParse("110")}
		node.Status.Capacity = node.Status.Allocatable
		if err := k8s.Status().Update(ctx, node); err != nil {
			t.Fatal(err)
		}
	}
	ns := namespace(t)
	sp := pipeline(ns, "inplace", withGateway("lynx-22"), withConnections(2), withSecurity(v1beta1.SecurityNone))
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		raw := time.Now().UnixNano() / 10
		fmt.Fprintf(w, "numastream_raw_bytes_total{role=\"receive\"} %d\n", raw)
		fmt.Fprintf(w, "numastream_wire_bytes_total{role=\"receive\"} %d\n", raw*2/7)
		fmt.Fprintf(w, "numastream_chunks_delivered_total{role=\"receive\"} %d\n", raw/11059200)
		fmt.Fprintf(w, "numastream_chunks_lost{role=\"receive\"} 0\nnumastream_chunks_corrupt_total{role=\"receive\"} 0\n")
	}))
	defer srv.Close()
	agentsServedBy(t, ns, srv.URL)
	condition(t, sp, v1beta1.ConditionPlanned, metav1.ConditionTrue, ReasonPlanned)
	pods := runJobPods(t, ns)
	var jobs batchv1.JobList
	_ = k8s.List(ctx, &jobs, client.InNamespace(ns))
	uids := map[string]string{}
	for _, j := range jobs.Items {
		uids[j.Name] = string(j.UID)
	}

	cur := &v1beta1.StreamPipeline{}
	eventually(t, "a re-plan applied in place", func() (bool, string) {
		_ = k8s.Get(ctx, client.ObjectKeyFromObject(sp), cur)
		return len(cur.Status.PlanHistory) == 1, fmt.Sprintf("%+v", cur.Status.PlanHistory)
	})
	h := cur.Status.PlanHistory[0]
	t.Logf("%s (%s)\n  from %s\n  to   %s", h.Reason, h.Applied, h.From, h.To)
	if h.Applied != "in place" || h.From == h.To {
		var evs eventsv1.EventList
		_ = k8s.List(ctx, &evs, client.InNamespace(ns))
		for _, e := range evs.Items {
			t.Logf("event %s: %s", e.Reason, e.Note)
		}
		t.Fatalf("history %+v", h)
	}
	for name, p := range pods {
		var job batchv1.Job
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &job); err != nil || string(job.UID) != uids[name] {
			t.Errorf("job %s was replaced (%v)", name, err)
		}
		// The gateway's plan changed (more decompressing CPUs), the sender's did not.
		if resized := job.Annotations[AnnotationResizedTo] != ""; resized != (name == "inplace-gateway-0") {
			t.Errorf("job %s annotations %v", name, job.Annotations)
		}
		got := &corev1.Pod{}
		_ = k8s.Get(ctx, client.ObjectKeyFromObject(p), got)
		for i, c := range got.Spec.Containers {
			before := p.Spec.Containers[i].Resources.Limits.Cpu()
			t.Logf("pod %s container %s: %s -> %s CPUs", got.Name, c.Name, before, c.Resources.Limits.Cpu())
		}
	}
	// The plan says how many CPUs each pod has now: the resized pods hold them.
	for _, n := range cur.Status.Plan.Nodes {
		for name, p := range pods {
			if p.Spec.NodeName != n.Node {
				continue
			}
			got := &corev1.Pod{}
			_ = k8s.Get(ctx, client.ObjectKeyFromObject(p), got)
			var cpus int64
			for _, c := range got.Spec.Containers {
				cpus += c.Resources.Limits.Cpu().Value()
			}
			if cpus != int64(n.CPUs) {
				t.Errorf("pod of %s holds %d CPUs, the new plan gives %s %d", name, cpus, n.Node, n.CPUs)
			}
		}
	}

	// The kubelet refuses the gateway's resize: the Job is re-created with the new plan.
	gw := pods["inplace-gateway-0"]
	got := &corev1.Pod{}
	_ = k8s.Get(ctx, client.ObjectKeyFromObject(gw), got)
	got.Status.Conditions = append(got.Status.Conditions, corev1.PodCondition{Type: corev1.PodResizePending, Status: corev1.ConditionTrue,
		Reason: corev1.PodReasonInfeasible, Message: "Node didn't have enough capacity: cpu"})
	if err := k8s.Status().Update(ctx, got); err != nil {
		t.Fatal(err)
	}
	// Any reconcile now replaces it; a spec-neutral nudge brings one.
	updateSpec(t, sp, func(p *v1beta1.StreamPipeline) {
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		p.Annotations["nudge"] = "1"
	})
	eventually(t, "the gateway Job re-created after an infeasible resize", func() (bool, string) {
		var job batchv1.Job
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "inplace-gateway-0"}, &job); err != nil {
			return false, err.Error()
		}
		return string(job.UID) != uids["inplace-gateway-0"] && job.Annotations[AnnotationResizedTo] == "", "same job"
	})
}

// StorageRoots the admin makes are checked by the API server like any manifest.
func TestBadStorageRootsAreRefusedNamingTheField(t *testing.T) {
	needEnvtest(t)
	access := []v1beta1.StorageAccess{{Namespaces: []string{"*"}, Users: []v1beta1.IDRange{{Min: 1000, Max: 1999}}, Groups: []v1beta1.IDRange{{Min: 1000, Max: 1999}}}}
	cases := map[string]struct {
		spec v1beta1.StorageRootSpec
		want string
	}{
		"the host's root":     {v1beta1.StorageRootSpec{Path: "/", Access: access}, "spec.path"},
		"a relative path":     {v1beta1.StorageRootSpec{Path: "data", Access: access}, "spec.path"},
		"a path with ..":      {v1beta1.StorageRootSpec{Path: "/data/../etc", Access: access}, "spec.path"},
		"no access":           {v1beta1.StorageRootSpec{Path: "/data"}, "spec.access"},
		"an unknown role":     {v1beta1.StorageRootSpec{Path: "/data", NodeRoles: []string{"analysis"}, Access: access}, "spec.nodeRoles[0]"},
		"root's uid":          {v1beta1.StorageRootSpec{Path: "/data", Access: []v1beta1.StorageAccess{{Namespaces: []string{"*"}, Users: []v1beta1.IDRange{{Min: 0, Max: 10}}, Groups: access[0].Groups}}}, "spec.access[0].users[0].min"},
		"a range upside down": {v1beta1.StorageRootSpec{Path: "/data", Access: []v1beta1.StorageAccess{{Namespaces: []string{"*"}, Users: access[0].Users, Groups: []v1beta1.IDRange{{Min: 20, Max: 10}}}}}, "min must not exceed max"},
		"no namespaces":       {v1beta1.StorageRootSpec{Path: "/data", Access: []v1beta1.StorageAccess{{Users: access[0].Users, Groups: access[0].Groups}}}, "spec.access[0].namespaces"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			root := &v1beta1.StorageRoot{ObjectMeta: metav1.ObjectMeta{Name: "bad-" + strings.ReplaceAll(strings.ReplaceAll(name, " ", "-"), "'", "")}, Spec: tc.spec}
			err := k8s.Create(ctx, root)
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error does not name %q: %v", tc.want, err)
			}
		})
	}
}

// A pipeline uses only the roots the admin admits its namespace to, with the user and group it
// runs as; it gets bound claims of exactly those roots on its nodes; a newer pipeline that would
// write the same files gets no pod and is told which field collides, until the older one goes.
func TestStorageRootsDecideWhatAPipelineMayUse(t *testing.T) {
	ensureNode(t, facilityNode("lynx-st", []int{16, 16}, "ens1f0", 1, 200000))
	ensureNode(t, facilityNode("updraft-st", []int{16, 16}, "ens1f0", 1, 100000))
	ns, other := namespace(t), namespace(t)
	root := &v1beta1.StorageRoot{ObjectMeta: metav1.ObjectMeta{Name: "archive-" + ns}, Spec: v1beta1.StorageRootSpec{
		Path: "/archive", NodeRoles: []string{v1beta1.StorageRoleGateway},
		Access: []v1beta1.StorageAccess{{Namespaces: []string{ns}, Users: []v1beta1.IDRange{{Min: 2000, Max: 2999}}, Groups: []v1beta1.IDRange{{Min: 2000, Max: 2999}}}},
	}}
	if err := k8s.Create(ctx, root); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(ctx, root) })
	sink := func(rootName, path string) spOption {
		return func(sp *v1beta1.StreamPipeline) {
			withSenders("updraft-st")(sp)
			sp.Spec.Gateway.Node = "lynx-st"
			sp.Spec.Sink = &v1beta1.Sink{HDF5: &v1beta1.HDF5Dataset{Root: rootName, Path: path}}
			sp.Spec.Files = &v1beta1.Files{User: ptr.To[int64](2100), Group: ptr.To[int64](2200)}
		}
	}
	jobs := func(sp *v1beta1.StreamPipeline) int {
		var l batchv1.JobList
		if err := k8s.List(ctx, &l, client.InNamespace(sp.Namespace), client.MatchingLabels{render.LabelPipeline: sp.Name}); err != nil {
			t.Fatal(err)
		}
		return len(l.Items)
	}

	first := pipeline(ns, "first", sink(root.Name, "run-1/scan-{stream}.h5"))
	if err := k8s.Create(ctx, first); err != nil {
		t.Fatal(err)
	}
	first = condition(t, first, v1beta1.ConditionPlanned, metav1.ConditionTrue, ReasonPlanned)
	var pvs corev1.PersistentVolumeList
	eventually(t, "a bound claim of /archive on lynx-st and of the state directory on updraft-st", func() (bool, string) {
		if err := k8s.List(ctx, &pvs, client.MatchingLabels{"numastream.io/pipeline-uid": string(first.UID)}); err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, pv := range pvs.Items {
			claim := &corev1.PersistentVolumeClaim{}
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: pv.Spec.ClaimRef.Name}, claim); err != nil || claim.Spec.VolumeName != pv.Name {
				return false, fmt.Sprintf("claim of %s: %v", pv.Name, err)
			}
			got[pv.Spec.HostPath.Path] = pv.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values[0]
		}
		want := map[string]string{"/archive": "lynx-st", "/var/lib/numastream/streams/" + ns + "/first-" + string(first.UID): "updraft-st"}
		return reflect.DeepEqual(got, want), fmt.Sprintf("volumes %v", got)
	})

	refused := func(sp *v1beta1.StreamPipeline, reason, field string) {
		t.Helper()
		if err := k8s.Create(ctx, sp); err != nil {
			t.Fatal(err)
		}
		cur := condition(t, sp, v1beta1.ConditionPlanned, metav1.ConditionFalse, reason)
		msg := meta.FindStatusCondition(cur.Status.Conditions, v1beta1.ConditionPlanned).Message
		if !strings.HasPrefix(msg, field+": ") {
			t.Errorf("%s: the refusal does not name %s: %s", sp.Name, field, msg)
		}
		if n := jobs(sp); n != 0 {
			t.Errorf("%s: %d Jobs for a refused pipeline", sp.Name, n)
		}
		// What the NumastreamPipelineNotPlanned alert reads (docs/monitoring.md).
		if v := testutil.ToFloat64(pipelineCondition.WithLabelValues(sp.Namespace, sp.Name, v1beta1.ConditionPlanned, "False", reason)); v != 1 {
			t.Errorf("%s: numastream_pipeline_condition{type=Planned,status=False,reason=%s} = %v, want 1", sp.Name, reason, v)
		}
		t.Logf("%s: %s", sp.Name, msg)
	}
	refused(pipeline(ns, "manifests", func(sp *v1beta1.StreamPipeline) {
		sink("", "")(sp)
		sp.Spec.Sink = &v1beta1.Sink{File: &v1beta1.FileSource{Root: "etc-kubernetes-manifests", Path: "x-{stream}.yaml"}}
	}), storage.ReasonNotAllowed, "spec.sink.file.root")
	refused(pipeline(other, "tenant-b", sink(root.Name, "b-{stream}.h5")), storage.ReasonNotAllowed, "spec.sink.hdf5.root")
	refused(pipeline(ns, "as-root-group", func(sp *v1beta1.StreamPipeline) {
		sink(root.Name, "c-{stream}.h5")(sp)
		sp.Spec.Files.Group = ptr.To[int64](65532)
	}), storage.ReasonNotAllowed, "spec.sink.hdf5.root")
	second := pipeline(ns, "second", sink(root.Name, "run-1/scan-0.h5"))
	refused(second, storage.ReasonPathInUse, "spec.sink.hdf5.path")

	// Several consumers (spec.sinks): files under the root and a live view are planned, with
	// one agent configuration naming them all; two file consumers on one path are refused.
	consumers := func(paths ...string) spOption {
		return func(sp *v1beta1.StreamPipeline) {
			sink(root.Name, "")(sp)
			sp.Spec.Sink = nil
			for i, p := range paths {
				sp.Spec.Sinks = append(sp.Spec.Sinks, v1beta1.Consumer{Name: fmt.Sprintf("files-%d", i),
					Sink: v1beta1.Sink{File: &v1beta1.FileSource{Root: root.Name, Path: p}}})
			}
			sp.Spec.Sinks = append(sp.Spec.Sinks, v1beta1.Consumer{Name: "live", Guarantee: v1beta1.GuaranteeLatest,
				Sink: v1beta1.Sink{ZMQ: &v1beta1.ZMQEndpoint{Endpoint: "tcp://viewer:7000"}}})
		}
	}
	fan := pipeline(ns, "fan", consumers("fan/a-{stream}.raw", "fan/b-{stream}.raw"))
	// And an onward hop to an HPC site 20 ms away on a 200 Mbit/s path losing 0.1%, with a spill
	// of its own under the root.
	fan.Spec.Sinks = append(fan.Spec.Sinks, v1beta1.Consumer{Name: "hpc", Spill: &v1beta1.ConsumerSpill{MaxBytes: 64 << 30, Root: root.Name, Path: "backlog"},
		Sink: v1beta1.Sink{Onward: &v1beta1.OnwardSink{
			Endpoint: "tcp://dtn.hpc.example:7000", ServerKey: farKey, Link: &v1beta1.OnwardLink{BandwidthMbps: 200,
				RoundTrip: &metav1.Duration{Duration: 20 * time.Millisecond}, LossPercent: "0.1"}}}})
	if err := k8s.Create(ctx, fan); err != nil {
		t.Fatal(err)
	}
	condition(t, fan, v1beta1.ConditionPlanned, metav1.ConditionTrue, ReasonPlanned)
	eventually(t, "the plan says how the onward hop forwards", func() (bool, string) {
		got := &v1beta1.StreamPipeline{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(fan), got); err != nil {
			return false, err.Error()
		}
		p := got.Status.Plan
		if p == nil || len(p.Onward) != 1 {
			return false, fmt.Sprintf("plan %+v", p)
		}
		o := p.Onward[0]
		// The path's 200 Mbit/s carry the stream compressed (expectedRatio 2): 400 of it.
		return o.Consumer == "hpc" && o.Connections == 9 && o.PredictedPathMbps == 200 && o.PredictedMbps == 400 &&
			o.Limit == "link" && o.PerConnectionMbps == 22 && o.Security == "curve", fmt.Sprintf("onward %+v", o)
	})
	eventually(t, "the gateway's configuration names the four consumers", func() (bool, string) {
		cm := &corev1.ConfigMap{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fan-agent"}, cm); err != nil {
			return false, err.Error()
		}
		var cfg render.AgentConfig
		if err := json.Unmarshal([]byte(cm.Data["gateway-0.json"]), &cfg); err != nil {
			return false, err.Error()
		}
		spill := "/var/spill/backlog/" + ns + "/fan-" + string(fan.UID) + "/hpc/stream-0"
		return len(cfg.Sinks) == 4 && cfg.Sinks[2].Guarantee == "latest" && cfg.Sinks[3].Kind == "numastream" &&
			cfg.Sinks[3].Connections == 9 && cfg.Sinks[3].Curve != nil && cfg.Sinks[3].Curve.ServerKey == farKey &&
			cfg.Sinks[3].Spill != nil && cfg.Sinks[3].Spill.Path == spill, fmt.Sprintf("sinks %+v, want the last one's spill in %s", cfg.Sinks, spill)
	})
	refused(pipeline(ns, "fan-same", consumers("fan2/a-{stream}.raw", "fan2/a-{stream}.raw")), storage.ReasonNotAllowed, "spec.sinks[1].file.path")
	refused(pipeline(ns, "fan-spill", consumers("fan3/a-{stream}.raw"), func(sp *v1beta1.StreamPipeline) {
		sp.Spec.Sinks[0].Spill = &v1beta1.ConsumerSpill{MaxBytes: 1 << 30, Root: "etc-kubernetes-manifests"}
	}), storage.ReasonNotAllowed, "spec.sinks[0].spill.root")

	if err := k8s.Delete(ctx, first); err != nil {
		t.Fatal(err)
	}
	// (envtest runs no controller-manager: the volume protection finalizer that the API server
	// adds stays, so "deleted" is a deletion timestamp here.)
	eventually(t, "the first pipeline's volumes deleted with it", func() (bool, string) {
		if err := k8s.List(ctx, &pvs, client.MatchingLabels{"numastream.io/pipeline-uid": string(first.UID)}); err != nil {
			t.Fatal(err)
		}
		left := 0
		for _, pv := range pvs.Items {
			if pv.DeletionTimestamp == nil {
				left++
			}
		}
		return left == 0, fmt.Sprintf("%d left", left)
	})
	condition(t, second, v1beta1.ConditionPlanned, metav1.ConditionTrue, ReasonPlanned)
}

// A write the API server refuses (here a namespace's quota on Jobs) is said in status with its
// reason, not only retried behind a status that no longer says what happens; once the quota
// goes, the Jobs are written and the condition clears.
func TestARefusedWriteIsACondition(t *testing.T) {
	ensureNode(t, facilityNode("lynx-31", []int{16, 16}, "ens1f0", 1, 200000))
	ensureNode(t, facilityNode("updraft-31", []int{16, 16}, "ens1f0", 1, 100000))
	ns := namespace(t)
	quota := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "no-jobs", Namespace: ns},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"count/jobs.batch": resource.MustParse("0")}}}
	if err := k8s.Create(ctx, quota); err != nil {
		t.Fatal(err)
	}
	// No quota controller runs here: say what it would (nothing used yet).
	quota.Status = corev1.ResourceQuotaStatus{Hard: quota.Spec.Hard, Used: corev1.ResourceList{"count/jobs.batch": resource.MustParse("0")}}
	if err := k8s.Status().Update(ctx, quota); err != nil {
		t.Fatal(err)
	}
	sp := pipeline(ns, "quota", withGateway("lynx-31"), withSenders("updraft-31"))
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	cur := condition(t, sp, v1beta1.ConditionReady, metav1.ConditionFalse, conditions.ReasonApplyFailed)
	ready := meta.FindStatusCondition(cur.Status.Conditions, v1beta1.ConditionReady)
	if !strings.Contains(ready.Message, "exceeded quota") || !strings.Contains(ready.Message, "no-jobs") {
		t.Errorf("Ready says %q: the quota is not named", ready.Message)
	}
	if rc := meta.FindStatusCondition(cur.Status.Conditions, conditions.Reconciling); rc == nil || rc.Status != metav1.ConditionTrue || rc.Reason != conditions.ReasonApplyFailed {
		t.Errorf("Reconciling %+v", rc)
	}
	if err := k8s.Delete(ctx, quota); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the Jobs written once the quota went", func() (bool, string) {
		var jobs batchv1.JobList
		_ = k8s.List(ctx, &jobs, client.InNamespace(ns))
		cur := &v1beta1.StreamPipeline{}
		_ = k8s.Get(ctx, client.ObjectKeyFromObject(sp), cur)
		r := meta.FindStatusCondition(cur.Status.Conditions, v1beta1.ConditionReady)
		return len(jobs.Items) == 2 && r != nil && r.Reason != conditions.ReasonApplyFailed, fmt.Sprintf("%d jobs, Ready %+v", len(jobs.Items), r)
	})
}

// With host networking no NetworkPolicy applies: the gateway's receiving agent admits connections
// only from its own sender node, by the addresses the operator reads from that node (the data NIC
// the node daemon published, InternalIP, ExternalIP; not the hostname), and spec.security.allowFrom.
func TestHostNetworkGatewaysAdmitOnlyTheirSenderNode(t *testing.T) {
	withAddress := func(ip string) nodeOption {
		return func(n *corev1.Node) { n.Labels[topology.NICAddressLabel("ens1f0")] = ip }
	}
	ensureNode(t, facilityNode("hn-gw", []int{16, 16}, "ens1f0", 1, 100000, withAddress("10.40.0.7")))
	ensureNode(t, facilityNode("hn-det", []int{16, 16}, "ens1f0", 1, 100000, withAddress("10.40.0.21")))
	det := &corev1.Node{}
	if err := k8s.Get(ctx, client.ObjectKey{Name: "hn-det"}, det); err != nil {
		t.Fatal(err)
	}
	det.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.7.21"},
		{Type: corev1.NodeExternalIP, Address: "203.0.113.21"}, {Type: corev1.NodeHostName, Address: "hn-det"}}
	if err := k8s.Status().Update(ctx, det); err != nil {
		t.Fatal(err)
	}
	ns := namespace(t)
	sp := pipeline(ns, "dtn", withGateway("hn-gw"), withSenders("hn-det"), func(sp *v1beta1.StreamPipeline) {
		sp.Spec.HostNetwork = true
		sp.Spec.Gateway.Network.Attachment = ""
		sp.Spec.Security = &v1beta1.Security{AllowFrom: []string{"10.99.0.0/16"}}
	})
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	condition(t, sp, v1beta1.ConditionPlanned, metav1.ConditionTrue, ReasonPlanned)
	var cfg render.AgentConfig
	eventually(t, "the gateway's configuration", func() (bool, string) {
		cm := &corev1.ConfigMap{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "dtn-agent"}, cm); err != nil {
			return false, err.Error()
		}
		return json.Unmarshal([]byte(cm.Data["gateway-0-relay.json"]), &cfg) == nil, cm.Data["gateway-0-relay.json"]
	})
	want := []string{"10.40.0.21/32", "10.99.0.0/16", "192.168.7.21/32", "203.0.113.21/32"}
	if cfg.Security == nil || cfg.Security.Curve == nil || !slices.Equal(cfg.Security.AllowFrom, want) {
		t.Errorf("gateway security %+v, want curve and allow_from %v", cfg.Security, want)
	}
}

// runPodsOf makes a running pod for each named Job, owned by it, as the Job controller and a
// kubelet would (envtest runs neither); the pods by Job name.
func runPodsOf(t *testing.T, ns string, names ...string) map[string]*corev1.Pod {
	t.Helper()
	out := map[string]*corev1.Pod{}
	for _, name := range names {
		j := &batchv1.Job{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, j); err != nil {
			t.Fatal(err)
		}
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: name + "-", Namespace: ns, Labels: map[string]string{batchv1.JobNameLabel: name},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: name, UID: j.UID, Controller: ptr.To(true)}}},
			Spec: j.Spec.Template.Spec}
		for k, v := range j.Spec.Template.Labels {
			p.Labels[k] = v
		}
		p.Spec.NodeName = j.Spec.Template.Spec.NodeSelector[corev1.LabelHostname]
		if err := k8s.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1"}
		if err := k8s.Status().Update(ctx, p); err != nil {
			t.Fatal(err)
		}
		out[name] = p
	}
	return out
}

// New keys for a two-stream pipeline roll one stream at a time (spec.rollout unset): stream 0's
// Jobs are replaced while stream 1's run on; stream 1 is replaced only once stream 0's new pods
// run; status.rollPending names stream 1 while it waits its turn.
func TestNewKeysRollOneStreamAtATime(t *testing.T) {
	// Nodes of its own: other tests leave running pods on the shared senders, whose CPUs the
	// planner counts.
	ensureNode(t, facilityNode("lynx-31", []int{16, 16}, "ens1f0", 1, 200000))
	for _, n := range []string{"roll-det-1", "roll-det-2"} {
		ensureNode(t, facilityNode(n, []int{16, 16}, "ens1f0", 1, 100000))
	}
	ns := namespace(t)
	sp := pipeline(ns, "roll", withGateway("lynx-31"), withSenders("roll-det-1", "roll-det-2"))
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	stream := func(id int) []string {
		return []string{fmt.Sprintf("roll-sender-%d", id), fmt.Sprintf("roll-gateway-%d", id)}
	}
	uids := func(names []string) map[string]types.UID {
		out := map[string]types.UID{}
		for _, name := range names {
			j := &batchv1.Job{}
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, j); err == nil && j.DeletionTimestamp == nil {
				out[name] = j.UID
			}
		}
		return out
	}
	eventually(t, "4 Jobs", func() (bool, string) { n := len(uids(append(stream(0), stream(1)...))); return n == 4, fmt.Sprint(n) })
	runPodsOf(t, ns, append(stream(0), stream(1)...)...)
	first0, first1 := uids(stream(0)), uids(stream(1))
	rolling := func() []int32 {
		cur := &v1beta1.StreamPipeline{}
		_ = k8s.Get(ctx, client.ObjectKeyFromObject(sp), cur)
		return cur.Status.RollPending
	}
	updateSpec(t, sp, func(p *v1beta1.StreamPipeline) {
		p.Annotations = map[string]string{v1beta1.AnnotationRotateKeys: "now"}
	})
	replaced := func(before map[string]types.UID, names []string) func() (bool, string) {
		return func() (bool, string) {
			now := uids(names)
			for _, n := range names {
				if now[n] == "" || now[n] == before[n] {
					return false, fmt.Sprintf("%v, rolling %v", now, rolling())
				}
			}
			return true, ""
		}
	}
	eventually(t, "stream 0 replaced with the new keys", replaced(first0, stream(0)))
	// Stream 1 runs on meanwhile, for as long as stream 0's new pods do not run.
	for range 5 {
		if got := uids(stream(1)); !maps.Equal(got, first1) {
			t.Fatalf("stream 1 replaced while stream 0 rolls: %v -> %v", first1, got)
		}
		if r := rolling(); !slices.Equal(r, []int32{1}) {
			t.Errorf("status.rollPending %v while stream 0 rolls", r)
		}
		time.Sleep(time.Second)
	}
	runPodsOf(t, ns, stream(0)...)
	eventually(t, "stream 1 replaced once stream 0 runs", replaced(first1, stream(1)))
	eventually(t, "nothing waits its turn", func() (bool, string) { r := rolling(); return len(r) == 0, fmt.Sprint(r) })
}

// farKey is a far receiver's CURVE public key, as an onward consumer's spec names it.
const farKey = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"

// The StreamPipelines and StorageRoots the documents show in full (a fenced yaml block with their
// kind) are accepted by the API server's own validation: a page never shows a manifest the API
// refuses.
func TestDocumentedManifestsAreAccepted(t *testing.T) {
	ns := namespace(t)
	pages, err := filepath.Glob(filepath.Join("..", "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, filepath.Join("..", "README.md"), filepath.Join("..", "ARCHITECTURE.md"))
	fence := regexp.MustCompile("(?s)```yaml\n(.*?)```")
	accepted := 0
	for _, page := range pages {
		text, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, block := range fence.FindAllStringSubmatch(string(text), -1) {
			for _, doc := range strings.Split(block[1], "\n---\n") {
				var obj client.Object
				switch {
				case strings.Contains(doc, "\nkind: StreamPipeline\n"):
					obj = &v1beta1.StreamPipeline{}
				case strings.Contains(doc, "\nkind: StorageRoot\n"):
					obj = &v1beta1.StorageRoot{}
				case strings.Contains(doc, "\nkind: RemoteSite\n"):
					obj = &v1beta1.RemoteSite{}
				default:
					continue
				}
				if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
					t.Errorf("%s: a manifest the API does not know: %v", page, err)
					continue
				}
				if _, cluster := obj.(*v1beta1.StorageRoot); !cluster {
					obj.SetNamespace(ns)
				}
				if err := k8s.Create(ctx, obj, client.DryRunAll); err != nil {
					t.Errorf("%s: %s refused: %v", page, obj.GetName(), err)
				}
				accepted++
			}
		}
	}
	if accepted < 2 {
		t.Errorf("only %d documented manifests found", accepted)
	}
	t.Logf("%d documented manifests accepted", accepted)
}

// Completed is written with the agents' final figures: a watcher that stops at Completed (as
// `kubectl numastream watch` does) reads every chunk, not the last reading taken while the
// agents ran (111 of 150 in a facility run, before the final figures were written with it).
func TestCompletedComesWithTheAgentsFinalFigures(t *testing.T) {
	gatewayAndSenders(t, "lynx-24")
	ensureNode(t, facilityNode("updraft-24", []int{16, 16}, "ens1f0", 1, 100000)) // its own: other tests' pipelines hold updraft-1's cores
	ns := namespace(t)
	sp := pipeline(ns, "ending", withGateway("lynx-24"), withSenders("updraft-24"))
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "numastream_raw_bytes_total{role=\"receive\"} %d\n", 111*11059200)
		fmt.Fprintf(w, "numastream_wire_bytes_total{role=\"receive\"} %d\n", 111*5529600)
		fmt.Fprintf(w, "numastream_chunks_delivered_total{role=\"receive\"} 111\n")
		fmt.Fprintf(w, "numastream_chunks_lost{role=\"receive\"} 0\nnumastream_chunks_corrupt_total{role=\"receive\"} 0\n")
	}))
	defer srv.Close()
	agentsServedBy(t, ns, srv.URL)
	runAgents(t, ns, "ending", "lynx-24")
	eventually(t, "a reading of the running agents", func() (bool, string) {
		cur := &v1beta1.StreamPipeline{}
		_ = k8s.Get(ctx, client.ObjectKeyFromObject(sp), cur)
		o := cur.Status.Observed
		return o != nil && o.ChunksDelivered == 111, fmt.Sprintf("%+v", o)
	})
	// The agents end: the kubelet writes their summaries, then the Job controller the Jobs.
	pod := &corev1.Pod{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "ending-gateway-0-xyz"}, pod); err != nil {
		t.Fatal(err)
	}
	ended := func(name, summary string) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: name, Image: "x", ImageID: "x", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: 0, Reason: "Completed", Message: summary,
			StartedAt: metav1.Now(), FinishedAt: metav1.Now()}}}
	}
	pod.Status.Phase = corev1.PodSucceeded
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{
		ended(render.ReceiveContainer, `{"role":"relay","nic_local":true}`),
		ended(render.DecompressContainer, `{"role":"receive","chunks":150,"lost":0,"corrupt":0,"raw_bytes":1658880000,"wire_bytes":829440000,"raw_gbps":1.75,"wire_gbps":0.87}`),
	}
	if err := k8s.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	var jobs batchv1.JobList
	if err := k8s.List(ctx, &jobs, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for i := range jobs.Items {
		j := &jobs.Items[i]
		now := metav1.Now()
		j.Status.Active, j.Status.Ready, j.Status.Succeeded = 0, ptr.To[int32](0), 1
		j.Status.CompletionTime = &now
		j.Status.Conditions = []batchv1.JobCondition{
			{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, LastTransitionTime: now, LastProbeTime: now},
			{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, LastTransitionTime: now, LastProbeTime: now}}
		if err := k8s.Status().Update(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	// Read as often as a watcher would see each version: the first version that says Completed.
	var cur *v1beta1.StreamPipeline
	testenv.Eventually(t, "Ready=True Completed", 20*time.Second, 5*time.Millisecond, func() (bool, string) {
		cur = &v1beta1.StreamPipeline{}
		_ = k8s.Get(ctx, client.ObjectKeyFromObject(sp), cur)
		ready := meta.FindStatusCondition(cur.Status.Conditions, v1beta1.ConditionReady)
		return ready != nil && ready.Reason == ReasonCompleted, fmt.Sprintf("Ready %v", ready)
	})
	if o := cur.Status.Observed; o == nil || o.ChunksDelivered != 150 || o.RawGbps != "1.75" || o.NICLocal == nil || !*o.NICLocal {
		t.Errorf("the first status that says Completed has observed %+v: want the agents' final figures (150 chunks, 1.75 Gbit/s, NIC-local)", o)
	}
}

// A pipeline sends on to a RemoteSite: the site's endpoint and key go into the gateway's hop, and
// the site's status lists the gateway's key for the far site to admit. A rotation lists the next
// key there first, while the agents keep theirs; once the site's keyPropagation has passed the
// gateway runs with the key listed, and the site admits only it. A pipeline naming a site that
// does not exist is held, naming it, until the site is made. A RemoteSite without a key is
// refused unless it says insecurePlaintext.
func TestARemoteSiteAdmitsTheNextGatewayKeyBeforeTheGatewayUsesIt(t *testing.T) {
	ensureNode(t, facilityNode("lynx-41", []int{16, 16}, "ens1f0", 1, 200000))
	ensureNode(t, facilityNode("far-det-1", []int{16, 16}, "ens1f0", 1, 100000))
	ns := namespace(t)
	if err := k8s.Create(ctx, &v1beta1.RemoteSite{ObjectMeta: metav1.ObjectMeta{Name: "keyless", Namespace: ns},
		Spec: v1beta1.RemoteSiteSpec{Endpoint: "tcp://dtn:7000"}}); err == nil || !strings.Contains(err.Error(), "serverKey: the far receiver's public key is required") {
		t.Errorf("a RemoteSite without a key: %v", err)
	}
	sp := pipeline(ns, "far", withGateway("lynx-41"), withSenders("far-det-1"), func(sp *v1beta1.StreamPipeline) {
		sp.Spec.Sinks = []v1beta1.Consumer{{Name: "archive", Sink: v1beta1.Sink{ZMQ: &v1beta1.ZMQEndpoint{Endpoint: "tcp://archive:7000"}}},
			{Name: "hpc", Sink: v1beta1.Sink{Onward: &v1beta1.OnwardSink{Site: "dtn"}}}}
	})
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	got := condition(t, sp, v1beta1.ConditionPlanned, metav1.ConditionFalse, ReasonRemoteSite)
	if c := meta.FindStatusCondition(got.Status.Conditions, v1beta1.ConditionPlanned); !strings.Contains(c.Message, "RemoteSite "+ns+"/dtn does not exist") {
		t.Errorf("held for a missing site: %q", c.Message)
	}
	site := &v1beta1.RemoteSite{ObjectMeta: metav1.ObjectMeta{Name: "dtn", Namespace: ns},
		Spec: v1beta1.RemoteSiteSpec{Endpoint: "tcp://dtn.example.org:7000", ServerKey: farKey, KeyPropagation: &metav1.Duration{Duration: 3 * time.Second}}}
	if err := k8s.Create(ctx, site); err != nil {
		t.Fatal(err)
	}
	condition(t, sp, v1beta1.ConditionPlanned, metav1.ConditionTrue, ReasonPlanned)
	var cm corev1.ConfigMap
	eventually(t, "the gateway's hop to the site's endpoint with its key", func() (bool, string) {
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "far-agent"}, &cm); err != nil {
			return false, err.Error()
		}
		all := fmt.Sprint(cm.Data)
		return strings.Contains(all, "tcp://dtn.example.org:7000") && strings.Contains(all, inConfig(farKey)), all
	})
	admitted := func(what string, ok func(keys []v1beta1.AdmittedKey, g *v1beta1.GatewayKey) bool) []v1beta1.AdmittedKey {
		t.Helper()
		var keys []v1beta1.AdmittedKey
		eventually(t, what, func() (bool, string) {
			cur, s := &v1beta1.StreamPipeline{}, &v1beta1.RemoteSite{}
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(sp), cur); err != nil {
				return false, err.Error()
			}
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(site), s); err != nil {
				return false, err.Error()
			}
			keys = s.Status.AdmittedKeys
			return ok(keys, cur.Status.GatewayKey), fmt.Sprintf("site admits %+v; pipeline's gateway key %+v", keys, cur.Status.GatewayKey)
		})
		return keys
	}
	first := admitted("the site admits the gateway's key", func(keys []v1beta1.AdmittedKey, g *v1beta1.GatewayKey) bool {
		return g != nil && len(keys) == 1 && keys[0].Key == g.Public && keys[0].Use == v1beta1.KeyUseCurrent && keys[0].Pipeline == "far"
	})
	gatewayKeys := func() string {
		var j batchv1.Job
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "far-gateway-0"}, &j); err != nil {
			return ""
		}
		return j.Spec.Template.Annotations[render.AnnotationKeys]
	}
	var before string
	eventually(t, "the gateway Job", func() (bool, string) { before = gatewayKeys(); return before != "", "" })

	askRotation(t, sp, "2026-11-30")
	listed := admitted("the next key listed beside the current one", func(keys []v1beta1.AdmittedKey, _ *v1beta1.GatewayKey) bool {
		return len(keys) == 2 && keys[0].Key == first[0].Key && keys[1].Use == v1beta1.KeyUseNext && keys[1].Since != nil
	})
	if now := gatewayKeys(); now != before {
		t.Errorf("the gateway's keys changed before the site had its keyPropagation to admit the next one")
	}
	admitted("the gateway's key is the one listed, and the site admits only it", func(keys []v1beta1.AdmittedKey, g *v1beta1.GatewayKey) bool {
		return len(keys) == 1 && keys[0].Key == listed[1].Key && keys[0].Use == v1beta1.KeyUseCurrent && g.Public == listed[1].Key && g.Next == ""
	})
	eventually(t, "the gateway Job with the new keys", func() (bool, string) {
		now := gatewayKeys()
		return now != "" && now != before, now
	})

	// The far site rotates its own key (and moves): the gateway's hop follows the site.
	farNext, err := curvekeys.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(site), site); err != nil {
			return err
		}
		site.Spec.ServerKey, site.Spec.Endpoint = farNext.Public, "tcp://dtn2.example.org:7001"
		return k8s.Update(ctx, site)
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the gateway's hop with the far site's new key and endpoint", func() (bool, string) {
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "far-agent"}, &cm); err != nil {
			return false, err.Error()
		}
		all := fmt.Sprint(cm.Data)
		return strings.Contains(all, "tcp://dtn2.example.org:7001") && strings.Contains(all, inConfig(farNext.Public)) &&
			!strings.Contains(all, inConfig(farKey)), all
	})

	if err := k8s.Delete(ctx, sp); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a deleted pipeline's key no longer admitted", func() (bool, string) {
		s := &v1beta1.RemoteSite{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(site), s); err != nil {
			return false, err.Error()
		}
		return len(s.Status.AdmittedKeys) == 0, fmt.Sprintf("%+v", s.Status.AdmittedKeys)
	})
}

// inConfig is a key as the agent's JSON configuration holds it (escaped, without quotes).
func inConfig(key string) string {
	b, _ := json.Marshal(key)
	return strings.Trim(string(b), `"`)
}

// askRotation sets the pipeline's numastream.io/rotate-keys annotation to value.
func askRotation(t *testing.T, sp *v1beta1.StreamPipeline, value string) {
	t.Helper()
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &v1beta1.StreamPipeline{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(sp), cur); err != nil {
			return err
		}
		metav1.SetMetaDataAnnotation(&cur.ObjectMeta, v1beta1.AnnotationRotateKeys, value)
		return k8s.Update(ctx, cur)
	}); err != nil {
		t.Fatal(err)
	}
}
