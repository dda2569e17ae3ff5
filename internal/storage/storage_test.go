package storage

import (
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
)

func roots() map[string]*v1beta1.StorageRoot {
	access := []v1beta1.StorageAccess{{
		Namespaces: []string{"beamline-7"},
		Users:      []v1beta1.IDRange{{Min: 2000, Max: 2999}},
		Groups:     []v1beta1.IDRange{{Min: 2000, Max: 2999}},
	}, {
		Namespaces: []string{"*"},
		Users:      []v1beta1.IDRange{{Min: 65532, Max: 65532}},
		Groups:     []v1beta1.IDRange{{Min: 65532, Max: 65532}},
	}}
	mk := func(name, path string, readOnly bool, roles ...string) *v1beta1.StorageRoot {
		return &v1beta1.StorageRoot{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1beta1.StorageRootSpec{Path: path, NodeRoles: roles, ReadOnly: readOnly, Access: access}}
	}
	return map[string]*v1beta1.StorageRoot{
		"archive":   mk("archive", "/archive", false, RoleGateway),
		"archive-2": mk("archive-2", "/archive/run", false, RoleGateway), // another name for a part of it
		"raw":       mk("raw", "/detector/raw", true, RoleSender),
		"nvme":      mk("nvme", "/nvme", false, RoleSender),
		"tenant-only": {ObjectMeta: metav1.ObjectMeta{Name: "tenant-only"}, Spec: v1beta1.StorageRootSpec{
			Path: "/tenant", NodeRoles: []string{RoleGateway}, Access: access[:1]}},
	}
}

func pipeline(ns, name string, created int, edit func(*v1beta1.StreamPipeline)) *v1beta1.StreamPipeline {
	sp := &v1beta1.StreamPipeline{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(name + "-uid"),
			CreationTimestamp: metav1.NewTime(time.Date(2026, 11, 25, 10, created, 0, 0, time.UTC))},
		Spec: v1beta1.StreamPipelineSpec{
			Senders: []v1beta1.Sender{{Node: "det-a", Source: v1beta1.Source{Synthetic: &v1beta1.SyntheticSource{}}}},
			Gateway: v1beta1.Gateway{Node: "gw-1"},
		},
	}
	if edit != nil {
		edit(sp)
	}
	return sp
}

func fileSink(root, path string) func(*v1beta1.StreamPipeline) {
	return func(sp *v1beta1.StreamPipeline) {
		sp.Spec.Sink = &v1beta1.Sink{File: &v1beta1.FileSource{Root: root, Path: path}}
	}
}

func sinks(ks ...v1beta1.Consumer) func(*v1beta1.StreamPipeline) {
	return func(sp *v1beta1.StreamPipeline) { sp.Spec.Sinks = ks }
}

func fileConsumer(name, root, path string) v1beta1.Consumer {
	return v1beta1.Consumer{Name: name, Sink: v1beta1.Sink{File: &v1beta1.FileSource{Root: root, Path: path}}}
}

func hdf5Consumer(name, root, path string) v1beta1.Consumer {
	return v1beta1.Consumer{Name: name, Sink: v1beta1.Sink{HDF5: &v1beta1.HDF5Dataset{Root: root, Path: path}}}
}

func spilling(k v1beta1.Consumer, root, path string) v1beta1.Consumer {
	k.Spill = &v1beta1.ConsumerSpill{MaxBytes: 1 << 30, Root: root, Path: path}
	return k
}

func ids(uid, gid int64) *v1beta1.Files { return &v1beta1.Files{User: &uid, Group: &gid} }

// refusal checks err: nil when field is "" (allowed), else a Refusal of that field and reason,
// which it returns (nil after a failure).
func refusal(t *testing.T, err error, reason, field string) *Refusal {
	t.Helper()
	var r *Refusal
	switch {
	case field == "" && err != nil:
		t.Fatalf("refused: %v", err)
	case field == "":
		return nil
	case !errors.As(err, &r):
		t.Fatalf("got %v, want a refusal of %s", err, field)
	case r.Field != field || r.Reason != reason:
		t.Errorf("got %s %s: %s; want %s %s", r.Reason, r.Field, r.Message, reason, field)
		return nil
	}
	return r
}

// Every way a pipeline can ask for storage the admin did not give it is refused, naming the field.
func TestCheckRefusesWhatTheAdminDidNotAllow(t *testing.T) {
	cases := map[string]struct {
		ns    string
		edit  func(*v1beta1.StreamPipeline)
		field string // "" allowed
		says  string
	}{
		"no storage":          {"beamline-7", nil, "", ""},
		"default ids, any ns": {"other", fileSink("archive", "x-{stream}.raw"), "", ""},
		"admitted range": {"beamline-7", func(sp *v1beta1.StreamPipeline) {
			fileSink("tenant-only", "x.raw")(sp)
			sp.Spec.Files = ids(2345, 2000)
		}, "", ""},
		"a claim is the namespace's own": {"other", func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sink = &v1beta1.Sink{HDF5: &v1beta1.HDF5Dataset{Claim: "gpfs", Path: "x.h5"}}
			sp.Spec.Files = ids(1, 1)
		}, "", ""},
		// What numastream 0.1.0 stored (host paths, no root) and an upgrade keeps in etcd.
		"a 0.1.0 host path sink": {"beamline-7", func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sink = &v1beta1.Sink{HDF5: &v1beta1.HDF5Dataset{Path: "/scratch/numastream/tomo-{stream}.h5"}}
		}, "spec.sink.hdf5", "names neither a root"},
		"a 0.1.0 host path source": {"beamline-7", func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Senders[0].Source = v1beta1.Source{File: &v1beta1.FileSource{Path: "/data/run-7"}}
		}, "spec.senders[0].source.file", "names neither a root"},
		"an escaping path under a root": {"beamline-7", fileSink("archive", "../etc/cron.d/x"), "spec.sink.file.path", "not a path relative"},
		"an absolute path on a claim": {"other", func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sink = &v1beta1.Sink{HDF5: &v1beta1.HDF5Dataset{Claim: "gpfs", Path: "/x.h5"}}
		}, "spec.sink.hdf5.path", "not a path relative"},
		"no such root":          {"beamline-7", fileSink("etc-kubernetes", "manifests/x.yaml"), "spec.sink.file.root", `no StorageRoot "etc-kubernetes"`},
		"sender root as a sink": {"beamline-7", fileSink("nvme", "x.raw"), "spec.sink.file.root", "serves sender nodes, not gateway nodes"},
		"gateway root as a source": {"beamline-7", func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Senders[0].Source = v1beta1.Source{HDF5: &v1beta1.HDF5Dataset{Root: "archive", Path: "a.h5"}}
		}, "spec.senders[0].source.hdf5.root", "serves gateway nodes, not sender nodes"},
		"read-only root as a spill": {"beamline-7", func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Spill = &v1beta1.Spill{MaxBytes: 1 << 30, Root: "raw"}
		}, "spec.spill.root", "read-only"},
		"namespace not admitted": {"other", fileSink("tenant-only", "x.raw"), "spec.sink.file.root", "does not admit namespace other with user 65532 and group 65532"},
		"user out of range": {"beamline-7", func(sp *v1beta1.StreamPipeline) {
			fileSink("tenant-only", "x.raw")(sp)
			sp.Spec.Files = ids(3000, 2000)
		}, "spec.sink.file.root", "user 3000"},
		// Several consumers (spec.sinks): each checked as its own field; the file consumers of
		// one gateway share one root or claim (one volume) and never one path.
		"sinks under one root": {"beamline-7", sinks(fileConsumer("raw", "archive", "x.raw"), hdf5Consumer("nx", "archive", "x.h5")), "", ""},
		"a sink consumer under another root": {"beamline-7", sinks(fileConsumer("raw", "archive", "x.raw"), hdf5Consumer("nx", "archive-2", "x.h5")),
			"spec.sinks[1].hdf5", "one root or claim (spec.sinks[0].file writes under root archive)"},
		"two sink consumers on one path": {"beamline-7", sinks(fileConsumer("raw", "archive", "x.raw"), fileConsumer("raw2", "archive", "./x.raw")),
			"spec.sinks[1].file.path", `spec.sinks[0].file writes "x.raw" already`},
		"a sink consumer's root refused": {"beamline-7", sinks(fileConsumer("raw", "nvme", "x.raw")), "spec.sinks[0].file.root", "serves sender nodes"},
		"a sink consumer escaping": {"beamline-7", sinks(fileConsumer("raw", "archive", "x.raw"), hdf5Consumer("nx", "archive", "../../etc/x.h5")),
			"spec.sinks[1].hdf5.path", "not a path relative"},
		// A consumer's spill (spec.sinks[].spill) is gateway storage the pipeline writes.
		"a consumer spilling on a gateway root": {"beamline-7", sinks(fileConsumer("raw", "archive", "x.raw"), spilling(fileConsumer("copy", "archive", "y.raw"), "archive", "spill")), "", ""},
		"a consumer spilling on a sender root": {"beamline-7", sinks(spilling(fileConsumer("raw", "archive", "x.raw"), "nvme", "")),
			"spec.sinks[0].spill.root", "serves sender nodes, not gateway nodes"},
		"a consumer spill escaping": {"beamline-7", sinks(spilling(fileConsumer("raw", "archive", "x.raw"), "archive", "../../etc")),
			"spec.sinks[0].spill.path", "not a path relative"},
		"a consumer spilling on no root": {"beamline-7", sinks(spilling(fileConsumer("raw", "archive", "x.raw"), "etc", "")),
			"spec.sinks[0].spill.root", `no StorageRoot "etc"`},
		"consumers spilling under two roots": {"beamline-7", sinks(spilling(fileConsumer("raw", "archive", "x.raw"), "archive", "s"),
			spilling(fileConsumer("copy", "archive", "y.raw"), "tenant-only", "s")),
			"spec.sinks[1].spill.root", "every consumer of a gateway spills under one root (an earlier consumer spills under root archive)"},
		"group out of range": {"beamline-7", func(sp *v1beta1.StreamPipeline) {
			fileSink("archive", "x.raw")(sp)
			sp.Spec.Files = ids(2000, 65532)
		}, "spec.sink.file.root", "group 65532"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			r := refusal(t, Check(pipeline(c.ns, "p", 0, c.edit), roots(), nil), ReasonNotAllowed, c.field)
			if r != nil && !strings.Contains(r.Message, c.says) {
				t.Errorf("%s: %s; want it to say %q", r.Field, r.Message, c.says)
			}
		})
	}
}

// Two pipelines never write the same file: the newer is refused, naming its field, whatever the
// roots or placeholders through which they name it.
func TestCollisionsAreRefusedToTheNewerPipeline(t *testing.T) {
	stream2 := func(path string) func(*v1beta1.StreamPipeline) {
		return func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Senders[0].Source = v1beta1.Source{Stream2: &v1beta1.ZMQEndpoint{Endpoint: "tcp://dcu:31001"}}
			sp.Spec.Sink = &v1beta1.Sink{HDF5: &v1beta1.HDF5Dataset{Root: "archive", Path: path}}
		}
	}
	twoStreams := func(edit func(*v1beta1.StreamPipeline)) func(*v1beta1.StreamPipeline) {
		return func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Senders = append(sp.Spec.Senders, v1beta1.Sender{Node: "det-b", Source: sp.Spec.Senders[0].Source})
			edit(sp)
		}
	}
	cases := map[string]struct {
		older, newer func(*v1beta1.StreamPipeline)
		newerNS      string
		field        string // "" no collision
	}{
		"same file":                       {fileSink("archive", "x.raw"), fileSink("archive", "x.raw"), "ns", "spec.sink.file.path"},
		"other file":                      {fileSink("archive", "x.raw"), fileSink("archive", "y.raw"), "ns", ""},
		"the same through two roots":      {fileSink("archive", "run/x.raw"), fileSink("archive-2", "x.raw"), "ns", "spec.sink.file.path"},
		"another namespace":               {fileSink("archive", "x.raw"), fileSink("archive", "x.raw"), "other", "spec.sink.file.path"},
		"{stream} meets a literal":        {twoStreams(fileSink("archive", "s-{stream}.raw")), fileSink("archive", "s-1.raw"), "ns", "spec.sink.file.path"},
		"{stream} beyond the streams":     {twoStreams(fileSink("archive", "s-{stream}.raw")), fileSink("archive", "s-2.raw"), "ns", ""},
		"a final name is another's .part": {fileSink("archive", "x.raw"), fileSink("archive", "x.raw.part"), "ns", "spec.sink.file.path"},
		"series files meet a literal":     {stream2("eiger-{series}.h5"), fileSink("archive", "eiger-12.h5"), "ns", "spec.sink.file.path"},
		"series without {series}":         {stream2("eiger.h5"), stream2("eiger_series_4.h5"), "ns", "spec.sink.hdf5.path"},
		"series patterns meet":            {stream2("scan/{series}.h5"), stream2("scan/{series}-b.h5"), "ns", "spec.sink.hdf5.path"},
		"series patterns apart":           {stream2("a-{series}.h5"), stream2("b-{series}.h5"), "ns", ""},
		"the same path on a claim": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sink = &v1beta1.Sink{File: &v1beta1.FileSource{Claim: "gpfs", Path: "x.raw"}}
		}, func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sink = &v1beta1.Sink{File: &v1beta1.FileSource{Claim: "gpfs", Path: "x.raw"}}
		}, "ns", "spec.sink.file.path"},
		"same claim name, other namespace": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sink = &v1beta1.Sink{File: &v1beta1.FileSource{Claim: "gpfs", Path: "x.raw"}}
		}, func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sink = &v1beta1.Sink{File: &v1beta1.FileSource{Claim: "gpfs", Path: "x.raw"}}
		}, "other", ""},
		"spills never meet": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Spill = &v1beta1.Spill{MaxBytes: 1 << 30, Root: "nvme", Path: "spill"}
		}, func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Spill = &v1beta1.Spill{MaxBytes: 1 << 30, Root: "nvme", Path: "spill"}
		}, "ns", ""},
		"a sink into another's spill": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Spill = &v1beta1.Spill{MaxBytes: 1 << 30, Root: "nvme", Path: "spill"}
		}, func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Gateway.Node = "det-a"
			sp.Spec.Sink = &v1beta1.Sink{File: &v1beta1.FileSource{Root: "nvme", Path: "spill/ns/old-old-uid/stream-0.spill"}}
		}, "ns", "spec.sink.file.path"},
		"consumer spills never meet": {sinks(spilling(fileConsumer("raw", "archive", "old.raw"), "archive", "spill")),
			sinks(spilling(fileConsumer("raw", "archive", "young.raw"), "archive", "spill")), "ns", ""},
		"a sink into another's consumer spill": {sinks(spilling(fileConsumer("raw", "archive", "x.raw"), "archive", "spill")),
			fileSink("archive", "spill/ns/old-old-uid/raw/stream-0/x.spill"), "ns", "spec.sink.file.path"},
		"same path, other gateway": {fileSink("archive", "x.raw"), func(sp *v1beta1.StreamPipeline) {
			fileSink("archive", "x.raw")(sp)
			sp.Spec.Gateway.Node = "gw-2"
		}, "ns", ""},
	}
	all := roots()
	all["nvme"].Spec.NodeRoles = []string{RoleSender, RoleGateway}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			old := pipeline("ns", "old", 0, c.older)
			young := pipeline(c.newerNS, "young", 1, c.newer)
			others := []v1beta1.StreamPipeline{*old, *young}
			if err := Collision(old, others, all, nil); err != nil {
				t.Errorf("the older pipeline is refused: %v", err)
			}
			r := refusal(t, Collision(young, others, all, nil), ReasonPathInUse, c.field)
			if r != nil && c.newerNS != "ns" && strings.Contains(r.Message, "old") {
				t.Errorf("names a pipeline of another namespace: %s", r.Message)
			}
		})
	}
}

// Where the node daemon makes pipelines' directories (a root under a prefix), each volume is the
// pipeline's own directory of the root, never the whole root; elsewhere, the whole root.
func TestVolumesAreThePipelinesOwnDirectories(t *testing.T) {
	all := roots()
	all["nvme"].Spec.NodeRoles = []string{RoleSender, RoleGateway}
	hostPaths := func(sp *v1beta1.StreamPipeline, prefixes []string) map[string]bool {
		out := map[string]bool{}
		for _, v := range Volumes(sp, all, prefixes) {
			if p := v.PV.Spec.HostPath.Path; !strings.HasPrefix(p, StateHostRoot) {
				out[p+map[bool]string{true: " ro", false: ""}[v.Claim.Spec.AccessModes[0] == "ReadOnlyMany"]] = true
			}
		}
		return out
	}
	sp := pipeline("beamline-7", "p", 0, func(sp *v1beta1.StreamPipeline) {
		sp.Spec.Senders[0].Source = v1beta1.Source{File: &v1beta1.FileSource{Root: "raw", Path: "visit-1/scan-3/frames.raw"}}
		sp.Spec.Spill = &v1beta1.Spill{MaxBytes: 1 << 30, Root: "nvme", Path: "spill"}
		sinks(fileConsumer("raw", "archive", "visit-1/run-{stream}/x.raw"), spilling(hdf5Consumer("nx", "archive", "visit-1/nx/{stream}.h5"), "nvme", "cs"))(sp)
		sp.Spec.Files = ids(2000, 2000)
	})
	if err := Check(sp, all, []string{"/archive", "/detector", "/nvme"}); err != nil {
		t.Fatal(err)
	}
	got := hostPaths(sp, []string{"/archive", "/detector", "/nvme"})
	want := map[string]bool{
		"/detector/raw/visit-1/scan-3 ro": true, // the source's directory, read-only
		"/nvme/spill/beamline-7/p-p-uid":  true, // the sender's spill
		"/archive/visit-1":                true, // both consumers' files, up to a placeholder
		"/nvme/cs/beamline-7/p-p-uid":     true, // the consumers' spills
	}
	if !maps.Equal(got, want) {
		t.Errorf("host paths %v, want %v", got, want)
	}
	// Only /archive served: the other roots whole, as before.
	got = hostPaths(sp, []string{"/archive/"})
	want = map[string]bool{"/detector/raw ro": true, "/nvme": true, "/archive/visit-1": true}
	if !maps.Equal(got, want) {
		t.Errorf("host paths %v, want %v", got, want)
	}
	// A prefix names directories, not the start of a name.
	if Served(all["archive"], []string{"/arch"}) || !Served(all["archive-2"], []string{"/archive"}) {
		t.Error("Served matches names, not directories")
	}
	// Another pipeline's claim for the same root and node is another claim.
	other := pipeline("beamline-7", "q", 1, sinks(fileConsumer("raw", "archive", "visit-2/x.raw")))
	mine, theirs := Volumes(sp, all, []string{"/archive"}), Volumes(other, all, []string{"/archive"})
	for _, a := range mine {
		for _, b := range theirs {
			if a.PV.Name == b.PV.Name {
				t.Errorf("two pipelines share volume %s", a.PV.Name)
			}
		}
	}
}

// A pipeline writing straight into a served root, or whose consumers share no directory, would
// have the whole root as its volume: refused, naming the field.
func TestCheckRefusesAVolumeOfTheWholeRoot(t *testing.T) {
	served := []string{"/archive"}
	for name, c := range map[string]struct {
		edit        func(*v1beta1.StreamPipeline)
		field, says string
	}{
		"a file in the root":      {fileSink("archive", "x-{stream}.raw"), "spec.sink.file.path", "not in a directory of its own"},
		"a placeholder on top":    {fileSink("archive", "{stream}/x.raw"), "spec.sink.file.path", "not in a directory of its own"},
		"consumers apart":         {sinks(fileConsumer("a", "archive", "a/x.raw"), fileConsumer("b", "archive", "b/x.raw")), "spec.sinks[0].file.path", "under one directory"},
		"consumers in one":        {sinks(fileConsumer("a", "archive", "v/a/x.raw"), fileConsumer("b", "archive", "v/b/x.raw")), "", ""},
		"a file in its directory": {fileSink("archive", "run/x.raw"), "", ""},
		"a root the daemon does not serve": {func(sp *v1beta1.StreamPipeline) {
			fileSink("tenant-only", "x.raw")(sp)
			sp.Spec.Files = ids(2000, 2000)
		}, "", ""},
	} {
		t.Run(name, func(t *testing.T) {
			r := refusal(t, Check(pipeline("beamline-7", "p", 0, c.edit), roots(), served), ReasonNotAllowed, c.field)
			if r != nil && !strings.Contains(r.Message, c.says) {
				t.Errorf("%s: %s; want it to say %q", r.Field, r.Message, c.says)
			}
		})
	}
}

// A root the node daemon makes no directories under would be a pipeline's volume whole: refused
// (unless the admin allows whole roots, which the operator decides), naming the field, the root's
// path and what the admin can do; a claim, or a root under a prefix, is not.
func TestWholeRootRefusesAVolumeOfARootNoPrefixServes(t *testing.T) {
	for name, c := range map[string]struct {
		edit     func(*v1beta1.StreamPipeline)
		prefixes []string
		field    string
		says     []string
	}{
		"no prefixes":                {fileSink("archive", "run/x.raw"), nil, "spec.sink.file.root", []string{"/archive", "none set", "operator.wholeRootVolumes"}},
		"another prefix":             {fileSink("archive", "run/x.raw"), []string{"/scratch", "/data"}, "spec.sink.file.root", []string{"/scratch, /data", "operator.hostPathPrefixes"}},
		"a prefix that is a sibling": {fileSink("archive", "run/x.raw"), []string{"/arch"}, "spec.sink.file.root", []string{"/archive"}},
		"served":                     {fileSink("archive", "run/x.raw"), []string{"/archive"}, "", nil},
		"served from above":          {fileSink("archive", "run/x.raw"), []string{"/"}, "", nil},
		"a claim": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sink = &v1beta1.Sink{File: &v1beta1.FileSource{Claim: "mine", Path: "x.raw"}}
		}, nil, "", nil},
		"a source read from a root": {func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Senders[0].Source = v1beta1.Source{File: &v1beta1.FileSource{Root: "archive", Path: "in/x.raw"}}
		}, nil, "spec.senders[0].source.file.root", []string{"/archive"}},
	} {
		t.Run(name, func(t *testing.T) {
			r := refusal(t, WholeRoot(pipeline("beamline-7", "p", 0, c.edit), roots(), c.prefixes), ReasonNotAllowed, c.field)
			for _, s := range c.says {
				if r != nil && !strings.Contains(r.Message, s) {
					t.Errorf("%s: %s; want it to say %q", r.Field, r.Message, s)
				}
			}
		})
	}
}

// Two pipelines' directories on a node are never one inside the other: the newer is refused.
func TestPipelinesDirectoriesNeverNest(t *testing.T) {
	all := roots()
	served := []string{"/archive"}
	for name, c := range map[string]struct {
		older, newer func(*v1beta1.StreamPipeline)
		newerNS      string
		field        string
	}{
		"one directory":          {fileSink("archive", "run/x.raw"), fileSink("archive", "run/y.raw"), "beamline-7", "spec.sink.file.path"},
		"inside the other's":     {fileSink("archive", "run/x.raw"), fileSink("archive", "run/a/y.raw"), "other", "spec.sink.file.path"},
		"holding the other's":    {fileSink("archive", "run/a/x.raw"), fileSink("archive", "run/y.raw"), "beamline-7", "spec.sink.file.path"},
		"through another root":   {fileSink("archive", "run/a/x.raw"), fileSink("archive-2", "a/y.raw"), "beamline-7", "spec.sink.file.path"},
		"siblings":               {fileSink("archive", "run/a/x.raw"), fileSink("archive", "run/b/y.raw"), "beamline-7", ""},
		"a name's prefix":        {fileSink("archive", "run/a/x.raw"), fileSink("archive", "run/ab/y.raw"), "beamline-7", ""},
		"not served: files only": {fileSink("tenant-only", "run/x.raw"), fileSink("tenant-only", "run/y.raw"), "beamline-7", ""},
	} {
		t.Run(name, func(t *testing.T) {
			old := pipeline("beamline-7", "old", 0, c.older)
			young := pipeline(c.newerNS, "young", 1, c.newer)
			others := []v1beta1.StreamPipeline{*old, *young}
			if err := Collision(old, others, all, served); err != nil {
				t.Errorf("the older pipeline is refused: %v", err)
			}
			r := refusal(t, Collision(young, others, all, served), ReasonPathInUse, c.field)
			if r != nil && c.newerNS != "beamline-7" && strings.Contains(r.Message, "StreamPipeline old") {
				t.Errorf("names a pipeline of another namespace: %s", r.Message)
			}
		})
	}
}
