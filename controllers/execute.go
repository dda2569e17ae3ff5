package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/render"
)

// AnnotationResizedTo marks a Job whose running pod was resized in place to the plan with this
// hash: its pod template (immutable) still describes the plan before, and the Job is kept.
const AnnotationResizedTo = "numastream.io/resized-to"

// executed is what execute did to the Jobs.
type executed struct {
	replaced bool // a Job was deleted to be created again with a new plan
	resized  int  // Jobs running the new plan through pods resized in place
}

// execute performs a Decision's writes, in order: the key Secret, the ConfigMap, Services and
// NetworkPolicy, the claims and volumes, each Job's action, then what is no longer wanted. It
// decides nothing but one thing: a resize the API server refuses replaces the Job instead.
func (r *StreamPipelineReconciler) execute(ctx context.Context, sp *v1beta1.StreamPipeline, d Decision) (executed, error) {
	var did executed
	if d.Plan == nil {
		return did, nil // refused: nothing to write
	}
	if err := r.writeKeys(ctx, sp, d.Keys); err != nil {
		return did, err
	}
	objs := []client.Object{d.Objects.ConfigMap}
	for _, s := range d.Objects.Services {
		objs = append(objs, s)
	}
	if d.Objects.NetworkPolicy != nil {
		objs = append(objs, d.Objects.NetworkPolicy)
	}
	for _, v := range d.Objects.Volumes {
		objs = append(objs, v.PV, v.Claim)
	}
	for _, o := range objs {
		if err := r.ssa(ctx, o); err != nil {
			return did, err
		}
	}
	for _, c := range d.DeleteClaims {
		if err := r.Delete(ctx, c); client.IgnoreNotFound(err) != nil {
			return did, err
		}
	}
	if err := r.deleteAll(ctx, d.DeleteVolumes); err != nil {
		return did, err
	}
	for _, s := range d.Jobs {
		if err := r.executeJob(ctx, sp, s, &did); err != nil {
			return did, err
		}
	}
	return did, nil
}

// executeJob performs one JobStep.
func (r *StreamPipelineReconciler) executeJob(ctx context.Context, sp *v1beta1.StreamPipeline, s JobStep, did *executed) error {
	background := client.PropagationPolicy(metav1.DeletePropagationBackground)
	switch s.Action {
	case JobCreate, JobKeep:
		return r.ssa(ctx, s.Desired)
	case JobResized:
		did.resized++
	case JobResize:
		done, err := r.resize(ctx, sp, s)
		if err != nil {
			return err
		}
		if done {
			did.resized++
			break
		}
		s.Event = &Event{Related: s.Existing, Type: corev1.EventTypeNormal, Reason: "Replacing", Action: "Apply",
			Message: fmt.Sprintf("Job %s runs an older plan: replacing it (its stream resumes where it stopped)", s.Existing.Name)}
		fallthrough
	case JobReplace:
		ctrl.LoggerFrom(ctx).Info("Replacing job with a new plan", "job", klog.KObj(s.Existing))
		if err := r.Delete(ctx, s.Existing, background); client.IgnoreNotFound(err) != nil {
			return err
		}
		did.replaced = true
	case JobDeleting:
		did.replaced = true
		return nil
	case JobDelete:
		if err := r.Delete(ctx, s.Existing, background); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	if s.Event != nil {
		r.record(sp, *s.Event)
	}
	return nil
}

// resize resizes a JobResize step's running pod through the pods/resize subresource (KEP-1287)
// to what the new plan's pod template asks, and marks the Job with the new plan's hash
// (AnnotationResizedTo). False when the API server refuses the resize (said in an event): the
// Job is then replaced.
func (r *StreamPipelineReconciler) resize(ctx context.Context, sp *v1beta1.StreamPipeline, s JobStep) (bool, error) {
	want := s.Desired.Annotations[render.AnnotationPlanHash]
	patch, err := resizePatch(s.Desired.Spec.Template.Spec.Containers)
	if err == nil {
		err = r.SubResource("resize").Patch(ctx, s.Pod, client.RawPatch(types.StrategicMergePatchType, patch))
	}
	if err != nil {
		r.record(sp, Event{Related: s.Existing, Type: corev1.EventTypeWarning, Reason: "ResizeRefused", Action: "Apply",
			Message: fmt.Sprintf("pod %s cannot be resized in place (%v): re-creating Job %s with the new plan", s.Pod.Name, err, s.Existing.Name)})
		return false, nil
	}
	// Not marked (an error): the next pass resizes it again to the same resources and marks it.
	mark := []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, AnnotationResizedTo, want))
	if err := r.Patch(ctx, s.Existing, client.RawPatch(types.MergePatchType, mark)); err != nil {
		return false, err
	}
	ctrl.LoggerFrom(ctx).Info("Resized a pod in place for a new plan", "pod", klog.KObj(s.Pod))
	return true, nil
}

// record records an event about the pipeline.
func (r *StreamPipelineReconciler) record(sp *v1beta1.StreamPipeline, e Event) {
	r.Recorder.Eventf(sp, e.Related, e.Type, e.Reason, e.Action, "%s", e.Message)
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

// deleteAll deletes the volumes (not found: gone already). The data under them stays: the
// volumes only point at host directories. A volume still bound to a claim in use waits for it
// (the API server's protection).
func (r *StreamPipelineReconciler) deleteAll(ctx context.Context, pvs []*corev1.PersistentVolume) error {
	for _, pv := range pvs {
		if err := r.Delete(ctx, pv); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	return nil
}

// AnnotationApplied is the hash of what the operator last applied to an object (server-side
// apply): a pass whose object hashes the same, on an object whose fields still hold what it
// sets, applies nothing.
const AnnotationApplied = "numastream.io/applied"

// ssa applies obj with server-side apply, unless the cached copy already holds it: the same
// AnnotationApplied hash (nothing the operator wants changed, nothing it set removed) and
// every field obj sets at the value it sets (anyone's edit of them is put back). Every pass
// applies every object of its pipeline; most change nothing, and each apply costs the API
// server a merge of the object's managed fields (13-15% of its CPU with 1000 pipelines arriving,
// docs/performance.md).
func (r *StreamPipelineReconciler) ssa(ctx context.Context, obj client.Object) error {
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return err
	}
	un := &unstructured.Unstructured{Object: u}
	unstructured.RemoveNestedField(un.Object, "metadata", "creationTimestamp")
	unstructured.RemoveNestedField(un.Object, "status")
	hash, err := appliedHash(un.Object)
	if err != nil {
		return err
	}
	annotations := un.GetAnnotations()
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[AnnotationApplied] = hash
	un.SetAnnotations(annotations)
	if r.holds(ctx, obj, un.Object) {
		applies.WithLabelValues(obj.GetNamespace(), "unchanged").Inc()
		return nil
	}
	applies.WithLabelValues(obj.GetNamespace(), "applied").Inc()
	return r.Apply(ctx, client.ApplyConfigurationFromUnstructured(un), client.FieldOwner(FieldOwner), client.ForceOwnership)
}

// holds: the cached copy of obj exists, is not going away, and holds every field of want.
func (r *StreamPipelineReconciler) holds(ctx context.Context, obj client.Object, want map[string]any) bool {
	existing, ok := reflect.New(reflect.TypeOf(obj).Elem()).Interface().(client.Object)
	if !ok {
		return false
	}
	if err := r.Get(ctx, client.ObjectKeyFromObject(obj), existing); err != nil || existing.GetDeletionTimestamp() != nil {
		return false
	}
	have, err := runtime.DefaultUnstructuredConverter.ToUnstructured(existing)
	if err != nil {
		return false
	}
	return contains(have, want)
}

// contains: every field of want is in have with the same value; lists the same length, item by
// item. Fields only have has (the API server's defaults, other managers' fields) do not count.
func contains(have, want any) bool {
	switch w := want.(type) {
	case map[string]any:
		h, ok := have.(map[string]any)
		if !ok {
			return len(w) == 0 && have == nil
		}
		for k, wv := range w {
			if wv == nil {
				continue // null: unset
			}
			hv, ok := h[k]
			if !ok || !contains(hv, wv) {
				return false
			}
		}
		return true
	case []any:
		h, ok := have.([]any)
		if !ok || len(h) != len(w) {
			return false
		}
		for i := range w {
			if !contains(h[i], w[i]) {
				return false
			}
		}
		return true
	default:
		return reflect.DeepEqual(have, want)
	}
}

// appliedHash hashes an object as applied (JSON orders map keys: the same object, the same hash).
func appliedHash(obj map[string]any) (string, error) {
	b, err := json.Marshal(obj)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:12]), nil
}
