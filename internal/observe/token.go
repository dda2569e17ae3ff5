package observe

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TokenKey is the key of the metrics token in its Secret.
const TokenKey = "token"

// MinTokenLen is the shortest metrics token taken from a Secret an admin made: a shorter one is
// refused, not used.
const MinTokenLen = 32

// MetricsToken is the token the agents' metrics ports ask for, from the Secret namespace/name:
// made (32 random bytes, base64url) when the Secret does not exist, read when it does (an admin
// may make it first to choose the token). A Secret without the key, or with a token shorter
// than MinTokenLen, is an error naming it.
func MetricsToken(ctx context.Context, c client.Client, namespace, name string) (string, error) {
	var s corev1.Secret
	err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &s)
	if apierrors.IsNotFound(err) {
		b := make([]byte, 32)
		if _, err := rand.Read(b); err != nil {
			return "", err
		}
		s = corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name,
				Labels: map[string]string{"app.kubernetes.io/managed-by": "numastream-operator"}},
			Type: corev1.SecretTypeOpaque,
			Data: map[string][]byte{TokenKey: []byte(base64.RawURLEncoding.EncodeToString(b))},
		}
		err = c.Create(ctx, &s)
		if apierrors.IsAlreadyExists(err) { // another replica made it first
			err = c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &s)
		}
	}
	if err != nil {
		return "", fmt.Errorf("the agents' metrics token, Secret %s/%s: %w", namespace, name, err)
	}
	token := string(s.Data[TokenKey])
	if len(token) < MinTokenLen {
		return "", fmt.Errorf("the agents' metrics token, Secret %s/%s key %q: %d characters, at least %d needed", namespace, name, TokenKey, len(token), MinTokenLen)
	}
	return token, nil
}

// TokenSHA256 is the hex SHA-256 of a token: what an agent's configuration holds, never the
// token itself.
func TokenSHA256(token string) string {
	d := sha256.Sum256([]byte(token))
	return hex.EncodeToString(d[:])
}
