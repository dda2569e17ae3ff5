// Package render turns a StreamPipeline and its plan into Kubernetes objects: the agents'
// configuration (a ConfigMap), one Job per sender and one per gateway stream, and a Service per
// gateway stream. Pure: same input, same objects. Each builder below changes one concern.
//
// A gateway pod has one container per stage group, so that the kubelet's Topology Manager (with
// container scope) can put each group's exclusive CPUs on a different NUMA node, as the paper
// does: the receiving container (the receive threads, on the NIC's node, holding the NIC's
// device resource) relays frames over IPC on a shared emptyDir to the decompressing container
// (decompression and the sink, where the planner put them). The relay hop is acknowledged
// (docs/wire-format.md), so either container may restart without losing data.
//
// Why Jobs: the agent's exit code means something. 0 is a stream that completed verified (do
// not restart it); anything else is a failure (restart it). A Deployment would restart a finished
// stream forever; a bare Pod would never come back after a failure or a Topology Manager
// rejection. A Job with restartPolicy OnFailure does exactly what the data needs, and its
// controller replaces pods that are lost with their node.
package render

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/planner"
	"github.com/numastream/numastream/internal/storage"
	"github.com/numastream/numastream/internal/topology"
)

// Labels and annotations the operator sets.
const (
	LabelPipeline      = "numastream.io/pipeline"
	LabelRole          = "numastream.io/role"
	LabelStream        = "numastream.io/stream"
	AnnotationPlanHash = "numastream.io/plan-hash"
	// AnnotationKeys on an agent pod identifies the CURVE keys it was started with.
	AnnotationKeys   = "numastream.io/keys"
	MultusAnnotation = "k8s.v1.cni.cncf.io/networks"
	ConfigMountPath  = "/etc/numastream"
	KeysMountPath    = "/etc/numastream/keys"
	MetricsPort      = 9100
	// DecompressMetricsPort is the decompressing container's metrics port in a gateway pod.
	DecompressMetricsPort = 9101
	// PreviewPort is where a gateway pod's decompressing container serves its live preview, on
	// the pod's loopback only (without host networking).
	PreviewPort = 9102
	// RelaySocket is where a gateway pod's receiving container hands frames to its decompressing
	// container (an emptyDir both mount at RelayDir).
	RelayDir      = "/run/numastream"
	RelaySocket   = "ipc://" + RelayDir + "/stream.sock"
	DataPathMount = "/data"
	// StateMountPath is where a sender keeps its record of what the gateway acknowledged, its
	// pipeline's directory under storage.StateHostRoot on the detector node (a volume the
	// operator binds to it), so that the next sender of the stream resumes where this one
	// stopped (after a drain, a suspension, a replaced gateway).
	StateMountPath = "/var/lib/numastream-state"
	// SpillMountPath is a sender's spill (spec.spill): an emptyDir limited to spill.maxBytes, or
	// the spill's StorageRoot.
	SpillMountPath = "/var/spill"
	// The values of LabelRole.
	RoleSender  = string(planner.RoleSender)
	RoleGateway = string(planner.RoleGateway)
	// The two containers of a gateway pod (the planner splits it).
	ReceiveContainer    = planner.ContainerReceive
	DecompressContainer = planner.ContainerDecompress
	managedBy           = "numastream-operator"
)

// Options are the operator-wide settings.
type Options struct {
	AgentImage string
	// NetworkPolicy: render one per pipeline so that only its sender pods reach its gateway's
	// data ports.
	NetworkPolicy bool
	// MetricsFrom: who may reach the gateway's metrics ports under that NetworkPolicy: namespace
	// names (the operator's, a monitoring one: their pods) and address blocks in CIDR notation (a
	// Prometheus outside the cluster); empty: every namespace. ParseMetricsFrom checks them.
	MetricsFrom []string
	// Pods are the scheduling settings of every agent pod (the chart's agent.pods); a
	// pipeline's spec.pods adds to them.
	Pods v1beta1.PodSettings
	// StoragePrefixes are the host directories the node daemon makes pipelines' directories
	// under (operator.hostPathPrefixes): Inputs.Prefixes.
	StoragePrefixes []string
	// WholeRootVolumes lets a pipeline's volume of a root under none of StoragePrefixes be the
	// whole root (operator.wholeRootVolumes); false: such a use is refused.
	WholeRootVolumes bool
	// MetricsTokenSHA256: the SHA-256 (hex) of the token the agents' metrics ports ask a client
	// off the pod's loopback for (the operator's metrics token); empty: none asked.
	MetricsTokenSHA256 string
}

// Inputs are what render needs besides the plan.
type Inputs struct {
	Pipeline *v1beta1.StreamPipeline
	Plan     planner.Plan
	Gateway  topology.Node
	// KeysSecret holds the pipeline's CURVE keys (security mode curve); empty: plain TCP.
	KeysSecret string
	// KeysHashes identify each stream's keys in it (by stream id; from their public halves):
	// new keys, new pods for that stream.
	KeysHashes map[int]string
	// GatewayAddress is the address of the gateway's data NIC on its node, as the node daemon
	// published it (hostNetwork senders connect to it; never the node's InternalIP, usually the
	// management network).
	GatewayAddress string
	// Roots are the cluster's StorageRoots by name (storage.Check passed).
	Roots map[string]*v1beta1.StorageRoot
	// Prefixes are the host directories under which the node daemon makes each pipeline's own
	// directory of a root (operator.hostPathPrefixes): a volume of a root under one of them is
	// the pipeline's directory (storage.Dir), of any other root the whole root.
	Prefixes []string
	// DataAddresses are the gateway pods' addresses on the data network, by stream, as Multus
	// reported them (network-status). Senders of a stream with an attachment dial that address;
	// until it is known (or given as spec.gateway.network.address) they are not created.
	DataAddresses map[int]string
	// SenderAddresses are each stream's sender node's addresses (its NICs' as the node daemon
	// published them, its InternalIP and ExternalIP): with host networking its gateway admits
	// connections only from them (and spec.security.allowFrom).
	SenderAddresses map[int][]string
}

// Objects is everything one pipeline owns.
type Objects struct {
	ConfigMap     *corev1.ConfigMap
	Services      []*corev1.Service
	Jobs          []*batchv1.Job
	NetworkPolicy *networkingv1.NetworkPolicy // nil unless Options.NetworkPolicy
	// Volumes are the claims the pods mount for their StorageRoots and state, with the
	// PersistentVolumes bound to them.
	Volumes []storage.Volume
	// Waiting names the sender Jobs held back until their gateway's data-network address is
	// known (the gateway pod runs and Multus reported it).
	Waiting []string
	// Endpoints are where each stream's sender connects (stream id -> tcp://address:port),
	// for status; a held-back sender has none yet.
	Endpoints map[int]string
}

// Render builds the objects for a plan.
func Render(in Inputs, opts Options) (Objects, error) {
	sp := in.Pipeline
	if sp.Spec.HostNetwork && in.GatewayAddress == "" && sp.Spec.Gateway.Network.Address == "" {
		return Objects{}, fmt.Errorf("hostNetwork: gateway node %s publishes no address for its data NIC %s (label %s, which the node daemon publishes when it runs with hostNetwork): set spec.gateway.network.address",
			sp.Spec.Gateway.Node, sp.Spec.Gateway.Network.NIC, topology.NICAddressLabel(sp.Spec.Gateway.Network.NIC))
	}
	if sp.Spec.HostNetwork && lastHostPort(in) > 65535 {
		return Objects{}, fmt.Errorf("hostNetwork: the data and metrics ports of %d streams run from %d to %d, past 65535: lower spec.port",
			len(sp.Spec.Senders), sp.Spec.Port, lastHostPort(in))
	}
	for i, k := range sp.Spec.Sinks {
		// The API refuses both since this check; pipelines stored before it (mode none, no key)
		// may hold them.
		if k.Onward != nil && k.Onward.ServerKey == "" && !k.Onward.InsecurePlaintext {
			return Objects{}, fmt.Errorf("spec.sinks[%d].onward.serverKey: the far receiver's public key is required: the hop proves who answers and encrypts whatever spec.security.mode says (set insecurePlaintext: true to send in clear, with nothing proving who answers)", i)
		}
		if k.Onward != nil && k.Onward.ServerKey != "" && in.KeysSecret == "" {
			return Objects{}, fmt.Errorf("spec.sinks[%d].onward: no keys Secret for the gateway's key: the hop is never sent in clear unless it says insecurePlaintext", i)
		}
	}
	out := Objects{Endpoints: map[int]string{}}
	configs := map[string]string{}
	addConfigs := func(cfgs map[string]AgentConfig) error {
		for key, cfg := range cfgs {
			cfg.Metrics.TokenSHA256 = opts.MetricsTokenSHA256
			cfg.Metrics.TLS = opts.MetricsTokenSHA256 != ""
			b, err := json.MarshalIndent(cfg, "", "  ")
			if err != nil {
				return err
			}
			configs[key] = string(b)
		}
		return nil
	}
	for _, s := range in.Plan.Senders {
		ep := senderEndpoint(in, s.Stream)
		if ep == "" {
			out.Waiting = append(out.Waiting, Name(sp, s.PodPlan))
			continue
		}
		out.Endpoints[s.Stream] = ep
		if err := addConfigs(senderConfigs(in, s, ep)); err != nil {
			return out, err
		}
	}
	for _, g := range in.Plan.Gateways {
		if err := addConfigs(gatewayConfigs(in, g)); err != nil {
			return out, err
		}
	}
	out.ConfigMap = &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: meta(sp, sp.Name+"-agent", "", -1),
		Data:       configs,
	}
	for _, s := range in.Plan.Senders {
		if _, ok := configs[configKey(s.PodPlan)]; !ok {
			continue // waiting for the gateway's data-network address
		}
		out.Jobs = append(out.Jobs, job(in, s.PodPlan, senderContainers(in, s, opts), configs[configKey(s.PodPlan)], opts))
	}
	for _, g := range in.Plan.Gateways {
		out.Services = append(out.Services, service(in, g))
		out.Jobs = append(out.Jobs, job(in, g.PodPlan, gatewayContainers(in, g, opts), configs[configKey(g.PodPlan)]+configs[relayKey(g.PodPlan)], opts))
	}
	out.Volumes = storage.Volumes(sp, in.Roots, in.Prefixes)
	if opts.NetworkPolicy && !sp.Spec.HostNetwork { // NetworkPolicy does not govern host networking
		out.NetworkPolicy = networkPolicy(in, opts.MetricsFrom)
	}
	return out, nil
}

// HostMetricsPortsPerStream: with host networking each stream's slot holds, past its data
// ports, its gateway's two metrics ports (receiving, decompressing container) and its sender's.
const HostMetricsPortsPerStream = 3

// metricsPorts are a plan entry's metrics ports: its agent's (a sender's, or a gateway's
// receiving container's) and, for a gateway, the decompressing container's. On the pod network
// every pod has its own address: 9100 and 9101. With host networking pods share their node's
// ports, so each stream's slot holds its own, right after its data ports: two streams into one
// gateway never collide, none is 9100 (node-exporter's), and a stream keeps its ports when others
// come and go.
func metricsPorts(in Inputs, n planner.PodPlan) (agent, decompress int) {
	sp := in.Pipeline
	if !sp.Spec.HostNetwork {
		return MetricsPort, DecompressMetricsPort
	}
	conns := in.Plan.Connections
	first := int(sp.Spec.Port) + max(sp.StreamSlot(n.Stream), 0)*(conns+HostMetricsPortsPerStream) + conns
	if n.Role == planner.RoleGateway {
		return first, first + 1
	}
	return first + 2, 0
}

// lastHostPort is the highest port a host-network pipeline uses (the last slot's sender
// metrics port).
func lastHostPort(in Inputs) int {
	return int(in.Pipeline.Spec.Port) + in.Pipeline.SlotSpan()*(in.Plan.Connections+HostMetricsPortsPerStream) - 1
}

// Name of the Job / Service for a plan entry.
func Name(sp *v1beta1.StreamPipeline, n planner.PodPlan) string {
	return fmt.Sprintf("%s-%s-%d", sp.Name, n.Role, n.Stream)
}

func configKey(n planner.PodPlan) string { return fmt.Sprintf("%s-%d.json", n.Role, n.Stream) }

// relayKey is the configuration of a gateway pod's receiving (relaying) container.
func relayKey(n planner.PodPlan) string { return fmt.Sprintf("%s-%d-relay.json", n.Role, n.Stream) }

func meta(sp *v1beta1.StreamPipeline, name, role string, stream int) metav1.ObjectMeta {
	labels := map[string]string{
		"app.kubernetes.io/name":       "numastream",
		"app.kubernetes.io/instance":   sp.Name,
		"app.kubernetes.io/managed-by": managedBy,
		LabelPipeline:                  sp.Name,
	}
	if role != "" {
		labels[LabelRole] = role
		labels[LabelStream] = fmt.Sprint(stream)
	}
	return metav1.ObjectMeta{
		Name:      name,
		Namespace: sp.Namespace,
		Labels:    labels,
		// Garbage collection: deleting the pipeline deletes everything it owns.
		OwnerReferences: []metav1.OwnerReference{{
			APIVersion:         v1beta1.GroupVersion.String(),
			Kind:               "StreamPipeline",
			Name:               sp.Name,
			UID:                sp.UID,
			Controller:         ptr.To(true),
			BlockOwnerDeletion: ptr.To(true),
		}},
	}
}

// service exposes one gateway stream's data ports and metrics.
func service(in Inputs, n planner.GatewayPlan) *corev1.Service {
	sp, conns := in.Pipeline, in.Plan.Connections
	rxMetrics, dxMetrics := metricsPorts(in, n.PodPlan)
	name := Name(sp, n.PodPlan)
	svc := &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: meta(sp, name, string(n.Role), n.Stream),
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{LabelPipeline: sp.Name, LabelRole: string(n.Role), LabelStream: fmt.Sprint(n.Stream)},
		},
	}
	for c := 0; c < conns; c++ {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{
			Name: fmt.Sprintf("data-%d", c), Protocol: corev1.ProtocolTCP,
			Port: int32(n.Port + c), TargetPort: intstr.FromInt32(int32(n.Port + c)),
		})
	}
	svc.Spec.Ports = append(svc.Spec.Ports,
		corev1.ServicePort{Name: "metrics", Port: int32(rxMetrics), TargetPort: intstr.FromInt32(int32(rxMetrics))},
		corev1.ServicePort{Name: "metrics-dx", Port: int32(dxMetrics), TargetPort: intstr.FromInt32(int32(dxMetrics))})
	if port := stream2Port(sp.Spec.Stream2Consumer()); port > 0 {
		// Consumers written for the detector connect here, as they would to the detector.
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: "stream2", Protocol: corev1.ProtocolTCP, Port: port, TargetPort: intstr.FromInt32(port)})
	}
	return svc
}

func job(in Inputs, n planner.PodPlan, cs []corev1.Container, config string, opts Options) *batchv1.Job {
	sp := in.Pipeline
	name := Name(sp, n)
	pod := corev1.PodTemplateSpec{ObjectMeta: meta(sp, "", string(n.Role), n.Stream)}
	pod.OwnerReferences = nil
	pod.Spec = corev1.PodSpec{
		// Never: a failed pod is replaced by a new one, which podFailurePolicy needs.
		RestartPolicy:                 corev1.RestartPolicyNever,
		TerminationGracePeriodSeconds: ptr.To[int64](30), // SIGTERM drains the stream
		SecurityContext:               podSecurity(sp),
		Containers:                    cs,
		Volumes:                       volumes(in, n),
		EnableServiceLinks:            ptr.To(false),
	}
	schedule(&pod.Spec, n, opts.Pods, sp.Spec.Pods)
	pod.Annotations = map[string]string{}
	if h := in.KeysHashes[n.Stream]; h != "" {
		pod.Annotations[AnnotationKeys] = h
	}
	withNetworkAttachment(&pod, sp, n)
	if sp.Spec.HostNetwork {
		pod.Spec.HostNetwork = true
		pod.Spec.DNSPolicy = corev1.DNSClusterFirstWithHostNet
	}
	// The plan hash covers the agent config the pod reads (from the ConfigMap) and everything the
	// pod is made of: image, host network, attachments, volumes, scheduling, keys. A Job's pod
	// template is immutable, so whatever changes the pod changes the hash, and a changed hash
	// means: replace the Job (never apply a changed template onto it).
	tmpl, err := json.Marshal(pod)
	if err != nil {
		panic(fmt.Sprintf("render: a pod template that does not marshal: %v", err)) // only plain API types here
	}
	sum := sha256.Sum256(append([]byte(config), tmpl...))
	hash := hex.EncodeToString(sum[:8])
	pod.Annotations[AnnotationPlanHash] = hash
	j := &batchv1.Job{
		TypeMeta:   metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"},
		ObjectMeta: meta(sp, name, string(n.Role), n.Stream),
		Spec: batchv1.JobSpec{
			BackoffLimit:     ptr.To[int32](10),
			PodFailurePolicy: podFailurePolicy(),
			Template:         pod,
		},
	}
	j.Annotations = map[string]string{AnnotationPlanHash: hash}
	if sp.Spec.Suspend {
		j.Spec.Suspend = ptr.To(true)
	}
	return j
}

// schedule sets the pod's node selection (the plan names the node; the settings may only
// narrow it), tolerations, priority class and image pull secrets: the operator's, then the
// pipeline's.
func schedule(spec *corev1.PodSpec, n planner.PodPlan, defaults v1beta1.PodSettings, own *v1beta1.PodSettings) {
	s := *defaults.DeepCopy()
	if own != nil {
		s.Tolerations = append(s.Tolerations, own.Tolerations...)
		for k, v := range own.NodeSelector {
			if s.NodeSelector == nil {
				s.NodeSelector = map[string]string{}
			}
			s.NodeSelector[k] = v
		}
		if own.PriorityClassName != "" {
			s.PriorityClassName = own.PriorityClassName
		}
		if len(own.ImagePullSecrets) > 0 {
			s.ImagePullSecrets = own.ImagePullSecrets
		}
	}
	spec.NodeSelector = map[string]string{}
	for k, v := range s.NodeSelector {
		spec.NodeSelector[k] = v
	}
	spec.NodeSelector[corev1.LabelHostname] = n.Node
	spec.Tolerations = s.Tolerations
	spec.PriorityClassName = s.PriorityClassName
	spec.ImagePullSecrets = s.ImagePullSecrets
}

// Agent exit codes (docs/agent-config.md) as the Job controller must read them.
const (
	ExitBadConfig       = 2   // fail fast: retrying cannot help
	ExitInterruptedTerm = 143 // SIGTERM before the stream completed: paused, resume it
	ExitInterruptedInt  = 130 // SIGINT, likewise
)

// podFailurePolicy: disruptions (node drain, eviction, preemption) and interrupted agents are
// retried without counting against the backoff limit; a bad configuration fails the Job at once.
// Everything else (peer gone, data lost) counts, up to backoffLimit.
func podFailurePolicy() *batchv1.PodFailurePolicy {
	return &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{
		{Action: batchv1.PodFailurePolicyActionIgnore, OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{
			{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue}}},
		{Action: batchv1.PodFailurePolicyActionFailJob, OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{
			Operator: batchv1.PodFailurePolicyOnExitCodesOpIn, Values: []int32{ExitBadConfig}}},
		{Action: batchv1.PodFailurePolicyActionIgnore, OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{
			Operator: batchv1.PodFailurePolicyOnExitCodesOpIn, Values: []int32{ExitInterruptedInt, ExitInterruptedTerm}}},
	}}
}

// withNetworkAttachment: the gateway's pods and the senders join the data network (Multus), the
// senders through their own attachment when the spec names one.
func withNetworkAttachment(pod *corev1.PodTemplateSpec, sp *v1beta1.StreamPipeline, n planner.PodPlan) {
	if a := attachmentOf(sp, n.Role); a != "" {
		pod.Annotations[MultusAnnotation] = a
	}
}

func attachmentOf(sp *v1beta1.StreamPipeline, role planner.Role) string {
	net := sp.Spec.Gateway.Network
	if role == planner.RoleSender && net.SenderAttachment != "" {
		return net.SenderAttachment
	}
	return net.Attachment
}

// senderEndpoint is where a sender dials its gateway: over the data network when there is one
// (the static address, else the one Multus reported for the gateway pod; "" while unknown), the
// gateway node's address with host networking, else the gateway's Service.
func senderEndpoint(in Inputs, stream int) string {
	sp := in.Pipeline
	gw, _ := in.Plan.Gateway(stream)
	host := fmt.Sprintf("%s.%s.svc", Name(sp, gw.PodPlan), sp.Namespace)
	switch {
	case sp.Spec.Gateway.Network.Address != "":
		host = sp.Spec.Gateway.Network.Address
	case sp.Spec.HostNetwork:
		host = in.GatewayAddress
	case sp.Spec.Gateway.Network.Attachment != "":
		host = in.DataAddresses[stream]
	}
	if host == "" {
		return ""
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]" // IPv6
	}
	return fmt.Sprintf("tcp://%s:%d", host, gw.Port)
}

// keysMount is where an agent on the network reads its CURVE keys.
var keysMount = corev1.VolumeMount{Name: "keys", MountPath: KeysMountPath, ReadOnly: true}

// senderContainers: a sender pod has one agent, with its state, spill and keys.
func senderContainers(in Inputs, s planner.SenderPlan, opts Options) []corev1.Container {
	n := s.PodPlan
	agentMetrics, _ := metricsPorts(in, n)
	tx := agent(in, n, opts, n.Containers[0], "send", configKey(n), agentMetrics, "metrics")
	tx.VolumeMounts = append(tx.VolumeMounts, corev1.VolumeMount{Name: "state", MountPath: StateMountPath})
	if in.Pipeline.Spec.Spill != nil {
		tx.VolumeMounts = append(tx.VolumeMounts, corev1.VolumeMount{Name: "spill", MountPath: SpillMountPath})
	}
	if dataKeys(in) {
		tx.VolumeMounts = append(tx.VolumeMounts, keysMount)
	}
	return []corev1.Container{tx}
}

// gatewayContainers: a gateway pod has the receiving container (the NIC's device resource, the
// data ports, the keys) and the decompressing container (the sink's volume).
func gatewayContainers(in Inputs, g planner.GatewayPlan, opts Options) []corev1.Container {
	n := g.PodPlan
	agentMetrics, dxMetrics := metricsPorts(in, n)
	rx := agent(in, n, opts, n.Containers[0], "receive", relayKey(n), agentMetrics, "metrics")
	sp := in.Pipeline
	if sp.Spec.Placement != v1beta1.PlacementOS {
		rx.Resources.Requests[corev1.ResourceName(nicResource(sp))] = resource.MustParse("1")
		rx.Resources.Limits[corev1.ResourceName(nicResource(sp))] = resource.MustParse("1")
	}
	for p := 0; p < in.Plan.Connections; p++ {
		rx.Ports = append(rx.Ports, corev1.ContainerPort{Name: fmt.Sprintf("data-%d", p), ContainerPort: int32(g.Port + p)})
	}
	dx := agent(in, n, opts, n.Containers[1], "receive", configKey(n), dxMetrics, "metrics-dx") // at most 15 characters
	if hasDataVolume(sp, n) {
		dx.VolumeMounts = append(dx.VolumeMounts, corev1.VolumeMount{Name: "data", MountPath: DataPathMount})
	}
	for _, u := range podUses(sp, n) {
		if u.Spill { // the consumers' spills (one root: storage.Check)
			dx.VolumeMounts = append(dx.VolumeMounts, corev1.VolumeMount{Name: podVolumeName(in, n, u), MountPath: SpillMountPath})
			break
		}
	}
	for _, c := range []*corev1.Container{&rx, &dx} {
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "relay", MountPath: RelayDir})
	}
	if dataKeys(in) {
		rx.VolumeMounts = append(rx.VolumeMounts, keysMount) // the containers on the network hold keys
	}
	if hopKeys(in) {
		dx.VolumeMounts = append(dx.VolumeMounts, keysMount) // its onward hop connects with the gateway's key
	}
	return []corev1.Container{rx, dx}
}

// agent is one agent container: Guaranteed QoS with integer CPUs (requests == limits) so the
// kubelet's static CPU manager gives it exclusive cores; a planned share of the shared pool
// (MilliCPU) stays Guaranteed but runs on the pool's CPUs.
func agent(in Inputs, n planner.PodPlan, opts Options, plan planner.Container, cmd, config string, metrics int, portName string) corev1.Container {
	sp := in.Pipeline
	name := plan.Name
	cpu := resource.MustParse(fmt.Sprint(plan.CPUs))
	if plan.MilliCPU > 0 {
		cpu = *resource.NewMilliQuantity(plan.MilliCPU, resource.DecimalSI)
	}
	mem := resource.MustParse(fmt.Sprintf("%dMi", plan.MemoryBytes>>20))
	res := corev1.ResourceList{corev1.ResourceCPU: cpu, corev1.ResourceMemory: mem}
	c := corev1.Container{
		Name:            name,
		Image:           opts.AgentImage,
		ImagePullPolicy: corev1.PullIfNotPresent,
		Args:            []string{cmd, "--config", ConfigMountPath + "/" + config, "--summary-file", corev1.TerminationMessagePathDefault},
		// An agent that fails before it writes its summary (a configuration error) leaves the
		// tail of its log as the termination message: the operator quotes it in status.
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		Resources:                corev1.ResourceRequirements{Requests: res, Limits: res.DeepCopy()},
		Ports:                    []corev1.ContainerPort{{Name: portName, ContainerPort: int32(metrics)}},
		SecurityContext:          containerSecurity(),
		VolumeMounts:             []corev1.VolumeMount{{Name: "config", MountPath: ConfigMountPath, ReadOnly: true}},
		LivenessProbe: &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(int32(metrics))}},
			PeriodSeconds: 10, FailureThreshold: 3,
		},
	}
	if n.Role == planner.RoleSender && hasDataVolume(sp, n) {
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "data", MountPath: DataPathMount, ReadOnly: true})
	}
	return c
}

// nicResource is the device resource aligned with the data NIC: the SR-IOV pool the attachment
// names, else numastream's NIC-locality token.
func nicResource(sp *v1beta1.StreamPipeline) string {
	if r := sp.Spec.Gateway.Network.ResourceName; r != "" {
		return r
	}
	return topology.NICResource(sp.Spec.Gateway.Network.NIC)
}

// podSecurity / containerSecurity: the restricted Pod Security profile, as the pipeline's user
// and group (spec.files).
func podSecurity(sp *v1beta1.StreamPipeline) *corev1.PodSecurityContext {
	uid, gid := sp.Spec.RunAs()
	return &corev1.PodSecurityContext{
		RunAsNonRoot: ptr.To(true),
		RunAsUser:    ptr.To(uid),
		RunAsGroup:   ptr.To(gid),
		// The key files (mode 0440) and emptyDirs are the agent's group's. A claim whose root
		// already belongs to the group is left as it is (the kubelet changes no ownership in it).
		FSGroup:             ptr.To(gid),
		FSGroupChangePolicy: ptr.To(corev1.FSGroupChangeOnRootMismatch),
		SeccompProfile:      &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

func containerSecurity() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		AllowPrivilegeEscalation: ptr.To(false),
		ReadOnlyRootFilesystem:   ptr.To(true),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
}

func hasDataVolume(sp *v1beta1.StreamPipeline, n planner.PodPlan) bool {
	for _, u := range podUses(sp, n) {
		if !u.Spill {
			return true
		}
	}
	return false
}

// Key names in a pipeline's CURVE Secret.
const (
	GatewaySecretKey = "gateway.secret"
	GatewayPublicKey = "gateway.public"
)

// SenderSecretKey / SenderPublicKey: the key names of stream i's sender in the Secret.
func SenderSecretKey(stream int) string { return fmt.Sprintf("sender-%d.secret", stream) }
func SenderPublicKey(stream int) string { return fmt.Sprintf("sender-%d.public", stream) }

// keysVolume projects, from the pipeline's Secret, only what one pod needs: a sender its own
// secret key and the gateway's public key; a gateway stream the gateway's secret key and the
// public key of the one sender it accepts. Readable by the agent's group only.
func keysVolume(secret string, n planner.PodPlan) corev1.Volume {
	items := []corev1.KeyToPath{
		{Key: SenderSecretKey(n.Stream), Path: "secret"},
		{Key: GatewayPublicKey, Path: "server.public"},
	}
	if n.Role == planner.RoleGateway {
		items = []corev1.KeyToPath{
			{Key: GatewaySecretKey, Path: "secret"},
			{Key: SenderPublicKey(n.Stream), Path: "allowed"},
		}
	}
	return corev1.Volume{Name: "keys", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
		SecretName: secret, Items: items, DefaultMode: ptr.To[int32](0o440),
	}}}
}

// networkPolicy: a gateway's data ports accept only this pipeline's sender pods; its metrics
// ports the pods of the namespaces `metricsFrom` names (the operator's observer, Prometheus), or
// of every namespace when it names none; a stream2 sink's port the consumers the spec names, or
// the pods of the pipeline's namespace. (The kubelet's probes come from the node, which
// NetworkPolicy implementations admit.)
func networkPolicy(in Inputs, metricsFrom []string) *networkingv1.NetworkPolicy {
	sp := in.Pipeline
	tcp := corev1.ProtocolTCP
	var data []networkingv1.NetworkPolicyPort
	for _, n := range in.Plan.Gateways {
		for c := 0; c < in.Plan.Connections; c++ {
			port := intstr.FromInt32(int32(n.Port + c))
			data = append(data, networkingv1.NetworkPolicyPort{Protocol: &tcp, Port: &port})
		}
	}
	metrics, dxMetrics := intstr.FromInt32(MetricsPort), intstr.FromInt32(DecompressMetricsPort)
	readers := []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}}}
	if len(metricsFrom) > 0 {
		readers = metricsPeers(metricsFrom)
	}
	np := &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: meta(sp, sp.Name+"-gateway", "", -1),
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelPipeline: sp.Name, LabelRole: RoleGateway}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{
				{
					From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{
						MatchLabels: map[string]string{LabelPipeline: sp.Name, LabelRole: RoleSender}}}},
					Ports: data,
				},
				{
					From:  readers,
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &metrics}, {Protocol: &tcp, Port: &dxMetrics}},
				},
			},
		},
	}
	if port := stream2Port(sp.Spec.Stream2Consumer()); port > 0 {
		// The Stream V2 consumers the spec names, else the pods of the pipeline's namespace.
		consumers := sp.Spec.Stream2Consumer().Consumers
		if len(consumers) == 0 {
			consumers = []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}}
		}
		p := intstr.FromInt32(port)
		np.Spec.Ingress = append(np.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{
			From: consumers, Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &p}}})
	}
	return np
}

// ParseMetricsFrom checks the entries of Options.MetricsFrom: each a namespace name (a DNS label)
// or an address block in CIDR notation; the error names the first that is neither.
func ParseMetricsFrom(entries []string) error {
	for _, e := range entries {
		if strings.Contains(e, "/") {
			if _, _, err := net.ParseCIDR(e); err != nil {
				return fmt.Errorf("%q is not an address block (CIDR such as 10.0.0.0/24): %w", e, err)
			}
			continue
		}
		if errs := validation.IsDNS1123Label(e); len(errs) > 0 {
			return fmt.Errorf("%q is neither a namespace name nor an address block: %s", e, strings.Join(errs, "; "))
		}
	}
	return nil
}

// metricsPeers: a namespace's pods for a name, the block itself for an address block.
func metricsPeers(entries []string) []networkingv1.NetworkPolicyPeer {
	var peers []networkingv1.NetworkPolicyPeer
	for _, e := range entries {
		if strings.Contains(e, "/") {
			peers = append(peers, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: e}})
			continue
		}
		peers = append(peers, networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{
			MatchLabels: map[string]string{corev1.LabelMetadataName: e}}})
	}
	return peers
}

func volumes(in Inputs, n planner.PodPlan) []corev1.Volume {
	sp := in.Pipeline
	vols := []corev1.Volume{{
		Name: "config",
		VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: sp.Name + "-agent"},
		}},
	}}
	claim := func(name, claim string, readOnly bool) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{
			ClaimName: claim, ReadOnly: readOnly}}}
	}
	if n.Role == planner.RoleGateway {
		vols = append(vols, corev1.Volume{Name: "relay", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	}
	if dataKeys(in) || (n.Role == planner.RoleGateway && hopKeys(in)) {
		vols = append(vols, keysVolume(in.KeysSecret, n))
	}
	if n.Role == planner.RoleSender {
		vols = append(vols, claim("state", storage.StateClaimName(sp, n.Node), false))
		if s := sp.Spec.Spill; s != nil && s.Root == "" {
			limit := resource.NewQuantity(s.MaxBytes, resource.BinarySI)
			vols = append(vols, corev1.Volume{Name: "spill", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: limit}}})
		}
	}
	// The volume (the pipeline's directory of a root, the whole root, a claim) is mounted whole,
	// never a subPath: a symbolic link in it resolves in the container, where nothing of the host
	// above it exists. Several file consumers write under one root or claim (storage.Check): one
	// volume.
	named := map[string]bool{}
	for _, u := range podUses(sp, n) {
		name := podVolumeName(in, n, u)
		if named[name] {
			continue
		}
		named[name] = true
		vols = append(vols, claim(name, claimOf(in, u), u.ReadOnly))
	}
	return vols
}

// podVolumeName is the volume through which a pod reaches use u: "data" for what it reads or
// writes, "spill" for its spill, or "data" again for a spill under the claim the data is on (a
// pod mounts a claim once).
func podVolumeName(in Inputs, n planner.PodPlan, u storage.Use) string {
	if !u.Spill {
		return "data"
	}
	for _, o := range podUses(in.Pipeline, n) {
		if !o.Spill && claimOf(in, o) == claimOf(in, u) {
			return "data"
		}
	}
	return "spill"
}

// claimOf is the claim through which a pod reaches use u.
func claimOf(in Inputs, u storage.Use) string {
	return storage.ClaimName(in.Pipeline, u, storage.Dir(in.Pipeline, u, in.Roots, in.Prefixes))
}

// podUses are the storage uses of one pod.
func podUses(sp *v1beta1.StreamPipeline, n planner.PodPlan) []storage.Use {
	var out []storage.Use
	for _, u := range storage.Uses(sp) {
		if u.Role == string(n.Role) && (n.Role == planner.RoleGateway || u.Stream == n.Stream) {
			out = append(out, u)
		}
	}
	return out
}
