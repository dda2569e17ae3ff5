package nodedaemon

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
)

// A pipeline with a sender on the node gets its state directory, owned by its agents' user and
// group, 0700, under directories nobody can list; a change of user hands it over without
// following the links inside; a pipeline streaming from other nodes gets nothing here.
func TestStatePrepMakesThePipelinesDirectoryForItsUser(t *testing.T) {
	needsRoot(t)
	root := filepath.Join(t.TempDir(), "streams")
	prep := &StatePrep{Root: root, Node: "det-a", Log: logr.Discard()}
	uid, gid := int64(2345), int64(2400)
	sp := &v1beta1.StreamPipeline{
		ObjectMeta: metav1.ObjectMeta{Namespace: "beamline", Name: "tomo", UID: "0b5e3e0a-1111-4222-8333-944455556666"},
		Spec: v1beta1.StreamPipelineSpec{
			Senders: []v1beta1.Sender{{Node: "det-b"}, {Node: "det-a"}},
			Files:   &v1beta1.Files{User: &uid, Group: &gid},
		},
	}
	dir := filepath.Join(root, "beamline", "tomo-"+string(sp.UID))
	owner := func(p string) (int64, int64, os.FileMode) { return ownerOf(t, p) }
	if changed, err := prep.Prepare(sp); err != nil || !changed {
		t.Fatalf("Prepare: %v %v", changed, err)
	}
	if u, g, m := owner(dir); u != uid || g != gid || m != 0o700 {
		t.Errorf("state directory %d:%d %o, want %d:%d 700", u, g, m, uid, gid)
	}
	for _, d := range []string{root, filepath.Dir(dir)} {
		if u, _, m := owner(d); u != 0 || m != 0o711 {
			t.Errorf("%s: %d %o, want root's, 711", d, u, m)
		}
	}
	if changed, err := prep.Prepare(sp); err != nil || changed {
		t.Errorf("a second Prepare changed something: %v %v", changed, err)
	}

	// The agents left a file and a link to a host file in their directory; the user changes.
	host := filepath.Join(t.TempDir(), "host-file")
	if err := os.WriteFile(host, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "stream-1.json"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(host, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	uid2 := int64(3000)
	sp.Spec.Files.User = &uid2
	if _, err := prep.Prepare(sp); err != nil {
		t.Fatal(err)
	}
	if u, _, _ := owner(filepath.Join(dir, "stream-1.json")); u != uid2 {
		t.Errorf("the state file stayed %d's", u)
	}
	if u, _, _ := owner(host); u != 0 {
		t.Errorf("the link was followed: the host's file is now %d's", u)
	}

	elsewhere := &StatePrep{Root: root, Node: "gw-1", Log: logr.Discard()}
	other := sp.DeepCopy()
	other.Name, other.UID = "other", "26a356f0-aaaa-4bbb-8ccc-dddeeeff0002"
	if changed, err := elsewhere.Prepare(other); err != nil || changed {
		t.Errorf("a node without a sender of the pipeline prepared it: %v %v", changed, err)
	}
}

// needsRoot skips a test that chowns unless it runs as root (fails under NUMASTREAM_REQUIRE_REAL=1).
func needsRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("NUMASTREAM_REQUIRE_REAL") == "1" {
			t.Fatal("NUMASTREAM_REQUIRE_REAL=1: chown needs root")
		}
		t.Skip("chown needs root")
	}
}

// ownerOf is p's owner, group and permission bits (the link itself for a link).
func ownerOf(t *testing.T, p string) (uid, gid int64, mode os.FileMode) {
	t.Helper()
	info, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	st := info.Sys().(*syscall.Stat_t)
	return int64(st.Uid), int64(st.Gid), info.Mode().Perm()
}
