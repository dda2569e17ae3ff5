package nodedaemon

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/go-logr/logr"
)

// The state of a deleted pipeline goes, the state of a live one stays, a directory too young to
// judge stays, and what is not a pipeline's state is never touched.
func TestStateGCRemovesOnlyDeletedPipelinesState(t *testing.T) {
	root := t.TempDir()
	live := "0b5e3e0a-1111-4222-8333-944455556666"
	gone := "fcef1090-aaaa-4bbb-8ccc-dddeeeff0001"
	young := "26a356f0-aaaa-4bbb-8ccc-dddeeeff0002"
	mk := func(rel string, age time.Duration) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(p, "stream-0.json"), []byte(`{"stream":0,"floor":41}`), 0o644); err != nil {
			t.Fatal(err)
		}
		at := time.Now().Add(-age)
		if err := os.Chtimes(p, at, at); err != nil {
			t.Fatal(err)
		}
	}
	mk("beamline/scan-a-"+live, time.Hour)
	mk("beamline/scan-b-"+gone, time.Hour)
	mk("other/tomo-"+young, time.Second)
	mk("beamline/not-a-pipeline", time.Hour)
	g := &StateGC{Root: root, MinAge: 10 * time.Minute, Log: logr.Discard(),
		Live: func(context.Context) (map[string]bool, error) { return map[string]bool{live: true}, nil }}
	removed, err := g.Once(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"beamline/scan-b-" + gone}; !reflect.DeepEqual(removed, want) {
		t.Fatalf("removed %v, want %v", removed, want)
	}
	for _, keep := range []string{"beamline/scan-a-" + live, "other/tomo-" + young, "beamline/not-a-pipeline"} {
		if _, err := os.Stat(filepath.Join(root, keep, "stream-0.json")); err != nil {
			t.Errorf("%s: %v", keep, err)
		}
	}
	// Without a root (no sender ever ran on the node) there is nothing to do.
	g.Root = filepath.Join(root, "absent")
	if removed, err := g.Once(context.Background()); err != nil || removed != nil {
		t.Errorf("%v %v", removed, err)
	}
}
