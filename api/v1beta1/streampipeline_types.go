package v1beta1

import (
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PlacementMode says whether the operator and the agents place stages by NUMA node.
// +kubebuilder:validation:Enum=numa-aware;os
type PlacementMode string

const (
	// PlacementNUMAAware pins receivers next to the NIC, spreads decompression, sizes stages.
	PlacementNUMAAware PlacementMode = "numa-aware"
	// PlacementOS pins nothing: the paper's operating-system baseline, kept for comparison.
	PlacementOS PlacementMode = "os"
)

// Codec compresses chunks on the senders. bslz4 is bitshuffle + LZ4 in the HDF5 filter 32008
// framing (what DECTRIS detectors send and NeXus files store); frames that arrive in it (an HDF5
// source stored with it) travel as they are.
// +kubebuilder:validation:Enum=lz4;shuffle-lz4;bslz4;none
type Codec string

// StreamPipelineSpec is what a user means: which nodes stream to which gateway over which
// network, and where the data goes. How threads are pinned is the operator's job.
// +kubebuilder:validation:XValidation:rule="!has(self.connections) || self.port + self.connections <= 65536",message="port + connections must not run past 65535"
// +kubebuilder:validation:XValidation:rule="!(has(self.security) && has(self.security.rotateEvery) && has(self.security.keysSecret))",message="security.rotateEvery rotates the operator's keys: rotate a keysSecret of your own yourself"
// +kubebuilder:validation:XValidation:rule="!(has(self.hostNetwork) && self.hostNetwork && has(self.gateway.network.attachment))",message="hostNetwork pods use the host's NICs: leave gateway.network.attachment unset"
// +kubebuilder:validation:XValidation:rule="!(size(self.senders) > 1 && has(self.sink) && has(self.sink.hdf5) && !self.sink.hdf5.path.contains('{stream}'))",message="sink.hdf5.path must contain {stream} when there are several senders: each stream writes its own file"
// +kubebuilder:validation:XValidation:rule="!(has(self.sink) && has(self.sink.stream2)) || self.senders.all(s, has(s.source.stream2))",message="sink.stream2 re-emits Stream V2 messages: every sender's source must be stream2"
// +kubebuilder:validation:XValidation:rule="!(has(self.sink) && has(self.sink.stream2) && size(self.senders) > 1)",message="a stream2 sink re-emits the series of one detector: one sender per StreamPipeline"
// +kubebuilder:validation:XValidation:rule="!(has(self.sink) && has(self.sink.hdf5) && has(self.sink.hdf5.nxmx)) || self.senders.all(s, has(s.source.stream2))",message="sink.hdf5.nxmx writes Stream V2 series: every sender's source must be stream2"
// +kubebuilder:validation:XValidation:rule="!(size(self.senders) > 1 && has(self.sink) && has(self.sink.file) && !self.sink.file.path.contains('{stream}'))",message="sink.file.path must contain {stream} when there are several senders: each stream writes its own file"
// +kubebuilder:validation:XValidation:rule="!(has(self.sink) && has(self.sinks))",message="give sink (one) or sinks (several consumers at once), not both"
// +kubebuilder:validation:XValidation:rule="!(has(self.sink) && has(self.sink.onward))",message="sink.onward: the onward hop is one of spec.sinks (beside what the gateway keeps)"
// +kubebuilder:validation:XValidation:rule="!has(self.sinks) || self.sinks.all(k, !has(k.onward) || has(k.onward.site) || (has(k.onward.serverKey) != (has(k.onward.insecurePlaintext) && k.onward.insecurePlaintext)))",message="sinks[].onward.serverKey: the far receiver's public key is required (the hop proves who answers and encrypts, whatever spec.security.mode says), unless insecurePlaintext is true; not both"
// +kubebuilder:validation:XValidation:rule="!has(self.sinks) || self.sinks.exists(k, !has(k.guarantee) || k.guarantee == 'lossless')",message="sinks: a chunk is acknowledged once its lossless consumers have it: at least one must be lossless"
// +kubebuilder:validation:XValidation:rule="!has(self.sinks) || self.sinks.filter(k, has(k.stream2)).size() <= 1",message="sinks: one stream2 re-emit per pipeline (one port on the gateway's Service)"
// +kubebuilder:validation:XValidation:rule="!(has(self.sinks) && self.sinks.exists(k, has(k.stream2))) || (size(self.senders) == 1 && self.senders.all(s, has(s.source.stream2)))",message="a stream2 consumer re-emits the series of one detector: one sender, its source stream2"
// +kubebuilder:validation:XValidation:rule="!(has(self.sinks) && self.sinks.exists(k, has(k.hdf5) && has(k.hdf5.nxmx))) || self.senders.all(s, has(s.source.stream2))",message="hdf5.nxmx writes Stream V2 series: every sender's source must be stream2"
// +kubebuilder:validation:XValidation:rule="!(size(self.senders) > 1 && has(self.sinks) && self.sinks.exists(k, (has(k.file) && !k.file.path.contains('{stream}')) || (has(k.hdf5) && !k.hdf5.path.contains('{stream}'))))",message="a file or hdf5 consumer's path must contain {stream} when there are several senders: each stream writes its own file"
type StreamPipelineSpec struct {
	// Senders are the source nodes; each one is one stream (the paper's detectors).
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=map
	// +listMapKey=node
	Senders []Sender `json:"senders"`

	// Gateway is the node that receives every stream, and its data network.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="gateway is immutable: create a new StreamPipeline to stream to another gateway"
	Gateway Gateway `json:"gateway"`

	// Sink is where verified chunks go on the gateway. Unset: verify and count (null sink).
	// +optional
	Sink *Sink `json:"sink,omitempty"`

	// Sinks are several consumers of the same verified chunks at once, instead of sink: files,
	// a Stream V2 re-emit and live zmq consumers fed by one gateway, each with its guarantee
	// (docs/agent-config.md: sinks). The payload is shared among them, not copied.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	// +listType=map
	// +listMapKey=name
	// +optional
	Sinks []Consumer `json:"sinks,omitempty"`

	// Codec for the chunks on the wire.
	// +kubebuilder:default=lz4
	// +optional
	Codec Codec `json:"codec,omitempty"`

	// ExpectedRatio is the compression ratio the planner assumes (raw / compressed), e.g. "2.0".
	// +kubebuilder:validation:Pattern=`^[0-9]+(\.[0-9]+)?$`
	// +kubebuilder:default="2.0"
	// +optional
	ExpectedRatio string `json:"expectedRatio,omitempty"`

	// Connections is the number of TCP connections per stream. Unset: the planner chooses.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=64
	// +optional
	Connections *int32 `json:"connections,omitempty"`

	// Port is the first data port on the gateway; stream i, connection j uses a port derived
	// from it (see docs/planner.md).
	// +kubebuilder:validation:Minimum=1024
	// +kubebuilder:validation:Maximum=65535
	// +kubebuilder:default=5555
	// +optional
	Port int32 `json:"port,omitempty"`

	// ChunkBytes is the size of one chunk (one projection: 11059200 bytes).
	// +kubebuilder:validation:Minimum=4096
	// +kubebuilder:validation:Maximum=268435456
	// +kubebuilder:default=11059200
	// +optional
	ChunkBytes int64 `json:"chunkBytes,omitempty"`

	// Threads overrides the planner's thread counts.
	// +optional
	Threads *StageThreads `json:"threads,omitempty"`

	// Security of the data connections. Unset: CURVE with keys the operator makes.
	// +optional
	Security *Security `json:"security,omitempty"`

	// Placement: numa-aware (default) or os (the baseline).
	// +kubebuilder:default=numa-aware
	// +optional
	Placement PlacementMode `json:"placement,omitempty"`

	// CodecCPUs says how the planner counts CPUs for the codec stages on nodes whose cores have
	// several hardware threads: cores (default: the threads of one core share its measured codec
	// speed) or threads (each hardware thread counts as a core).
	// +kubebuilder:validation:Enum=cores;threads
	// +kubebuilder:default=cores
	// +optional
	CodecCPUs string `json:"codecCPUs,omitempty"`

	// TargetGbps is the raw rate per stream to plan for; unset: as fast as the hardware allows.
	// The planner then uses only the cores that rate needs.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +optional
	TargetGbps *int32 `json:"targetGbps,omitempty"`

	// Suspend scales the pipeline to zero without deleting it.
	// +optional
	Suspend bool `json:"suspend,omitempty"`

	// Rollout is how a change that replaces running agents (a new agent image, new keys, a new
	// plan) reaches a running pipeline: a few streams at a time, each drained and resumed where it
	// stopped, the others streaming on their current pods meanwhile.
	// +optional
	Rollout *Rollout `json:"rollout,omitempty"`

	// HostNetwork runs the agent pods in their nodes' network namespaces, as data transfer nodes
	// usually do: senders connect to the gateway's data NIC address (gateway.network.address,
	// else the address the node daemon publishes for gateway.network.nic). No Service, no Multus
	// attachment; NetworkPolicy does not apply (see allowFrom).
	// +optional
	HostNetwork bool `json:"hostNetwork,omitempty"`

	// IdleTimeoutSeconds fails a started stream that has had no data and no sender connected
	// this long (its sender gone and not coming back); a connected, quiet sender keeps its
	// stream (the connections' TCP keepalive is its heartbeat). Unset: off for endless sources
	// (a beamline pauses between scans), 600 s for sources with an end.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=86400
	// +optional
	IdleTimeoutSeconds *int32 `json:"idleTimeoutSeconds,omitempty"`

	// Pods adds scheduling settings to every agent pod of the pipeline, over the operator's
	// defaults (the chart's agent.pods).
	// +optional
	Pods *PodSettings `json:"pods,omitempty"`

	// Replan: auto (default) lets the operator re-plan a running pipeline from what its agents
	// observe (the real compression ratio, the measured decompression speed) when that departs
	// from what the plan assumed; off keeps the plan made from the spec and the node labels
	// (docs/adaptive.md).
	// +kubebuilder:validation:Enum=auto;off
	// +kubebuilder:default=auto
	// +optional
	Replan string `json:"replan,omitempty"`

	// Files says as which user and group the agents run, so who owns what they write, and the
	// permissions of the files. With a StorageRoot, the root's access must admit them for the
	// pipeline's namespace. Unset: user and group 65532, mode 0640.
	// +optional
	Files *Files `json:"files,omitempty"`

	// Spill lets the senders keep what the pipeline downstream cannot take yet on node-local
	// storage instead of holding back (or losing) a source that cannot wait (docs/adaptive.md).
	// +optional
	Spill *Spill `json:"spill,omitempty"`

	// Preview serves the latest frame of each stream as a picture, with its rate, on each
	// gateway's metrics port (/preview; docs/preview.md): a live view for the people at the
	// experiment that never holds the data back. It shows the data to whoever reaches that port,
	// so it is off unless set.
	// +optional
	Preview *Preview `json:"preview,omitempty"`
}

// Preview is the gateway's live view: set (even empty) turns it on.
type Preview struct {
	// MaxSide is the picture's longest side at most, in pixels (frames are binned to fit).
	// +kubebuilder:validation:Minimum=16
	// +kubebuilder:validation:Maximum=4096
	// +optional
	MaxSide *int32 `json:"maxSide,omitempty"`
	// IntervalMilliseconds: a stream's frame is taken at most this often.
	// +kubebuilder:validation:Minimum=50
	// +kubebuilder:validation:Maximum=60000
	// +optional
	IntervalMilliseconds *int32 `json:"intervalMilliseconds,omitempty"`
}

// Spill is node-local storage for a sender's backlog: an emptyDir the operator mounts (on the
// node's disk, limited to MaxBytes), or a directory under a StorageRoot the admin made (e.g. a
// local NVMe).
// +kubebuilder:validation:XValidation:rule="!has(self.path) || has(self.root)",message="spill.path is relative to spill.root: name the root"
type Spill struct {
	// MaxBytes is the most the spill may hold per sender.
	// +kubebuilder:validation:Minimum=1048576
	MaxBytes int64 `json:"maxBytes"`
	// Root names a StorageRoot (role sender) to spill into; unset: an emptyDir of MaxBytes.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	Root string `json:"root,omitempty"`
	// Path under the root; the pipeline's spill is <path>/<namespace>/<name>-<uid> below it, so
	// no two pipelines share one. Relative, without "." or ".." segments or empty ones.
	// +kubebuilder:validation:Pattern=`^([^/]*[^/.][^/]*|\.\.\.+)(/([^/]*[^/.][^/]*|\.\.\.+))*$`
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Path string `json:"path,omitempty"`
}

// Files: owner and permissions of what the agents write.
type Files struct {
	// User (uid) the agents run as; not 0.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=2147483647
	// +optional
	User *int64 `json:"user,omitempty"`
	// Group (gid) the agents run as and the files belong to; not 0.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=2147483647
	// +optional
	Group *int64 `json:"group,omitempty"`
	// Mode of the files the sinks write, octal: the owner reads and writes (a resumed stream
	// writes on), the group may read or write, others may only read; nothing is executable.
	// Directories the sinks make get the matching search bits (0640: 0750).
	// +kubebuilder:validation:Pattern=`^0?6[0246][04]$`
	// +kubebuilder:default="0640"
	// +optional
	Mode string `json:"mode,omitempty"`
}

// PodSettings are scheduling settings of the agent pods. The node itself is the plan's: a pod
// always runs on the node its stream names.
type PodSettings struct {
	// Tolerations, added to the operator's (e.g. for tainted detector or DTN nodes).
	// +optional
	// +listType=atomic
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// NodeSelector, merged with the operator's; it can only narrow: kubernetes.io/hostname is the plan's.
	// +kubebuilder:validation:XValidation:rule="!('kubernetes.io/hostname' in self)",message="kubernetes.io/hostname is set by the plan"
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// PriorityClassName of the agent pods (a detector stream usually outranks batch work).
	// +kubebuilder:validation:MaxLength=253
	// +optional
	PriorityClassName string `json:"priorityClassName,omitempty"`
	// ImagePullSecrets for the agent image, replacing the operator's when set.
	// +optional
	// +listType=atomic
	ImagePullSecrets []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`
}

// Sender is one source node.
type Sender struct {
	// Node is the name of the Kubernetes node.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Node string `json:"node"`

	// Source is where this stream's data comes from: exactly one kind.
	Source Source `json:"source"`
}

// Source is a union: exactly one member is set.
// +kubebuilder:validation:XValidation:rule="(has(self.synthetic) ? 1 : 0) + (has(self.file) ? 1 : 0) + (has(self.zmq) ? 1 : 0) + (has(self.hdf5) ? 1 : 0) + (has(self.stream2) ? 1 : 0) == 1",message="exactly one of synthetic, file, zmq, hdf5 or stream2 must be set"
// +kubebuilder:validation:XValidation:rule="!has(self.hdf5) || !has(self.hdf5.io)",message="hdf5.io is how a gateway writes a sink's files; a source's file is only read"
// +kubebuilder:validation:XValidation:rule="!has(self.hdf5) || !has(self.hdf5.nxmx)",message="hdf5.nxmx is how a gateway writes a sink's series; a source's file is only read"
type Source struct {
	// Synthetic tomography projections, deterministic from a seed.
	// +optional
	Synthetic *SyntheticSource `json:"synthetic,omitempty"`
	// File or directory on the sender node.
	// +optional
	File *FileSource `json:"file,omitempty"`
	// ZMQ: chunks pulled from a ZeroMQ endpoint (a detector's acquisition software).
	// +optional
	ZMQ *ZMQEndpoint `json:"zmq,omitempty"`
	// HDF5: the frames of a dataset (one chunk per frame along its first axis). Frames stored
	// with bslz4, one per HDF5 chunk, are sent as stored, never decompressed.
	// +optional
	HDF5 *HDF5Dataset `json:"hdf5,omitempty"`
	// Stream2: a DECTRIS Stream V2 detector (EIGER2, PILATUS4): its PUSH endpoint, usually
	// port 31001 of the detector control unit. Every CBOR message (start, image, end) is carried
	// byte for byte; frames stay compressed as the detector compressed them. Series follow
	// series: the stream has no end.
	// +optional
	Stream2 *ZMQEndpoint `json:"stream2,omitempty"`
}

// HDF5Dataset is a dataset of frames (frames x rows x cols) in an HDF5 file under a StorageRoot
// or on a PersistentVolumeClaim.
// +kubebuilder:validation:XValidation:rule="(has(self.root) ? 1 : 0) + (has(self.claim) ? 1 : 0) == 1",message="name exactly one of root (a StorageRoot) or claim (a PersistentVolumeClaim)"
type HDF5Dataset struct {
	// Root names the StorageRoot the path is under (the admin's; see docs/security.md).
	// +kubebuilder:validation:MaxLength=253
	// +optional
	Root string `json:"root,omitempty"`
	// Claim names a PersistentVolumeClaim of the pipeline's namespace the path is under (a
	// facility filesystem through CSI; it must be mountable on the node).
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	// +kubebuilder:validation:MaxLength=253
	// +optional
	Claim string `json:"claim,omitempty"`
	// Path of the file; in a sink, "{stream}" is the stream id.
	// Relative to the root or the claim, without "." or ".." segments or empty ones: no escapes.
	// +kubebuilder:validation:Pattern=`^([^/]*[^/.][^/]*|\.\.\.+)(/([^/]*[^/.][^/]*|\.\.\.+))*$`
	// +kubebuilder:validation:MaxLength=1024
	Path string `json:"path"`
	// Dataset inside the file (DXchange's by default).
	// +kubebuilder:validation:Pattern=`^/`
	// +kubebuilder:default="/exchange/data"
	// +optional
	Dataset string `json:"dataset,omitempty"`
	// IO is how the gateway writes a sink's files: "buffered" through the page cache (unset),
	// or "direct" past it (O_DIRECT), where the filesystem takes it and through the page cache
	// where it refuses (docs/agent-config.md, sink.io). Sinks only: a source's file is read.
	// +kubebuilder:validation:Enum=buffered;direct
	// +optional
	IO string `json:"io,omitempty"`
	// NXmx writes each Stream V2 series as an NXmx master file and data files of at most
	// framesPerFile images ("<name>_master.h5", "<name>_data_000001.h5", ... beside the path's
	// name), which analysis opens while the series runs (docs/stream2.md). Sinks with stream2
	// sources only.
	// +optional
	NXmx *NXmxFiles `json:"nxmx,omitempty"`
}

// NXmxFiles is the NXmx layout of a series: the data files' size and the names NXmx asks for
// that a detector does not send ("unknown" when not given).
type NXmxFiles struct {
	// FramesPerFile is the most images a data file holds.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000
	// +kubebuilder:default=1000
	// +optional
	FramesPerFile int64 `json:"framesPerFile,omitempty"`
	// Instrument names the beamline (/entry/instrument/name).
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Instrument string `json:"instrument,omitempty"`
	// Source names the light source (/entry/source/name).
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Source string `json:"source,omitempty"`
	// Sample names the sample (/entry/sample/name).
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Sample string `json:"sample,omitempty"`
}

// SyntheticSource generates 16-bit projections with photon-counting noise.
type SyntheticSource struct {
	// Chunks to send; 0 streams until the pipeline is deleted or suspended.
	// +kubebuilder:validation:Minimum=0
	// +optional
	Chunks int64 `json:"chunks,omitempty"`
	// Seed makes the data reproducible.
	// +kubebuilder:validation:Minimum=0
	// +optional
	Seed int64 `json:"seed,omitempty"`
	// RateGbps paces the source like a detector; unset: as fast as possible.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +optional
	RateGbps *int32 `json:"rateGbps,omitempty"`
}

// FileSource is a file, or every file of a directory in name order, under a StorageRoot or on a
// PersistentVolumeClaim.
// +kubebuilder:validation:XValidation:rule="(has(self.root) ? 1 : 0) + (has(self.claim) ? 1 : 0) == 1",message="name exactly one of root (a StorageRoot) or claim (a PersistentVolumeClaim)"
type FileSource struct {
	// Root names the StorageRoot the path is under (the admin's; see docs/security.md).
	// +kubebuilder:validation:MaxLength=253
	// +optional
	Root string `json:"root,omitempty"`
	// Claim names a PersistentVolumeClaim of the pipeline's namespace the path is under (a
	// facility filesystem through CSI; it must be mountable on the node).
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	// +kubebuilder:validation:MaxLength=253
	// +optional
	Claim string `json:"claim,omitempty"`
	// Path of the file or directory (a source's is mounted read-only).
	// Relative to the root or the claim, without "." or ".." segments or empty ones: no escapes.
	// +kubebuilder:validation:Pattern=`^([^/]*[^/.][^/]*|\.\.\.+)(/([^/]*[^/.][^/]*|\.\.\.+))*$`
	// +kubebuilder:validation:MaxLength=1024
	Path string `json:"path"`
}

// ZMQEndpoint is a ZeroMQ TCP endpoint.
type ZMQEndpoint struct {
	// Endpoint like tcp://host:port.
	// +kubebuilder:validation:Pattern=`^tcp://[^:]+:[0-9]{1,5}$`
	Endpoint string `json:"endpoint"`
}

// Gateway is the receiving node and its data network.
type Gateway struct {
	// Node is the name of the gateway's Kubernetes node.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Node string `json:"node"`

	// Network is the data network the streams arrive on.
	Network DataNetwork `json:"network"`
}

// SecurityMode of the data connections.
// +kubebuilder:validation:Enum=none;curve;authenticate
type SecurityMode string

const (
	SecurityNone         SecurityMode = "none"
	SecurityCurve        SecurityMode = "curve"
	SecurityAuthenticate SecurityMode = "authenticate"
)

// Security: with mode curve (the default) every data connection is authenticated and encrypted
// (ZeroMQ CURVE); with mode authenticate the same keys only prove who connects and frames travel
// unencrypted (no cost per byte; see docs/security.md); none is plain TCP, an opt-out. Either
// way each gateway stream accepts only its own sender's key.
type Security struct {
	// Mode: curve (default), authenticate or none.
	// +kubebuilder:default=curve
	// +optional
	Mode SecurityMode `json:"mode,omitempty"`

	// KeysSecret names a Secret in the pipeline's namespace with the keys: gateway.secret,
	// gateway.public, and sender-<i>.secret / sender-<i>.public per stream (Z85, as
	// `numastream-agent keygen` writes them). Unset: the operator creates and fills
	// <name>-curve-keys. Changed keys replace the agents, each stream draining and resuming.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	KeysSecret string `json:"keysSecret,omitempty"`

	// RotateEvery replaces the operator's keys (no keysSecret) this often, e.g. "720h". On
	// demand: set the annotation numastream.io/rotate-keys on the pipeline to a new value.
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m')",message="rotateEvery must be at least 1m"
	// +optional
	RotateEvery *metav1.Duration `json:"rotateEvery,omitempty"`

	// AllowFrom lists the address blocks (CIDR, e.g. "10.40.0.0/24") senders may connect from;
	// each gateway refuses any other peer before its key is looked at. With hostNetwork each
	// stream's own sender node is admitted already: list what else its traffic comes from (NAT,
	// a second NIC). Empty: no address check beyond the NetworkPolicy (docs/security.md).
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=43
	// +kubebuilder:validation:items:XValidation:rule="isCIDR(self) && cidr(self) == cidr(self).masked()",message="must be an address block in CIDR notation with no bits set past its prefix, e.g. 10.40.0.0/24"
	// +listType=set
	// +optional
	AllowFrom []string `json:"allowFrom,omitempty"`
}

// SecurityMode is the pipeline's mode: curve unless spec.security says otherwise.
func (s *StreamPipelineSpec) SecurityMode() SecurityMode {
	if s.Security == nil || s.Security.Mode == "" {
		return SecurityCurve
	}
	return s.Security.Mode
}

// AnnotationRotateKeys on a StreamPipeline asks for new keys whenever its value changes.
const AnnotationRotateKeys = "numastream.io/rotate-keys"

// DataNetwork names the Multus attachment and the host NIC behind it.
type DataNetwork struct {
	// NIC is the host interface the data arrives on (e.g. ens1f0); its NUMA node decides where
	// the receivers run.
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9_.-]{1,15}$`
	NIC string `json:"nic"`

	// Attachment is the Multus NetworkAttachmentDefinition ("name" or "namespace/name").
	// Unset: the pods use the cluster network.
	// +kubebuilder:validation:Pattern=`^([a-z0-9]([-a-z0-9]*[a-z0-9])?/)?[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +optional
	Attachment string `json:"attachment,omitempty"`

	// ResourceName is the device resource that carries the NIC's NUMA node to Topology Manager
	// (an SR-IOV VF pool, taken from the attachment's k8s.v1.cni.cncf.io/resourceName
	// annotation). Unset: numastream's NIC-locality token numastream.io/nic-<nic>.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	ResourceName string `json:"resourceName,omitempty"`

	// SenderAttachment is the attachment the sender pods join to reach the gateway on the data
	// network (when the detector side has its own, e.g. another address range or VLAN). Unset:
	// the senders join Attachment.
	// +kubebuilder:validation:Pattern=`^([a-z0-9]([-a-z0-9]*[a-z0-9])?/)?[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +optional
	SenderAttachment string `json:"senderAttachment,omitempty"`

	// Address is the gateway's address on the data network, when it is fixed (static IPAM, a
	// host NIC's address). Unset: with an attachment, the address Multus reports for the
	// gateway pod (k8s.v1.cni.cncf.io/network-status); with hostNetwork, the named NIC's
	// address as the node daemon publishes it.
	// +kubebuilder:validation:Pattern=`^[0-9a-fA-F:.]{2,45}$`
	// +optional
	Address string `json:"address,omitempty"`
}

// Sink is a union: at most one member is set; none is the null sink.
// +kubebuilder:validation:XValidation:rule="(has(self.file) ? 1 : 0) + (has(self.zmq) ? 1 : 0) + (has(self.hdf5) ? 1 : 0) + (has(self.stream2) ? 1 : 0) <= 1",message="at most one of file, zmq, hdf5 or stream2 may be set"
type Sink struct {
	// File writes each stream, in order, on the gateway ("{stream}" in the path is the stream id).
	// +optional
	File *FileSource `json:"file,omitempty"`
	// ZMQ forwards every verified chunk to a downstream consumer.
	// +optional
	ZMQ *ZMQEndpoint `json:"zmq,omitempty"`
	// HDF5 writes each stream into a dataset of frames x rows x cols, one frame per HDF5 chunk;
	// bslz4 frames are stored as they arrived (filter 32008). With stream2 sources: one NXmx file
	// per detector series ("{series}" in the path is the series id; without it, "_series_<id>"
	// is added before the extension), images as the detector compressed them.
	// +optional
	HDF5 *HDF5Dataset `json:"hdf5,omitempty"`
	// Stream2 re-emits a stream2 source's messages byte for byte, in the detector's order, on a
	// PUSH socket the gateway binds on this port, so consumers written for the detector connect
	// to the gateway instead.
	// +optional
	Stream2 *Stream2Sink `json:"stream2,omitempty"`
	// Onward carries every verified chunk on to a numastream receiver at another site (an HPC or
	// analysis site's transfer node, another cluster's gateway): acknowledged by it, resumable,
	// encrypted to its key, over connections the planner sizes from the path. One of spec.sinks.
	// +optional
	Onward *OnwardSink `json:"onward,omitempty"`
}

// OnwardSink is an acknowledged hop from the gateway to a numastream receiver elsewhere: a
// RemoteSite (site), or the far receiver described here (endpoint, serverKey, link).
// +kubebuilder:validation:XValidation:rule="has(self.site) != has(self.endpoint)",message="name the far site (site, a RemoteSite) or describe it (endpoint): one of the two"
// +kubebuilder:validation:XValidation:rule="!has(self.site) || !(has(self.serverKey) || has(self.insecurePlaintext) || has(self.link))",message="site: the RemoteSite holds the far site's key and link: leave serverKey, insecurePlaintext and link unset"
type OnwardSink struct {
	// Site names a RemoteSite in the pipeline's namespace: its endpoint, key and link. The
	// site's status lists the gateway's key for the far site to admit, and a key rotation lists
	// the new key there before the gateway uses it.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	Site string `json:"site,omitempty"`
	// Endpoint of the far receiver's first data port, tcp://host:port; connection i goes to
	// port + i (start the far receiver with at least status.plan.onward[].connections).
	// +kubebuilder:validation:Pattern=`^tcp://[^:]+:[0-9]{1,5}$`
	// +optional
	Endpoint string `json:"endpoint,omitempty"`
	// ServerKey is the far receiver's CURVE public key (40 Z85 characters). The gateway connects
	// with its own key (gateway.public in the pipeline's keys Secret, which the far receiver must
	// admit) and encrypts, whatever spec.security.mode says: a host answering in the far
	// receiver's place cannot complete the handshake. Required unless insecurePlaintext.
	// +kubebuilder:validation:Pattern=`^[0-9a-zA-Z.:+=^!/*?&<>()\[\]{}@%$#-]{40}$`
	// +optional
	ServerKey string `json:"serverKey,omitempty"`
	// InsecurePlaintext sends to the far site in clear, with nothing proving who answers: any
	// host reaching the endpoint (or on the path) reads the data and may acknowledge chunks it
	// never stored. Only for a far site on a network trusted end to end; status.plan.onward
	// says so for each stream.
	// +optional
	InsecurePlaintext bool `json:"insecurePlaintext,omitempty"`
	// Link is the path to the far site, for the planner to size the connections.
	// +optional
	Link *OnwardLink `json:"link,omitempty"`
	// Connections to the far receiver, instead of the planner's choice.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=16
	// +optional
	Connections *int32 `json:"connections,omitempty"`
}

// OnwardLink is the wide-area path from the gateway to the far site.
type OnwardLink struct {
	// BandwidthMbps of the path's narrowest hop, megabits per second (unset: the stream's rate
	// is the goal). Several streams share it.
	// +kubebuilder:validation:Minimum=1
	// +optional
	BandwidthMbps int64 `json:"bandwidthMbps,omitempty"`
	// RoundTrip time of the path, like "20ms".
	// +optional
	RoundTrip *metav1.Duration `json:"roundTrip,omitempty"`
	// LossPercent of packets the path loses, like "0.1".
	// +kubebuilder:validation:Pattern=`^(100|[0-9]{1,2})(\.[0-9]{1,4})?$`
	// +optional
	LossPercent string `json:"lossPercent,omitempty"`
	// CongestionControl of the gateway's host (net.ipv4.tcp_congestion_control): loss-based
	// (CUBIC, Reno; the default) or bbr.
	// +kubebuilder:validation:Enum=loss-based;bbr
	// +optional
	CongestionControl string `json:"congestionControl,omitempty"`
}

// ConsumerGuarantee is what a consumer of several sinks is promised.
// +kubebuilder:validation:Enum=lossless;latest
type ConsumerGuarantee string

const (
	// GuaranteeLossless: every chunk; a chunk is acknowledged to its sender only once every
	// lossless consumer has it, so a stopped one holds the others back (never loses anything).
	GuaranteeLossless ConsumerGuarantee = "lossless"
	// GuaranteeLatest: a live view or online analysis (zmq only) that never holds anyone back; a
	// chunk it has no room for passes it by, counted.
	GuaranteeLatest ConsumerGuarantee = "latest"
)

// Consumer is one of a pipeline's sinks, named, with its guarantee.
// +kubebuilder:validation:XValidation:rule="(has(self.file) ? 1 : 0) + (has(self.zmq) ? 1 : 0) + (has(self.hdf5) ? 1 : 0) + (has(self.stream2) ? 1 : 0) + (has(self.onward) ? 1 : 0) == 1",message="a consumer is exactly one of file, zmq, hdf5, stream2 or onward"
// +kubebuilder:validation:XValidation:rule="!has(self.guarantee) || self.guarantee != 'latest' || has(self.zmq)",message="latest-only is for a live zmq consumer: files and Stream V2 series are written whole"
// +kubebuilder:validation:XValidation:rule="!has(self.spill) || !has(self.guarantee) || self.guarantee != 'latest'",message="a latest-only consumer passes chunks over instead: a spill is for a lossless one"
type Consumer struct {
	// Name of the consumer in status.observed.consumers.
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +kubebuilder:validation:MaxLength=32
	Name string `json:"name"`
	// Guarantee: lossless (default) or latest.
	// +optional
	Guarantee ConsumerGuarantee `json:"guarantee,omitempty"`
	// Spill lets this lossless consumer fall behind the others by up to MaxBytes on the gateway
	// node's storage: every chunk for it is written there and counts as taken once written (its
	// sink reads them back), so it holds the others back only once its spill is full
	// (docs/stream2.md).
	// +optional
	Spill *ConsumerSpill `json:"spill,omitempty"`
	Sink  `json:",inline"`
}

// ConsumerSpill is a consumer's own backlog on the gateway node, under a StorageRoot the admin
// made for gateway nodes. Never an emptyDir: the chunks in it are acknowledged to the senders
// already, so they must outlive the gateway pod (a restarted gateway hands them on first).
type ConsumerSpill struct {
	// MaxBytes is the most the consumer's spill may hold, per stream.
	// +kubebuilder:validation:Minimum=1048576
	MaxBytes int64 `json:"maxBytes"`
	// Root names a StorageRoot (role gateway) to spill into.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Root string `json:"root"`
	// Path under the root; the consumer spills in <path>/<namespace>/<name>-<uid>/<consumer>/
	// stream-<id> below it, so no two pipelines, consumers or streams share one. Relative,
	// without "." or ".." segments or empty ones.
	// +kubebuilder:validation:Pattern=`^([^/]*[^/.][^/]*|\.\.\.+)(/([^/]*[^/.][^/]*|\.\.\.+))*$`
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Path string `json:"path,omitempty"`
}

// Stream2Sink is where the gateway speaks Stream V2 again.
type Stream2Sink struct {
	// Port the gateway's PUSH socket binds (on every address of the gateway pod).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +kubebuilder:default=31001
	// +optional
	Port int32 `json:"port,omitempty"`
	// Redeliver is how many of the last messages handed to a consumer the gateway keeps, to send
	// again (after the series' start message) when that consumer goes away: Stream V2 cannot say
	// what a consumer processed. 0 keeps none. Memory: this many detector messages.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	// +optional
	Redeliver *int32 `json:"redeliver,omitempty"`
	// Consumers may connect to the port, as NetworkPolicy peers (pods, namespaces, address
	// blocks) in the gateway's NetworkPolicy; unset: the pods of the pipeline's namespace.
	// +kubebuilder:validation:MaxItems=32
	// +listType=atomic
	// +optional
	Consumers []networkingv1.NetworkPolicyPeer `json:"consumers,omitempty"`
	// AllowFrom lists the address blocks (CIDR) consumers may connect from, checked by the
	// gateway itself on every network it listens on (the pod network, a data network, the
	// host's); any other consumer is refused at its connection and counted, never given a
	// message. Empty: whoever reaches the port (and Consumers admits).
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=43
	// +kubebuilder:validation:items:XValidation:rule="isCIDR(self) && cidr(self) == cidr(self).masked()",message="must be an address block in CIDR notation with no bits set past its prefix, e.g. 10.40.0.0/24"
	// +listType=set
	// +optional
	AllowFrom []string `json:"allowFrom,omitempty"`
}

// StageThreads overrides the planner per stage.
type StageThreads struct {
	// Compress threads per sender.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1024
	// +optional
	Compress *int32 `json:"compress,omitempty"`
	// Decompress threads per stream on the gateway.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1024
	// +optional
	Decompress *int32 `json:"decompress,omitempty"`
}

// Condition types.
const (
	ConditionPlanned  = "Planned"
	ConditionReady    = "Ready"
	ConditionNICLocal = "NICLocal"
	ConditionDegraded = "Degraded"
)

// StagePlan is one stage group on one node.
type StagePlan struct {
	// Stage: source, compress, send, receive, decompress, sink.
	Stage string `json:"stage"`
	// Threads of the stage.
	Threads int32 `json:"threads"`
	// NUMA is the stage's NUMA target: a node id, "nic", "spread" or "any".
	NUMA string `json:"numa"`
	// RateMbps is the raw rate the stage can sustain, in megabits per second.
	// +optional
	RateMbps int64 `json:"rateMbps,omitempty"`
}

// NodePlan is what runs on one node.
type NodePlan struct {
	// Node name.
	Node string `json:"node"`
	// Role: sender or gateway.
	Role string `json:"role"`
	// StreamID of a sender.
	// +optional
	StreamID *int32 `json:"streamID,omitempty"`
	// CPUs the node's pod requests (integer cores, Guaranteed QoS).
	CPUs int32 `json:"cpus"`
	// SharedMilliCPU is what a gateway pod with no whole core left for decompression asks
	// besides its CPUs, in millicores: decompression runs in the node's shared pool.
	// +optional
	SharedMilliCPU int64 `json:"sharedMilliCPU,omitempty"`
	// Stages on this node.
	Stages []StagePlan `json:"stages"`
}

// NUMACores is a number of cores on one NUMA node.
type NUMACores struct {
	// NUMANode id.
	NUMANode int32 `json:"numaNode"`
	// Cores on it.
	Cores int32 `json:"cores"`
}

// Plan is the planner's decision for the whole pipeline.
type Plan struct {
	// NICNUMANode is the NUMA node of the gateway's data NIC.
	NICNUMANode int32 `json:"nicNUMANode"`
	// GatewayCores is what this pipeline holds on the gateway, per NUMA node; pipelines that share
	// a gateway split its cores by these figures.
	// +listType=map
	// +listMapKey=numaNode
	// +optional
	GatewayCores []NUMACores `json:"gatewayCores,omitempty"`
	// Connections per stream.
	Connections int32 `json:"connections"`
	// Nodes in the plan: the senders, then the gateway.
	Nodes []NodePlan `json:"nodes"`
	// PredictedMbps is the predicted raw rate of the slowest stream, megabits per second.
	PredictedMbps int64 `json:"predictedMbps"`
	// PredictedTotalMbps is the predicted raw rate of all streams together.
	PredictedTotalMbps int64 `json:"predictedTotalMbps"`
	// Bottleneck names the stage that limits the rate.
	Bottleneck string `json:"bottleneck"`
	// Onward is how each stream's gateway forwards to each onward consumer (spec.sinks[].onward).
	// +optional
	Onward []OnwardPlan `json:"onward,omitempty"`
}

// OnwardPlan is one stream's onward hop to one consumer.
type OnwardPlan struct {
	// StreamID of the stream.
	StreamID int32 `json:"streamID"`
	// Consumer names the spec.sinks entry.
	Consumer string `json:"consumer"`
	// Connections to the far receiver.
	Connections int32 `json:"connections"`
	// PerConnectionMbps is what one connection carries on the path (0: nothing bounds it).
	// +optional
	PerConnectionMbps int64 `json:"perConnectionMbps,omitempty"`
	// PredictedMbps is the raw rate the hop carries the stream at.
	PredictedMbps int64 `json:"predictedMbps"`
	// PredictedPathMbps is that rate on the path: the hop carries the chunks compressed as they
	// reached the gateway (the far receiver decodes them), PredictedMbps / the expected ratio.
	// +optional
	PredictedPathMbps int64 `json:"predictedPathMbps,omitempty"`
	// Limit: stream (the hop keeps up), link (the path's share) or connections (16 carry less).
	Limit string `json:"limit"`
	// Security of the hop: curve (the far receiver proven by its key, encrypted) or
	// insecure-plaintext (spec.sinks[].onward.insecurePlaintext).
	// +optional
	Security string `json:"security,omitempty"`
}

// PodSeries is what one gateway pod (or, in seriesBeforePods, every pod that is gone) counted
// of the Stream V2 series.
type PodSeries struct {
	// UID of the pod (empty in seriesBeforePods).
	// +optional
	UID string `json:"uid,omitempty"`
	// Completed: series written whole (or re-emitted to their end).
	// +optional
	Completed int64 `json:"completed,omitempty"`
	// Incomplete: series that ended without their end message.
	// +optional
	Incomplete int64 `json:"incomplete,omitempty"`
	// Delivered: chunks the pod verified and delivered itself (not those earlier pods of its
	// stream delivered). A pod of a stream no longer in the pipeline leaves them out once gone.
	// +optional
	Delivered int64 `json:"delivered,omitempty"`
	// Stream is the pod's stream.
	// +optional
	Stream int32 `json:"stream,omitempty"`
}

// Observed are the figures the agents report.
type Observed struct {
	// RawGbps is the decompressed rate at the gateway.
	RawGbps string `json:"rawGbps,omitempty"`
	// WireGbps is the compressed rate on the network.
	WireGbps string `json:"wireGbps,omitempty"`
	// ChunksDelivered verified at the gateway.
	ChunksDelivered int64 `json:"chunksDelivered"`
	// ChunksLost announced by the senders and never delivered.
	ChunksLost int64 `json:"chunksLost"`
	// ChunksCorrupt failed verification.
	ChunksCorrupt int64 `json:"chunksCorrupt"`
	// ChunksDeclaredMissing counts, of chunksLost, those their sender declared gone: chunks a
	// restarted sender of a live source (a detector) took and never had acknowledged, or chunks a
	// full spill refused (docs/wire-format.md, "gap").
	// +optional
	ChunksDeclaredMissing int64 `json:"chunksDeclaredMissing,omitempty"`
	// MissingChunks names the last declared gaps (at most 5): stream, chunks and why.
	// +kubebuilder:validation:MaxItems=5
	// +optional
	MissingChunks []string `json:"missingChunks,omitempty"`
	// SeriesCompleted counts the Stream V2 series the gateway completed: written whole to their
	// files (or re-emitted to their end message), by every gateway pod the pipeline had.
	// +optional
	SeriesCompleted int64 `json:"seriesCompleted,omitempty"`
	// SeriesIncomplete counts the Stream V2 series that ended incomplete at the gateway: their
	// detector went away before the series' end message (docs/stream2.md).
	// +optional
	SeriesIncomplete int64 `json:"seriesIncomplete,omitempty"`
	// SeriesByPod is each gateway pod's series and delivered chunks as last read, and
	// SeriesBeforePods what pods no longer there counted: a replaced gateway's series and
	// chunks stay in the totals.
	// +kubebuilder:validation:MaxItems=64
	// +optional
	SeriesByPod []PodSeries `json:"seriesByPod,omitempty"`
	// SeriesBeforePods: what the gateway pods that are gone counted, together.
	// +optional
	SeriesBeforePods *PodSeries `json:"seriesBeforePods,omitempty"`
	// SpillBytes is what the senders hold in their spills now (spec.spill): the pipeline
	// downstream of them is behind.
	// +optional
	SpillBytes int64 `json:"spillBytes,omitempty"`
	// SpillLost counts the chunks the senders lost because their spill was full (their source
	// could not wait); the gateway reports the same chunks in chunksLost.
	// +optional
	SpillLost int64 `json:"spillLost,omitempty"`
	// IncompleteSeries names the last of them (at most 5), and why.
	// +kubebuilder:validation:MaxItems=5
	// +optional
	IncompleteSeries []string `json:"incompleteSeries,omitempty"`
	// NICLocal reports whether the receiving threads really run on the NIC's NUMA node.
	// +optional
	NICLocal *bool `json:"nicLocal,omitempty"`
	// NICLocalStreams says for how many of the streams that report it every receiving thread
	// runs on the NIC's NUMA node ("2/2"; the NIC-Local column).
	// +optional
	NICLocalStreams string `json:"nicLocalStreams,omitempty"`
	// Placement is where each stage's threads run, from the agents' own report
	// (numastream_thread_info), next to the plan's NUMA target: one row per stream, pod role and
	// stage. A stage with threads off a planned node makes the pipeline Degraded (OffPlannedNode).
	// +kubebuilder:validation:MaxItems=256
	// +optional
	Placement []StagePlacement `json:"placement,omitempty"`
	// Consumers are, per stream, what each of spec.sinks got, from the gateway's own counts
	// (running gateway pods with several consumers).
	// +kubebuilder:validation:MaxItems=512
	// +listType=atomic
	// +optional
	Consumers []ConsumerStatus `json:"consumers,omitempty"`
	// Ratio is the compression ratio the gateway sees now (raw / wire bytes over the last
	// interval).
	// +optional
	Ratio string `json:"ratio,omitempty"`
	// DecompressMBps is the measured decompression speed of one gateway thread over the last
	// interval (raw MB/s per busy thread).
	// +optional
	DecompressMBps string `json:"decompressMBps,omitempty"`
	// Bottleneck is the stage that limits the streams now, from the agents' busy and blocked
	// times over the last interval (compress, decompress, sink, network or source; empty when
	// none stands out); status.bottleneck is the plan's prediction.
	// +optional
	Bottleneck string `json:"bottleneck,omitempty"`
	// BottleneckDetail gives the figures behind Bottleneck.
	// +optional
	BottleneckDetail string `json:"bottleneckDetail,omitempty"`
	// UpdatedAt is when the agents were last read.
	// +optional
	UpdatedAt *metav1.Time `json:"updatedAt,omitempty"`
}

// ConsumerStatus is one consumer of one stream (spec.sinks), as the gateway's agent counts it.
type ConsumerStatus struct {
	// Stream id.
	Stream int32 `json:"stream"`
	// Name of the consumer in spec.sinks.
	Name string `json:"name"`
	// Kind: file, hdf5, zmq or stream2.
	Kind string `json:"kind"`
	// Guarantee: lossless or latest.
	Guarantee string `json:"guarantee"`
	// Chunks handed to the consumer.
	Chunks int64 `json:"chunks"`
	// PassedOver: chunks a latest-only consumer had no room for (0 for a lossless one: it is
	// waited for).
	PassedOver int64 `json:"passedOver"`
	// Behind: chunks waiting in its queue now (a lossless one with many is holding the others back).
	Behind int64 `json:"behind"`
	// SpillBytes: what its spill (spec.sinks[].spill) holds now, not yet handed to it.
	// +optional
	SpillBytes int64 `json:"spillBytes,omitempty"`
}

// StagePlacement is where one stage of one stream runs, as its agent reports it.
type StagePlacement struct {
	// Stream id.
	Stream int32 `json:"stream"`
	// Role of the pod: sender or gateway.
	Role string `json:"role"`
	// Agent: the agent's role in the pod (send; relay, the gateway's NIC-local receiving
	// container; receive, its decompressing one).
	Agent string `json:"agent"`
	// Stage: compress, send, receive, decompress, sink, ...
	Stage string `json:"stage"`
	// Threads of the stage.
	Threads int32 `json:"threads"`
	// CPUs the threads run on (a cpulist).
	CPUs string `json:"cpus"`
	// NUMANodes the threads run on (a list).
	NUMANodes string `json:"numaNodes"`
	// Planned is the plan's NUMA target for the stage: a node id (the NIC's, for "nic"),
	// "spread" or "any".
	Planned string `json:"planned"`
	// OnPlan: every thread on the planned node (always, for spread and any).
	OnPlan bool `json:"onPlan"`
}

// Rollout limits how many streams are replaced at once.
type Rollout struct {
	// MaxStreams is how many streams are replaced at once: a stream is replaced until its new
	// pods run (or have finished). Unset: 1, one stream at a time; 0: every stream at once.
	// +kubebuilder:validation:Minimum=0
	// +optional
	MaxStreams *int32 `json:"maxStreams,omitempty"`
}

// RolloutMaxStreams is spec.rollout.maxStreams with its default (0: no limit).
func (s *StreamPipelineSpec) RolloutMaxStreams() int {
	if s.Rollout == nil || s.Rollout.MaxStreams == nil {
		return 1
	}
	return int(*s.Rollout.MaxStreams)
}

// SenderStream is one sender's stream id.
type SenderStream struct {
	// Node is the sender's node (its key in spec.senders).
	Node string `json:"node"`
	// Stream is its stream id.
	// +kubebuilder:validation:Minimum=0
	Stream int32 `json:"stream"`
	// Slot is the stream's place among the gateway's ports: its data ports are spec.port +
	// slot x connections (with host networking its metrics ports follow the data ports). Kept
	// for the stream's life, so removing or reordering senders moves no other stream's ports
	// (which would replace its pods); a new stream takes the lowest slot no current stream has.
	// +kubebuilder:validation:Minimum=0
	// +optional
	Slot *int32 `json:"slot,omitempty"`
}

// StreamIDs are the senders' stream ids in spec order: each keeps the id status.senders gave
// it; a sender without one gets the next id no sender had (status.nextStream, and past every id
// given), in spec order. A new pipeline's senders get 0, 1, 2, ...
func (sp *StreamPipeline) StreamIDs() []int {
	given := map[string]int{}
	next := int(sp.Status.NextStream)
	for _, s := range sp.Status.Senders {
		given[s.Node] = int(s.Stream)
		next = max(next, int(s.Stream)+1)
	}
	ids := make([]int, len(sp.Spec.Senders))
	for i, s := range sp.Spec.Senders {
		if id, ok := given[s.Node]; ok {
			ids[i] = id
		} else {
			ids[i] = next
			next++
		}
	}
	return ids
}

// StreamSlots are the senders' port slots in spec order (SenderStream.Slot): each keeps the
// slot status.senders gave it; the others take the lowest slots no sender has, in spec order.
// A new pipeline's senders get 0, 1, 2, ...; so do those of a pipeline whose status has ids but
// no slots yet (they then keep the ports their positions gave them).
func (sp *StreamPipeline) StreamSlots() []int {
	given := map[string]int{}
	for _, s := range sp.Status.Senders {
		if s.Slot != nil {
			given[s.Node] = int(*s.Slot)
		}
	}
	slots := make([]int, len(sp.Spec.Senders))
	used := map[int]bool{}
	for i, s := range sp.Spec.Senders {
		slots[i] = -1
		if slot, ok := given[s.Node]; ok && !used[slot] {
			slots[i], used[slot] = slot, true
		}
	}
	free := 0
	for i := range slots {
		if slots[i] < 0 {
			for used[free] {
				free++
			}
			slots[i], used[free] = free, true
		}
	}
	return slots
}

// SlotSpan is the number of port slots the streams span: one past the highest slot (at least
// the number of senders).
func (sp *StreamPipeline) SlotSpan() int {
	span := 0
	for _, s := range sp.StreamSlots() {
		span = max(span, s+1)
	}
	return span
}

// StreamSlot is the port slot of the stream with id (-1: no sender has it).
func (sp *StreamPipeline) StreamSlot(id int) int {
	if i := sp.SenderOfStream(id); i >= 0 {
		return sp.StreamSlots()[i]
	}
	return -1
}

// AssignStreams records StreamIDs and StreamSlots in status: the ids and slots of the current
// senders, and the next id.
// ExpectedChunks is how many chunks the pipeline's streams carry in all, when every sender's
// source says how many (synthetic with a count); 0 when unknown (a detector streams until told).
func (sp *StreamPipeline) ExpectedChunks() int64 {
	var n int64
	for _, s := range sp.Spec.Senders {
		if s.Source.Synthetic == nil || s.Source.Synthetic.Chunks == 0 {
			return 0
		}
		n += s.Source.Synthetic.Chunks
	}
	return n
}

func (sp *StreamPipeline) AssignStreams() {
	ids, slots := sp.StreamIDs(), sp.StreamSlots()
	next := int(sp.Status.NextStream)
	sp.Status.Senders = make([]SenderStream, len(ids))
	for i, id := range ids {
		sp.Status.Senders[i] = SenderStream{Node: sp.Spec.Senders[i].Node, Stream: int32(id), Slot: new(int32(slots[i]))}
		next = max(next, id+1)
	}
	sp.Status.NextStream = int32(next)
}

// SenderOfStream is the index in spec.senders of the sender with stream id, or -1.
func (sp *StreamPipeline) SenderOfStream(id int) int {
	for i, s := range sp.StreamIDs() {
		if s == id {
			return i
		}
	}
	return -1
}

// StreamPipelineStatus is what the operator observed and decided.
type StreamPipelineStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Planned, Ready, Degraded, NICLocal, and kstatus's Reconciling and Stalled
	// (docs/status.md).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Streams is the number of streams (senders).
	// +optional
	Streams int32 `json:"streams,omitempty"`
	// ExpectedChunks is how many chunks the streams carry in all, when every sender's source says
	// (a synthetic source's count); absent when unknown (a detector streams until told).
	// +optional
	ExpectedChunks int64 `json:"expectedChunks,omitempty"`
	// Senders gives each sender its stream id for the pipeline's life: the id names its stream's
	// Jobs, keys and files ({stream} in sink paths). Removing or reordering senders never
	// renumbers the others, and a new sender gets an id no earlier sender had (NextStream).
	// +listType=map
	// +listMapKey=node
	// +kubebuilder:validation:MaxItems=64
	// +optional
	Senders []SenderStream `json:"senders,omitempty"`
	// NextStream is the id the next new sender gets.
	// +optional
	NextStream int32 `json:"nextStream,omitempty"`
	// PredictedGbps is the predicted raw rate of all streams, for display.
	// +optional
	PredictedGbps string `json:"predictedGbps,omitempty"`
	// Bottleneck is the stage that limits the predicted rate.
	// +optional
	Bottleneck string `json:"bottleneck,omitempty"`
	// Plan is the chosen placement and thread counts.
	// +optional
	Plan *Plan `json:"plan,omitempty"`
	// Endpoints are where each stream's sender connects: the gateway's address on the data
	// network (Multus network-status, a static address, or the data NIC's address with
	// hostNetwork) and the stream's first port. A stream waiting for its gateway's address has none.
	// +listType=map
	// +listMapKey=stream
	// +optional
	Endpoints []StreamEndpoint `json:"endpoints,omitempty"`
	// Observed figures from the agents.
	// +optional
	Observed *Observed `json:"observed,omitempty"`
	// RollPending are the streams that need replacing (a new agent image, new keys, a new plan)
	// and wait their turn on their current pods while others are replaced (spec.rollout).
	// +optional
	RollPending []int32 `json:"rollPending,omitempty"`
	// TopologyRejection: the kubelet's Topology Manager refused a gateway pod of this
	// generation; the plans that follow ask for fewer receiving cores.
	// +optional
	TopologyRejection *TopologyRejection `json:"topologyRejection,omitempty"`
	// Replan holds the observed facts the plan is made from instead of the spec's assumptions
	// (spec.replan auto).
	// +optional
	Replan *Replan `json:"replan,omitempty"`
	// Departure counts the agents' readings in a row that departed from the plan's assumptions
	// (spec.replan auto): kept here so that a restarted operator or a new leader goes on
	// counting where the last one stopped.
	// +optional
	Departure *Departure `json:"departure,omitempty"`
	// GatewayKey is the public key the gateway connects to far sites with (spec.sinks[].onward),
	// for the far site to admit; during a rotation, also the next one.
	// +optional
	GatewayKey *GatewayKey `json:"gatewayKey,omitempty"`
	// PlanHistory is the last re-plans, oldest first (at most 10).
	// +kubebuilder:validation:MaxItems=10
	// +listType=atomic
	// +optional
	PlanHistory []PlanChange `json:"planHistory,omitempty"`
}

// GatewayKey is the gateway's CURVE public key as far sites must admit it.
type GatewayKey struct {
	// Public is the key the gateway connects with now (Z85).
	Public string `json:"public"`
	// Next is the key of a rotation under way: listed in the RemoteSites the pipeline sends to
	// from NextSince, used by the gateway once their keyPropagation has passed.
	// +optional
	Next string `json:"next,omitempty"`
	// NextSince is when Next was listed.
	// +optional
	NextSince *metav1.Time `json:"nextSince,omitempty"`
}

// Replan is what the agents observed that the planner now uses.
type Replan struct {
	// Ratio: the observed compression ratio, used instead of spec.expectedRatio.
	// +optional
	Ratio string `json:"ratio,omitempty"`
	// DecompressMBps: the measured decompression speed per gateway thread, used instead of the
	// gateway's calibration label.
	// +optional
	DecompressMBps string `json:"decompressMBps,omitempty"`
	// Reason says what departed from the plan, and by how much.
	Reason string `json:"reason"`
	// ObservedAt is when the departure was confirmed.
	ObservedAt metav1.Time `json:"observedAt"`
	// Applied turns true once a plan was made from it.
	// +optional
	Applied bool `json:"applied,omitempty"`
}

// Departure is the re-plan watch of a pipeline.
type Departure struct {
	// Readings: departing readings in a row that agree with FirstRatio.
	Readings int32 `json:"readings"`
	// FirstRatio is the compression ratio the streak started at.
	// +optional
	FirstRatio string `json:"firstRatio,omitempty"`
	// LastReadingAt is when the last reading was counted (one per rate window).
	// +optional
	LastReadingAt *metav1.MicroTime `json:"lastReadingAt,omitempty"`
	// LastReplanAt is when the watch last called for a re-plan (the cooldown counts from it).
	// +optional
	LastReplanAt *metav1.MicroTime `json:"lastReplanAt,omitempty"`
}

// PlanChange is one re-plan as the user sees it.
type PlanChange struct {
	// At is when the operator re-planned.
	At metav1.Time `json:"at"`
	// Reason is the observed departure.
	Reason string `json:"reason"`
	// From and To summarize the plan before and after (threads, predicted rate, bottleneck).
	From string `json:"from"`
	To   string `json:"to"`
	// Applied says how: "in place" (the agents' running pods were resized through pods/resize;
	// their streams go on), "re-created" (the agents' pods were replaced; their streams resume),
	// "status only" (the pods already run what the new plan asks; its prediction changed), or
	// "unchanged" (the new facts give the same plan).
	Applied string `json:"applied"`
}

// StreamEndpoint is where one stream's sender connects.
type StreamEndpoint struct {
	// Stream id.
	Stream int32 `json:"stream"`
	// Endpoint, tcp://address:port.
	Endpoint string `json:"endpoint"`
}

// TopologyRejection records the gateway pods Topology Manager refused and the cap it led to.
type TopologyRejection struct {
	// Pods refused ("pod on node"), the latest last, at most 5.
	// +kubebuilder:validation:MaxItems=5
	Pods []string `json:"pods"`
	// ReceiveCores is the most receiving cores per stream the next plans ask for.
	ReceiveCores int32 `json:"receiveCores"`
	// Generation of the spec these rejections belong to: a changed spec plans afresh.
	Generation int64 `json:"generation"`
}

// StreamPipeline streams data from sender nodes through a gateway with NUMA-aware placement.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=sp;sps,categories=numastream
// +kubebuilder:printcolumn:name="Gateway",type=string,JSONPath=`.spec.gateway.node`
// +kubebuilder:printcolumn:name="Streams",type=integer,JSONPath=`.status.streams`
// +kubebuilder:printcolumn:name="Predicted-Gbps",type=string,JSONPath=`.status.predictedGbps`
// +kubebuilder:printcolumn:name="Bottleneck",type=string,JSONPath=`.status.bottleneck`
// +kubebuilder:printcolumn:name="Observed-Gbps",type=string,JSONPath=`.status.observed.rawGbps`
// +kubebuilder:printcolumn:name="Delivered",type=integer,JSONPath=`.status.observed.chunksDelivered`
// +kubebuilder:printcolumn:name="Expected",type=integer,JSONPath=`.status.expectedChunks`
// +kubebuilder:printcolumn:name="Lost",type=integer,JSONPath=`.status.observed.chunksLost`
// +kubebuilder:printcolumn:name="Series",type=integer,JSONPath=`.status.observed.seriesCompleted`
// +kubebuilder:printcolumn:name="NIC-Local",type=string,JSONPath=`.status.observed.nicLocalStreams`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type StreamPipeline struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   StreamPipelineSpec   `json:"spec,omitempty"`
	Status StreamPipelineStatus `json:"status,omitempty"`
}

// StreamPipelineList is a list of StreamPipelines.
// +kubebuilder:object:root=true
type StreamPipelineList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []StreamPipeline `json:"items"`
}

func init() {
	SchemeBuilder.Register(&StreamPipeline{}, &StreamPipelineList{})
}

// DefaultAgentID is the uid and gid the agents run as when spec.files names none.
const DefaultAgentID int64 = 65532

// RunAs is the uid and gid the pipeline's agents run as.
func (s *StreamPipelineSpec) RunAs() (uid, gid int64) {
	uid, gid = DefaultAgentID, DefaultAgentID
	if s.Files != nil && s.Files.User != nil {
		uid = *s.Files.User
	}
	if s.Files != nil && s.Files.Group != nil {
		gid = *s.Files.Group
	}
	return uid, gid
}

// FileMode is the permission bits of the files the sinks write (default 0640).
func (s *StreamPipelineSpec) FileMode() uint32 {
	mode := uint32(0o640)
	if s.Files != nil && s.Files.Mode != "" {
		if m, err := strconv.ParseUint(s.Files.Mode, 8, 32); err == nil { // the CRD admits octal digits only
			mode = uint32(m)
		}
	}
	return mode
}

// Consumers are where the gateway hands verified chunks: spec.sinks, or spec.sink as one
// lossless consumer named "sink"; none for the null sink.
func (s *StreamPipelineSpec) Consumers() []Consumer {
	if len(s.Sinks) > 0 {
		return s.Sinks
	}
	if k := s.Sink; k != nil && (k.File != nil || k.ZMQ != nil || k.HDF5 != nil || k.Stream2 != nil) {
		return []Consumer{{Name: "sink", Guarantee: GuaranteeLossless, Sink: *k}}
	}
	return nil
}

// ConsumerField is the spec field of consumer i of Consumers() ("spec.sink", "spec.sinks[1]").
func (s *StreamPipelineSpec) ConsumerField(i int) string {
	if len(s.Sinks) > 0 {
		return fmt.Sprintf("spec.sinks[%d]", i)
	}
	return "spec.sink"
}

// Stream2Consumer is the consumer that re-emits Stream V2, or nil.
func (s *StreamPipelineSpec) Stream2Consumer() *Stream2Sink {
	for _, k := range s.Consumers() {
		if k.Stream2 != nil {
			return k.Stream2
		}
	}
	return nil
}
