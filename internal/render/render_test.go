package render

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	psa "k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"

	"github.com/numastream/numastream/internal/planner"
	"github.com/numastream/numastream/internal/topology"
)

type option func(*v1beta1.StreamPipeline)

func withStreams(n int) option {
	return func(sp *v1beta1.StreamPipeline) {
		sp.Spec.Senders = nil
		for i := 0; i < n; i++ {
			sp.Spec.Senders = append(sp.Spec.Senders, v1beta1.Sender{
				Node:   "det-" + string(rune('a'+i)),
				Source: v1beta1.Source{Synthetic: &v1beta1.SyntheticSource{Chunks: 100, Seed: int64(i)}},
			})
		}
	}
}
func withAttachment(a string) option {
	return func(sp *v1beta1.StreamPipeline) { sp.Spec.Gateway.Network.Attachment = a }
}
func withResourceName(r string) option {
	return func(sp *v1beta1.StreamPipeline) { sp.Spec.Gateway.Network.ResourceName = r }
}
func withPlacement(m v1beta1.PlacementMode) option {
	return func(sp *v1beta1.StreamPipeline) { sp.Spec.Placement = m }
}
func withFileSink(p string) option {
	return func(sp *v1beta1.StreamPipeline) {
		sp.Spec.Sink = &v1beta1.Sink{File: &v1beta1.FileSource{Root: "archive", Path: p}}
	}
}
func withFileSource(p string) option {
	return func(sp *v1beta1.StreamPipeline) {
		sp.Spec.Senders[0].Source = v1beta1.Source{File: &v1beta1.FileSource{Root: "scratch", Path: p}}
	}
}

// testRoots: the admin's StorageRoots the tests' pipelines use.
func testRoots() map[string]*v1beta1.StorageRoot {
	root := func(name, path string, roles ...string) *v1beta1.StorageRoot {
		return &v1beta1.StorageRoot{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1beta1.StorageRootSpec{Path: path, NodeRoles: roles}}
	}
	return map[string]*v1beta1.StorageRoot{
		"scratch": root("scratch", "/scratch", v1beta1.StorageRoleSender),
		"archive": root("archive", "/archive", v1beta1.StorageRoleGateway),
		"nvme":    root("nvme", "/nvme", v1beta1.StorageRoleSender),
		"tape":    root("tape", "/tape-cache", v1beta1.StorageRoleGateway),
	}
}

func pipeline(name string, opts ...option) *v1beta1.StreamPipeline {
	sp := &v1beta1.StreamPipeline{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "beamline", UID: "uid-1"},
		Spec: v1beta1.StreamPipelineSpec{
			Gateway:    v1beta1.Gateway{Node: "lynx-1", Network: v1beta1.DataNetwork{NIC: "ens1f0"}},
			Codec:      "lz4",
			Port:       5555,
			ChunkBytes: 11059200,
			Placement:  v1beta1.PlacementNUMAAware,
		},
	}
	withStreams(1)(sp)
	for _, o := range opts {
		o(sp)
	}
	return sp
}

func gateway() topology.Node {
	return topology.Node{
		Name:         "lynx-1",
		NUMANodes:    []topology.NUMANode{{ID: 0, CPUs: 16}, {ID: 1, CPUs: 16}},
		NICs:         map[string]topology.NIC{"ens1f0": {Name: "ens1f0", NUMANode: 1, SpeedMbit: 200000}},
		CompressMBps: 440, DecompressMBps: 1600,
	}
}

func sender(name string) topology.Node {
	n := gateway()
	n.Name = name
	return n
}

func renderFor(t *testing.T, sp *v1beta1.StreamPipeline) (Objects, planner.Plan) {
	t.Helper()
	in := inputsFor(t, sp)
	objs, err := Render(in, Options{AgentImage: "numastream/agent:test", NetworkPolicy: true})
	if err != nil {
		t.Fatal(err)
	}
	return objs, in.Plan
}

// inputsFor plans the pipeline on the tests' nodes and gives render what the operator would.
func inputsFor(t *testing.T, sp *v1beta1.StreamPipeline) Inputs {
	t.Helper()
	var senders []topology.Node
	for _, s := range sp.Spec.Senders {
		senders = append(senders, sender(s.Node))
	}
	plan, err := planner.Make(planner.Request{
		Senders: senders, Gateway: gateway(), GatewayNIC: "ens1f0", Ratio: 2, Port: 5555,
		Mode: planner.Mode(sp.Spec.Placement), HasSink: len(sp.Spec.Consumers()) > 0, Slots: sp.StreamSlots(),
		ExtraConsumers:      ExtraConsumers(sp),
		Onward:              OnwardRequests(sp),
		ExtraPortsPerStream: map[bool]int{true: HostMetricsPortsPerStream}[sp.Spec.HostNetwork],
	})
	if err != nil {
		t.Fatal(err)
	}
	// Each gateway pod's address on the data network, as Multus reports it once the pod runs.
	in := Inputs{Pipeline: sp, Plan: plan, Gateway: gateway(), DataAddresses: map[int]string{}, Roots: testRoots(),
		SenderAddresses: map[int][]string{}}
	for i := range sp.Spec.Senders {
		in.DataAddresses[i] = fmt.Sprintf("10.215.0.%d", 100+i)
		// The sender node's data NIC and InternalIP, as the operator reads them from the node.
		in.SenderAddresses[i] = []string{fmt.Sprintf("10.40.0.%d", 20+i), fmt.Sprintf("192.168.7.%d", 20+i)}
	}
	if sp.Spec.HostNetwork {
		in.GatewayAddress = "10.40.0.7"
	}
	hop := slices.ContainsFunc(sp.Spec.Sinks, func(k v1beta1.Consumer) bool { return k.Onward != nil && k.Onward.ServerKey != "" })
	if sp.Spec.SecurityMode() != v1beta1.SecurityNone || hop { // as the operator's keys decide
		in.KeysSecret, in.KeysHashes = sp.Name+"-curve-keys", map[int]string{}
		for _, id := range sp.StreamIDs() {
			in.KeysHashes[id] = "k1"
		}
	}
	return in
}

func TestRenderedPodsAreGuaranteedAndPinnedToTheirNode(t *testing.T) {
	objs, plan := renderFor(t, pipeline("tomo", withStreams(2)))
	if len(objs.Jobs) != 4 || len(objs.Services) != 2 {
		t.Fatalf("%d jobs, %d services", len(objs.Jobs), len(objs.Services))
	}
	for i, j := range objs.Jobs {
		n := plan.Pods()[i]
		pod := j.Spec.Template.Spec
		if pod.NodeSelector[corev1.LabelHostname] != n.Node {
			t.Errorf("%s: node selector %v", j.Name, pod.NodeSelector)
		}
		if pod.RestartPolicy != corev1.RestartPolicyNever {
			t.Errorf("%s: restart policy %s", j.Name, pod.RestartPolicy)
		}
		total := int64(0)
		for _, c := range pod.Containers {
			cpu := c.Resources.Requests[corev1.ResourceCPU]
			if cpu.MilliValue()%1000 != 0 || cpu.Value() < 1 {
				t.Errorf("%s/%s: cpu request %s, want whole cores", j.Name, c.Name, cpu.String())
			}
			total += cpu.Value()
			for name, q := range c.Resources.Requests {
				if l := c.Resources.Limits[name]; l.Cmp(q) != 0 {
					t.Errorf("%s/%s: %s request %s != limit %s (not Guaranteed)", j.Name, c.Name, name, q.String(), l.String())
				}
			}
			if _, ok := c.Resources.Requests[corev1.ResourceMemory]; !ok {
				t.Errorf("%s/%s: no memory request", j.Name, c.Name)
			}
		}
		if total != int64(n.CPUs) {
			t.Errorf("%s: %d cores over its containers, the plan says %d", j.Name, total, n.CPUs)
		}
		if len(j.OwnerReferences) != 1 || j.OwnerReferences[0].Kind != "StreamPipeline" || !*j.OwnerReferences[0].Controller {
			t.Errorf("%s: owner refs %+v", j.Name, j.OwnerReferences)
		}
	}
}

// A gateway pod has one container per stage group: the receiving container holds the NIC's
// device resource (so Topology Manager aligns its cores with the NIC) and the receive threads'
// cores; the decompressing container holds decompression and the sink, and no NIC resource.
// They share an emptyDir for the IPC socket between them.
func TestGatewayPodHasOneContainerPerStageGroup(t *testing.T) {
	objs, plan := renderFor(t, pipeline("tomo", withAttachment("data/hsn-200g")))
	gw := objs.Jobs[1]
	if gw.Labels[LabelRole] != RoleGateway {
		t.Fatalf("second job is %s", gw.Name)
	}
	cs := gw.Spec.Template.Spec.Containers
	if len(cs) != 2 || cs[0].Name != ReceiveContainer || cs[1].Name != DecompressContainer {
		t.Fatalf("gateway containers %v", cs)
	}
	rx, dx := cs[0], cs[1]
	if q := rx.Resources.Limits["numastream.io/nic-ens1f0"]; q.Cmp(resource.MustParse("1")) != 0 {
		t.Errorf("NIC token limit %v", rx.Resources.Limits)
	}
	if _, ok := dx.Resources.Limits["numastream.io/nic-ens1f0"]; ok {
		t.Error("the decompressing container must not take the NIC token")
	}
	if cpu := rx.Resources.Requests[corev1.ResourceCPU]; cpu.Value() != int64(plan.Connections) {
		t.Errorf("receiving container has %s CPUs, want one per connection (%d)", cpu.String(), plan.Connections)
	}
	if len(rx.Ports) != 1+plan.Connections || len(dx.Ports) != 1 || dx.Ports[0].ContainerPort != DecompressMetricsPort {
		t.Errorf("ports: receive %v, decompress %v", rx.Ports, dx.Ports)
	}
	for _, c := range cs {
		for _, port := range c.Ports {
			if errs := validation.IsValidPortName(port.Name); len(errs) > 0 {
				t.Errorf("%s port %q: %v", c.Name, port.Name, errs)
			}
		}
	}
	if rx.Args[2] != ConfigMountPath+"/gateway-0-relay.json" || dx.Args[2] != ConfigMountPath+"/gateway-0.json" {
		t.Errorf("args: %v / %v", rx.Args, dx.Args)
	}
	shared := func(c corev1.Container) bool {
		for _, m := range c.VolumeMounts {
			if m.Name == "relay" && m.MountPath == RelayDir {
				return true
			}
		}
		return false
	}
	if !shared(rx) || !shared(dx) {
		t.Error("both containers mount the relay emptyDir")
	}
	if got := gw.Spec.Template.Annotations[MultusAnnotation]; got != "data/hsn-200g" {
		t.Errorf("multus annotation %q", got)
	}
	if got := objs.Jobs[0].Spec.Template.Annotations[MultusAnnotation]; got != "data/hsn-200g" {
		t.Errorf("the sender joins the data network too (it dials the gateway there): annotation %q", got)
	}
	if _, ok := objs.Jobs[0].Spec.Template.Spec.Containers[0].Resources.Limits["numastream.io/nic-ens1f0"]; ok {
		t.Error("sender must not request the gateway's NIC token")
	}
	objs, _ = renderFor(t, pipeline("tomo", withResourceName("intel.com/sriov_200g")))
	if _, ok := objs.Jobs[1].Spec.Template.Spec.Containers[0].Resources.Limits["intel.com/sriov_200g"]; !ok {
		t.Error("an SR-IOV resource name replaces the NIC token")
	}
	objs, _ = renderFor(t, pipeline("tomo", withPlacement(v1beta1.PlacementOS)))
	if len(objs.Jobs[1].Spec.Template.Spec.Containers[0].Resources.Limits) != 2 {
		t.Error("os placement requests no NIC alignment")
	}
}

func TestRestrictedSecurityContext(t *testing.T) {
	objs, _ := renderFor(t, pipeline("tomo"))
	for _, j := range objs.Jobs {
		ps := j.Spec.Template.Spec.SecurityContext
		if !*ps.RunAsNonRoot || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("%s pod security %+v", j.Name, ps)
		}
		for _, ct := range j.Spec.Template.Spec.Containers {
			c := ct.SecurityContext
			if *c.AllowPrivilegeEscalation || !*c.ReadOnlyRootFilesystem || c.Capabilities.Drop[0] != "ALL" {
				t.Errorf("%s/%s container security %+v", j.Name, ct.Name, c)
			}
		}
	}
}

// The rendered agent configs follow docs/agent-config.md: the fields the agent parses, with the
// plan's thread counts and NUMA targets.
func TestAgentConfigsFollowThePlan(t *testing.T) {
	objs, plan := renderFor(t, pipeline("tomo", withStreams(2)))
	var tx, relay, rx map[string]any
	for key, out := range map[string]*map[string]any{"sender-1.json": &tx, "gateway-1-relay.json": &relay, "gateway-1.json": &rx} {
		if err := json.Unmarshal([]byte(objs.ConfigMap.Data[key]), out); err != nil {
			t.Fatal(key, err)
		}
	}
	wantPort := plan.Gateways[1].Port
	if tx["endpoint"] != "tcp://tomo-gateway-1.beamline.svc:"+itoa(wantPort) {
		t.Errorf("sender endpoint %v", tx["endpoint"])
	}
	if tx["stream_id"] != 1.0 || tx["connections"] != float64(plan.Connections) {
		t.Errorf("sender %v", tx)
	}
	// The receiving container: the data ports, the receive threads on the NIC's node, relaying
	// to the decompressing container.
	if relay["endpoint"] != "tcp://0.0.0.0:"+itoa(wantPort) || relay["relay"] != true ||
		relay["sink"].(map[string]any)["endpoint"] != RelaySocket {
		t.Errorf("relay %v", relay)
	}
	pl := relay["placement"].(map[string]any)
	stages := pl["stages"].(map[string]any)
	if r := stages["receive"].(map[string]any); r["numa"] != "nic" || r["threads"] != float64(plan.Connections) || len(stages) != 1 {
		t.Errorf("relay stages %v", stages)
	}
	if pl["nic_numa_node"] != 1.0 {
		t.Errorf("nic numa node %v", pl)
	}
	// The decompressing container: reads the IPC socket, decompresses where the plan says.
	if rx["endpoint"] != RelaySocket || rx["connections"] != 1.0 || rx["streams"] != 1.0 {
		t.Errorf("decompressing endpoint %v connections %v streams %v", rx["endpoint"], rx["connections"], rx["streams"])
	}
	dstages := rx["placement"].(map[string]any)["stages"].(map[string]any)
	var planned float64
	for _, st := range plan.Gateways[1].Stages {
		if st.Name == "decompress" {
			planned = float64(st.Threads)
		}
	}
	if d := dstages["decompress"].(map[string]any); d["threads"] != planned {
		t.Errorf("decompress stage %v, plan %v", d, planned)
	}
	if _, ok := rx["placement"].(map[string]any)["nic_numa_node"]; ok {
		t.Error("the decompressing container does not touch the NIC")
	}
	src := tx["source"].(map[string]any)
	if src["kind"] != "synthetic" || src["chunks"] != 100.0 || src["seed"] != 1.0 {
		t.Errorf("source %v", src)
	}
	for _, key := range []string{"version", "endpoint", "connections", "chunk_bytes", "codec", "metrics", "placement"} {
		if _, ok := tx[key]; !ok {
			t.Errorf("sender config lacks %s", key)
		}
	}
}

// Sources and sinks under StorageRoots reach the pods through claims bound to volumes of the
// whole root on the pod's node (a source's read-only): no pod carries a hostPath volume, and the
// agents' paths are the spec's relative paths under the mount.
func TestStorageRootsAreMountedThroughBoundClaims(t *testing.T) {
	sp := pipeline("tomo", withFileSource("scan-42"), withFileSink("run-7/scan-{stream}.raw"))
	objs, _ := renderFor(t, sp)
	tx := objs.Jobs[0].Spec.Template.Spec
	rx := objs.Jobs[1].Spec.Template.Spec
	txClaim := volumeNamed(tx, "data").PersistentVolumeClaim
	rxClaim := volumeNamed(rx, "data").PersistentVolumeClaim
	if txClaim == nil || !txClaim.ReadOnly || !tx.Containers[0].VolumeMounts[1].ReadOnly {
		t.Errorf("sender data volume %+v %+v", tx.Volumes, tx.Containers[0].VolumeMounts)
	}
	dx := rx.Containers[1]
	if rxClaim == nil || rxClaim.ReadOnly || dx.VolumeMounts[len(dx.VolumeMounts)-2].Name != "data" || dx.VolumeMounts[len(dx.VolumeMounts)-2].ReadOnly {
		t.Errorf("gateway data volume %+v mounts %+v", rx.Volumes, dx.VolumeMounts)
	}
	for _, job := range objs.Jobs {
		for _, v := range job.Spec.Template.Spec.Volumes {
			if v.HostPath != nil {
				t.Errorf("%s mounts the host's %s directly", job.Name, v.HostPath.Path)
			}
		}
		if len(job.Spec.Template.Spec.InitContainers) != 0 {
			t.Errorf("%s has init containers", job.Name)
		}
	}
	pvs := map[string]*corev1.PersistentVolume{}
	for _, v := range objs.Volumes {
		if v.PV.Spec.ClaimRef.Name != v.Claim.Name || v.Claim.Spec.VolumeName != v.PV.Name || v.Claim.Namespace != "beamline" {
			t.Errorf("claim %s and volume %s are not bound to each other", v.Claim.Name, v.PV.Name)
		}
		pvs[v.Claim.Name] = v.PV
	}
	for claim, want := range map[string]struct{ path, node string }{
		txClaim.ClaimName: {"/scratch", "det-a"}, rxClaim.ClaimName: {"/archive", "lynx-1"},
		volumeNamed(tx, "state").PersistentVolumeClaim.ClaimName: {"/var/lib/numastream/streams/beamline/tomo-uid-1", "det-a"},
	} {
		pv := pvs[claim]
		if pv == nil || pv.Spec.HostPath.Path != want.path || *pv.Spec.HostPath.Type != corev1.HostPathDirectory ||
			pv.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values[0] != want.node ||
			pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimRetain {
			t.Errorf("claim %s: volume %+v, want %s on %s, retained", claim, pv, want.path, want.node)
		}
	}
	if !strings.Contains(objs.ConfigMap.Data["gateway-0.json"], `"path": "/data/run-7/scan-{stream}.raw"`) ||
		!strings.Contains(objs.ConfigMap.Data["gateway-0.json"], `"mode": "0640"`) ||
		!strings.Contains(objs.ConfigMap.Data["sender-0.json"], `"path": "/data/scan-42"`) {
		t.Errorf("configs %v", objs.ConfigMap.Data)
	}
	// A pipeline's own claim is mounted as it is: no volume is made for it.
	sp.Spec.Sink.File = &v1beta1.FileSource{Claim: "gpfs-beamline", Path: "x-{stream}.raw"}
	objs, _ = renderFor(t, sp)
	if c := volumeNamed(objs.Jobs[1].Spec.Template.Spec, "data").PersistentVolumeClaim; c == nil || c.ClaimName != "gpfs-beamline" {
		t.Errorf("gateway data volume %+v", objs.Jobs[1].Spec.Template.Spec.Volumes)
	}
	if len(objs.Volumes) != 2 { // the source's root, the state
		t.Errorf("volumes %d, want 2", len(objs.Volumes))
	}
}

// Where the node daemon makes pipelines' directories (Prefixes), each volume holds the
// pipeline's own directory of its root and the agents' paths are relative to it.
func TestAVolumeIsThePipelinesOwnDirectoryWhereTheDaemonMakesIt(t *testing.T) {
	sp := pipeline("tomo", withFileSource("visit-1/scan-42"), withFileSink("run-7/scan-{stream}.raw"), func(sp *v1beta1.StreamPipeline) {
		sp.Spec.Spill = &v1beta1.Spill{MaxBytes: 8 << 30, Root: "nvme", Path: "spill"}
	})
	in := inputsFor(t, sp)
	in.Prefixes = []string{"/scratch", "/archive", "/nvme"}
	objs, err := Render(in, Options{AgentImage: "numastream/agent:test"})
	if err != nil {
		t.Fatal(err)
	}
	tx, rx := objs.Jobs[0].Spec.Template.Spec, objs.Jobs[1].Spec.Template.Spec
	hostPath := map[string]string{}
	for _, v := range objs.Volumes {
		hostPath[v.Claim.Name] = v.PV.Spec.HostPath.Path
	}
	for _, c := range []struct {
		pod        corev1.PodSpec
		volume     string
		want       string
		configKey  string
		configPath string
	}{
		{tx, "data", "/scratch/visit-1", "sender-0.json", `"path": "/data/scan-42"`},
		{tx, "spill", "/nvme/spill/beamline/tomo-uid-1", "sender-0.json", `"path": "/var/spill"`},
		{rx, "data", "/archive/run-7", "gateway-0.json", `"path": "/data/scan-{stream}.raw"`},
	} {
		v := volumeNamed(c.pod, c.volume)
		if v == nil || v.PersistentVolumeClaim == nil || hostPath[v.PersistentVolumeClaim.ClaimName] != c.want {
			t.Errorf("volume %s: %+v on %v, want %s", c.volume, v, hostPath, c.want)
		}
		if !strings.Contains(objs.ConfigMap.Data[c.configKey], c.configPath) {
			t.Errorf("%s lacks %s: %s", c.configKey, c.configPath, objs.ConfigMap.Data[c.configKey])
		}
	}
}

// The onward hop proves the far site and encrypts whatever the facility network's mode: with
// mode none the data ports stay plain (no keys for the sender, none in the relay) while the
// container running the hop gets the gateway's key; a hop without the far key is refused unless
// it opts into plaintext by name, and then goes in clear.
func TestTheOnwardHopIsEncryptedWhateverTheFacilityNetworksMode(t *testing.T) {
	const far = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"
	hop := func(o v1beta1.OnwardSink) option {
		return func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Security = &v1beta1.Security{Mode: v1beta1.SecurityNone}
			o.Endpoint = "tcp://dtn:7000"
			sp.Spec.Sinks = []v1beta1.Consumer{{Name: "here", Sink: v1beta1.Sink{File: &v1beta1.FileSource{Root: "archive", Path: "run/s-{stream}.raw"}}},
				{Name: "hpc", Sink: v1beta1.Sink{Onward: &o}}}
		}
	}
	mounts := func(c corev1.Container) bool {
		return slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "keys" })
	}
	objs, _ := renderFor(t, pipeline("hop", hop(v1beta1.OnwardSink{ServerKey: far})))
	tx, rx := objs.Jobs[0].Spec.Template.Spec, objs.Jobs[1].Spec.Template.Spec
	if volumeNamed(tx, "keys") != nil || mounts(rx.Containers[0]) || !mounts(rx.Containers[1]) {
		t.Errorf("keys: sender volume %v, relay %v, hop's container %v: want only the hop's", volumeNamed(tx, "keys") != nil, mounts(rx.Containers[0]), mounts(rx.Containers[1]))
	}
	var gw, relay, sender AgentConfig
	for key, cfg := range map[string]*AgentConfig{"gateway-0.json": &gw, "gateway-0-relay.json": &relay, "sender-0.json": &sender} {
		if err := json.Unmarshal([]byte(objs.ConfigMap.Data[key]), cfg); err != nil {
			t.Fatal(err)
		}
	}
	if c := gw.Sinks[1].Curve; c == nil || c.Mode != "encrypt" || c.ServerKey != far || relay.Security != nil || sender.Security != nil {
		t.Errorf("hop curve %+v, relay security %+v, sender security %+v: want the hop alone encrypted", gw.Sinks[1].Curve, relay.Security, sender.Security)
	}

	in := inputsFor(t, pipeline("hop", hop(v1beta1.OnwardSink{})))
	if _, err := Render(in, Options{AgentImage: "numastream/agent:test"}); err == nil || !strings.Contains(err.Error(), "spec.sinks[1].onward.serverKey") {
		t.Errorf("a hop without the far key: %v, want refused naming the field", err)
	}
	in = inputsFor(t, pipeline("hop", hop(v1beta1.OnwardSink{ServerKey: far})))
	in.KeysSecret = ""
	if _, err := Render(in, Options{AgentImage: "numastream/agent:test"}); err == nil || !strings.Contains(err.Error(), "spec.sinks[1].onward") {
		t.Errorf("a hop with no keys to connect with: %v, want refused", err)
	}
	objs, _ = renderFor(t, pipeline("hop", hop(v1beta1.OnwardSink{InsecurePlaintext: true})))
	gw = AgentConfig{}
	if err := json.Unmarshal([]byte(objs.ConfigMap.Data["gateway-0.json"]), &gw); err != nil {
		t.Fatal(err)
	}
	if gw.Sinks[1].Curve != nil || volumeNamed(objs.Jobs[1].Spec.Template.Spec, "keys") != nil {
		t.Errorf("an insecure-plaintext hop: curve %+v", gw.Sinks[1].Curve)
	}
}

func TestPlanHashChangesWithTheConfig(t *testing.T) {
	a, _ := renderFor(t, pipeline("tomo"))
	sp := pipeline("tomo")
	sp.Spec.Codec = "shuffle-lz4"
	b, _ := renderFor(t, sp)
	if a.Jobs[0].Annotations[AnnotationPlanHash] == b.Jobs[0].Annotations[AnnotationPlanHash] {
		t.Error("changing the codec must change the plan hash")
	}
	c, _ := renderFor(t, pipeline("tomo"))
	if a.Jobs[0].Annotations[AnnotationPlanHash] != c.Jobs[0].Annotations[AnnotationPlanHash] {
		t.Error("rendering is deterministic")
	}
}

// Every agent's configuration asks for the operator's metrics token by its digest (never the
// token), over HTTPS only, and a new token replaces the Jobs whose agents would refuse it;
// without a token, no TLS either.
func TestEveryAgentAsksForTheMetricsToken(t *testing.T) {
	in := inputsFor(t, pipeline("tomo", withStreams(2)))
	digest := strings.Repeat("ab", 32)
	objs, err := Render(in, Options{AgentImage: "numastream/agent:test", MetricsTokenSHA256: digest})
	if err != nil {
		t.Fatal(err)
	}
	if len(objs.ConfigMap.Data) < 6 {
		t.Fatalf("configs %v", objs.ConfigMap.Data)
	}
	for key, text := range objs.ConfigMap.Data {
		var cfg struct{ Metrics MetricsConfig }
		if err := json.Unmarshal([]byte(text), &cfg); err != nil || cfg.Metrics.TokenSHA256 != digest || cfg.Metrics.Listen == "" || !cfg.Metrics.TLS {
			t.Errorf("%s: metrics %+v %v", key, cfg.Metrics, err)
		}
	}
	other, _ := Render(in, Options{AgentImage: "numastream/agent:test", MetricsTokenSHA256: strings.Repeat("cd", 32)})
	if objs.Jobs[0].Annotations[AnnotationPlanHash] == other.Jobs[0].Annotations[AnnotationPlanHash] {
		t.Error("another metrics token must change the plan hash")
	}
	none, _ := Render(in, Options{AgentImage: "numastream/agent:test"})
	for key, text := range none.ConfigMap.Data {
		var cfg struct{ Metrics MetricsConfig }
		if err := json.Unmarshal([]byte(text), &cfg); err != nil || cfg.Metrics.TokenSHA256 != "" || cfg.Metrics.TLS {
			t.Errorf("without a token, %s: metrics %+v %v", key, cfg.Metrics, err)
		}
	}
}

// Whatever changes a pod changes its plan hash, so the Job is replaced rather than patched with a
// pod template the API server refuses (a Job's template is immutable): a new agent image (helm
// upgrade), host networking switched, another data network attachment.
func TestPlanHashCoversTheWholePod(t *testing.T) {
	_, plan := renderFor(t, pipeline("tomo", withStreams(2)))
	render := func(edit func(*v1beta1.StreamPipeline, *Inputs, *Options)) []*batchv1.Job {
		t.Helper()
		sp := pipeline("tomo", withStreams(2))
		in := Inputs{Pipeline: sp, Plan: plan, Gateway: gateway(), GatewayAddress: "10.40.0.7",
			DataAddresses: map[int]string{0: "10.215.0.100", 1: "10.215.0.101"}}
		opts := Options{AgentImage: "numastream/agent:1.0"}
		edit(sp, &in, &opts)
		objs, err := Render(in, opts)
		if err != nil {
			t.Fatal(err)
		}
		return objs.Jobs
	}
	base := render(func(*v1beta1.StreamPipeline, *Inputs, *Options) {})
	for what, edit := range map[string]func(*v1beta1.StreamPipeline, *Inputs, *Options){
		"a new agent image": func(_ *v1beta1.StreamPipeline, _ *Inputs, o *Options) { o.AgentImage = "numastream/agent:1.1" },
		"host networking":   func(sp *v1beta1.StreamPipeline, _ *Inputs, _ *Options) { sp.Spec.HostNetwork = true },
		"another attachment": func(sp *v1beta1.StreamPipeline, _ *Inputs, _ *Options) {
			sp.Spec.Gateway.Network.Attachment = "data-b"
		},
		"new keys": func(_ *v1beta1.StreamPipeline, in *Inputs, _ *Options) {
			in.KeysHashes = map[int]string{0: "k2", 1: "k2"}
		},
		"an operator toleration": func(_ *v1beta1.StreamPipeline, _ *Inputs, o *Options) {
			o.Pods.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
		},
	} {
		got := render(edit)
		for i := range base {
			if base[i].Annotations[AnnotationPlanHash] == got[i].Annotations[AnnotationPlanHash] {
				t.Errorf("%s keeps the plan hash of %s: the Job would be patched, not replaced", what, base[i].Name)
			}
			if got[i].Annotations[AnnotationPlanHash] != got[i].Spec.Template.Annotations[AnnotationPlanHash] {
				t.Errorf("%s: Job and pod template carry different hashes", what)
			}
		}
	}
	again := render(func(*v1beta1.StreamPipeline, *Inputs, *Options) {})
	for i := range base {
		if base[i].Annotations[AnnotationPlanHash] != again[i].Annotations[AnnotationPlanHash] {
			t.Errorf("%s: the same inputs give another hash", base[i].Name)
		}
	}
}

func TestSuspendSuspendsTheJobs(t *testing.T) {
	sp := pipeline("tomo")
	sp.Spec.Suspend = true
	objs, _ := renderFor(t, sp)
	for _, j := range objs.Jobs {
		if !ptr.Deref(j.Spec.Suspend, false) {
			t.Errorf("%s not suspended", j.Name)
		}
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func withCurve(sp *v1beta1.StreamPipeline) {
	sp.Spec.Security = &v1beta1.Security{Mode: v1beta1.SecurityCurve}
}

// With CURVE, each pod gets only its own keys from the pipeline's Secret: a sender its secret
// key and the gateway's public key; a gateway stream's receiving container the gateway's secret
// key and its one sender's public key. The decompressing container holds no key.
func TestCurveKeysAreMountedPerPod(t *testing.T) {
	objs, _ := renderFor(t, pipeline("tomo", withStreams(2), withCurve))
	for _, j := range objs.Jobs {
		pod := j.Spec.Template.Spec
		var keys *corev1.SecretVolumeSource
		for _, v := range pod.Volumes {
			if v.Name == "keys" {
				keys = v.Secret
			}
		}
		if keys == nil || keys.SecretName != "tomo-curve-keys" || *keys.DefaultMode != 0o440 {
			t.Fatalf("%s keys volume %+v", j.Name, keys)
		}
		stream := j.Labels[LabelStream]
		want := map[string]string{"sender-" + stream + ".secret": "secret", GatewayPublicKey: "server.public"}
		if j.Labels[LabelRole] == RoleGateway {
			want = map[string]string{GatewaySecretKey: "secret", "sender-" + stream + ".public": "allowed"}
		}
		got := map[string]string{}
		for _, it := range keys.Items {
			got[it.Key] = it.Path
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s projects %v, want %v", j.Name, got, want)
		}
		for _, c := range pod.Containers {
			mounted := false
			for _, m := range c.VolumeMounts {
				mounted = mounted || m.Name == "keys"
			}
			if mounted != (c.Name != DecompressContainer) {
				t.Errorf("%s/%s keys mounted: %v", j.Name, c.Name, mounted)
			}
		}
		if *pod.SecurityContext.FSGroup != v1beta1.DefaultAgentID {
			t.Errorf("%s: fsGroup %v: the agent could not read its keys", j.Name, pod.SecurityContext.FSGroup)
		}
	}
	if !strings.Contains(objs.ConfigMap.Data["sender-1.json"], `"server_key_file": "/etc/numastream/keys/server.public"`) ||
		!strings.Contains(objs.ConfigMap.Data["gateway-1-relay.json"], `"allowed_keys_file": "/etc/numastream/keys/allowed"`) ||
		strings.Contains(objs.ConfigMap.Data["gateway-1.json"], "security") {
		t.Errorf("configs %v", objs.ConfigMap.Data)
	}
	if !strings.Contains(objs.ConfigMap.Data["sender-1.json"], `"mode": "encrypt"`) {
		t.Errorf("sender config %s", objs.ConfigMap.Data["sender-1.json"])
	}
	auth, _ := renderFor(t, pipeline("tomo", func(sp *v1beta1.StreamPipeline) {
		sp.Spec.Security = &v1beta1.Security{Mode: v1beta1.SecurityAuthenticate}
	}))
	if !strings.Contains(auth.ConfigMap.Data["sender-0.json"], `"mode": "authenticate"`) ||
		!strings.Contains(auth.ConfigMap.Data["gateway-0-relay.json"], `"mode": "authenticate"`) {
		t.Errorf("authenticate configs %v", auth.ConfigMap.Data)
	}
	plain, _ := renderFor(t, pipeline("tomo", func(sp *v1beta1.StreamPipeline) {
		sp.Spec.Security = &v1beta1.Security{Mode: v1beta1.SecurityNone}
	}))
	if strings.Contains(plain.ConfigMap.Data["sender-0.json"], "security") {
		t.Error("security mode none, still rendered")
	}
}

// The NetworkPolicy lets only the pipeline's sender pods reach its gateway's data ports, and
// (by default) any namespace its metrics ports; with MetricsFrom, the namespaces it names.
func TestNetworkPolicyAdmitsOnlyThePipelinesSenders(t *testing.T) {
	objs, plan := renderFor(t, pipeline("tomo", withStreams(2)))
	np := objs.NetworkPolicy
	if np == nil {
		t.Fatal("no NetworkPolicy")
	}
	if np.Spec.PodSelector.MatchLabels[LabelPipeline] != "tomo" || np.Spec.PodSelector.MatchLabels[LabelRole] != RoleGateway {
		t.Errorf("selects %v", np.Spec.PodSelector)
	}
	data := np.Spec.Ingress[0]
	if len(data.From) != 1 || data.From[0].PodSelector.MatchLabels[LabelRole] != RoleSender ||
		data.From[0].PodSelector.MatchLabels[LabelPipeline] != "tomo" || data.From[0].NamespaceSelector != nil {
		t.Errorf("data ports admit %+v", data.From)
	}
	ports := map[int32]bool{}
	for _, p := range data.Ports {
		ports[p.Port.IntVal] = true
	}
	for _, n := range plan.Gateways {
		for c := 0; c < plan.Connections; c++ {
			if !ports[int32(n.Port+c)] {
				t.Errorf("data port %d of stream %d not in the policy", n.Port+c, n.Stream)
			}
		}
	}
	if len(ports) != 2*plan.Connections {
		t.Errorf("%d data ports, want %d", len(ports), 2*plan.Connections)
	}
	if m := np.Spec.Ingress[1]; len(m.Ports) != 2 || m.Ports[0].Port.IntVal != MetricsPort || m.Ports[1].Port.IntVal != DecompressMetricsPort {
		t.Errorf("metrics rule %+v", m)
	}
	// With MetricsFrom, the metrics ports admit the pods of those namespaces only.
	in := Inputs{Pipeline: pipeline("tomo", withStreams(2)), Plan: plan, Gateway: gateway(), DataAddresses: map[int]string{0: "10.215.0.100", 1: "10.215.0.101"}}
	objs, err := Render(in, Options{AgentImage: "numastream/agent:test", NetworkPolicy: true, MetricsFrom: []string{"numastream-system", "monitoring"}})
	if err != nil {
		t.Fatal(err)
	}
	var from []string
	for _, p := range objs.NetworkPolicy.Spec.Ingress[1].From {
		if p.PodSelector != nil || p.NamespaceSelector == nil || len(p.NamespaceSelector.MatchLabels) != 1 {
			t.Errorf("metrics peer %+v", p)
			continue
		}
		from = append(from, p.NamespaceSelector.MatchLabels[corev1.LabelMetadataName])
	}
	if strings.Join(from, ",") != "numastream-system,monitoring" {
		t.Errorf("metrics ports admit namespaces %v", from)
	}
	// An address block (a Prometheus outside the cluster) is admitted as that block, beside a
	// namespace's pods.
	objs, err = Render(in, Options{AgentImage: "numastream/agent:test", NetworkPolicy: true, MetricsFrom: []string{"numastream-system", "10.212.0.1/32"}})
	if err != nil {
		t.Fatal(err)
	}
	peers := objs.NetworkPolicy.Spec.Ingress[1].From
	if len(peers) != 2 || peers[0].NamespaceSelector == nil || peers[1].IPBlock == nil || peers[1].IPBlock.CIDR != "10.212.0.1/32" ||
		peers[1].NamespaceSelector != nil || peers[1].PodSelector != nil {
		t.Errorf("metrics peers for a namespace and a block: %+v", peers)
	}
}

// What the operator's --metrics-from takes: namespace names and address blocks; anything else is
// refused naming the entry.
func TestParseMetricsFromNamesWhatIsNeitherANamespaceNorABlock(t *testing.T) {
	for _, ok := range [][]string{nil, {"monitoring"}, {"numastream-system", "10.0.0.0/8", "fd00::/64", "192.168.1.7/32"}} {
		if err := ParseMetricsFrom(ok); err != nil {
			t.Errorf("%v: %v", ok, err)
		}
	}
	for _, bad := range []string{"10.0.0.0/33", "10.0.0/8", "Monitoring", "monitoring_ns", "-x", "10.0.0.1", strings.Repeat("a", 64), "a/b"} {
		err := ParseMetricsFrom([]string{"monitoring", bad})
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", bad)) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// With hostNetwork the pods use their nodes' network namespaces and the senders connect to the
// gateway node's address; without an address the pipeline cannot be rendered.
func TestHostNetworkPodsConnectToTheGatewayDataNICAddress(t *testing.T) {
	sp := pipeline("dtn", withStreams(2))
	sp.Spec.HostNetwork = true
	_, plan := renderFor(t, pipeline("dtn", withStreams(2)))
	objs, err := Render(Inputs{Pipeline: sp, Plan: plan, Gateway: gateway(), GatewayAddress: "10.40.0.7"},
		Options{AgentImage: "x", NetworkPolicy: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range objs.Jobs {
		if !j.Spec.Template.Spec.HostNetwork || j.Spec.Template.Spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
			t.Errorf("%s: hostNetwork %v dns %s", j.Name, j.Spec.Template.Spec.HostNetwork, j.Spec.Template.Spec.DNSPolicy)
		}
	}
	if !strings.Contains(objs.ConfigMap.Data["sender-1.json"], `"endpoint": "tcp://10.40.0.7:`+itoa(plan.Gateways[1].Port)+`"`) {
		t.Errorf("sender endpoint: %s", objs.ConfigMap.Data["sender-1.json"])
	}
	if objs.NetworkPolicy != nil {
		t.Error("a NetworkPolicy cannot govern host-network pods; none is rendered")
	}
	if _, err := Render(Inputs{Pipeline: sp, Plan: plan, Gateway: gateway()}, Options{}); err == nil ||
		!strings.Contains(err.Error(), "numastream.io/nic.ens1f0.ipv4") {
		t.Errorf("no gateway address: %v", err)
	}
}

// The data travels over the data network: senders join it and dial the gateway pod's address
// there (Multus network-status), never the Service's ClusterIP on the cluster network. Until
// that address is known the senders are held back, and status says why.
func TestSendersDialTheGatewayOnTheDataNetwork(t *testing.T) {
	sp := pipeline("tomo", withAttachment("data-gateway"))
	sp.Spec.Gateway.Network.SenderAttachment = "data-detector"
	objs, plan := renderFor(t, sp)
	var cfg map[string]any
	if err := json.Unmarshal([]byte(objs.ConfigMap.Data["sender-0.json"]), &cfg); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("tcp://10.215.0.100:%d", plan.Gateways[0].Port)
	if cfg["endpoint"] != want {
		t.Errorf("sender endpoint %v, want %s (the gateway pod's data-network address)", cfg["endpoint"], want)
	}
	if got := objs.Jobs[0].Spec.Template.Annotations[MultusAnnotation]; got != "data-detector" {
		t.Errorf("sender attachment %q, want its own data-detector", got)
	}

	in := Inputs{Pipeline: sp, Plan: plan, Gateway: gateway()}
	objs, err := Render(in, Options{AgentImage: "a"})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range objs.Jobs {
		if j.Labels[LabelRole] == RoleSender {
			t.Errorf("sender job %s rendered before the gateway's data address is known", j.Name)
		}
	}
	if len(objs.Waiting) != len(sp.Spec.Senders) {
		t.Errorf("waiting %v", objs.Waiting)
	}
	if _, ok := objs.ConfigMap.Data["sender-0.json"]; ok {
		t.Error("a sender config without an endpoint was rendered")
	}

	sp.Spec.Gateway.Network.Address = "fd00::5"
	objs, err = Render(Inputs{Pipeline: sp, Plan: plan, Gateway: gateway()}, Options{AgentImage: "a"})
	if err != nil || len(objs.Waiting) != 0 {
		t.Fatalf("a static address needs no wait: %v %v", err, objs.Waiting)
	}
	if !strings.Contains(objs.ConfigMap.Data["sender-0.json"], `"tcp://[fd00::5]:`) {
		t.Errorf("static IPv6 address: %s", objs.ConfigMap.Data["sender-0.json"])
	}
}

// Exit codes mean what the Job controller does with them: disruptions and interrupted agents
// retry without consuming the backoff, a bad configuration fails at once.
func TestJobsRetryDisruptionsAndFailFastOnBadConfig(t *testing.T) {
	objs, _ := renderFor(t, pipeline("tomo"))
	for _, j := range objs.Jobs {
		pfp := j.Spec.Template.Spec.RestartPolicy == corev1.RestartPolicyNever && j.Spec.PodFailurePolicy != nil
		if !pfp {
			t.Fatalf("%s: podFailurePolicy needs restartPolicy Never", j.Name)
		}
		actions := map[string]batchv1.PodFailurePolicyAction{}
		for _, r := range j.Spec.PodFailurePolicy.Rules {
			for _, c := range r.OnPodConditions {
				actions[string(c.Type)] = r.Action
			}
			if r.OnExitCodes != nil {
				for _, v := range r.OnExitCodes.Values {
					actions[fmt.Sprint(v)] = r.Action
				}
			}
		}
		want := map[string]batchv1.PodFailurePolicyAction{
			"DisruptionTarget": batchv1.PodFailurePolicyActionIgnore, "143": batchv1.PodFailurePolicyActionIgnore,
			"130": batchv1.PodFailurePolicyActionIgnore, "2": batchv1.PodFailurePolicyActionFailJob,
		}
		for k, v := range want {
			if actions[k] != v {
				t.Errorf("%s: on %s: %q, want %q", j.Name, k, actions[k], v)
			}
		}
	}
}

// A detector pausing between scans is normal: endless streams have no idle limit unless the
// spec sets one; streams with an end get 600 s.
func TestIdleLimitFitsTheSource(t *testing.T) {
	idle := func(sp *v1beta1.StreamPipeline) any {
		objs, _ := renderFor(t, sp)
		var cfg map[string]any
		if err := json.Unmarshal([]byte(objs.ConfigMap.Data["gateway-0.json"]), &cfg); err != nil {
			t.Fatal(err)
		}
		return cfg["timeouts"].(map[string]any)["idle_s"]
	}
	finite := pipeline("tomo")
	if got := idle(finite); got != 600.0 {
		t.Errorf("finite source: idle %v, want 600", got)
	}
	endless := pipeline("tomo")
	for i := range endless.Spec.Senders {
		endless.Spec.Senders[i].Source = v1beta1.Source{Synthetic: &v1beta1.SyntheticSource{}}
	}
	if got := idle(endless); got != 0.0 {
		t.Errorf("endless source: idle %v, want 0 (off)", got)
	}
	endless.Spec.IdleTimeoutSeconds = ptr.To[int32](30)
	if got := idle(endless); got != 30.0 {
		t.Errorf("spec idleTimeoutSeconds 30: idle %v", got)
	}
}

// The live preview is off unless the spec asks, and then only on the gateway's decoding
// container (the relay forwards frames as they came), with the spec's figures.
func TestThePreviewIsTheDecodingContainersAndOffUnlessAsked(t *testing.T) {
	configs := func(sp *v1beta1.StreamPipeline) (gateway, relay map[string]any) {
		objs, _ := renderFor(t, sp)
		for key, out := range map[string]*map[string]any{"gateway-0.json": &gateway, "gateway-0-relay.json": &relay} {
			if err := json.Unmarshal([]byte(objs.ConfigMap.Data[key]), out); err != nil {
				t.Fatalf("%s: %v", key, err)
			}
		}
		return gateway, relay
	}
	sp := pipeline("tomo")
	if g, r := configs(sp); g["preview"] != nil || r["preview"] != nil {
		t.Errorf("no spec.preview: preview %v / relay %v, want none", g["preview"], r["preview"])
	}
	sp.Spec.Preview = &v1beta1.Preview{IntervalMilliseconds: ptr.To[int32](1000)}
	g, r := configs(sp)
	if r["preview"] != nil {
		t.Errorf("the relay got a preview: %v", r["preview"])
	}
	// Served on the pod's loopback only: the API server's port-forward reaches it, the pod
	// network does not.
	want := map[string]any{"enabled": true, "interval_ms": 1000.0, "listen": "127.0.0.1:9102"}
	if got, _ := g["preview"].(map[string]any); !reflect.DeepEqual(got, want) {
		t.Errorf("gateway preview %v, want %v", g["preview"], want)
	}
	// With host networking the loopback is the node's: on the stream's own metrics port.
	sp.Spec.HostNetwork = true
	g, _ = configs(sp)
	want = map[string]any{"enabled": true, "interval_ms": 1000.0}
	if got, _ := g["preview"].(map[string]any); !reflect.DeepEqual(got, want) {
		t.Errorf("host network: gateway preview %v, want %v", g["preview"], want)
	}
}

func volumeNamed(spec corev1.PodSpec, name string) *corev1.Volume {
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == name {
			return &spec.Volumes[i]
		}
	}
	return nil
}

// A stream2 sink's port admits the consumers the spec names, else the pods of the pipeline's own
// namespace; without a stream2 sink the policy has no third rule.
func TestNetworkPolicyAdmitsTheStream2Consumers(t *testing.T) {
	stream2 := func(consumers ...networkingv1.NetworkPolicyPeer) option {
		return func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Codec = "bslz4"
			sp.Spec.Senders[0].Source = v1beta1.Source{Stream2: &v1beta1.ZMQEndpoint{Endpoint: "tcp://dcu:31001"}}
			sp.Spec.Sink = &v1beta1.Sink{Stream2: &v1beta1.Stream2Sink{Port: 31001, Consumers: consumers}}
		}
	}
	rule := func(objs Objects) *networkingv1.NetworkPolicyIngressRule {
		in := objs.NetworkPolicy.Spec.Ingress
		if len(in) != 3 || len(in[2].Ports) != 1 || in[2].Ports[0].Port.IntVal != 31001 {
			t.Fatalf("ingress %+v", in)
		}
		return &in[2]
	}
	objs, _ := renderFor(t, pipeline("eiger", stream2()))
	if r := rule(objs); len(r.From) != 1 || r.From[0].PodSelector == nil || len(r.From[0].PodSelector.MatchLabels) != 0 || r.From[0].NamespaceSelector != nil {
		t.Errorf("default stream2 consumers %+v: the pipeline's namespace", r.From)
	}
	dials := networkingv1.NetworkPolicyPeer{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: "mx-analysis"}},
		PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app": "dials"}},
	}
	objs, _ = renderFor(t, pipeline("eiger", stream2(dials)))
	if r := rule(objs); len(r.From) != 1 || r.From[0].PodSelector.MatchLabels["app"] != "dials" ||
		r.From[0].NamespaceSelector.MatchLabels[corev1.LabelMetadataName] != "mx-analysis" {
		t.Errorf("named stream2 consumers %+v", r.From)
	}
	objs, _ = renderFor(t, pipeline("tomo"))
	if len(objs.NetworkPolicy.Spec.Ingress) != 2 {
		t.Errorf("no stream2 sink, yet %d rules", len(objs.NetworkPolicy.Spec.Ingress))
	}
}

// A sink moved to another root under the same relative path renders the same agent config, but
// another volume: the gateway's Job is replaced (its pod template is immutable), the sender's not.
func TestAnotherRootReplacesTheJobThatMountsIt(t *testing.T) {
	a, _ := renderFor(t, pipeline("tomo", withFileSink("x-{stream}.raw")))
	b, _ := renderFor(t, pipeline("tomo", func(sp *v1beta1.StreamPipeline) {
		sp.Spec.Sink = &v1beta1.Sink{File: &v1beta1.FileSource{Root: "tape", Path: "x-{stream}.raw"}}
	}))
	if a.ConfigMap.Data["gateway-0.json"] != b.ConfigMap.Data["gateway-0.json"] {
		t.Fatal("the agent config changed too: this test needs a change of volume alone")
	}
	if a.Jobs[1].Annotations[AnnotationPlanHash] == b.Jobs[1].Annotations[AnnotationPlanHash] {
		t.Error("the gateway's Job keeps its hash: it would keep writing into the old root")
	}
	if a.Jobs[0].Annotations[AnnotationPlanHash] != b.Jobs[0].Annotations[AnnotationPlanHash] {
		t.Error("the sender's Job changed hash for a change of the gateway's volume")
	}
}

// CURVE is the default; new keys (rotated) give every agent a new plan hash, so every Job is
// replaced and its pods start with them; security mode none is the opt-out.
func TestNewKeysReplaceEveryAgent(t *testing.T) {
	sp := pipeline("tomo", withStreams(2))
	in := inputsFor(t, sp)
	a, err := Render(in, Options{AgentImage: "numastream/agent:test"})
	if err != nil {
		t.Fatal(err)
	}
	for id := range in.KeysHashes {
		in.KeysHashes[id] = "k2"
	}
	b, err := Render(in, Options{AgentImage: "numastream/agent:test"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range a.Jobs {
		pa, pb := a.Jobs[i].Spec.Template, b.Jobs[i].Spec.Template
		if volumeNamed(pa.Spec, "keys") == nil || !strings.Contains(a.ConfigMap.Data["sender-0.json"], `"mode": "encrypt"`) {
			t.Fatalf("%s: no CURVE by default", a.Jobs[i].Name)
		}
		if pa.Annotations[AnnotationPlanHash] == pb.Annotations[AnnotationPlanHash] || pb.Annotations[AnnotationKeys] != "k2" {
			t.Errorf("%s: new keys, same plan hash %s (keys %q)", a.Jobs[i].Name, pa.Annotations[AnnotationPlanHash], pb.Annotations[AnnotationKeys])
		}
	}
	sp.Spec.Security = &v1beta1.Security{Mode: v1beta1.SecurityNone}
	plain, _ := renderFor(t, sp)
	if volumeNamed(plain.Jobs[0].Spec.Template.Spec, "keys") != nil || strings.Contains(plain.ConfigMap.Data["sender-0.json"], "curve") {
		t.Error("security mode none still uses keys")
	}
}

// A sender keeps its acknowledged record in its pipeline's directory on its node, mounted through
// a claim; no init container, and the agent runs as the pipeline's user (spec.files) without
// any capability.
func TestSenderStateDirectoryOnTheNode(t *testing.T) {
	uid, gid := int64(2345), int64(2400)
	objs, _ := renderFor(t, pipeline("tomo", func(sp *v1beta1.StreamPipeline) {
		sp.Spec.Files = &v1beta1.Files{User: &uid, Group: &gid}
	}))
	tx := objs.Jobs[0].Spec.Template.Spec
	v := volumeNamed(tx, "state")
	if v == nil || v.PersistentVolumeClaim == nil || v.PersistentVolumeClaim.ReadOnly {
		t.Fatalf("state volume %+v", v)
	}
	if !strings.Contains(objs.ConfigMap.Data["sender-0.json"], `"state_dir": "`+StateMountPath+`"`) {
		t.Errorf("sender config %s", objs.ConfigMap.Data["sender-0.json"])
	}
	if len(tx.InitContainers) != 0 {
		t.Fatalf("init containers %+v", tx.InitContainers)
	}
	if *tx.SecurityContext.RunAsUser != uid || *tx.SecurityContext.RunAsGroup != gid || *tx.SecurityContext.FSGroup != gid {
		t.Errorf("pod security %+v", tx.SecurityContext)
	}
	if len(tx.Containers[0].SecurityContext.Capabilities.Add) != 0 || tx.Containers[0].SecurityContext.RunAsUser != nil {
		t.Errorf("the agent container runs as the pod's non-root user: %+v", tx.Containers[0].SecurityContext)
	}
}

// Every agent pod passes Pod Security "restricted" as the API server evaluates it (the
// admission library's own checks); with spec.hostNetwork only the host namespace is refused,
// which no level but privileged admits.
func TestAgentPodsPassPodSecurityRestricted(t *testing.T) {
	eval, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, sp := range goldenCases() {
		if sp.Spec.HostNetwork {
			continue // below
		}
		objs, _ := renderFor(t, sp)
		for _, j := range objs.Jobs {
			pod := j.Spec.Template
			res := policy.AggregateCheckResults(eval.EvaluatePod(psa.LevelVersion{Level: psa.LevelRestricted, Version: psa.LatestVersion()}, &pod.ObjectMeta, &pod.Spec))
			if !res.Allowed {
				t.Errorf("%s/%s: restricted refuses: %v %v", name, j.Name, res.ForbiddenReasons, res.ForbiddenDetails)
			}
		}
	}
	hostNet := pipeline("dtn", func(sp *v1beta1.StreamPipeline) {
		sp.Spec.HostNetwork = true
		sp.Spec.Gateway.Network.Address = "10.20.0.1"
	})
	objs, _ := renderFor(t, hostNet)
	for _, j := range objs.Jobs {
		pod := j.Spec.Template
		res := policy.AggregateCheckResults(eval.EvaluatePod(psa.LevelVersion{Level: psa.LevelRestricted, Version: psa.LatestVersion()}, &pod.ObjectMeta, &pod.Spec))
		if res.Allowed || !slices.Equal(res.ForbiddenReasons, []string{"host namespaces"}) {
			t.Errorf("hostNetwork %s: restricted says %v %v; want only host namespaces", j.Name, res.ForbiddenReasons, res.ForbiddenDetails)
		}
	}
}

// spec.spill: each sender spills into an emptyDir limited to maxBytes (or the node's directory),
// mounted where its config says; without it, no spill volume and no spill config.
func TestSendersSpillToNodeLocalStorage(t *testing.T) {
	objs, _ := renderFor(t, pipeline("tomo", func(sp *v1beta1.StreamPipeline) {
		sp.Spec.Spill = &v1beta1.Spill{MaxBytes: 8 << 30}
	}))
	tx := objs.Jobs[0].Spec.Template.Spec
	v := volumeNamed(tx, "spill")
	if v == nil || v.EmptyDir == nil || v.EmptyDir.SizeLimit.Value() != 8<<30 {
		t.Fatalf("spill volume %+v", v)
	}
	mounted := false
	for _, m := range tx.Containers[0].VolumeMounts {
		mounted = mounted || (m.Name == "spill" && m.MountPath == SpillMountPath)
	}
	if !mounted {
		t.Errorf("spill not mounted: %+v", tx.Containers[0].VolumeMounts)
	}
	if !strings.Contains(objs.ConfigMap.Data["sender-0.json"], `"spill": {
    "path": "/var/spill",
    "max_bytes": 8589934592
  }`) {
		t.Errorf("sender config %s", objs.ConfigMap.Data["sender-0.json"])
	}
	objs, _ = renderFor(t, pipeline("tomo", func(sp *v1beta1.StreamPipeline) {
		sp.Spec.Spill = &v1beta1.Spill{MaxBytes: 8 << 30, Root: "nvme", Path: "spill"}
	}))
	tx = objs.Jobs[0].Spec.Template.Spec
	if v := volumeNamed(tx, "spill"); v == nil || v.PersistentVolumeClaim == nil || v.PersistentVolumeClaim.ReadOnly {
		t.Fatalf("spill volume %+v", v)
	}
	// Two pipelines naming one directory spill apart: a sender recovers only its own.
	if !strings.Contains(objs.ConfigMap.Data["sender-0.json"], `"path": "/var/spill/spill/beamline/tomo-uid-1"`) {
		t.Errorf("sender config %s", objs.ConfigMap.Data["sender-0.json"])
	}
	other, _ := renderFor(t, pipeline("other", func(sp *v1beta1.StreamPipeline) {
		sp.Spec.Spill = &v1beta1.Spill{MaxBytes: 8 << 30, Root: "nvme", Path: "spill"}
	}))
	if !strings.Contains(other.ConfigMap.Data["sender-0.json"], `"path": "/var/spill/spill/beamline/other-uid-1"`) {
		t.Errorf("sender config %s", other.ConfigMap.Data["sender-0.json"])
	}
	objs, _ = renderFor(t, pipeline("tomo"))
	if volumeNamed(objs.Jobs[0].Spec.Template.Spec, "spill") != nil || strings.Contains(objs.ConfigMap.Data["sender-0.json"], "spill") {
		t.Error("no spill unless asked for")
	}
}

// Agent pods get the operator's scheduling settings and the pipeline's on top: tolerations add
// up, the node selector only narrows (the node stays the plan's), the pipeline's priority class
// and pull secrets win. A change of them replaces the Jobs (their pod template is immutable).
func TestAgentPodsCarryTheSchedulingSettings(t *testing.T) {
	sp := pipeline("sched")
	sp.Spec.Pods = &v1beta1.PodSettings{
		Tolerations:       []corev1.Toleration{{Key: "beamline/detector", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
		NodeSelector:      map[string]string{"facility/zone": "hutch-2"},
		PriorityClassName: "beamline-stream",
	}
	_, plan := renderFor(t, sp)
	opts := Options{AgentImage: "numastream/agent:test", Pods: v1beta1.PodSettings{
		Tolerations:      []corev1.Toleration{{Key: "dtn", Operator: corev1.TolerationOpExists}},
		NodeSelector:     map[string]string{"numastream.io/facility": "box"},
		ImagePullSecrets: []corev1.LocalObjectReference{{Name: "registry"}},
	}}
	in := Inputs{Pipeline: sp, Plan: plan, Gateway: gateway(), DataAddresses: map[int]string{0: "10.215.0.100"}}
	objs, err := Render(in, opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range objs.Jobs {
		ps := j.Spec.Template.Spec
		want := map[string]string{corev1.LabelHostname: ps.NodeSelector[corev1.LabelHostname],
			"numastream.io/facility": "box", "facility/zone": "hutch-2"}
		if !reflect.DeepEqual(ps.NodeSelector, want) || (ps.NodeSelector[corev1.LabelHostname] != "lynx-1" && ps.NodeSelector[corev1.LabelHostname] != "det-a") {
			t.Errorf("%s nodeSelector %v", j.Name, ps.NodeSelector)
		}
		if len(ps.Tolerations) != 2 || ps.Tolerations[0].Key != "dtn" || ps.Tolerations[1].Key != "beamline/detector" {
			t.Errorf("%s tolerations %+v", j.Name, ps.Tolerations)
		}
		if ps.PriorityClassName != "beamline-stream" || len(ps.ImagePullSecrets) != 1 || ps.ImagePullSecrets[0].Name != "registry" {
			t.Errorf("%s priority %q pull secrets %v", j.Name, ps.PriorityClassName, ps.ImagePullSecrets)
		}
	}
	sp2 := sp.DeepCopy()
	sp2.Spec.Pods.PriorityClassName = "best-effort"
	in.Pipeline = sp2
	again, err := Render(in, opts)
	if err != nil {
		t.Fatal(err)
	}
	if objs.Jobs[0].Annotations[AnnotationPlanHash] == again.Jobs[0].Annotations[AnnotationPlanHash] {
		t.Error("a new priority class keeps the plan hash: the Job would not be replaced")
	}
}

// A stream2 sink: the gateway's agent binds the port on every address of its pod, and the
// gateway's Service carries it, so a consumer written for the detector connects there.
func TestStream2SinkIsReachableThroughTheGatewayService(t *testing.T) {
	sp := goldenCases()["stream2-stream2"]
	objs, _ := renderFor(t, sp)
	if len(objs.Services) != 1 {
		t.Fatalf("%d services", len(objs.Services))
	}
	found := false
	for _, p := range objs.Services[0].Spec.Ports {
		if p.Name == "stream2" && p.Port == 31001 && p.TargetPort.IntVal == 31001 {
			found = true
		}
	}
	if !found {
		t.Errorf("gateway service ports %+v: no stream2 port 31001", objs.Services[0].Spec.Ports)
	}
	for key, cfg := range objs.ConfigMap.Data {
		if strings.HasPrefix(key, "gateway-0.json") && !strings.Contains(cfg, `"endpoint": "tcp://*:31001"`) {
			t.Errorf("%s does not bind the stream2 sink on port 31001:\n%s", key, cfg)
		}
	}
}

// With host networking no NetworkPolicy applies: each gateway stream admits connections only
// from its own sender node's addresses and spec.security.allowFrom; another stream's sender is
// not admitted. Without host networking only spec.security.allowFrom is checked.
func TestHostNetworkGatewaysAdmitOnlyTheirOwnSender(t *testing.T) {
	relayConfig := func(objs Objects, stream int) AgentConfig {
		t.Helper()
		var cfg AgentConfig
		if err := json.Unmarshal([]byte(objs.ConfigMap.Data[fmt.Sprintf("gateway-%d-relay.json", stream)]), &cfg); err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	hostNet := func(sp *v1beta1.StreamPipeline) { sp.Spec.HostNetwork = true }
	allow := func(sp *v1beta1.StreamPipeline) {
		if sp.Spec.Security == nil {
			sp.Spec.Security = &v1beta1.Security{}
		}
		sp.Spec.Security.AllowFrom = []string{"10.50.0.0/16", "fd00:50::/64"}
	}
	objs, _ := renderFor(t, pipeline("tomo", withStreams(2), hostNet, allow))
	for stream, want := range map[int][]string{
		0: {"10.40.0.20/32", "10.50.0.0/16", "192.168.7.20/32", "fd00:50::/64"},
		1: {"10.40.0.21/32", "10.50.0.0/16", "192.168.7.21/32", "fd00:50::/64"},
	} {
		cfg := relayConfig(objs, stream)
		if cfg.Security == nil || cfg.Security.Curve == nil || !reflect.DeepEqual(cfg.Security.AllowFrom, want) {
			t.Errorf("stream %d relay security %+v, want curve and allow_from %v", stream, cfg.Security, want)
		}
	}
	objs, _ = renderFor(t, pipeline("tomo", hostNet, func(sp *v1beta1.StreamPipeline) {
		sp.Spec.Security = &v1beta1.Security{Mode: v1beta1.SecurityNone}
	}))
	if cfg := relayConfig(objs, 0); cfg.Security == nil || cfg.Security.Curve != nil ||
		!reflect.DeepEqual(cfg.Security.AllowFrom, []string{"10.40.0.20/32", "192.168.7.20/32"}) {
		t.Errorf("plain host-network relay security %+v, want no curve and its sender's two addresses", cfg.Security)
	}
	objs, _ = renderFor(t, pipeline("tomo", allow))
	if cfg := relayConfig(objs, 0); !reflect.DeepEqual(cfg.Security.AllowFrom, []string{"10.50.0.0/16", "fd00:50::/64"}) {
		t.Errorf("pod-network relay allow_from %v, want only spec.security.allowFrom", cfg.Security.AllowFrom)
	}
	objs, _ = renderFor(t, pipeline("tomo"))
	if cfg := relayConfig(objs, 0); cfg.Security.AllowFrom != nil {
		t.Errorf("pod-network relay without allowFrom checks addresses: %v", cfg.Security.AllowFrom)
	}
	for key, text := range objs.ConfigMap.Data {
		if strings.Contains(key, "sender") && strings.Contains(text, "allow_from") {
			t.Errorf("%s: a sender has no allow_from", key)
		}
	}
}

// Host-network pods share their node's ports: two streams into one gateway (and their senders)
// get data and metrics ports that never collide, none of them node-exporter's 9100; each
// agent listens where its container port, liveness probe and Service say.
func TestHostNetworkStreamsGetTheirOwnPorts(t *testing.T) {
	sp := pipeline("dtn", withStreams(2), func(sp *v1beta1.StreamPipeline) { sp.Spec.HostNetwork = true })
	objs, plan := renderFor(t, sp)
	gatewayPorts := map[int32]string{}
	for _, j := range objs.Jobs {
		pod := j.Spec.Template.Spec
		for _, c := range pod.Containers {
			var metrics int32
			for _, p := range c.Ports {
				if p.ContainerPort == 9100 || p.ContainerPort == 9101 {
					t.Errorf("%s/%s uses port %d on the host", j.Name, c.Name, p.ContainerPort)
				}
				if j.Labels[LabelRole] == RoleGateway {
					if other, dup := gatewayPorts[p.ContainerPort]; dup {
						t.Errorf("%s/%s and %s both use port %d on the gateway", j.Name, c.Name, other, p.ContainerPort)
					}
					gatewayPorts[p.ContainerPort] = j.Name + "/" + c.Name
				}
				if strings.HasPrefix(p.Name, "metrics") {
					metrics = p.ContainerPort
				}
			}
			if got := c.LivenessProbe.HTTPGet.Port.IntValue(); int32(got) != metrics {
				t.Errorf("%s/%s: liveness probe on %d, metrics port %d", j.Name, c.Name, got, metrics)
			}
			var cfg AgentConfig
			key := strings.TrimPrefix(c.Args[2], ConfigMountPath+"/")
			if err := json.Unmarshal([]byte(objs.ConfigMap.Data[key]), &cfg); err != nil {
				t.Fatal(err)
			}
			if cfg.Metrics.Listen != fmt.Sprintf("0.0.0.0:%d", metrics) {
				t.Errorf("%s/%s: agent listens on %s, container port %d", j.Name, c.Name, cfg.Metrics.Listen, metrics)
			}
		}
	}
	// 2 streams, each 5 connections of data then 2 metrics ports on the gateway.
	if len(gatewayPorts) != 2*plan.Connections+4 {
		t.Errorf("gateway ports %v", gatewayPorts)
	}
	for _, svc := range objs.Services {
		for _, p := range svc.Spec.Ports {
			if p.Port == 9100 || p.Port == 9101 {
				t.Errorf("service %s exposes %d", svc.Name, p.Port)
			}
		}
	}
	// Ports past 65535 are refused, naming the field.
	in := inputsFor(t, pipeline("dtn", withStreams(2), func(sp *v1beta1.StreamPipeline) { sp.Spec.HostNetwork = true }))
	in.Pipeline.Spec.Port = 65525 // data up to 65534, metrics past 65535
	if _, err := Render(in, Options{AgentImage: "x"}); err == nil || !strings.Contains(err.Error(), "spec.port") {
		t.Errorf("ports past 65535: %v", err)
	}
	// On the pod network every pod has its own address: the usual ports.
	objs, _ = renderFor(t, pipeline("pods", withStreams(2)))
	if p := objs.Jobs[0].Spec.Template.Spec.Containers[0].Ports[0]; p.ContainerPort != MetricsPort {
		t.Errorf("pod-network sender metrics port %d", p.ContainerPort)
	}
}

// A gateway with no whole core left for decompression (the static CPU manager reserving part of a
// small node): the receiving container asks whole CPUs (exclusive, next to the NIC), the
// decompressing one the planned share of the shared pool; both stay Guaranteed (requests ==
// limits), so the pod keeps its exclusive receiving core.
func TestADecompressingContainerInTheSharedPoolAsksItsShare(t *testing.T) {
	sp := pipeline("small", withFileSink("run1"))
	sp.Spec.Gateway = v1beta1.Gateway{Node: "gateway-n", Network: v1beta1.DataNetwork{NIC: "fab0"}}
	gw := topology.Node{Name: "gateway-n", NUMANodes: []topology.NUMANode{{ID: 0, CPUs: 1}, {ID: 1, CPUs: 1}},
		NICs:         map[string]topology.NIC{"fab0": {Name: "fab0", NUMANode: 1, SpeedMbit: 1000}},
		CompressMBps: 400, DecompressMBps: 1500, AllocatableMilliCPU: 1900, OtherPodsMilliCPU: 100}
	plan, err := planner.Make(planner.Request{Senders: []topology.Node{sender("det-a")}, Gateway: gw, GatewayNIC: "fab0",
		Ratio: 2, Port: 5555, Mode: planner.NUMAAware, HasSink: true})
	if err != nil {
		t.Fatal(err)
	}
	in := Inputs{Pipeline: sp, Plan: plan, Gateway: gw, DataAddresses: map[int]string{0: "10.215.0.100"}, Roots: testRoots(),
		SenderAddresses: map[int][]string{0: {"10.40.0.20"}}}
	objs, err := Render(in, Options{AgentImage: "numastream/agent:test"})
	if err != nil {
		t.Fatal(err)
	}
	pod := objs.Jobs[1].Spec.Template.Spec
	want := map[string]string{"receive": "1", "decompress": "800m"}
	for _, c := range pod.Containers {
		req, lim := c.Resources.Requests[corev1.ResourceCPU], c.Resources.Limits[corev1.ResourceCPU]
		if req.String() != want[c.Name] || lim.Cmp(req) != 0 {
			t.Errorf("%s: cpu request %s limit %s, want %s both", c.Name, req.String(), lim.String(), want[c.Name])
		}
	}
}

// Several consumers (spec.sinks): the decompressing agent gets them all with their guarantees
// (the relay keeps its one hop), one data volume however many file consumers write under its
// root, and the Stream V2 consumer's port on the gateway's Service and in its NetworkPolicy.
func TestSeveralConsumersAreOneAgentsSinksWithOneVolumeAndTheStream2Port(t *testing.T) {
	sp := goldenCases()["stream2-fanout"]
	sp.Spec.Sinks = append(sp.Spec.Sinks, v1beta1.Consumer{Name: "raw", Sink: v1beta1.Sink{File: &v1beta1.FileSource{Root: "archive", Path: "raw/s.bin"}}})
	objs, _ := renderFor(t, sp)
	var gw, relay AgentConfig
	for key, doc := range objs.ConfigMap.Data {
		target := &gw
		switch {
		case key == "gateway-0-relay.json":
			target = &relay
		case key != "gateway-0.json":
			continue
		}
		if err := json.Unmarshal([]byte(doc), target); err != nil {
			t.Fatal(err)
		}
	}
	if gw.Sink != nil || len(gw.Sinks) != 4 || gw.Sinks[2].Guarantee != "latest" || gw.Sinks[3].Kind != "file" || gw.Sinks[3].Mode == "" {
		t.Errorf("decompressing agent: sink %+v, sinks %+v", gw.Sink, gw.Sinks)
	}
	if relay.Sinks != nil || relay.Sink == nil || relay.Sink.Kind != "zmq" {
		t.Errorf("relay: sink %+v, sinks %+v: want its one hop to the decompressing agent", relay.Sink, relay.Sinks)
	}
	pod := objs.Jobs[1].Spec.Template.Spec
	data := 0
	for _, v := range pod.Volumes {
		if v.Name == "data" {
			data++
		}
	}
	if data != 1 {
		t.Errorf("%d data volumes, want 1: %+v", data, pod.Volumes)
	}
	port := false
	for _, p := range objs.Services[0].Spec.Ports {
		port = port || (p.Name == "stream2" && p.Port == 31002)
	}
	if !port {
		t.Errorf("service ports %+v: no stream2 port 31002", objs.Services[0].Spec.Ports)
	}
	admitted := false
	for _, r := range objs.NetworkPolicy.Spec.Ingress {
		for _, p := range r.Ports {
			admitted = admitted || (p.Port != nil && p.Port.IntVal == 31002)
		}
	}
	if !admitted {
		t.Errorf("NetworkPolicy %+v does not admit the Stream V2 consumers on 31002", objs.NetworkPolicy.Spec.Ingress)
	}
}

// An onward consumer: the decompressing container, which runs it, gets the gateway's key too
// (the far receiver admits gateway.public); its configuration has the plan's connections and
// the far receiver's public key; the plan says what the hop carries.
func TestAnOnwardConsumerConnectsWithTheGatewaysKeyOverThePlannedConnections(t *testing.T) {
	const far = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"
	sp := pipeline("hop", withCurve, func(sp *v1beta1.StreamPipeline) {
		sp.Spec.Sinks = []v1beta1.Consumer{
			{Name: "here", Sink: v1beta1.Sink{File: &v1beta1.FileSource{Root: "archive", Path: "s.raw"}}},
			{Name: "hpc", Sink: v1beta1.Sink{Onward: &v1beta1.OnwardSink{Endpoint: "tcp://dtn:7000", ServerKey: far,
				Link: &v1beta1.OnwardLink{BandwidthMbps: 200, RoundTrip: &metav1.Duration{Duration: 20 * time.Millisecond},
					LossPercent: "0.1"}}}},
		}
	})
	objs, plan := renderFor(t, sp)
	g := plan.Gateways[0]
	if len(g.Onward) != 1 || g.Onward[0].Limit != planner.OnwardLimitLink || g.Onward[0].Connections != 9 ||
		g.Onward[0].PredictedMbps != 200 || g.Onward[0].RawMbps != 400 {
		t.Fatalf("onward plan %+v: want the 200 Mbit/s link filled by nine 22.3 Mbit/s connections, 400 Mbit/s of the stream at ratio 2", g.Onward)
	}
	for _, j := range objs.Jobs {
		if j.Labels[LabelRole] != RoleGateway {
			continue
		}
		for _, c := range j.Spec.Template.Spec.Containers {
			mounted := false
			for _, m := range c.VolumeMounts {
				mounted = mounted || m.Name == "keys"
			}
			if !mounted {
				t.Errorf("%s/%s has no keys: the onward hop could not connect", j.Name, c.Name)
			}
		}
	}
	var cfg AgentConfig
	if err := json.Unmarshal([]byte(objs.ConfigMap.Data["gateway-0.json"]), &cfg); err != nil {
		t.Fatal(err)
	}
	hop := cfg.Sinks[1]
	if hop.Kind != "numastream" || hop.Endpoint != "tcp://dtn:7000" || hop.Connections != g.Onward[0].Connections ||
		hop.Curve == nil || hop.Curve.ServerKey != far || hop.Curve.SecretKeyFile != KeysMountPath+"/secret" || hop.Curve.Mode != "encrypt" {
		t.Errorf("onward sink %+v (curve %+v)", hop, hop.Curve)
	}
}

// The hop to another site crosses networks the facility does not control: it encrypts whatever
// the facility network's mode, so a pipeline in authenticate mode (frames in clear inside the
// facility) still carries its chunks to the far site encrypted (before, in clear).
func TestAnOnwardHopEncryptsWhateverTheFacilityNetworksMode(t *testing.T) {
	sp := pipeline("hop", withCurve, func(sp *v1beta1.StreamPipeline) {
		sp.Spec.Security.Mode = v1beta1.SecurityAuthenticate
		sp.Spec.Sinks = []v1beta1.Consumer{
			{Name: "here", Sink: v1beta1.Sink{File: &v1beta1.FileSource{Root: "archive", Path: "s.raw"}}},
			{Name: "hpc", Sink: v1beta1.Sink{Onward: &v1beta1.OnwardSink{Endpoint: "tcp://dtn:7000",
				ServerKey: "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"}}},
		}
	})
	objs, _ := renderFor(t, sp)
	var cfg AgentConfig
	if err := json.Unmarshal([]byte(objs.ConfigMap.Data["gateway-0.json"]), &cfg); err != nil {
		t.Fatal(err)
	}
	if hop := cfg.Sinks[1]; hop.Curve == nil || hop.Curve.Mode != "encrypt" {
		t.Errorf("onward hop %+v (curve %+v): want it encrypted", hop, hop.Curve)
	}
}

// A consumer's spill (spec.sinks[].spill) is under its StorageRoot on the gateway node, in a
// directory of the pipeline object, the consumer and the stream, mounted only in the container
// that runs the consumers; under the root the files are written to, the one data volume serves.
func TestAConsumersSpillIsOnTheGatewayNodesRootInADirectoryOfItsOwn(t *testing.T) {
	consumers := func(spillRoot string) option {
		return func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sinks = []v1beta1.Consumer{
				{Name: "here", Sink: v1beta1.Sink{File: &v1beta1.FileSource{Root: "archive", Path: "s{stream}.raw"}}},
				{Name: "hpc", Spill: &v1beta1.ConsumerSpill{MaxBytes: 64 << 30, Root: spillRoot, Path: "spill"},
					Sink: v1beta1.Sink{Onward: &v1beta1.OnwardSink{Endpoint: "tcp://dtn:7000", InsecurePlaintext: true}}},
			}
		}
	}
	objs, _ := renderFor(t, pipeline("hop", withStreams(2), consumers("tape")))
	for stream, key := range []string{"gateway-0.json", "gateway-1.json"} {
		var cfg AgentConfig
		if err := json.Unmarshal([]byte(objs.ConfigMap.Data[key]), &cfg); err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("/var/spill/spill/beamline/hop-uid-1/hpc/stream-%d", stream)
		if s := cfg.Sinks[1].Spill; s == nil || s.Path != want || s.MaxBytes != 64<<30 || cfg.Sinks[0].Spill != nil {
			t.Errorf("%s: sinks %+v: want the onward consumer's spill in %s", key, cfg.Sinks, want)
		}
	}
	var relay AgentConfig
	if err := json.Unmarshal([]byte(objs.ConfigMap.Data["gateway-0-relay.json"]), &relay); err != nil {
		t.Fatal(err)
	}
	if relay.Sink == nil || relay.Sink.Spill != nil {
		t.Errorf("relay sink %+v: the relay has no consumer to spill for", relay.Sink)
	}
	mountedAt := func(c corev1.Container, path string) string {
		for _, m := range c.VolumeMounts {
			if m.MountPath == path {
				return m.Name
			}
		}
		return ""
	}
	for _, j := range objs.Jobs {
		if j.Labels[LabelRole] != RoleGateway {
			if volumeNamed(j.Spec.Template.Spec, "spill") != nil {
				t.Errorf("%s: a sender with a consumer's spill volume", j.Name)
			}
			continue
		}
		pod := j.Spec.Template.Spec
		v := volumeNamed(pod, "spill")
		if v == nil || v.PersistentVolumeClaim == nil || v.PersistentVolumeClaim.ReadOnly {
			t.Fatalf("%s: spill volume %+v: want the root's writable claim", j.Name, v)
		}
		rx, dx := pod.Containers[0], pod.Containers[1]
		if mountedAt(dx, SpillMountPath) != "spill" || mountedAt(rx, SpillMountPath) != "" {
			t.Errorf("%s: spill mounted in %q (consumers) and %q (relay): want spill and none", j.Name, mountedAt(dx, SpillMountPath), mountedAt(rx, SpillMountPath))
		}
	}
	var pvs []string
	for _, v := range objs.Volumes {
		if v.PV != nil {
			pvs = append(pvs, v.PV.Spec.HostPath.Path)
		}
	}
	if !slices.Contains(pvs, "/tape-cache") {
		t.Errorf("persistent volumes on %v: none holds the spill's root /tape-cache", pvs)
	}

	// Spilling under the files' own root: the pod mounts that claim once, at both places.
	objs, _ = renderFor(t, pipeline("hop", withStreams(2), consumers("archive")))
	pod := objs.Jobs[len(objs.Jobs)-1].Spec.Template.Spec
	if volumeNamed(pod, "spill") != nil || mountedAt(pod.Containers[1], SpillMountPath) != "data" || mountedAt(pod.Containers[1], DataPathMount) != "data" {
		t.Errorf("volumes %+v, mounts %+v: want the data volume at %s and %s", pod.Volumes, pod.Containers[1].VolumeMounts, DataPathMount, SpillMountPath)
	}
}
