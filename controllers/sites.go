package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
)

// ReasonRemoteSite: a RemoteSite the pipeline names (spec.sinks[].onward.site) does not exist.
const ReasonRemoteSite = "RemoteSiteNotFound"

// sitesOf are the RemoteSites the pipeline's onward hops name, sorted, each once.
func sitesOf(sp *v1beta1.StreamPipeline) []string {
	var names []string
	for _, k := range sp.Spec.Sinks {
		if k.Onward != nil && k.Onward.Site != "" && !slices.Contains(names, k.Onward.Site) {
			names = append(names, k.Onward.Site)
		}
	}
	slices.Sort(names)
	return names
}

// readSites reads the RemoteSites the pipeline names, by name; a missing one is left out
// (useSites refuses the pipeline).
func (r *StreamPipelineReconciler) readSites(ctx context.Context, sp *v1beta1.StreamPipeline) (map[string]*v1beta1.RemoteSite, error) {
	sites := map[string]*v1beta1.RemoteSite{}
	for _, name := range sitesOf(sp) {
		site := &v1beta1.RemoteSite{}
		if err := r.Get(ctx, client.ObjectKey{Namespace: sp.Namespace, Name: name}, site); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return nil, err
		}
		sites[name] = site
	}
	return sites, nil
}

// useSites puts each named RemoteSite's endpoint, key and link into the onward hops that name
// it (sp is the pass's copy), and says how a key rotation of the pipeline goes with them. A
// RemoteSite that does not exist refuses the pipeline (until it is made: its watch wakes the
// pipeline).
func useSites(sp *v1beta1.StreamPipeline, sites map[string]*v1beta1.RemoteSite) (siteLead, error) {
	var lead siteLead
	for i, k := range sp.Spec.Sinks {
		if k.Onward == nil || k.Onward.Site == "" {
			continue
		}
		site, ok := sites[k.Onward.Site]
		if !ok {
			return siteLead{}, &notPlannedError{reason: ReasonRemoteSite, err: fmt.Errorf(
				"spec.sinks[%d].onward.site: RemoteSite %s/%s does not exist", i, sp.Namespace, k.Onward.Site)}
		}
		hop := *k.Onward
		hop.Endpoint, hop.ServerKey, hop.InsecurePlaintext, hop.Link = site.Spec.Endpoint, site.Spec.ServerKey, site.Spec.InsecurePlaintext, site.Spec.Link.DeepCopy()
		sp.Spec.Sinks[i].Onward = &hop
		if site.Spec.ServerKey != "" && !slices.Contains(lead.sites, site.Name) {
			lead.sites = append(lead.sites, site.Name)
			lead.propagation = max(lead.propagation, site.Spec.Propagation())
		}
	}
	slices.Sort(lead.sites)
	return lead, nil
}

// withSites is the pipeline with its RemoteSites put in (a copy; the pipeline itself when it
// names none or one is missing).
func withSites(sp *v1beta1.StreamPipeline, sites map[string]*v1beta1.RemoteSite) *v1beta1.StreamPipeline {
	if len(sitesOf(sp)) == 0 {
		return sp
	}
	out := sp.DeepCopy()
	if _, err := useSites(out, sites); err != nil {
		return sp
	}
	return out
}

// pipelinesOfSite wakes the pipelines of a RemoteSite's namespace that name it.
func pipelinesOfSite(c client.Reader) handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		var all v1beta1.StreamPipelineList
		if err := c.List(ctx, &all, client.InNamespace(o.GetNamespace())); err != nil {
			return nil
		}
		var reqs []reconcile.Request
		for i := range all.Items {
			if slices.Contains(sitesOf(&all.Items[i]), o.GetName()) {
				reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&all.Items[i])})
			}
		}
		return reqs
	})
}

// RemoteSiteReconciler keeps each RemoteSite's status.admittedKeys: the gateway keys of the
// pipelines that send there, current and next, as those pipelines' status.gatewayKey says.
type RemoteSiteReconciler struct {
	client.Client
	// Namespaces the operator watches.
	Namespaces Namespaces
}

// +kubebuilder:rbac:groups=numastream.io,resources=remotesites,verbs=get;list;watch
// +kubebuilder:rbac:groups=numastream.io,resources=remotesites/status,verbs=get;update;patch

// Reconcile writes one RemoteSite's admitted keys.
func (r *RemoteSiteReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if !r.Namespaces.Watches(req.Namespace) {
		return ctrl.Result{}, nil
	}
	site := &v1beta1.RemoteSite{}
	if err := r.Get(ctx, req.NamespacedName, site); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	var all v1beta1.StreamPipelineList
	if err := r.List(ctx, &all, client.InNamespace(site.Namespace)); err != nil {
		return ctrl.Result{}, err
	}
	before := site.DeepCopy()
	site.Status.AdmittedKeys = admittedKeys(site.Name, all.Items)
	site.Status.ObservedGeneration = site.Generation
	if equality.Semantic.DeepEqual(before.Status, site.Status) {
		return ctrl.Result{}, nil
	}
	if err := r.Status().Patch(ctx, site, client.MergeFrom(before)); err != nil {
		return ctrl.Result{}, err
	}
	var keys []string
	for _, k := range site.Status.AdmittedKeys {
		keys = append(keys, k.Pipeline+"/"+k.Use)
	}
	ctrl.LoggerFrom(ctx).Info("The far site's admitted keys changed", "keys", strings.Join(keys, ", "))
	return ctrl.Result{}, nil
}

// admittedKeys are the keys the far site `site` must admit for the pipelines (of its
// namespace) that name it: each one's current gateway key, and its next during a rotation;
// sorted by pipeline, current first; at most the status's 512.
func admittedKeys(site string, pipelines []v1beta1.StreamPipeline) []v1beta1.AdmittedKey {
	var keys []v1beta1.AdmittedKey
	for i := range pipelines {
		sp := &pipelines[i]
		g := sp.Status.GatewayKey
		if g == nil || sp.DeletionTimestamp != nil || !slices.Contains(sitesOf(sp), site) {
			continue
		}
		keys = append(keys, v1beta1.AdmittedKey{Pipeline: sp.Name, Key: g.Public, Use: v1beta1.KeyUseCurrent})
		if g.Next != "" {
			keys = append(keys, v1beta1.AdmittedKey{Pipeline: sp.Name, Key: g.Next, Use: v1beta1.KeyUseNext, Since: g.NextSince})
		}
	}
	slices.SortStableFunc(keys, func(a, b v1beta1.AdmittedKey) int { return strings.Compare(a.Pipeline, b.Pipeline) })
	if len(keys) > 512 {
		keys = keys[:512]
	}
	return keys
}

// SetupWithManager wires the watches: the RemoteSites, and the pipelines that name them (a
// pipeline's new gateway key, or one gone).
func (r *RemoteSiteReconciler) SetupWithManager(mgr ctrl.Manager) error {
	toSites := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		sp, ok := o.(*v1beta1.StreamPipeline)
		if !ok {
			return nil
		}
		var reqs []reconcile.Request
		for _, name := range sitesOf(sp) {
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: sp.Namespace, Name: name}})
		}
		return reqs
	})
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1beta1.RemoteSite{}).
		Watches(&v1beta1.StreamPipeline{}, toSites).
		Complete(r)
}
