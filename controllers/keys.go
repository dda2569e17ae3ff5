package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
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
	// AnnotationNextListedAt: when the gateway's next key pair (gateway.next.*) was made and
	// listed in the RemoteSites the pipeline sends to (RFC 3339).
	AnnotationNextListedAt = "numastream.io/next-listed-at"
)

// The gateway's next key pair in the operator's Secret, during a rotation of a pipeline that
// sends to RemoteSites: listed for the far sites to admit before the gateway uses it.
const (
	GatewayNextSecretKey = "gateway.next.secret"
	GatewayNextPublicKey = "gateway.next.public"
)

// siteLead is how a rotation of a pipeline that sends to RemoteSites goes: the gateway's next
// key is listed in the sites' status first, and used once the slowest site's keyPropagation
// has passed.
type siteLead struct {
	sites       []string
	propagation time.Duration
}

// pipelineKeys are the pipeline's CURVE keys as render needs them.
type pipelineKeys struct {
	secret string // the Secret's name; "" for plain TCP
	// hashes identify each stream's keys (by stream id): the public halves of the gateway's
	// pair and the stream's sender's. They change when those keys do, which replaces the
	// stream's agents, and only its: a sender added or removed restarts no other stream.
	hashes map[int]string
	// nextRotation is when the next scheduled rotation, or a listed key's use, is due (0: none).
	nextRotation time.Duration
	// gatewayKey: the gateway's public keys for far sites (nil: the pipeline has no onward hop).
	gatewayKey *v1beta1.GatewayKey
}

// keysSecretName is the Secret that holds the pipeline's CURVE keys: the one the user names, or
// the operator's own (<name>-curve-keys, owned by the pipeline; managed).
func keysSecretName(sp *v1beta1.StreamPipeline) (name string, managed bool) {
	if sp.Spec.Security != nil && sp.Spec.Security.KeysSecret != "" {
		return sp.Spec.Security.KeysSecret, false
	}
	return sp.Name + "-curve-keys", true
}

// needsKeys: the pipeline's agents authenticate with CURVE keys.
func needsKeys(sp *v1beta1.StreamPipeline) bool {
	mode := sp.Spec.SecurityMode()
	if mode == v1beta1.SecurityCurve || mode == v1beta1.SecurityAuthenticate {
		return true
	}
	// An onward hop proves the far site and encrypts whatever the facility network's mode: the
	// gateway needs its key pair.
	for _, k := range sp.Spec.Sinks {
		if k.Onward != nil && k.Onward.ServerKey != "" {
			return true
		}
	}
	return false
}

// readKeysSecret reads the Secret keysSecretName names (nil when it does not exist). Secrets
// are read uncached: the operator never lists or watches them.
func (r *StreamPipelineReconciler) readKeysSecret(ctx context.Context, sp *v1beta1.StreamPipeline) (*corev1.Secret, error) {
	if !needsKeys(sp) {
		return nil, nil
	}
	name, _ := keysSecretName(sp)
	reader := r.APIReader
	if reader == nil {
		reader = r.Client
	}
	sec := &corev1.Secret{}
	if err := reader.Get(ctx, client.ObjectKey{Namespace: sp.Namespace, Name: name}, sec); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, err
	}
	return sec, nil
}

// keysDecision is what decideKeys decided: the keys render uses and the Secret to write.
type keysDecision struct {
	keys pipelineKeys
	// write is the Secret to create (create) or update; nil when it stays as it is.
	write  *corev1.Secret
	create bool
	// rotated says why all pairs were made again ("" when they were not); listed, that the
	// gateway's next pair was made and listed for the far sites instead.
	rotated, listed string
}

// decideKeys makes sure the Secret with the pipeline's CURVE keys (sec as read; nil when it does
// not exist) holds a key pair for the gateway and for every sender. A Secret the user names is
// only checked; the operator's own gets the pairs it lacks, and all new pairs when a rotation is
// due (spec.security.rotateEvery) or asked for (a new value of the pipeline's
// numastream.io/rotate-keys annotation). A pipeline that sends to RemoteSites (lead) rotates in
// two steps: the gateway's next pair is made and listed first, and the rotation uses it once
// the sites have had their keyPropagation to admit it. newPair makes a key pair (curvekeys.New).
func decideKeys(sp *v1beta1.StreamPipeline, sec *corev1.Secret, lead siteLead, now time.Time, newPair func() (curvekeys.KeyPair, error)) (keysDecision, error) {
	if !needsKeys(sp) {
		return keysDecision{}, nil
	}
	name, managed := keysSecretName(sp)
	pairs := [][2]string{{render.GatewaySecretKey, render.GatewayPublicKey}}
	for _, stream := range sp.StreamIDs() {
		pairs = append(pairs, [2]string{render.SenderSecretKey(stream), render.SenderPublicKey(stream)})
	}
	exists := sec != nil
	if !exists && !managed {
		return keysDecision{}, &notPlannedError{reason: ReasonKeys, err: fmt.Errorf("spec.security.keysSecret: Secret %s/%s does not exist", sp.Namespace, name)}
	}
	// The operator's own Secret is the one it made: controlled by this pipeline. One someone made
	// at that name first (keys they know, for the agents to trust) is never adopted.
	if managed && exists && !metav1.IsControlledBy(sec, sp) {
		return keysDecision{}, &notPlannedError{reason: ReasonKeys, err: fmt.Errorf(
			"Secret %s/%s exists and is not this pipeline's (the operator makes it, owned by the pipeline): delete it, or name it in spec.security.keysSecret to use its keys as your own", sp.Namespace, name)}
	}
	if exists {
		sec = sec.DeepCopy()
	} else {
		sec = &corev1.Secret{}
	}
	if sec.Data == nil {
		sec.Data = map[string][]byte{}
	}
	why, listed, promoted, changed := "", "", false, false
	var wait time.Duration
	if managed && exists {
		why = rotationDue(sp, sec, now)
		if len(lead.sites) > 0 {
			var err error
			if why, listed, promoted, changed, wait, err = leadRotation(sec, why, lead, now, newPair); err != nil {
				return keysDecision{}, err
			}
		}
	}
	var missing []string
	for _, p := range pairs {
		secret, public := string(sec.Data[p[0]]), string(sec.Data[p[1]])
		if secret != "" && public != "" && (why == "" || (promoted && p[0] == render.GatewaySecretKey)) {
			if derived, err := curvekeys.PublicOf(trimKey(secret)); err != nil || derived != trimKey(public) {
				return keysDecision{}, &notPlannedError{reason: ReasonKeys, err: fmt.Errorf("Secret %s: %s is not the public key of %s", name, p[1], p[0])}
			}
			continue
		}
		if !managed {
			missing = append(missing, p[0], p[1])
			continue
		}
		kp, err := newPair()
		if err != nil {
			return keysDecision{}, err
		}
		sec.Data[p[0]], sec.Data[p[1]] = []byte(kp.Secret+"\n"), []byte(kp.Public+"\n")
		changed = true
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return keysDecision{}, &notPlannedError{reason: ReasonKeys, err: fmt.Errorf("Secret %s lacks %v (numastream-agent keygen makes key pairs)", name, missing)}
	}
	if managed && (!exists || why != "") {
		if sec.Annotations == nil {
			sec.Annotations = map[string]string{}
		}
		sec.Annotations[AnnotationKeysRotatedAt] = now.UTC().Format(time.RFC3339)
		sec.Annotations[AnnotationKeysRotatedFor] = sp.Annotations[v1beta1.AnnotationRotateKeys]
	}
	next := nextRotation(sp, sec, now)
	if wait > 0 {
		// The rotation is due and waits for the listed key (a schedule that fell due would say
		// "now" again every second meanwhile).
		next = wait
	}
	d := keysDecision{keys: pipelineKeys{secret: name, hashes: map[int]string{}, nextRotation: next, gatewayKey: gatewayKeyOf(sp, sec)}}
	for _, stream := range sp.StreamIDs() {
		d.keys.hashes[stream] = streamKeysHash(sec, stream)
	}
	if !changed {
		return d, nil
	}
	d.write, d.create, d.rotated, d.listed = sec, !exists, why, listed
	if !exists {
		sec.Name, sec.Namespace = name, sp.Namespace
		sec.Labels = map[string]string{render.LabelPipeline: sp.Name, "app.kubernetes.io/managed-by": FieldOwner}
		sec.Type = corev1.SecretTypeOpaque
		sec.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(sp, v1beta1.GroupVersion.WithKind("StreamPipeline"))}
	}
	return d, nil
}

// writeKeys writes the Secret decideKeys decided (the operator's own is owned by the pipeline).
func (r *StreamPipelineReconciler) writeKeys(ctx context.Context, sp *v1beta1.StreamPipeline, d keysDecision) error {
	switch {
	case d.write == nil:
		return nil
	case d.create: // owned by the pipeline (decideKeys)
		return r.Create(ctx, d.write)
	}
	if err := r.Update(ctx, d.write); err != nil {
		return err
	}
	if d.rotated != "" {
		ctrl.LoggerFrom(ctx).Info("Rotated the pipeline's CURVE keys", "secret", d.write.Name, "why", d.rotated)
	}
	return nil
}

// leadRotation is the first step of a rotation (why) of a pipeline that sends to RemoteSites,
// on its Secret sec (changed in place): the gateway's next pair made and listed, and once the
// sites' keyPropagation has passed since, put in the gateway pair's place (promoted) so that
// the rotation goes on with it. It returns the rotation's reason if it goes on now ("" while
// the next key waits), what was listed ("" when nothing was), whether sec changed, and how
// long until the next key may be used.
func leadRotation(sec *corev1.Secret, why string, lead siteLead, now time.Time, newPair func() (curvekeys.KeyPair, error)) (
	rotate, listed string, promoted, changed bool, wait time.Duration, err error) {
	at, err := time.Parse(time.RFC3339, sec.Annotations[AnnotationNextListedAt])
	has := err == nil && len(sec.Data[GatewayNextSecretKey]) > 0 && len(sec.Data[GatewayNextPublicKey]) > 0
	if has {
		derived, err := curvekeys.PublicOf(trimKey(string(sec.Data[GatewayNextSecretKey])))
		has = err == nil && derived == trimKey(string(sec.Data[GatewayNextPublicKey]))
	}
	switch {
	case why == "":
		// A next pair no rotation asks for any more (the annotation was taken back) goes.
		stale := sec.Annotations[AnnotationNextListedAt] != "" || sec.Data[GatewayNextSecretKey] != nil || sec.Data[GatewayNextPublicKey] != nil
		dropNext(sec)
		return "", "", false, stale, 0, nil
	case !has:
		kp, err := newPair()
		if err != nil {
			return "", "", false, false, 0, err
		}
		sec.Data[GatewayNextSecretKey], sec.Data[GatewayNextPublicKey] = []byte(kp.Secret+"\n"), []byte(kp.Public+"\n")
		if sec.Annotations == nil {
			sec.Annotations = map[string]string{}
		}
		sec.Annotations[AnnotationNextListedAt] = now.UTC().Format(time.RFC3339)
		return "", fmt.Sprintf("the gateway's next key %s is listed in RemoteSite %s (%s); the rotation uses it in %s",
			kp.Public, strings.Join(lead.sites, ", "), why, lead.propagation), false, true, max(time.Second, lead.propagation), nil
	case now.Sub(at) < lead.propagation:
		return "", "", false, false, at.Add(lead.propagation).Sub(now), nil
	}
	sec.Data[render.GatewaySecretKey], sec.Data[render.GatewayPublicKey] = sec.Data[GatewayNextSecretKey], sec.Data[GatewayNextPublicKey]
	dropNext(sec)
	return why + fmt.Sprintf("; the gateway's key listed in RemoteSite %s since %s", strings.Join(lead.sites, ", "), at.Format(time.RFC3339)),
		"", true, true, 0, nil
}

// dropNext takes the gateway's next pair out of the Secret.
func dropNext(sec *corev1.Secret) {
	delete(sec.Data, GatewayNextSecretKey)
	delete(sec.Data, GatewayNextPublicKey)
	delete(sec.Annotations, AnnotationNextListedAt)
}

// gatewayKeyOf is the gateway's public keys as status.gatewayKey shows them for a pipeline with
// an onward hop (nil for one without).
func gatewayKeyOf(sp *v1beta1.StreamPipeline, sec *corev1.Secret) *v1beta1.GatewayKey {
	hop := false
	for _, k := range sp.Spec.Sinks {
		hop = hop || (k.Onward != nil && k.Onward.ServerKey != "")
	}
	public := trimKey(string(sec.Data[render.GatewayPublicKey]))
	if !hop || public == "" {
		return nil
	}
	g := &v1beta1.GatewayKey{Public: public, Next: trimKey(string(sec.Data[GatewayNextPublicKey]))}
	if at, err := time.Parse(time.RFC3339, sec.Annotations[AnnotationNextListedAt]); err == nil && g.Next != "" {
		g.NextSince = &metav1.Time{Time: at}
	}
	return g
}

// rotationDue says why the operator's keys must be made again ("" when they need not).
func rotationDue(sp *v1beta1.StreamPipeline, sec *corev1.Secret, now time.Time) string {
	if asked := sp.Annotations[v1beta1.AnnotationRotateKeys]; asked != "" && asked != sec.Annotations[AnnotationKeysRotatedFor] {
		return fmt.Sprintf("asked for: %s=%s", v1beta1.AnnotationRotateKeys, asked)
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
func nextRotation(sp *v1beta1.StreamPipeline, sec *corev1.Secret, now time.Time) time.Duration {
	if sp.Spec.Security == nil || sp.Spec.Security.RotateEvery == nil {
		return 0
	}
	at, err := time.Parse(time.RFC3339, sec.Annotations[AnnotationKeysRotatedAt])
	if err != nil {
		return time.Second
	}
	return max(time.Second, at.Add(sp.Spec.Security.RotateEvery.Duration).Sub(now))
}

// streamKeysHash identifies the keys one stream's agents use: the public keys of the gateway's
// pair and of the stream's sender's.
func streamKeysHash(sec *corev1.Secret, stream int) string {
	h := sha256.New()
	for _, key := range []string{render.GatewayPublicKey, render.SenderPublicKey(stream)} {
		h.Write([]byte(trimKey(string(sec.Data[key])) + "\n"))
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

func trimKey(s string) string {
	for len(s) > 0 && (s[len(s)-1] == '\n' || s[len(s)-1] == '\r' || s[len(s)-1] == ' ') {
		s = s[:len(s)-1]
	}
	return s
}
