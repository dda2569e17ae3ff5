// Package storage decides where a StreamPipeline may read and write on its nodes: the
// StorageRoots the facility's admin made (host directories, per node role, per namespace, with
// the users and groups allowed there) and the pipeline's own PersistentVolumeClaims. It checks a
// pipeline against the roots, finds pipelines that would write the same files, and builds the
// PersistentVolumes and claims through which the agent pods mount what they use (so the pods
// themselves carry no hostPath volume and pass Pod Security "restricted"). Pure functions.
package storage

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
)

const (
	// Roles of the nodes, as in the plan.
	RoleSender  = v1beta1.StorageRoleSender
	RoleGateway = v1beta1.StorageRoleGateway

	// StateHostRoot is where senders keep what their gateway acknowledged, one directory per
	// pipeline object (<namespace>/<name>-<uid>), made by the node daemon for the pipeline's user.
	StateHostRoot = "/var/lib/numastream/streams"

	// Labels of the PersistentVolumes made for a pipeline (cluster-scoped: no owner reference).
	LabelPipelineNamespace = "numastream.io/pipeline-namespace"
	LabelPipelineName      = "numastream.io/pipeline"
	LabelPipelineUID       = "numastream.io/pipeline-uid"
	managedBy              = "numastream-operator"

	// Reasons a pipeline is refused.
	ReasonNotAllowed = "StorageNotAllowed"
	ReasonPathInUse  = "PathInUse"
)

// Use is one place a pipeline reads or writes, on one node.
type Use struct {
	// Field of the spec, for messages: spec.sink.hdf5, spec.senders[0].source.file, spec.spill.
	Field string
	Role  string
	Node  string
	// Stream of a sender; -1 for the gateway.
	Stream int
	Root   string
	Claim  string
	// Path relative to the root or the claim.
	Path     string
	ReadOnly bool
	// Spill: a sender's spill directory (Path/<namespace>/<name>-<uid> under the root), or a
	// gateway consumer's (.../<consumer>/stream-<id>: Consumer names it).
	Spill    bool
	Consumer string
	// Series: an hdf5 consumer of Stream V2 sources, one file (or NXmx set) per series.
	Series bool
}

// Uses lists every place the pipeline's pods read or write, senders first.
func Uses(sp *v1beta1.StreamPipeline) []Use {
	var uses []Use
	ids := sp.StreamIDs()
	for i, s := range sp.Spec.Senders {
		field := fmt.Sprintf("spec.senders[%d].source", i)
		if f := s.Source.File; f != nil {
			uses = append(uses, Use{Field: field + ".file", Role: RoleSender, Node: s.Node, Stream: ids[i], Root: f.Root, Claim: f.Claim, Path: f.Path, ReadOnly: true})
		}
		if h := s.Source.HDF5; h != nil {
			uses = append(uses, Use{Field: field + ".hdf5", Role: RoleSender, Node: s.Node, Stream: ids[i], Root: h.Root, Claim: h.Claim, Path: h.Path, ReadOnly: true})
		}
		if sp.Spec.Spill != nil && sp.Spec.Spill.Root != "" {
			uses = append(uses, Use{Field: "spec.spill", Role: RoleSender, Node: s.Node, Stream: ids[i], Root: sp.Spec.Spill.Root, Path: sp.Spec.Spill.Path, Spill: true})
		}
	}
	gw := sp.Spec.Gateway.Node
	for i, k := range sp.Spec.Consumers() {
		field := sp.Spec.ConsumerField(i)
		if k.File != nil {
			uses = append(uses, Use{Field: field + ".file", Role: RoleGateway, Node: gw, Stream: -1, Root: k.File.Root, Claim: k.File.Claim, Path: k.File.Path})
		}
		if k.HDF5 != nil {
			uses = append(uses, Use{Field: field + ".hdf5", Role: RoleGateway, Node: gw, Stream: -1, Root: k.HDF5.Root, Claim: k.HDF5.Claim,
				Path: k.HDF5.Path, Series: seriesSink(sp)})
		}
		if s := k.Spill; s != nil {
			uses = append(uses, Use{Field: field + ".spill", Role: RoleGateway, Node: gw, Stream: -1, Root: s.Root, Path: s.Path, Spill: true, Consumer: k.Name})
		}
	}
	return uses
}

// consumersShareOneVolume refuses file consumers of one gateway that write under different
// roots or claims (the decompressing container mounts one, at /data) or to one path, and
// consumer spills under different roots (it mounts one, at /var/spill).
func consumersShareOneVolume(sp *v1beta1.StreamPipeline) error {
	var seen []Use
	spillRoot := ""
	for _, u := range Uses(sp) {
		if u.Role != RoleGateway {
			continue
		}
		if u.Spill {
			if spillRoot != "" && u.Root != spillRoot {
				return &Refusal{ReasonNotAllowed, u.Field + ".root", fmt.Sprintf(
					"every consumer of a gateway spills under one root (an earlier consumer spills under root %s)", spillRoot)}
			}
			spillRoot = u.Root
			continue
		}
		for _, o := range seen {
			if u.Root != o.Root || u.Claim != o.Claim {
				return &Refusal{ReasonNotAllowed, u.Field, fmt.Sprintf(
					"every file consumer of a gateway writes under one root or claim (%s writes under %s)", o.Field, describeBase(o))}
			}
			if path.Clean(u.Path) == path.Clean(o.Path) {
				return &Refusal{ReasonNotAllowed, u.Field + ".path", fmt.Sprintf("%s writes %q already", o.Field, o.Path)}
			}
		}
		seen = append(seen, u)
	}
	return nil
}

func describeBase(u Use) string {
	if u.Claim != "" {
		return "claim " + u.Claim
	}
	return "root " + u.Root
}

// Refusal says why a pipeline may not use its storage, naming the field.
type Refusal struct {
	Reason, Field, Message string
}

func (r *Refusal) Error() string { return r.Field + ": " + r.Message }

// Check refuses a use of a root that does not exist, does not serve the node's role, is
// read-only where the pipeline writes, or does not admit the pipeline's namespace with the
// user and group its agents run as. A claim is the namespace's own: nothing to check here.
//
// Where the node daemon makes pipelines' directories (prefixes, Served), a pipeline writes in a
// directory of its own: its files (every file consumer's of a gateway) under one directory of
// the root, not in the root itself.
func Check(sp *v1beta1.StreamPipeline, roots map[string]*v1beta1.StorageRoot, prefixes []string) error {
	if err := consumersShareOneVolume(sp); err != nil {
		return err
	}
	if err := writesInADirectory(sp, roots, prefixes); err != nil {
		return err
	}
	uid, gid := sp.Spec.RunAs()
	for _, u := range Uses(sp) {
		// The API refuses both since 0.2.0; pipelines stored by 0.1.0 (host paths) still hold them.
		if u.Root == "" && u.Claim == "" {
			return &Refusal{ReasonNotAllowed, u.Field, fmt.Sprintf(
				"%q names neither a root (a StorageRoot) nor a claim: paths on a node are only reachable through a StorageRoot since numastream 0.2.0 (CHANGELOG.md); name one", u.Path)}
		}
		if !relativeClean(u.Path) && !(u.Spill && u.Path == "") {
			return &Refusal{ReasonNotAllowed, u.Field + ".path", fmt.Sprintf(
				"%q is not a path relative to its root or claim (no leading /, no empty, . or .. segments)", u.Path)}
		}
		if u.Root == "" {
			continue
		}
		field := u.Field + ".root"
		root, ok := roots[u.Root]
		if !ok {
			return &Refusal{ReasonNotAllowed, field, fmt.Sprintf("no StorageRoot %q: storage on the nodes is the admin's to allow (kubectl get storageroots)", u.Root)}
		}
		if !slices.Contains(root.Spec.NodeRoles, u.Role) && len(root.Spec.NodeRoles) > 0 {
			return &Refusal{ReasonNotAllowed, field, fmt.Sprintf("StorageRoot %q serves %s nodes, not %s nodes",
				u.Root, strings.Join(root.Spec.NodeRoles, " and "), u.Role)}
		}
		if root.Spec.ReadOnly && !u.ReadOnly {
			return &Refusal{ReasonNotAllowed, field, fmt.Sprintf("StorageRoot %q is read-only: sources only", u.Root)}
		}
		if !admits(root, sp.Namespace, uid, gid) {
			return &Refusal{ReasonNotAllowed, field, fmt.Sprintf(
				"StorageRoot %q does not admit namespace %s with user %d and group %d (spec.files): ask the admin, or use one of your PersistentVolumeClaims",
				u.Root, sp.Namespace, uid, gid)}
		}
	}
	return nil
}

// WholeRoot refuses a use of a root the node daemon makes no pipelines' directories under
// (prefixes, Served): the pipeline's volume of it would be the whole root, every other
// pipeline's files in it. Such volumes are made only where the admin allows them
// (operator.wholeRootVolumes). Roots that do not exist are Check's to refuse.
func WholeRoot(sp *v1beta1.StreamPipeline, roots map[string]*v1beta1.StorageRoot, prefixes []string) error {
	for _, u := range Uses(sp) {
		root, ok := roots[u.Root]
		if u.Claim != "" || !ok || Served(root, prefixes) {
			continue
		}
		listed := "none set"
		if len(prefixes) > 0 {
			listed = strings.Join(prefixes, ", ")
		}
		return &Refusal{ReasonNotAllowed, u.Field + ".root", fmt.Sprintf(
			"StorageRoot %q (%s) is under none of the directories the node daemon makes pipelines' own directories in "+
				"(operator.hostPathPrefixes: %s): this pipeline's volume would be the whole root, every other pipeline's files in it; "+
				"the admin adds a directory above %s to operator.hostPathPrefixes, or allows whole roots (operator.wholeRootVolumes)",
			u.Root, root.Spec.Path, listed, root.Spec.Path)}
	}
	return nil
}

// writesInADirectory refuses files written directly in a root the node daemon serves: the
// pipeline's volume would be the whole root.
func writesInADirectory(sp *v1beta1.StreamPipeline, roots map[string]*v1beta1.StorageRoot, prefixes []string) error {
	for _, u := range Uses(sp) {
		root, ok := roots[u.Root]
		if u.ReadOnly || u.Spill || u.Claim != "" || !ok || !Served(root, prefixes) || Dir(sp, u, roots, prefixes) != "" {
			continue
		}
		msg := fmt.Sprintf("%q is not in a directory of its own under StorageRoot %q: a pipeline's volume is its own directory of the root, never the whole root (e.g. run-1/%s)",
			u.Path, u.Root, path.Base(u.Path))
		if u.Role == RoleGateway && useDir(sp, u) != "" {
			msg = fmt.Sprintf("the file consumers of a gateway write under one directory of StorageRoot %q (the pipeline's volume); %q and another consumer's path have none in common", u.Root, u.Path)
		}
		return &Refusal{ReasonNotAllowed, u.Field + ".path", msg}
	}
	return nil
}

// relativeClean says p is relative and has no empty, "." or ".." segment: it stays below
// whatever it is joined to.
func relativeClean(p string) bool {
	if p == "" {
		return false
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return false
		}
	}
	return true
}

func admits(root *v1beta1.StorageRoot, namespace string, uid, gid int64) bool {
	in := func(rs []v1beta1.IDRange, id int64) bool {
		return slices.ContainsFunc(rs, func(r v1beta1.IDRange) bool { return r.Contains(id) })
	}
	for _, a := range root.Spec.Access {
		if (slices.Contains(a.Namespaces, namespace) || slices.Contains(a.Namespaces, "*")) && in(a.Users, uid) && in(a.Groups, gid) {
			return true
		}
	}
	return false
}

// Written is a set of files a pipeline writes: Pattern is an absolute path on a node (under a
// root) or a path on a claim, with at most one "*" (any text).
type Written struct {
	Field   string
	Node    string // "" on a claim (its volume is the same from every node)
	Claim   string // namespace/name
	Pattern string
}

// Writes lists what the pipeline writes: its sink's files (each stream's, the .part and .idx
// beside them; a series sink's files for every series id) and its spill directories. Uses of
// roots that do not exist are left out (Check refuses them).
func Writes(sp *v1beta1.StreamPipeline, roots map[string]*v1beta1.StorageRoot) []Written {
	var out []Written
	for _, u := range Uses(sp) {
		if u.ReadOnly {
			continue
		}
		w := Written{Field: u.Field + ".path", Node: u.Node}
		base := u.Path
		if u.Claim != "" {
			w.Node, w.Claim = "", sp.Namespace+"/"+u.Claim
		} else if root, ok := roots[u.Root]; ok {
			base = path.Join(root.Spec.Path, u.Path)
		} else {
			continue
		}
		var patterns []string
		switch {
		case u.Spill:
			patterns = []string{path.Join(base, pipelineDir(sp), u.Consumer) + "/*"}
		case u.Series:
			patterns = []string{seriesPattern(base)}
		default:
			for _, stream := range sp.StreamIDs() {
				p := strings.ReplaceAll(base, "{stream}", fmt.Sprint(stream))
				patterns = append(patterns, p, p+".part", p+".part.idx")
			}
		}
		for _, p := range patterns {
			w.Pattern = p
			out = append(out, w)
		}
	}
	return out
}

// seriesSink: an HDF5 sink of Stream V2 sources writes one file per detector series.
func seriesSink(sp *v1beta1.StreamPipeline) bool {
	for _, s := range sp.Spec.Senders {
		if s.Source.Stream2 == nil {
			return false
		}
	}
	return true
}

// seriesPattern covers every file a series sink may write: the series id replaces "{series}"
// (or goes before the extension as _series_<id>), a series seen again adds -2, -3, ... before
// the extension, and each file is first a .part.
func seriesPattern(p string) string {
	p = strings.ReplaceAll(p, "{stream}", "0")
	if i := strings.Index(p, "{series}"); i >= 0 {
		return p[:i] + "*"
	}
	dot := strings.LastIndex(p, ".")
	if dot < 0 || strings.Contains(p[dot:], "/") {
		dot = len(p)
	}
	return p[:dot] + "_series_*"
}

// Overlap says whether two written sets can name the same file.
func Overlap(a, b Written) bool {
	if a.Node != b.Node || a.Claim != b.Claim {
		return false
	}
	return patternsMeet(a.Pattern, b.Pattern)
}

// patternsMeet: some string matches both patterns (each with at most one "*").
func patternsMeet(p, q string) bool {
	pa, pb, pStar := strings.Cut(p, "*")
	qa, qb, qStar := strings.Cut(q, "*")
	switch {
	case !pStar && !qStar:
		return p == q
	case !pStar:
		return len(p) >= len(qa)+len(qb) && strings.HasPrefix(p, qa) && strings.HasSuffix(p, qb)
	case !qStar:
		return patternsMeet(q, p)
	}
	prefixes := strings.HasPrefix(pa, qa) || strings.HasPrefix(qa, pa)
	suffixes := strings.HasSuffix(pb, qb) || strings.HasSuffix(qb, pb)
	return prefixes && suffixes
}

// Collision finds the first file the pipeline would write that an older pipeline (earlier
// creation, then namespace/name) already writes. Others are every pipeline of the cluster.
// Where volumes are pipelines' own directories (prefixes), two pipelines' directories on a node
// are never one inside the other either.
func Collision(sp *v1beta1.StreamPipeline, others []v1beta1.StreamPipeline, roots map[string]*v1beta1.StorageRoot, prefixes []string) error {
	mine := Writes(sp, roots)
	if len(mine) == 0 {
		return nil
	}
	myDirs := hostDirs(sp, roots, prefixes)
	for i := range others {
		o := &others[i]
		if o.UID == sp.UID || !older(o, sp) || o.DeletionTimestamp != nil {
			continue
		}
		if err := dirsMeet(sp, o, myDirs, roots, prefixes); err != nil {
			return err
		}
		for _, theirs := range Writes(o, roots) {
			for _, w := range mine {
				if !Overlap(w, theirs) {
					continue
				}
				who := "a StreamPipeline of another namespace"
				if o.Namespace == sp.Namespace {
					who = "StreamPipeline " + o.Name
				}
				where := "on node " + w.Node
				if w.Claim != "" {
					where = "on claim " + w.Claim
				}
				return &Refusal{ReasonPathInUse, w.Field, fmt.Sprintf("%s %s is written by %s (%s), created earlier: two pipelines never write the same file; choose another path",
					w.Pattern, where, who, theirs.Pattern)}
			}
		}
	}
	return nil
}

// hostDirs are the host directories of the pipeline's own volumes that it writes in, by node.
type hostDir struct{ field, node, dir string }

func hostDirs(sp *v1beta1.StreamPipeline, roots map[string]*v1beta1.StorageRoot, prefixes []string) []hostDir {
	var out []hostDir
	for _, u := range Uses(sp) {
		if dir := Dir(sp, u, roots, prefixes); !u.ReadOnly && dir != "" {
			out = append(out, hostDir{u.Field + ".path", u.Node, path.Join(roots[u.Root].Spec.Path, dir)})
		}
	}
	return out
}

// dirsMeet refuses sp's directories (mine) when one is o's, or one is inside the other, on one
// node.
func dirsMeet(sp, o *v1beta1.StreamPipeline, mine []hostDir, roots map[string]*v1beta1.StorageRoot, prefixes []string) error {
	if len(mine) == 0 {
		return nil
	}
	for _, theirs := range hostDirs(o, roots, prefixes) {
		for _, d := range mine {
			if d.node != theirs.node || (!Within(d.dir, theirs.dir) && !Within(theirs.dir, d.dir)) {
				continue
			}
			theirsIs := "the directory of a StreamPipeline of another namespace"
			if o.Namespace == sp.Namespace {
				theirsIs = theirs.dir + ", the directory of StreamPipeline " + o.Name
			}
			return &Refusal{ReasonPathInUse, d.field, fmt.Sprintf("directory %s on node %s is, holds or is inside %s, created earlier: each pipeline writes in a directory of its own; choose another path",
				d.dir, d.node, theirsIs)}
		}
	}
	return nil
}

func older(a, b *v1beta1.StreamPipeline) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
}

// pipelineDir names one pipeline object under a shared directory: <namespace>/<name>-<uid>.
func pipelineDir(sp *v1beta1.StreamPipeline) string {
	dir := sp.Name
	if sp.UID != "" {
		dir += "-" + string(sp.UID)
	}
	return sp.Namespace + "/" + dir
}

// SpillDir is a sender's spill directory relative to its root: no two pipelines share one.
func SpillDir(sp *v1beta1.StreamPipeline) string {
	return path.Join(sp.Spec.Spill.Path, pipelineDir(sp))
}

// ConsumerSpillDir is a gateway consumer's spill directory for one stream, relative to the
// spill's root: no two pipelines, consumers or streams share one.
func ConsumerSpillDir(sp *v1beta1.StreamPipeline, k *v1beta1.Consumer, stream int) string {
	return path.Join(k.Spill.Path, pipelineDir(sp), k.Name, fmt.Sprintf("stream-%d", stream))
}

// StateDir is the pipeline's state directory on its sender nodes.
func StateDir(sp *v1beta1.StreamPipeline) string { return StateHostRoot + "/" + pipelineDir(sp) }

// Volume is one PersistentVolumeClaim an agent pod mounts, and the PersistentVolume the
// operator makes for it (nil for the pipeline's own claims).
type Volume struct {
	Claim *corev1.PersistentVolumeClaim
	PV    *corev1.PersistentVolume
}

// ClaimName is the claim a pod of this role, stream and node mounts for a use: the pipeline's
// own, or the one made for the root (or the pipeline's directory of it, dir) on that node.
func ClaimName(sp *v1beta1.StreamPipeline, u Use, dir string) string {
	if u.Claim != "" {
		return u.Claim
	}
	parts := []string{u.Root, u.Node, fmt.Sprint(u.ReadOnly)}
	if dir != "" {
		parts = append(parts, dir)
	}
	return fmt.Sprintf("%s-%s-%s", sp.Name, "storage", hash(parts...)[:10])
}

// Served says the node daemon makes pipelines' directories under the root: its path is one of
// prefixes (the chart's operator.hostPathPrefixes, which the daemon mounts) or under one.
func Served(root *v1beta1.StorageRoot, prefixes []string) bool {
	return slices.ContainsFunc(prefixes, func(p string) bool { return Within(root.Spec.Path, p) })
}

// Within says the absolute path p is the directory dir or under it (a directory, not the start
// of a name: /archive-2 is not within /archive).
func Within(p, dir string) bool {
	dir = path.Clean(dir)
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// Dir is the directory of its root that a use's volume holds, relative to the root: the
// directory its files are in (up to the first placeholder), or for a spill the pipeline's own
// spill directory, common to every use that shares the volume. "" is the whole root (or claim):
// a claim, or a root the node daemon does not serve (Served).
func Dir(sp *v1beta1.StreamPipeline, u Use, roots map[string]*v1beta1.StorageRoot, prefixes []string) string {
	root, ok := roots[u.Root]
	if u.Claim != "" || !ok || !Served(root, prefixes) {
		return ""
	}
	dir, first := "", true
	for _, o := range Uses(sp) {
		if !sameVolume(o, u) {
			continue
		}
		if d := useDir(sp, o); first {
			dir, first = d, false
		} else {
			dir = commonDir(dir, d)
		}
	}
	return dir
}

// sameVolume: two uses reach the host through one volume: one root, node, role, access and kind
// (data or spill); each sender's pod has its own.
func sameVolume(a, b Use) bool {
	return a.Root == b.Root && a.Claim == b.Claim && a.Node == b.Node && a.Role == b.Role &&
		a.ReadOnly == b.ReadOnly && a.Spill == b.Spill && (a.Role == RoleGateway || a.Stream == b.Stream)
}

// useDir is the directory one use needs of its root.
func useDir(sp *v1beta1.StreamPipeline, u Use) string {
	switch {
	case u.Spill && u.Role == RoleSender:
		return SpillDir(sp)
	case u.Spill:
		return path.Join(u.Path, pipelineDir(sp)) // above each consumer's and stream's
	}
	segs := strings.Split(u.Path, "/")
	segs = segs[:len(segs)-1] // the file's name
	for i, s := range segs {
		if strings.Contains(s, "{") {
			segs = segs[:i]
			break
		}
	}
	return strings.Join(segs, "/")
}

// commonDir is the longest directory both a and b are in ("" the root).
func commonDir(a, b string) string {
	as, bs := strings.Split(a, "/"), strings.Split(b, "/")
	n := 0
	for n < len(as) && n < len(bs) && as[n] == bs[n] {
		n++
	}
	return strings.Join(as[:n], "/")
}

// InDir is p (relative to the root) relative to dir, the part of the root a volume holds.
func InDir(p, dir string) string {
	if dir == "" {
		return p
	}
	if p == dir {
		return ""
	}
	return strings.TrimPrefix(p, dir+"/")
}

// StateClaimName is the claim of a sender node's state directory.
func StateClaimName(sp *v1beta1.StreamPipeline, node string) string {
	return fmt.Sprintf("%s-state-%s", sp.Name, hash(node)[:10])
}

// Volumes are the claims and volumes the operator makes for the pipeline: one per root, node
// and access it uses — the pipeline's own directory of the root (Dir) where the node daemon makes
// it, else the whole root — and one per sender node for its state. Each volume is bound to its
// claim from the start: the pods never see the host above it.
func Volumes(sp *v1beta1.StreamPipeline, roots map[string]*v1beta1.StorageRoot, prefixes []string) []Volume {
	var out []Volume
	seen := map[string]bool{}
	add := func(claim, node, hostPath string, hostType corev1.HostPathType, readOnly bool) {
		if seen[claim] {
			return
		}
		seen[claim] = true
		out = append(out, volume(sp, claim, node, hostPath, hostType, readOnly))
	}
	for _, s := range sp.Spec.Senders {
		add(StateClaimName(sp, s.Node), s.Node, StateDir(sp), corev1.HostPathDirectory, false)
	}
	for _, u := range Uses(sp) {
		root, ok := roots[u.Root]
		if u.Claim != "" || !ok {
			continue
		}
		dir := Dir(sp, u, roots, prefixes)
		add(ClaimName(sp, u, dir), u.Node, path.Join(root.Spec.Path, dir), corev1.HostPathDirectory, u.ReadOnly)
	}
	return out
}

func volume(sp *v1beta1.StreamPipeline, claim, node, hostPath string, hostType corev1.HostPathType, readOnly bool) Volume {
	labels := map[string]string{
		"app.kubernetes.io/name":       "numastream",
		"app.kubernetes.io/managed-by": managedBy,
		LabelPipelineNamespace:         sp.Namespace,
		LabelPipelineName:              sp.Name,
		LabelPipelineUID:               string(sp.UID),
	}
	access := corev1.ReadWriteOnce
	if readOnly {
		access = corev1.ReadOnlyMany
	}
	// Nominal: a host directory has no size of its own; the spill's limit is the agent's.
	size := corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}
	pvName := "numastream-" + hash(string(sp.UID), sp.Namespace, sp.Name, claim)[:20]
	pv := &corev1.PersistentVolume{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolume"},
		ObjectMeta: metav1.ObjectMeta{Name: pvName, Labels: labels},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      size,
			AccessModes:                   []corev1.PersistentVolumeAccessMode{access},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain, // the data is never the operator's to delete
			StorageClassName:              "",
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: hostPath, Type: ptr.To(hostType)},
			},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
			}}}},
			ClaimRef: &corev1.ObjectReference{APIVersion: "v1", Kind: "PersistentVolumeClaim", Namespace: sp.Namespace, Name: claim},
		},
	}
	pvc := &corev1.PersistentVolumeClaim{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolumeClaim"},
		ObjectMeta: metav1.ObjectMeta{Name: claim, Namespace: sp.Namespace, Labels: labels,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: v1beta1.GroupVersion.String(), Kind: "StreamPipeline", Name: sp.Name, UID: sp.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{access},
			StorageClassName: ptr.To(""),
			VolumeName:       pvName,
			Resources:        corev1.VolumeResourceRequirements{Requests: size},
		},
	}
	return Volume{Claim: pvc, PV: pv}
}

func hash(parts ...string) string {
	h := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return hex.EncodeToString(h[:])
}
