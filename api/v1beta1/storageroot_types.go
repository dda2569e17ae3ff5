package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Node roles a StorageRoot serves.
const (
	// StorageRoleGateway: the gateway's sinks write files under the root.
	StorageRoleGateway = "gateway"
	// StorageRoleSender: the senders read their sources and keep their spills under the root.
	StorageRoleSender = "sender"
)

// StorageRootSpec is a host directory the facility's admin lets pipelines use, as a
// StorageClass lets claims use a kind of storage: which nodes' roles may use it, which
// namespaces, and as which users and groups the agents may then read and write it.
// +kubebuilder:validation:XValidation:rule="self.path == oldSelf.path",message="path is immutable: create another StorageRoot"
type StorageRootSpec struct {
	// Path is the directory on the nodes, absolute, without "." or ".." segments or empty ones,
	// and not "/". It must exist (the admin makes it, with permissions that let the users and
	// groups below write in it); pipelines name paths relative to it and never leave it.
	// +kubebuilder:validation:Pattern=`^(/([^/]*[^/.][^/]*|\.\.\.+))+/?$`
	// +kubebuilder:validation:MaxLength=4096
	Path string `json:"path"`

	// NodeRoles are where the root may be used: gateway (sinks) and sender (sources, spills).
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:items:Enum=gateway;sender
	// +listType=set
	// +kubebuilder:default={gateway,sender}
	// +optional
	NodeRoles []string `json:"nodeRoles,omitempty"`

	// ReadOnly roots serve sources only.
	// +optional
	ReadOnly bool `json:"readOnly,omitempty"`

	// Access says which namespaces may use the root and as which users and groups their agents
	// then run (files belong to an experiment's account, not to numastream).
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=256
	// +listType=atomic
	Access []StorageAccess `json:"access"`
}

// StorageAccess admits some namespaces with some users and groups.
type StorageAccess struct {
	// Namespaces admitted by name; "*" admits every namespace.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=1024
	// +kubebuilder:validation:items:MaxLength=63
	// +listType=set
	Namespaces []string `json:"namespaces"`
	// Users (uids) the agents of these namespaces may run as on this root.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	Users []IDRange `json:"users"`
	// Groups (gids) the agents of these namespaces may run as on this root.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	Groups []IDRange `json:"groups"`
}

// IDRange is an inclusive range of uids or gids; 0 (root) is never admitted.
// +kubebuilder:validation:XValidation:rule="self.min <= self.max",message="min must not exceed max"
type IDRange struct {
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=2147483647
	Min int64 `json:"min"`
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=2147483647
	Max int64 `json:"max"`
}

// Contains says whether id is in the range.
func (r IDRange) Contains(id int64) bool { return id >= r.Min && id <= r.Max }

// StorageRoot is a host directory pipelines may use, set up by the facility's admin.
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=sroot,categories=numastream
// +kubebuilder:printcolumn:name="Path",type=string,JSONPath=`.spec.path`
// +kubebuilder:printcolumn:name="Roles",type=string,JSONPath=`.spec.nodeRoles`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type StorageRoot struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec StorageRootSpec `json:"spec"`
}

// StorageRootList is a list of StorageRoots.
// +kubebuilder:object:root=true
type StorageRootList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []StorageRoot `json:"items"`
}

func init() {
	SchemeBuilder.Register(&StorageRoot{}, &StorageRootList{})
}
