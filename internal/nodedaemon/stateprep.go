package nodedaemon

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/go-logr/logr"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
)

// StatePrep makes, on one node, the state directory of every StreamPipeline with a sender there
// (<root>/<namespace>/<name>-<uid>), owned by the user and group its agents run as (spec.files)
// with mode 0700. The agent pods mount it through a volume the operator binds and run as that
// user: no root step in any pipeline's pod, and no pipeline's agents read another's state. The
// root and the namespace directories only let through (0711): nobody lists them.
type StatePrep struct {
	// Root is the state root as mounted in the daemon's pod.
	Root string
	Node string
	Log  logr.Logger
}

// Prepare makes the pipeline's directory when it has a sender on this node, or hands it to the
// pipeline's user and group when spec.files changed. True when it made or changed something.
func (p *StatePrep) Prepare(sp *v1beta1.StreamPipeline) (bool, error) {
	here := false
	for _, s := range sp.Spec.Senders {
		here = here || s.Node == p.Node
	}
	if !here || sp.UID == "" || sp.DeletionTimestamp != nil {
		return false, nil
	}
	uid, gid := sp.Spec.RunAs()
	nsDir := filepath.Join(p.Root, sp.Namespace)
	for _, d := range []string{p.Root, nsDir} {
		// Traversable, not listable: each pipeline's agents reach their own directory only.
		if err := os.Mkdir(d, 0o711); err != nil && !errors.Is(err, fs.ErrExist) { //nolint:gosec // G301: as said
			return false, err
		}
		if err := os.Chmod(d, 0o711); err != nil { //nolint:gosec // G302: a directory, as above
			return false, err
		}
	}
	dir := filepath.Join(nsDir, sp.Name+"-"+string(sp.UID))
	changed := false
	switch info, err := os.Lstat(dir); {
	case errors.Is(err, fs.ErrNotExist):
		if err := os.Mkdir(dir, 0o700); err != nil {
			return false, err
		}
		changed = true
	case err != nil:
		return false, err
	case !info.IsDir():
		return false, fmt.Errorf("%s is not a directory: left as it is", dir)
	default:
		changed = !ownedBy(info, uid, gid)
	}
	if !changed {
		return false, nil
	}
	// The agents own what is in the directory and may change it meanwhile: every path is resolved
	// inside it (os.Root: a link they left, even one swapped in for a directory during the walk,
	// never leads out), and Lchown never follows the link it names.
	root, err := os.OpenRoot(dir)
	if err != nil {
		return false, err
	}
	defer func() { _ = root.Close() }()
	err = fs.WalkDir(root.FS(), ".", func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return root.Lchown(path, int(uid), int(gid))
	})
	if err == nil {
		err = os.Chmod(dir, 0o700) //nolint:gosec // G302: a directory, its owner's only
	}
	if err == nil {
		p.Log.Info("Prepared a pipeline's state directory", "directory", sp.Namespace+"/"+filepath.Base(dir), "uid", uid, "gid", gid)
	}
	return true, err
}
