package controllers

import (
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	corev1 "k8s.io/api/core/v1"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
)

// Namespaces are the namespaces whose StreamPipelines the operator drives (a namespace-scoped
// install, chart value operator.watchNamespaces); nil: every namespace.
type Namespaces map[string]bool

// Watches says whether the operator drives the pipelines of a namespace.
func (n Namespaces) Watches(namespace string) bool { return n == nil || n[namespace] }

// CacheOptions caches the namespaced objects the operator writes (Jobs, Services, ConfigMaps,
// claims...) in its namespaces only, where its Roles let it read them; StreamPipelines and pods
// are read cluster-wide (a gateway's cores are shared with every pipeline and every pod on it),
// which its ClusterRole allows and nothing more. No cached object keeps its managedFields: the
// operator never reads them (it applies what it renders), and on the pods and nodes of a large
// cluster they are a good part of what the cache would hold.
func (n Namespaces) CacheOptions() cache.Options {
	if n == nil {
		return cache.Options{DefaultTransform: cache.TransformStripManagedFields()}
	}
	opts := cache.Options{DefaultNamespaces: map[string]cache.Config{}, ByObject: map[client.Object]cache.ByObject{},
		DefaultTransform: cache.TransformStripManagedFields()}
	for ns := range n {
		opts.DefaultNamespaces[ns] = cache.Config{}
	}
	all := map[string]cache.Config{cache.AllNamespaces: {}}
	opts.ByObject[&v1beta1.StreamPipeline{}] = cache.ByObject{Namespaces: all}
	opts.ByObject[&corev1.Pod{}] = cache.ByObject{Namespaces: all}
	return opts
}

// ParseNamespaces reads a comma-separated list ("" : every namespace).
func ParseNamespaces(list []string) Namespaces {
	if len(list) == 0 {
		return nil
	}
	n := Namespaces{}
	for _, ns := range list {
		n[ns] = true
	}
	return n
}
