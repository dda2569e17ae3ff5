package v1beta1

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// RemoteSiteSpec is a numastream receiver at another site (an HPC centre's transfer node,
// another cluster's gateway) that pipelines of its namespace carry their streams on to: where it
// answers, the key that proves it, and the path to it.
// +kubebuilder:validation:XValidation:rule="has(self.serverKey) != (has(self.insecurePlaintext) && self.insecurePlaintext)",message="serverKey: the far receiver's public key is required (the hop proves who answers and encrypts), unless insecurePlaintext is true; not both"
type RemoteSiteSpec struct {
	// Endpoint of the far receiver's first data port, tcp://host:port; connection i goes to
	// port + i.
	// +kubebuilder:validation:Pattern=`^tcp://[^:]+:[0-9]{1,5}$`
	Endpoint string `json:"endpoint"`
	// ServerKey is the far receiver's CURVE public key (40 Z85 characters). Changing it (the far
	// site rotated its key) replaces the gateways that send there; each hop resumes.
	// +kubebuilder:validation:Pattern=`^[0-9a-zA-Z.:+=^!/*?&<>()\[\]{}@%$#-]{40}$`
	// +optional
	ServerKey string `json:"serverKey,omitempty"`
	// InsecurePlaintext sends to the far site in clear, with nothing proving who answers. Only for
	// a far site on a network trusted end to end.
	// +optional
	InsecurePlaintext bool `json:"insecurePlaintext,omitempty"`
	// Link is the path to the far site, for the planner to size the connections.
	// +optional
	Link *OnwardLink `json:"link,omitempty"`
	// KeyPropagation is how long the far site takes to admit a key listed in
	// status.admittedKeys. A rotation of a pipeline that sends here lists the gateway's new key
	// this long before the gateway uses it. Default 5m.
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s') && duration(self) <= duration('24h')",message="keyPropagation must be between 0s and 24h"
	// +optional
	KeyPropagation *metav1.Duration `json:"keyPropagation,omitempty"`
}

// DefaultKeyPropagation is spec.keyPropagation when unset.
const DefaultKeyPropagation = 5 * time.Minute

// Propagation is how long the far site takes to admit a key (spec.keyPropagation or its default).
func (s *RemoteSiteSpec) Propagation() time.Duration {
	if s.KeyPropagation != nil {
		return s.KeyPropagation.Duration
	}
	return DefaultKeyPropagation
}

// Uses of an admitted key.
const (
	// KeyUseCurrent: the key the pipeline's gateway connects with now.
	KeyUseCurrent = "current"
	// KeyUseNext: the key of a rotation under way; the gateway uses it once the site's
	// keyPropagation has passed since Since.
	KeyUseNext = "next"
)

// AdmittedKey is a gateway key the far site must admit.
type AdmittedKey struct {
	// Pipeline is the StreamPipeline whose gateway connects with the key.
	Pipeline string `json:"pipeline"`
	// Key is the gateway's CURVE public key (Z85): one line of the far receiver's allowed-keys
	// file.
	Key string `json:"key"`
	// Use is current or next.
	// +kubebuilder:validation:Enum=current;next
	Use string `json:"use"`
	// Since is when the key was listed here.
	// +optional
	Since *metav1.Time `json:"since,omitempty"`
}

// RemoteSiteStatus is what the far site must know of the pipelines that send there.
type RemoteSiteStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// AdmittedKeys are the gateway keys the far receiver must admit (its
	// security.curve.allowed_keys_file, one key per line): each pipeline's current key, and
	// during a rotation its next.
	// +kubebuilder:validation:MaxItems=512
	// +listType=atomic
	// +optional
	AdmittedKeys []AdmittedKey `json:"admittedKeys,omitempty"`
}

// RemoteSite is a far site pipelines carry their streams on to (spec.sinks[].onward.site).
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=rsite,categories=numastream
// +kubebuilder:printcolumn:name="Endpoint",type=string,JSONPath=`.spec.endpoint`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type RemoteSite struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec RemoteSiteSpec `json:"spec"`
	// +optional
	Status RemoteSiteStatus `json:"status,omitempty"`
}

// RemoteSiteList is a list of RemoteSites.
// +kubebuilder:object:root=true
type RemoteSiteList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []RemoteSite `json:"items"`
}

func init() {
	SchemeBuilder.Register(&RemoteSite{}, &RemoteSiteList{})
}
