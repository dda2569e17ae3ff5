package controllers

import (
	"context"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1alpha1 "github.com/numastream/numastream/api/v1alpha1"
	"github.com/numastream/numastream/internal/curvekeys"
	"github.com/numastream/numastream/internal/render"
)

// ReasonKeys: the pipeline's CURVE keys are missing or do not match.
const ReasonKeys = "KeysInvalid"

// curveKeys makes sure the Secret with the pipeline's CURVE keys holds a key pair for the gateway
// and for every sender, and returns its name ("" when the pipeline does not use CURVE). A Secret
// the user names is only checked; the operator's own (<name>-curve-keys, owned by the pipeline)
// gets the pairs it lacks. Secrets are read uncached: the operator never lists or watches them.
func (r *StreamPipelineReconciler) curveKeys(ctx context.Context, sp *v1alpha1.StreamPipeline) (string, error) {
	if sp.Spec.Security == nil || (sp.Spec.Security.Mode != v1alpha1.SecurityCurve &&
		sp.Spec.Security.Mode != v1alpha1.SecurityAuthenticate) {
		return "", nil
	}
	name, managed := sp.Spec.Security.KeysSecret, false
	if name == "" {
		name, managed = sp.Name+"-curve-keys", true
	}
	pairs := [][2]string{{render.GatewaySecretKey, render.GatewayPublicKey}}
	for i := range sp.Spec.Senders {
		pairs = append(pairs, [2]string{render.SenderSecretKey(i), render.SenderPublicKey(i)})
	}
	reader := r.APIReader
	if reader == nil {
		reader = r.Client
	}
	sec := &corev1.Secret{}
	err := reader.Get(ctx, client.ObjectKey{Namespace: sp.Namespace, Name: name}, sec)
	exists := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		return "", err
	}
	if !exists && !managed {
		return "", &notPlannedError{reason: ReasonKeys, err: fmt.Errorf("spec.security.keysSecret: Secret %s/%s does not exist", sp.Namespace, name)}
	}
	if sec.Data == nil {
		sec.Data = map[string][]byte{}
	}
	var missing []string
	changed := false
	for _, p := range pairs {
		secret, public := string(sec.Data[p[0]]), string(sec.Data[p[1]])
		if secret != "" && public != "" {
			if derived, err := curvekeys.PublicOf(trimKey(secret)); err != nil || derived != trimKey(public) {
				return "", &notPlannedError{reason: ReasonKeys, err: fmt.Errorf("Secret %s: %s is not the public key of %s", name, p[1], p[0])}
			}
			continue
		}
		if !managed {
			missing = append(missing, p[0], p[1])
			continue
		}
		kp, err := curvekeys.New()
		if err != nil {
			return "", err
		}
		sec.Data[p[0]], sec.Data[p[1]] = []byte(kp.Secret+"\n"), []byte(kp.Public+"\n")
		changed = true
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return "", &notPlannedError{reason: ReasonKeys, err: fmt.Errorf("Secret %s lacks %v (numastream-agent keygen makes key pairs)", name, missing)}
	}
	if !changed {
		return name, nil
	}
	if !exists {
		sec.ObjectMeta = metav1.ObjectMeta{Name: name, Namespace: sp.Namespace, Labels: map[string]string{
			render.LabelPipeline: sp.Name, "app.kubernetes.io/managed-by": FieldOwner}}
		sec.Type = corev1.SecretTypeOpaque
		if err := controllerutil.SetControllerReference(sp, sec, r.Scheme); err != nil {
			return "", err
		}
		return name, r.Create(ctx, sec)
	}
	return name, r.Update(ctx, sec)
}

func trimKey(s string) string {
	for len(s) > 0 && (s[len(s)-1] == '\n' || s[len(s)-1] == '\r' || s[len(s)-1] == ' ') {
		s = s[:len(s)-1]
	}
	return s
}
