package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/planner"
	"github.com/numastream/numastream/internal/render"
	"github.com/numastream/numastream/internal/storage"
	"github.com/numastream/numastream/internal/topology"
)

// facts are what one pass reads from the API server; nothing after gather reads.
type facts struct {
	senders           []topology.Node
	gateway           topology.Node
	gatewayNICAddress string
	// senderAddresses: each stream's sender node's addresses (host networking admits only them).
	senderAddresses map[int][]string
	// nodesErr: a node is missing or lacks a label the planner needs (a refusal, not an API error).
	nodesErr error
	// dataAddresses: each running gateway pod's address on the data network, by stream.
	dataAddresses map[int]string
	held          map[int]int
	heldStreams   int
	// jobs and pods of the pipeline; jobs by name.
	jobs map[string]*batchv1.Job
	pods []corev1.Pod
	// failedCreate: the latest FailedCreate event message per Job name (admission refusals).
	failedCreate map[string]string
	// podless: the pipeline's Jobs that have no pod yet, by name. What the Job controller says
	// about them (FailedCreate events) is not watched: the pass is repeated until they have one.
	podless map[string]*batchv1.Job
	// roots: the cluster's StorageRoots by name; pipelines: every StreamPipeline of the cluster
	// (whose files this one's must not overwrite).
	roots     map[string]*v1beta1.StorageRoot
	pipelines []v1beta1.StreamPipeline
	// sites: the RemoteSites the pipeline's onward hops name, by name (a missing one is absent).
	sites map[string]*v1beta1.RemoteSite
	// keysSecret: the Secret with the pipeline's CURVE keys (nil: none, or not needed).
	keysSecret *corev1.Secret
	// claims and volumes: the claims and PersistentVolumes made for the pipeline.
	claims  []corev1.PersistentVolumeClaim
	volumes []corev1.PersistentVolume
}

type notPlannedError struct {
	reason string
	err    error
	retry  bool
}

func (e *notPlannedError) Error() string { return e.err.Error() }

// gather reads every fact of one pass: the nodes, what other pipelines hold on the gateway,
// the pipeline's Jobs, pods, claims, volumes, RemoteSites and key Secret, the StorageRoots and the Job
// controller's refusals. Only API errors are returned.
func (r *StreamPipelineReconciler) gather(ctx context.Context, sp *v1beta1.StreamPipeline) (facts, error) {
	var f facts
	var err error
	if f.nodesErr, err = r.readNodes(ctx, sp, &f); err != nil {
		return f, err
	}
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(sp.Namespace), client.MatchingLabels{render.LabelPipeline: sp.Name}); err != nil {
		return f, err
	}
	f.pods = pods.Items
	f.dataAddresses = gatewayDataAddresses(sp, f.pods)
	if f.held, f.heldStreams, err = r.heldOnGateway(ctx, sp); err != nil {
		return f, err
	}
	var jobs batchv1.JobList
	if err := r.List(ctx, &jobs, client.InNamespace(sp.Namespace), client.MatchingLabels{render.LabelPipeline: sp.Name}); err != nil {
		return f, err
	}
	f.jobs = map[string]*batchv1.Job{}
	for i := range jobs.Items {
		if metav1.IsControlledBy(&jobs.Items[i], sp) {
			f.jobs[jobs.Items[i].Name] = &jobs.Items[i]
		}
	}
	f.podless = podlessJobs(f.jobs, f.pods)
	if f.failedCreate, err = r.failedCreates(ctx, sp, f); err != nil {
		return f, err
	}
	var roots v1beta1.StorageRootList
	if err := r.List(ctx, &roots); err != nil {
		return f, err
	}
	f.roots = map[string]*v1beta1.StorageRoot{}
	for i := range roots.Items {
		f.roots[roots.Items[i].Name] = &roots.Items[i]
	}
	if len(storage.Uses(sp)) > 0 {
		var all v1beta1.StreamPipelineList
		if err := r.List(ctx, &all); err != nil {
			return f, err
		}
		f.pipelines = all.Items
	}
	if f.sites, err = r.readSites(ctx, sp); err != nil {
		return f, err
	}
	if f.keysSecret, err = r.readKeysSecret(ctx, withSites(sp, f.sites)); err != nil {
		return f, err
	}
	var claims corev1.PersistentVolumeClaimList
	if err := r.List(ctx, &claims, client.InNamespace(sp.Namespace), client.MatchingLabels{storage.LabelPipelineName: sp.Name}); err != nil {
		return f, err
	}
	f.claims = claims.Items
	if f.volumes, err = r.pipelineVolumes(ctx, sp.Namespace, sp.Name); err != nil {
		return f, err
	}
	return f, nil
}

// pipelineVolumes are the PersistentVolumes made for the pipeline namespace/name.
func (r *StreamPipelineReconciler) pipelineVolumes(ctx context.Context, namespace, name string) ([]corev1.PersistentVolume, error) {
	var pvs corev1.PersistentVolumeList
	err := r.List(ctx, &pvs, client.MatchingLabels{storage.LabelPipelineNamespace: namespace, storage.LabelPipelineName: name})
	return pvs.Items, err
}

// readNodes reads the sender and gateway nodes into f. A missing node or label is returned as
// the first result (the pipeline cannot be planned), an API error as the second.
func (r *StreamPipelineReconciler) readNodes(ctx context.Context, sp *v1beta1.StreamPipeline, f *facts) (error, error) {
	addresses := map[string][]string{}
	read := func(name string) (topology.Node, error, error) {
		node := &corev1.Node{}
		if err := r.Get(ctx, types.NamespacedName{Name: name}, node); err != nil {
			if apierrors.IsNotFound(err) {
				return topology.Node{}, &notPlannedError{ReasonNodeNotFound, fmt.Errorf("node %s does not exist", name), true}, nil
			}
			return topology.Node{}, nil, err
		}
		t, err := topology.FromLabels(name, node.Labels)
		if err == nil && !passThrough(sp) {
			t, err = t.ForCodec(string(sp.Spec.Codec))
		}
		if err != nil {
			return t, &notPlannedError{ReasonMissingNodeLabels, err, true}, nil
		}
		if cpu, ok := node.Status.Allocatable[corev1.ResourceCPU]; ok {
			t.AllocatableCPUs = int(cpu.MilliValue() / 1000)
			t.AllocatableMilliCPU = cpu.MilliValue()
		}
		others, err := r.otherPodsMilliCPU(ctx, sp, name)
		if err != nil {
			return t, nil, err
		}
		t.OtherPodsMilliCPU = others
		if name == sp.Spec.Gateway.Node {
			f.gatewayNICAddress = t.NICs[sp.Spec.Gateway.Network.NIC].Address
		}
		addresses[name] = nodeAddresses(t, node)
		return t, nil, nil
	}
	f.senderAddresses = map[int][]string{}
	ids := sp.StreamIDs()
	for i, s := range sp.Spec.Senders {
		t, refused, err := read(s.Node)
		if refused != nil || err != nil {
			return refused, err
		}
		f.senders = append(f.senders, t)
		f.senderAddresses[ids[i]] = addresses[s.Node]
	}
	gw, refused, err := read(sp.Spec.Gateway.Node)
	f.gateway = gw
	return refused, err
}

// nodeAddresses are the addresses a host-network pod on the node may connect from: its NICs'
// (as the node daemon published them) and its InternalIP and ExternalIP.
func nodeAddresses(t topology.Node, node *corev1.Node) []string {
	var out []string
	for _, nic := range t.NICs {
		if nic.Address != "" {
			out = append(out, nic.Address)
		}
	}
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP || a.Type == corev1.NodeExternalIP {
			out = append(out, a.Address)
		}
	}
	return out
}

// otherPodsMilliCPU sums what the pods on a node that are not the pipeline's request, in
// millicores, as the scheduler counts it. On the pipeline's gateway, the gateway pods of other
// pipelines are left out: the cores they hold are counted from their plans (heldOnGateway).
// Once a pod of the pipeline runs on the node, pods that came after it are left out too: they
// were scheduled into what the pipeline left, so they must not shrink a running plan (which
// would replace the pipeline's Jobs whenever an unrelated pod starts there).
func (r *StreamPipelineReconciler) otherPodsMilliCPU(ctx context.Context, sp *v1beta1.StreamPipeline, node string) (int64, error) {
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.MatchingFields{indexPodNode: node}); err != nil {
		return 0, err
	}
	active := func(p *corev1.Pod) bool {
		return p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed && p.DeletionTimestamp == nil
	}
	mine := func(p *corev1.Pod) bool {
		return p.Namespace == sp.Namespace && p.Labels[render.LabelPipeline] == sp.Name
	}
	var since *metav1.Time
	for i := range pods.Items {
		if p := &pods.Items[i]; mine(p) && active(p) && (since == nil || p.CreationTimestamp.Before(since)) {
			since = &p.CreationTimestamp
		}
	}
	var total int64
	for i := range pods.Items {
		p := &pods.Items[i]
		if !active(p) || mine(p) || (since != nil && !p.CreationTimestamp.Before(since)) {
			continue
		}
		if node == sp.Spec.Gateway.Node && p.Labels[render.LabelRole] == render.RoleGateway && p.Labels[render.LabelPipeline] != "" {
			continue
		}
		total += podMilliCPU(p)
	}
	return total, nil
}

// podMilliCPU is a pod's CPU request as the scheduler counts it: the larger of its containers'
// sum (with restartable init containers, the sidecars) and its largest init container, plus
// the pod overhead.
func podMilliCPU(p *corev1.Pod) int64 {
	var sum, sidecars, initMax int64
	for _, c := range p.Spec.Containers {
		sum += c.Resources.Requests.Cpu().MilliValue()
	}
	for _, c := range p.Spec.InitContainers {
		v := c.Resources.Requests.Cpu().MilliValue()
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			sidecars += v
			continue
		}
		initMax = max(initMax, sidecars+v)
	}
	total := max(sum+sidecars, initMax)
	if cpu, ok := p.Spec.Overhead[corev1.ResourceCPU]; ok {
		total += cpu.MilliValue()
	}
	return total
}

// admissionGrace: how long a new Job may have no pod before the Job controller's events are
// read for why. The Job controller makes a pod within a second when nothing refuses it; reading
// the namespace's events for every Job of a creation burst (1000 pipelines applied at once)
// would make each pass cost as much as the events there are.
const admissionGrace = 3 * time.Second

// podlessJobs: the Jobs that have no pod among pods, run none and have not finished one.
func podlessJobs(jobs map[string]*batchv1.Job, pods []corev1.Pod) map[string]*batchv1.Job {
	withPods := map[string]bool{}
	for _, p := range pods {
		withPods[p.Labels[batchv1.JobNameLabel]] = true
	}
	out := map[string]*batchv1.Job{}
	for name, j := range jobs {
		if !withPods[name] && j.Status.Active == 0 && j.Status.Succeeded == 0 {
			out[name] = j
		}
	}
	return out
}

// failedCreates reads the Job controller's FailedCreate events for the pipeline's Jobs that
// have had no pod for admissionGrace: what an admission webhook or Pod Security said when it
// refused the pod. Events are read uncached (the operator does not watch them), and only when
// such a Job exists.
func (r *StreamPipelineReconciler) failedCreates(ctx context.Context, sp *v1beta1.StreamPipeline, f facts) (map[string]string, error) {
	if r.APIReader == nil {
		return nil, nil
	}
	waited := false
	for _, j := range f.podless {
		waited = waited || time.Since(j.CreationTimestamp.Time) >= admissionGrace
	}
	if !waited {
		return nil, nil
	}
	var events corev1.EventList
	if err := r.APIReader.List(ctx, &events, client.InNamespace(sp.Namespace), client.MatchingFieldsSelector{
		Selector: fields.AndSelectors(fields.OneTermEqualSelector("involvedObject.kind", "Job"),
			fields.OneTermEqualSelector("reason", "FailedCreate"))}); err != nil {
		return nil, err
	}
	out, at := map[string]string{}, map[string]time.Time{}
	for _, e := range events.Items {
		name := e.InvolvedObject.Name
		j, ok := f.podless[name]
		if !ok || e.InvolvedObject.UID != j.UID {
			continue
		}
		t := e.LastTimestamp.Time
		if e.EventTime.After(t) {
			t = e.EventTime.Time
		}
		if _, seen := at[name]; !seen || t.After(at[name]) {
			out[name], at[name] = e.Message, t
		}
	}
	return out, nil
}

// gatewayDataAddresses is, from each running gateway pod, the address Multus gave it on the
// data network (k8s.v1.cni.cncf.io/network-status).
func gatewayDataAddresses(sp *v1beta1.StreamPipeline, pods []corev1.Pod) map[int]string {
	attachment := sp.Spec.Gateway.Network.Attachment
	if attachment == "" || sp.Spec.Gateway.Network.Address != "" {
		return nil
	}
	out := map[int]string{}
	for i := range pods {
		p := &pods[i]
		stream, err := strconv.Atoi(p.Labels[render.LabelStream])
		running := p.Status.Phase == corev1.PodRunning || p.Status.Phase == corev1.PodSucceeded
		if err != nil || p.Labels[render.LabelRole] != render.RoleGateway || p.DeletionTimestamp != nil || !running {
			continue
		}
		if addr := networkStatusAddress(p, sp.Namespace, attachment); addr != "" {
			out[stream] = addr
		}
	}
	return out
}

// networkStatusAddress is the pod's first address on the attachment ("name" or "namespace/name")
// in its Multus network-status annotation; "" when not there.
func networkStatusAddress(p *corev1.Pod, namespace, attachment string) string {
	var status []struct {
		Name string   `json:"name"`
		IPs  []string `json:"ips"`
	}
	if err := json.Unmarshal([]byte(p.Annotations[NetworkStatusAnnotation]), &status); err != nil {
		return ""
	}
	if !strings.Contains(attachment, "/") {
		attachment = namespace + "/" + attachment
	}
	for _, s := range status {
		if s.Name == attachment && len(s.IPs) > 0 {
			return s.IPs[0]
		}
	}
	return ""
}

// heldOnGateway sums the gateway cores that older pipelines hold. Age decides who keeps cores
// when they run out, so a plan never flips back and forth between two pipelines.
func (r *StreamPipelineReconciler) heldOnGateway(ctx context.Context, sp *v1beta1.StreamPipeline) (map[int]int, int, error) {
	var list v1beta1.StreamPipelineList
	if err := r.List(ctx, &list, client.MatchingFields{indexGateway: sp.Spec.Gateway.Node}); err != nil {
		return nil, 0, err
	}
	held, streams := map[int]int{}, 0
	for i := range list.Items {
		o := &list.Items[i]
		if o.UID == sp.UID || o.Spec.Suspend || o.Status.Plan == nil || !older(o, sp) ||
			!meta.IsStatusConditionTrue(o.Status.Conditions, v1beta1.ConditionPlanned) {
			continue
		}
		for _, c := range o.Status.Plan.GatewayCores {
			held[int(c.NUMANode)] += int(c.Cores)
		}
		streams += len(o.Spec.Senders)
	}
	return held, streams, nil
}

// passThrough: every sender carries a detector's messages as they came (Stream V2): no codec
// work to plan on either side.
func passThrough(sp *v1beta1.StreamPipeline) bool {
	for _, s := range sp.Spec.Senders {
		if s.Source.Stream2 == nil {
			return false
		}
	}
	return len(sp.Spec.Senders) > 0
}

func older(a, b *v1beta1.StreamPipeline) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
}

// ReplanOff is spec.replan's value that keeps the plan made from the spec and the node labels.
const ReplanOff = "off"

// assumedRatio is the compression ratio the plan is made from: the observed one after a re-plan
// (status.replan), else spec.expectedRatio.
func assumedRatio(sp *v1beta1.StreamPipeline) float64 {
	if rp := sp.Status.Replan; rp != nil && sp.Spec.Replan != ReplanOff {
		if r, err := strconv.ParseFloat(rp.Ratio, 64); err == nil && r > 0 {
			return r
		}
	}
	ratio, _ := strconv.ParseFloat(sp.Spec.ExpectedRatio, 64)
	if ratio <= 0 {
		ratio = 2
	}
	return ratio
}

func request(sp *v1beta1.StreamPipeline, f facts) planner.Request {
	ratio := assumedRatio(sp)
	gateway := f.gateway
	if rp := sp.Status.Replan; rp != nil && sp.Spec.Replan != ReplanOff {
		// The decompressing threads' measured speed replaces the gateway's calibration label
		// (which is per core: the planner counts a hardware thread as its share of one).
		if v, err := strconv.ParseFloat(rp.DecompressMBps, 64); err == nil && v > 0 {
			share := 1.0
			if sp.Spec.CodecCPUs != "threads" && gateway.CoresPerCPU() > 0 {
				share = gateway.CoresPerCPU()
			}
			gateway.DecompressMBps = v / share
		}
	}
	req := planner.Request{
		Senders: f.senders, Gateway: gateway, GatewayNIC: sp.Spec.Gateway.Network.NIC,
		Ratio: ratio, Mode: planner.NUMAAware, Held: f.held, HeldStreams: f.heldStreams,
		HasSink:        len(sp.Spec.Consumers()) > 0,
		ExtraConsumers: render.ExtraConsumers(sp),
		Port:           int(sp.Spec.Port),
		ChunkBytes:     sp.Spec.ChunkBytes,
		PassThrough:    passThrough(sp),
		Encrypt:        sp.Spec.SecurityMode() == v1beta1.SecurityCurve,
		StreamIDs:      sp.StreamIDs(),
		Slots:          sp.StreamSlots(),
	}
	if sp.Spec.HostNetwork {
		req.ExtraPortsPerStream = render.HostMetricsPortsPerStream
	}
	if sp.Spec.Placement == v1beta1.PlacementOS {
		req.Mode = planner.OS
	}
	req.CountHardwareThreads = sp.Spec.CodecCPUs == "threads"
	if sp.Spec.Connections != nil {
		req.Connections = int(*sp.Spec.Connections)
	}
	req.Onward = render.OnwardRequests(sp)
	if t := sp.Spec.Threads; t != nil {
		if t.Compress != nil {
			req.CompressThreads = int(*t.Compress)
		}
		if t.Decompress != nil {
			req.DecompressThreads = int(*t.Decompress)
		}
	}
	if sp.Spec.TargetGbps != nil {
		req.TargetMbit = float64(*sp.Spec.TargetGbps) * 1000
	}
	if tr := sp.Status.TopologyRejection; tr != nil && tr.Generation == sp.Generation {
		req.ReceiveCoresLimit = int(tr.ReceiveCores)
	}
	return req
}
