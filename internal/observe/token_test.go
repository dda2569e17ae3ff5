package observe

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// The metrics token: made once (random, long) when its Secret is missing and then read back the
// same; an admin's own Secret is taken as it is when long enough and refused, naming it, when
// not; its digest is SHA-256, in hex.
func TestTheMetricsTokenIsMadeOnceAndAShortOneRefused(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	c := fake.NewClientBuilder().WithScheme(scheme).Build()
	ctx := context.Background()
	first, err := MetricsToken(ctx, c, "ops", "agent-metrics")
	if err != nil || len(first) < 43 {
		t.Fatalf("made: %q %v", first, err)
	}
	again, err := MetricsToken(ctx, c, "ops", "agent-metrics")
	if err != nil || again != first {
		t.Fatalf("read back %q %v, made %q", again, err, first)
	}
	other, _ := MetricsToken(ctx, fake.NewClientBuilder().WithScheme(scheme).Build(), "ops", "agent-metrics")
	if other == first {
		t.Error("two clusters made the same token")
	}
	own := strings.Repeat("t", MinTokenLen)
	for name, token := range map[string]string{"admins": own, "short": own[1:], "empty": ""} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: name}, Data: map[string][]byte{TokenKey: []byte(token)}}
		if err := c.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
		got, err := MetricsToken(ctx, c, "ops", name)
		if name == "admins" && (err != nil || got != own) {
			t.Errorf("an admin's token: %q %v", got, err)
		}
		if name != "admins" && (err == nil || !strings.Contains(err.Error(), "ops/"+name) || !strings.Contains(err.Error(), "at least 32")) {
			t.Errorf("a %s token: %q %v", name, got, err)
		}
	}
	var s corev1.Secret
	_ = c.Get(ctx, client.ObjectKey{Namespace: "ops", Name: "short"}, &s)
	if string(s.Data[TokenKey]) != own[1:] {
		t.Error("a refused Secret was changed")
	}
	if d := TokenSHA256("abc"); d != "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" {
		t.Errorf("sha256(abc) = %s", d)
	}
}

// The observer sends its token to the agents' metrics ports, over HTTPS (an agent's certificate
// is its own, made at its start, as httptest's is); without a token it reads them over HTTP.
func TestTheObserverSendsItsTokenOverTLS(t *testing.T) {
	var got []string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Get("Authorization"))
		if r.Header.Get("Authorization") != "Bearer s3cret" {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		_, _ = w.Write([]byte("numastream_up 1\n"))
	}))
	defer srv.Close()
	addr := srv.Listener.Addr().(*net.TCPAddr)
	pod := &corev1.Pod{Status: corev1.PodStatus{PodIP: addr.IP.String()}}
	o := NewObserver(0)
	o.Token = "s3cret"
	url := o.URL(pod, int32(addr.Port))
	if want := "https://" + addr.String() + "/metrics"; url != want {
		t.Fatalf("the URL of an agent asking for the token: %s, want %s", url, want)
	}
	if _, err := o.fetch(context.Background(), url); err != nil {
		t.Fatal(err)
	}
	o.Token = ""
	if _, err := o.fetch(context.Background(), url); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("without the token: %v", err)
	}
	if len(got) != 2 || got[0] != "Bearer s3cret" || got[1] != "" {
		t.Errorf("headers sent: %q", got)
	}
	if url := o.URL(pod, 9100); !strings.HasPrefix(url, "http://") {
		t.Errorf("without a token the agents are read over plain HTTP: %s", url)
	}
}
