// Package v1beta1 holds the numastream.io/v1beta1 API: the StreamPipeline, StorageRoot and RemoteSite kinds.
// It depends only on the standard library and Kubernetes API packages.
// +kubebuilder:object:generate=true
// +groupName=numastream.io
package v1beta1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the API group and version of StreamPipeline.
	GroupVersion = schema.GroupVersion{Group: "numastream.io", Version: "v1beta1"}

	// SchemeBuilder registers the types of this package.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion} //nolint:staticcheck // SA1019: kubebuilder's API packages register their types with it

	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
