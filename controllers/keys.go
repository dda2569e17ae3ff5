package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1alpha1 "github.com/numastream/numastream/api/v1alpha1"
	"github.com/numastream/numastream/internal/curvekeys"
	"github.com/numastream/numastream/internal/render"
)

// ReasonKeys: the pipeline's CURVE keys are missing or do not match.
const ReasonKeys = "KeysInvalid"

// Annotations of the operator's key Secret.
const (
	// AnnotationKeysRotatedAt: when the keys in the Secret were made (RFC 3339).
	AnnotationKeysRotatedAt = "numastream.io/rotated-at"
	// AnnotationKeysRotatedFor: the pipeline's numastream.io/rotate-keys value they were made for.
	AnnotationKeysRotatedFor = "numastream.io/rotated-for"
)

// pipelineKeys are the pipeline's CURVE keys as render needs them.
type pipelineKeys struct {
	secret string // the Secret's name; "" for plain TCP
	hash   string // of the public keys: it changes when the keys do, which replaces the agents
	// nextRotation is when the next scheduled rotation is due (0: none scheduled).
	nextRotation time.Duration
}

// curveKeys makes sure the Secret with the pipeline's CURVE keys holds a key pair for the gateway
// and for every sender. A Secret the user names is only checked; the operator's own
// (<name>-curve-keys, owned by the pipeline) gets the pairs it lacks, and all new pairs when a
// rotation is due (spec.security.rotateEvery) or asked for (a new value of the pipeline's
// numastream.io/rotate-keys annotation). Secrets are read uncached: the operator never lists or
// watches them.
func (r *StreamPipelineReconciler) curveKeys(ctx context.Context, sp *v1alpha1.StreamPipeline) (pipelineKeys, error) {
	mode := sp.Spec.SecurityMode()
	if mode != v1alpha1.SecurityCurve && mode != v1alpha1.SecurityAuthenticate {
		return pipelineKeys{}, nil
	}
	name, managed := "", false
	if sp.Spec.Security != nil {
		name = sp.Spec.Security.KeysSecret
	}
	if name == "" {
		name, managed = sp.Name+"-curve-keys", true
	}
	pairs := [][2]string{{render.GatewaySecretKey, render.GatewayPublicKey}}
	for _, stream := range sp.StreamIDs() {
		pairs = append(pairs, [2]string{render.SenderSecretKey(stream), render.SenderPublicKey(stream)})
	}
	reader := r.APIReader
	if reader == nil {
		reader = r.Client
	}
	sec := &corev1.Secret{}
	err := reader.Get(ctx, client.ObjectKey{Namespace: sp.Namespace, Name: name}, sec)
	exists := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		return pipelineKeys{}, err
	}
	if !exists && !managed {
		return pipelineKeys{}, &notPlannedError{reason: ReasonKeys, err: fmt.Errorf("spec.security.keysSecret: Secret %s/%s does not exist", sp.Namespace, name)}
	}
	if sec.Data == nil {
		sec.Data = map[string][]byte{}
	}
	now := time.Now()
	why := ""
	if managed && exists {
		why = rotationDue(sp, sec, now)
	}
	var missing []string
	changed := false
	for _, p := range pairs {
		secret, public := string(sec.Data[p[0]]), string(sec.Data[p[1]])
		if secret != "" && public != "" && why == "" {
			if derived, err := curvekeys.PublicOf(trimKey(secret)); err != nil || derived != trimKey(public) {
				return pipelineKeys{}, &notPlannedError{reason: ReasonKeys, err: fmt.Errorf("Secret %s: %s is not the public key of %s", name, p[1], p[0])}
			}
			continue
		}
		if !managed {
			missing = append(missing, p[0], p[1])
			continue
		}
		kp, err := curvekeys.New()
		if err != nil {
			return pipelineKeys{}, err
		}
		sec.Data[p[0]], sec.Data[p[1]] = []byte(kp.Secret+"\n"), []byte(kp.Public+"\n")
		changed = true
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return pipelineKeys{}, &notPlannedError{reason: ReasonKeys, err: fmt.Errorf("Secret %s lacks %v (numastream-agent keygen makes key pairs)", name, missing)}
	}
	if managed && (!exists || why != "") {
		if sec.Annotations == nil {
			sec.Annotations = map[string]string{}
		}
		sec.Annotations[AnnotationKeysRotatedAt] = now.UTC().Format(time.RFC3339)
		sec.Annotations[AnnotationKeysRotatedFor] = sp.Annotations[v1alpha1.AnnotationRotateKeys]
	}
	keys := pipelineKeys{secret: name, hash: publicKeysHash(sec, pairs), nextRotation: nextRotation(sp, sec, now)}
	switch {
	case !changed:
		return keys, nil
	case !exists:
		sec.ObjectMeta.Name, sec.ObjectMeta.Namespace = name, sp.Namespace
		sec.ObjectMeta.Labels = map[string]string{render.LabelPipeline: sp.Name, "app.kubernetes.io/managed-by": FieldOwner}
		sec.Type = corev1.SecretTypeOpaque
		if err := controllerutil.SetControllerReference(sp, sec, r.Scheme); err != nil {
			return pipelineKeys{}, err
		}
		return keys, r.Create(ctx, sec)
	}
	if err := r.Update(ctx, sec); err != nil {
		return pipelineKeys{}, err
	}
	if why != "" {
		ctrl.LoggerFrom(ctx).Info("Rotated the pipeline's CURVE keys", "secret", name, "why", why)
		r.Recorder.Eventf(sp, sec, corev1.EventTypeNormal, "KeysRotated", "Rotate",
			"new CURVE keys in Secret %s (%s): the agents are replaced with them, each stream drains and resumes", name, why)
	}
	return keys, nil
}

// rotationDue says why the operator's keys must be made again ("" when they need not).
func rotationDue(sp *v1alpha1.StreamPipeline, sec *corev1.Secret, now time.Time) string {
	if asked := sp.Annotations[v1alpha1.AnnotationRotateKeys]; asked != "" && asked != sec.Annotations[AnnotationKeysRotatedFor] {
		return fmt.Sprintf("asked for: %s=%s", v1alpha1.AnnotationRotateKeys, asked)
	}
	if sp.Spec.Security != nil && sp.Spec.Security.RotateEvery != nil {
		at, err := time.Parse(time.RFC3339, sec.Annotations[AnnotationKeysRotatedAt])
		if err != nil || now.Sub(at) >= sp.Spec.Security.RotateEvery.Duration {
			return "due every " + sp.Spec.Security.RotateEvery.Duration.String()
		}
	}
	return ""
}

// nextRotation is how long until the next scheduled rotation (0: none scheduled).
func nextRotation(sp *v1alpha1.StreamPipeline, sec *corev1.Secret, now time.Time) time.Duration {
	if sp.Spec.Security == nil || sp.Spec.Security.RotateEvery == nil {
		return 0
	}
	at, err := time.Parse(time.RFC3339, sec.Annotations[AnnotationKeysRotatedAt])
	if err != nil {
		return time.Second
	}
	return max(time.Second, at.Add(sp.Spec.Security.RotateEvery.Duration).Sub(now))
}

// publicKeysHash identifies the keys the agents use: the public keys of every pair.
func publicKeysHash(sec *corev1.Secret, pairs [][2]string) string {
	h := sha256.New()
	for _, p := range pairs {
		h.Write([]byte(trimKey(string(sec.Data[p[1]])) + "\n"))
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

func trimKey(s string) string {
	for len(s) > 0 && (s[len(s)-1] == '\n' || s[len(s)-1] == '\r' || s[len(s)-1] == ' ') {
		s = s[:len(s)-1]
	}
	return s
}
