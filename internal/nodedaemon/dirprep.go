package nodedaemon

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"

	"github.com/go-logr/logr"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/storage"
)

// DirPrep makes, on one node, each StreamPipeline's own directories of the StorageRoots it
// writes under (storage.Dir: the directory its files go in, its spill directory), so that the
// volume the operator binds for it is that directory and never the whole root. Only roots under
// Prefixes (the chart's operator.hostPathPrefixes, mounted in the daemon's pod under HostMount)
// are served. A directory it makes belongs to the pipeline's user and group with the mode of its
// files plus the search bits (0640: 0750); the directories it makes above it are root's, 0755. A
// directory that exists already is left as it is: it may be someone else's.
type DirPrep struct {
	// HostMount is where the host's prefixes are mounted in the daemon's pod: prefix P at
	// HostMount+P.
	HostMount string
	Prefixes  []string
	Node      string
	// Roots reads the cluster's StorageRoots by name.
	Roots func() map[string]*v1beta1.StorageRoot
	Log   logr.Logger
}

// Prepare makes the pipeline's directories on this node that do not exist yet; the host paths it
// made, in order.
func (p *DirPrep) Prepare(sp *v1beta1.StreamPipeline) ([]string, error) {
	if sp.UID == "" || sp.DeletionTimestamp != nil {
		return nil, nil
	}
	roots := p.Roots()
	uid, gid := sp.Spec.RunAs()
	mode := fs.FileMode(sp.Spec.FileMode())
	mode |= (mode & 0o444) >> 2 // search where read
	var made []string
	seen := map[string]bool{}
	for _, u := range storage.Uses(sp) {
		dir := storage.Dir(sp, u, roots, p.Prefixes)
		if u.Node != p.Node || u.ReadOnly || dir == "" {
			continue
		}
		host := path.Join(roots[u.Root].Spec.Path, dir)
		if seen[host] {
			continue
		}
		seen[host] = true
		did, err := p.make(host, int(uid), int(gid), mode)
		if err != nil {
			return made, fmt.Errorf("%s (%s): %w", host, u.Field, err)
		}
		if did {
			made = append(made, host)
			p.Log.Info("Made a pipeline's directory", "directory", host, "pipeline", sp.Namespace+"/"+sp.Name, "uid", uid, "gid", gid, "mode", fmt.Sprintf("%04o", mode))
		}
	}
	return made, nil
}

// make makes host (an absolute host path under one of the prefixes) if it is missing, resolving
// every step inside the prefix (os.Root: a link never leads out of it) and setting owner and mode
// through the directory it opened, never through a name a link could have replaced meanwhile.
func (p *DirPrep) make(host string, uid, gid int, mode fs.FileMode) (bool, error) {
	prefix, rel, ok := p.split(host)
	if !ok {
		return false, errors.New("under none of the prefixes the daemon serves")
	}
	root, err := os.OpenRoot(p.HostMount + prefix)
	if err != nil {
		return false, err
	}
	defer func() { _ = root.Close() }()
	segs := strings.Split(rel, "/")
	for i := range segs {
		name := strings.Join(segs[:i+1], "/")
		last := i == len(segs)-1
		info, err := root.Lstat(name)
		switch {
		case err == nil && !info.IsDir():
			return false, fmt.Errorf("%s is not a directory: left as it is", path.Join(prefix, name))
		case err == nil && last:
			return false, nil // someone's already: left as it is
		case err == nil:
			continue
		case !errors.Is(err, fs.ErrNotExist):
			return false, err
		}
		if err := root.Mkdir(name, 0o700); err != nil {
			return false, err
		}
		if last {
			return true, own(root, name, uid, gid, mode)
		}
		if err := own(root, name, 0, 0, 0o755); err != nil {
			return false, err
		}
	}
	return false, nil
}

// own sets the owner and mode of the directory name through a descriptor of it (O_NOFOLLOW: a
// link swapped in for it is refused, not followed).
func own(root *os.Root, name string, uid, gid int, mode fs.FileMode) error {
	d, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer func() { _ = d.Close() }()
	if err := d.Chown(uid, gid); err != nil {
		return err
	}
	return d.Chmod(mode)
}

// split finds the prefix host is under: the prefix and host relative to it.
func (p *DirPrep) split(host string) (prefix, rel string, ok bool) {
	for _, pre := range p.Prefixes {
		pre = path.Clean(pre)
		if host != pre && storage.Within(host, pre) {
			return pre, strings.TrimPrefix(strings.TrimPrefix(host, pre), "/"), true
		}
	}
	return "", "", false
}
