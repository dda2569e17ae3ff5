package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
)

func remoteSite(keys ...v1beta1.AdmittedKey) *v1beta1.RemoteSite {
	return &v1beta1.RemoteSite{ObjectMeta: metav1.ObjectMeta{Name: "hpc-dtn", Namespace: "beamline"},
		Spec: v1beta1.RemoteSiteSpec{Endpoint: "tcp://dtn:7000"}, Status: v1beta1.RemoteSiteStatus{AdmittedKeys: keys}}
}

// site-keys prints what the far receiver's allowed-keys file holds: one key per line, as listed.
func TestSiteKeysPrintsTheAllowedKeysFile(t *testing.T) {
	e, out := env(t, remoteSite(v1beta1.AdmittedKey{Pipeline: "eiger", Key: "KEY-A", Use: "current"},
		v1beta1.AdmittedKey{Pipeline: "eiger", Key: "KEY-B", Use: "next"}))
	if err := SiteKeys(context.Background(), e, "hpc-dtn"); err != nil {
		t.Fatal(err)
	}
	if out.String() != "KEY-A\nKEY-B\n" {
		t.Errorf("printed %q", out.String())
	}
	if err := SiteKeys(context.Background(), e, "elsewhere"); err == nil || !strings.Contains(err.Error(), "remotesite beamline/elsewhere") {
		t.Errorf("a site that is not there: %v", err)
	}
}

// syncBuffer is an io.Writer read while FollowSiteKeys writes to it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// site-keys --follow keeps the file in step with the site: written when the keys change (a
// rotation's next key added, then the old one gone), never emptied when the site lists none, and
// never seen half-written (it is renamed into place).
func TestSiteKeysFollowKeepsTheFileInStepWithTheSite(t *testing.T) {
	e, _ := env(t, remoteSite())
	var out syncBuffer
	e.Out = &out
	file := filepath.Join(t.TempDir(), "allowed")
	if err := os.WriteFile(file, []byte("OLD\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- FollowSiteKeys(ctx, e, "hpc-dtn", file, 10*time.Millisecond) }()
	setKeys := func(keys ...v1beta1.AdmittedKey) {
		t.Helper()
		site := &v1beta1.RemoteSite{}
		if err := e.Client.Get(ctx, client.ObjectKey{Namespace: "beamline", Name: "hpc-dtn"}, site); err != nil {
			t.Fatal(err)
		}
		site.Status.AdmittedKeys = keys
		if err := e.Client.Update(ctx, site); err != nil {
			t.Fatal(err)
		}
	}
	waitFor := func(want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			got, _ := os.ReadFile(file)
			if string(got) == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the file holds %q, want %q; said:\n%s", got, want, out.String())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), "lists no key") && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got, _ := os.ReadFile(file); string(got) != "OLD\n" {
		t.Errorf("a site that lists no key changed the file: %q", got)
	}
	setKeys(v1beta1.AdmittedKey{Pipeline: "eiger", Key: "KEY-A", Use: "current"})
	waitFor("KEY-A\n")
	setKeys(v1beta1.AdmittedKey{Pipeline: "eiger", Key: "KEY-A", Use: "current"}, v1beta1.AdmittedKey{Pipeline: "eiger", Key: "KEY-B", Use: "next"})
	waitFor("KEY-A\nKEY-B\n")
	setKeys(v1beta1.AdmittedKey{Pipeline: "eiger", Key: "KEY-B", Use: "current"})
	waitFor("KEY-B\n")
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(file); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("the file's mode: %v %v", st, err)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(file), ".allowed.*")); len(left) != 0 {
		t.Errorf("files left beside it: %v", left)
	}
	for _, want := range []string{"admits 1 key(s): eiger/current", "admits 2 key(s): eiger/current, eiger/next"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("said %q, not %q", out.String(), want)
		}
	}
}
