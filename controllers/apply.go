package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/numastream/numastream/api/v1alpha1"
	"github.com/numastream/numastream/internal/render"
	"github.com/numastream/numastream/internal/storage"
)

// AnnotationResizedTo marks a Job whose running pod was resized in place to the plan with this
// hash: its pod template (immutable) still describes the plan before, and the Job is kept.
const AnnotationResizedTo = "numastream.io/resized-to"

// applied is what apply did to the Jobs.
type applied struct {
	replaced bool // a Job was deleted to be created again with a new plan
	resized  int  // Jobs running the new plan through pods resized in place
}

// apply writes the desired objects with server-side apply. A Job whose rendered config changed
// is deleted (its pod template is immutable) and created again on the next pass, unless inPlace
// (a re-plan that changes only the containers' CPUs and memory) and its running pod could be
// resized in place instead (resizeInPlace). Jobs of streams that no longer exist are deleted.
func (r *StreamPipelineReconciler) apply(ctx context.Context, sp *v1alpha1.StreamPipeline, objs render.Objects, inPlace bool) (applied, error) {
	var did applied
	if err := r.ssa(ctx, objs.ConfigMap); err != nil {
		return did, err
	}
	for _, s := range objs.Services {
		if err := r.ssa(ctx, s); err != nil {
			return did, err
		}
	}
	if objs.NetworkPolicy != nil {
		if err := r.ssa(ctx, objs.NetworkPolicy); err != nil {
			return did, err
		}
	}
	if err := r.applyVolumes(ctx, sp, objs.Volumes); err != nil {
		return did, err
	}
	want := map[string]bool{}
	for _, name := range objs.Waiting { // held back, not removed: they run until replaced
		want[name] = true
	}
	for _, j := range objs.Jobs {
		want[j.Name] = true
		existing := &batchv1.Job{}
		err := r.Get(ctx, client.ObjectKeyFromObject(j), existing)
		hash := j.Annotations[render.AnnotationPlanHash]
		if err == nil && existing.DeletionTimestamp == nil && existing.Annotations[render.AnnotationPlanHash] != hash {
			done, rerr := r.resizeInPlace(ctx, sp, existing, j, inPlace)
			if rerr != nil {
				return did, rerr
			}
			if done {
				// Resized to this plan, now or by an earlier pass that did not get to record it.
				did.resized++
				continue
			}
		}
		if err == nil && existing.Annotations[render.AnnotationPlanHash] != hash {
			ctrl.LoggerFrom(ctx).Info("Replacing job with a new plan", "job", klog.KObj(existing))
			r.Recorder.Eventf(sp, existing, corev1.EventTypeNormal, "Replacing", "Apply",
				"Job %s runs an older plan: replacing it (its stream resumes where it stopped)", existing.Name)
			if err := r.Delete(ctx, existing, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
				return did, err
			}
			did.replaced = true
			continue
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return did, err
		}
		if existing.DeletionTimestamp != nil {
			did.replaced = true
			continue
		}
		if err := r.ssa(ctx, j); err != nil {
			return did, err
		}
	}
	var jobs batchv1.JobList
	if err := r.List(ctx, &jobs, client.InNamespace(sp.Namespace), client.MatchingLabels{render.LabelPipeline: sp.Name}); err != nil {
		return did, err
	}
	for i := range jobs.Items {
		if !want[jobs.Items[i].Name] && metav1.IsControlledBy(&jobs.Items[i], sp) {
			if err := r.Delete(ctx, &jobs.Items[i], client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
				return did, err
			}
		}
	}
	return did, nil
}

// resizeInPlace keeps a Job whose plan changed only in its containers' CPUs and memory: its
// running pod is resized through the pods/resize subresource (KEP-1287) to what the new plan's
// pod template asks, and the Job is marked with the new plan's hash (AnnotationResizedTo). True
// when the Job stays: resized now, or earlier and the kubelet has not refused it. A pod the
// kubelet cannot resize (PodResizePending, reason Infeasible: e.g. exclusive CPUs under the
// static CPU manager without KEP-5554), a resize the API server refuses, or no running pod: false,
// and the Job is re-created as for any other plan change.
func (r *StreamPipelineReconciler) resizeInPlace(ctx context.Context, sp *v1alpha1.StreamPipeline, existing, desired *batchv1.Job, inPlace bool) (bool, error) {
	want := desired.Annotations[render.AnnotationPlanHash]
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(existing.Namespace), client.MatchingLabels{batchv1.JobNameLabel: existing.Name}); err != nil {
		return false, err
	}
	var running []*corev1.Pod
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			running = append(running, p)
		}
	}
	if existing.Annotations[AnnotationResizedTo] == want {
		// Kept whatever its pod does now (a finished stream stays finished), unless the kubelet
		// refused the resize.
		for _, p := range running {
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodResizePending && c.Status == corev1.ConditionTrue && c.Reason == corev1.PodReasonInfeasible {
					r.Recorder.Eventf(sp, existing, corev1.EventTypeWarning, "ResizeInfeasible", "Apply",
						"the kubelet cannot resize pod %s in place (%s): re-creating Job %s with the new plan", p.Name, c.Message, existing.Name)
					return false, nil
				}
			}
		}
		return true, nil
	}
	if !inPlace || len(running) != 1 {
		return false, nil
	}
	patch, err := resizePatch(desired.Spec.Template.Spec.Containers)
	if err != nil {
		return false, err
	}
	if err := r.SubResource("resize").Patch(ctx, running[0], client.RawPatch(types.StrategicMergePatchType, patch)); err != nil {
		r.Recorder.Eventf(sp, existing, corev1.EventTypeWarning, "ResizeRefused", "Apply",
			"pod %s cannot be resized in place (%v): re-creating Job %s with the new plan", running[0].Name, err, existing.Name)
		return false, nil
	}
	mark := []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, AnnotationResizedTo, want))
	if err := r.Patch(ctx, existing, client.RawPatch(types.MergePatchType, mark)); err != nil {
		return false, err
	}
	ctrl.LoggerFrom(ctx).Info("Resized a pod in place for a new plan", "pod", klog.KObj(running[0]))
	r.Recorder.Eventf(sp, running[0], corev1.EventTypeNormal, "ResizedInPlace", "Apply",
		"pod %s resized in place to the new plan (%s): its agents use the new CPUs as they run", running[0].Name, describeResources(desired.Spec.Template.Spec.Containers))
	return true, nil
}

// resizePatch is the pods/resize patch that gives each container the CPU and memory of `want`.
func resizePatch(want []corev1.Container) ([]byte, error) {
	type res struct {
		Requests corev1.ResourceList `json:"requests"`
		Limits   corev1.ResourceList `json:"limits"`
	}
	type ctr struct {
		Name      string `json:"name"`
		Resources res    `json:"resources"`
	}
	var cs []ctr
	for _, c := range want {
		pick := func(l corev1.ResourceList) corev1.ResourceList {
			out := corev1.ResourceList{}
			for _, n := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
				if q, ok := l[n]; ok {
					out[n] = q
				}
			}
			return out
		}
		cs = append(cs, ctr{Name: c.Name, Resources: res{Requests: pick(c.Resources.Requests), Limits: pick(c.Resources.Limits)}})
	}
	return json.Marshal(map[string]any{"spec": map[string]any{"containers": cs}})
}

func describeResources(cs []corev1.Container) string {
	var parts []string
	for _, c := range cs {
		parts = append(parts, fmt.Sprintf("%s %s CPU", c.Name, c.Resources.Limits.Cpu()))
	}
	return strings.Join(parts, ", ")
}

// applyVolumes makes the claims (and the volumes bound to them) the pods mount, before the Jobs;
// those no longer wanted go: a claim when no pod uses it any more (the API server's protection),
// its volume once the claim is gone.
func (r *StreamPipelineReconciler) applyVolumes(ctx context.Context, sp *v1alpha1.StreamPipeline, vols []storage.Volume) error {
	wantPV, wantClaim := map[string]bool{}, map[string]bool{}
	for _, v := range vols {
		if err := r.ssa(ctx, v.PV); err != nil {
			return err
		}
		if err := r.ssa(ctx, v.Claim); err != nil {
			return err
		}
		wantPV[v.PV.Name], wantClaim[v.Claim.Name] = true, true
	}
	var claims corev1.PersistentVolumeClaimList
	if err := r.List(ctx, &claims, client.InNamespace(sp.Namespace), client.MatchingLabels{storage.LabelPipelineName: sp.Name}); err != nil {
		return err
	}
	for i := range claims.Items {
		c := &claims.Items[i]
		if !wantClaim[c.Name] && metav1.IsControlledBy(c, sp) && c.DeletionTimestamp == nil {
			if err := r.Delete(ctx, c); client.IgnoreNotFound(err) != nil {
				return err
			}
		}
	}
	return r.deleteVolumes(ctx, sp.Namespace, sp.Name, wantPV)
}

// deleteVolumes deletes the PersistentVolumes made for a pipeline (namespace/name) but those in
// keep. The data under them stays: the volumes only point at host directories. A volume still
// bound to a claim in use waits for it (the API server's protection).
func (r *StreamPipelineReconciler) deleteVolumes(ctx context.Context, namespace, name string, keep map[string]bool) error {
	var pvs corev1.PersistentVolumeList
	if err := r.List(ctx, &pvs, client.MatchingLabels{storage.LabelPipelineNamespace: namespace, storage.LabelPipelineName: name}); err != nil {
		return err
	}
	for i := range pvs.Items {
		pv := &pvs.Items[i]
		if !keep[pv.Name] && pv.DeletionTimestamp == nil {
			if err := r.Delete(ctx, pv); client.IgnoreNotFound(err) != nil {
				return err
			}
		}
	}
	return nil
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
