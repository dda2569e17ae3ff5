package nodedaemon

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"time"

	"github.com/go-logr/logr"
)

// StateGC removes, on one node, the sender state directories of StreamPipelines that no longer
// exist. A sender keeps what the gateway acknowledged in <root>/<namespace>/<name>-<uid> so that
// a restarted stream resumes; once its pipeline is deleted nothing reads it again, and on a
// detector node that streams for years the directories would pile up.
type StateGC struct {
	// Root is the state root as mounted in the daemon's pod (the host's
	// /var/lib/numastream/streams).
	Root string
	// Live returns the UIDs of the StreamPipelines that exist.
	Live func(ctx context.Context) (map[string]bool, error)
	// MinAge keeps directories changed more recently than this: their pipeline may be too new
	// for the list the daemon read.
	MinAge time.Duration
	Now    func() time.Time
	Log    logr.Logger
}

var stateDirName = regexp.MustCompile(`^.+-([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$`)

// Once removes the state directories of deleted pipelines and returns them ("namespace/dir").
// Directories that do not look like a pipeline's (no UID) are left alone.
func (g *StateGC) Once(ctx context.Context) ([]string, error) {
	namespaces, err := os.ReadDir(g.Root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	live, err := g.Live(ctx)
	if err != nil {
		return nil, err
	}
	now := time.Now
	if g.Now != nil {
		now = g.Now
	}
	var removed []string
	var errs []error
	for _, ns := range namespaces {
		if !ns.IsDir() {
			continue
		}
		dirs, err := os.ReadDir(filepath.Join(g.Root, ns.Name()))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, d := range dirs {
			m := stateDirName.FindStringSubmatch(d.Name())
			if !d.IsDir() || m == nil || live[m[1]] {
				continue
			}
			info, err := d.Info()
			if err != nil || now().Sub(info.ModTime()) < g.MinAge {
				continue
			}
			path := filepath.Join(g.Root, ns.Name(), d.Name())
			if err := os.RemoveAll(path); err != nil {
				errs = append(errs, err)
				continue
			}
			removed = append(removed, ns.Name()+"/"+d.Name())
		}
	}
	sort.Strings(removed)
	if len(removed) > 0 {
		g.Log.Info("Removed the state of deleted pipelines", "directories", removed)
	}
	return removed, errors.Join(errs...)
}
