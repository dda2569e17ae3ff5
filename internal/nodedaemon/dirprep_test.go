package nodedaemon

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
)

// A pipeline writing under a root the daemon serves gets its own directories there — its files'
// and its consumers' spill's — owned by its user and group with its mode's search bits, under
// directories of root's; nothing that exists is changed, a link never leads out of the prefix,
// and other nodes' and unserved roots' uses get nothing.
func TestDirPrepMakesThePipelinesOwnDirectories(t *testing.T) {
	needsRoot(t)
	tmp := t.TempDir()
	prefix := filepath.Join(tmp, "data")
	outside := filepath.Join(tmp, "outside")
	for _, d := range []string{filepath.Join(prefix, "archive"), filepath.Join(prefix, "other"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	roots := map[string]*v1beta1.StorageRoot{
		"archive":  {ObjectMeta: metav1.ObjectMeta{Name: "archive"}, Spec: v1beta1.StorageRootSpec{Path: filepath.Join(prefix, "archive")}},
		"unserved": {ObjectMeta: metav1.ObjectMeta{Name: "unserved"}, Spec: v1beta1.StorageRootSpec{Path: filepath.Join(tmp, "unserved")}},
	}
	prep := &DirPrep{Prefixes: []string{prefix}, Node: "gw-1", Log: logr.Discard(), Roots: func() map[string]*v1beta1.StorageRoot { return roots }}
	uid, gid := int64(2345), int64(2400)
	pipeline := func(name string, sinks ...v1beta1.Consumer) *v1beta1.StreamPipeline {
		return &v1beta1.StreamPipeline{
			ObjectMeta: metav1.ObjectMeta{Namespace: "beamline", Name: name, UID: types.UID("uid-" + name)},
			Spec: v1beta1.StreamPipelineSpec{
				Senders: []v1beta1.Sender{{Node: "det-a"}},
				Gateway: v1beta1.Gateway{Node: "gw-1"},
				Files:   &v1beta1.Files{User: &uid, Group: &gid, Mode: "0660"},
				Sinks:   sinks,
			},
		}
	}
	file := func(name, root, p string) v1beta1.Consumer {
		return v1beta1.Consumer{Name: name, Sink: v1beta1.Sink{File: &v1beta1.FileSource{Root: root, Path: p}}}
	}
	stat := func(p string) (int64, int64, os.FileMode) { return ownerOf(t, p) }

	spilling := file("copy", "archive", "visit-1/run-7/copy/{stream}.raw")
	spilling.Spill = &v1beta1.ConsumerSpill{MaxBytes: 1 << 30, Root: "archive", Path: "spill"}
	sp := pipeline("tomo", file("raw", "archive", "visit-1/run-7/{stream}.raw"), spilling)
	made, err := prep.Prepare(sp)
	files, spill := filepath.Join(prefix, "archive/visit-1/run-7"), filepath.Join(prefix, "archive/spill/beamline/tomo-uid-tomo")
	if err != nil || !slices.Equal(made, []string{files, spill}) {
		t.Fatalf("Prepare made %v (%v), want %s and %s", made, err, files, spill)
	}
	for _, d := range []string{files, spill} {
		if u, g, m := stat(d); u != uid || g != gid || m != 0o770 {
			t.Errorf("%s: %d:%d %o, want %d:%d 770", d, u, g, m, uid, gid)
		}
	}
	for _, d := range []string{filepath.Dir(files), filepath.Dir(spill), filepath.Dir(filepath.Dir(spill))} {
		if u, _, m := stat(d); u != 0 || m != 0o755 {
			t.Errorf("%s: %d %o, want root's, 755", d, u, m)
		}
	}
	if made, err := prep.Prepare(sp); err != nil || len(made) != 0 {
		t.Errorf("a second Prepare made %v (%v)", made, err)
	}

	// Someone's directory is left as it is.
	theirs := filepath.Join(prefix, "archive/theirs")
	if err := os.Mkdir(theirs, 0o700); err != nil {
		t.Fatal(err)
	}
	if made, err := prep.Prepare(pipeline("b", file("raw", "archive", "theirs/x.raw"))); err != nil || len(made) != 0 {
		t.Errorf("Prepare made %v (%v) where a directory was", made, err)
	}
	if u, _, m := stat(theirs); u != 0 || m != 0o700 {
		t.Errorf("an existing directory changed: %d %o", u, m)
	}

	// A link in the root to a directory outside the prefix: nothing is made through it.
	if err := os.Symlink(outside, filepath.Join(prefix, "archive/escape")); err != nil {
		t.Fatal(err)
	}
	if made, err := prep.Prepare(pipeline("c", file("raw", "archive", "escape/run/x.raw"))); err == nil || len(made) != 0 {
		t.Errorf("Prepare through a link out of the prefix: made %v, error %v", made, err)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("made %v outside the prefix", entries)
	}

	// A file where a directory goes: named, nothing made.
	if err := os.WriteFile(filepath.Join(prefix, "archive/afile"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if made, err := prep.Prepare(pipeline("d", file("raw", "archive", "afile/run/x.raw"))); err == nil || len(made) != 0 {
		t.Errorf("Prepare over a file: made %v, error %v", made, err)
	}

	// Another node's gateway, an unserved root: nothing here.
	elsewhere := pipeline("e", file("raw", "archive", "visit-9/x.raw"))
	elsewhere.Spec.Gateway.Node = "gw-2"
	for _, o := range []*v1beta1.StreamPipeline{elsewhere, pipeline("f", file("raw", "unserved", "visit-9/x.raw"))} {
		if made, err := prep.Prepare(o); err != nil || len(made) != 0 {
			t.Errorf("%s: made %v (%v)", o.Name, made, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(prefix, "archive/visit-9")); err == nil {
		t.Error("made another node's directory")
	}
}
