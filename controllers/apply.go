package controllers

import (
	"context"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/numastream/numastream/api/v1alpha1"
	"github.com/numastream/numastream/internal/render"
)

// apply writes the desired objects with server-side apply. A Job whose rendered config changed
// is deleted (its pod template is immutable) and created again on the next pass. Jobs of
// streams that no longer exist are deleted.
func (r *StreamPipelineReconciler) apply(ctx context.Context, sp *v1alpha1.StreamPipeline, objs render.Objects) (bool, error) {
	if err := r.ssa(ctx, objs.ConfigMap); err != nil {
		return false, err
	}
	for _, s := range objs.Services {
		if err := r.ssa(ctx, s); err != nil {
			return false, err
		}
	}
	if objs.NetworkPolicy != nil {
		if err := r.ssa(ctx, objs.NetworkPolicy); err != nil {
			return false, err
		}
	}
	replaced := false
	want := map[string]bool{}
	for _, name := range objs.Waiting { // held back, not removed: they run until replaced
		want[name] = true
	}
	for _, j := range objs.Jobs {
		want[j.Name] = true
		existing := &batchv1.Job{}
		err := r.Get(ctx, client.ObjectKeyFromObject(j), existing)
		if err == nil && existing.Annotations[render.AnnotationPlanHash] != j.Annotations[render.AnnotationPlanHash] {
			ctrl.LoggerFrom(ctx).Info("Replacing job with a new plan", "job", klog.KObj(existing))
			r.Recorder.Eventf(sp, existing, corev1.EventTypeNormal, "Replacing", "Apply",
				"Job %s runs an older plan: replacing it (its stream resumes where it stopped)", existing.Name)
			if err := r.Delete(ctx, existing, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
				return false, err
			}
			replaced = true
			continue
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return false, err
		}
		if existing.DeletionTimestamp != nil {
			replaced = true
			continue
		}
		if err := r.ssa(ctx, j); err != nil {
			return false, err
		}
	}
	var jobs batchv1.JobList
	if err := r.List(ctx, &jobs, client.InNamespace(sp.Namespace), client.MatchingLabels{render.LabelPipeline: sp.Name}); err != nil {
		return false, err
	}
	for i := range jobs.Items {
		if !want[jobs.Items[i].Name] && metav1.IsControlledBy(&jobs.Items[i], sp) {
			if err := r.Delete(ctx, &jobs.Items[i], client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
				return false, err
			}
		}
	}
	return replaced, nil
}

func (r *StreamPipelineReconciler) ssa(ctx context.Context, obj client.Object) error {
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return err
	}
	un := &unstructured.Unstructured{Object: u}
	unstructured.RemoveNestedField(un.Object, "metadata", "creationTimestamp")
	unstructured.RemoveNestedField(un.Object, "status")
	return r.Apply(ctx, client.ApplyConfigurationFromUnstructured(un), client.FieldOwner(FieldOwner), client.ForceOwnership)
}
