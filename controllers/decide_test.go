package controllers

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/curvekeys"
	"github.com/numastream/numastream/internal/render"
	"github.com/numastream/numastream/internal/topology"
)

// decideWorld is a running pipeline as Decide sees it: its nodes' facts, the Jobs and the key
// Secret of its last pass.
type decideWorld struct {
	nodes  map[string]topology.Node
	jobs   map[string]*batchv1.Job
	pods   []corev1.Pod // one running pod per Job
	secret *corev1.Secret
	opts   decideOptions
}

func newDecideWorld(t *testing.T) *decideWorld {
	t.Helper()
	w := &decideWorld{nodes: map[string]topology.Node{}, jobs: map[string]*batchv1.Job{},
		opts: decideOptions{Render: render.Options{AgentImage: "numastream/agent:1.0", NetworkPolicy: true},
			Now: time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC), NewPair: curvekeys.New}}
	for _, n := range []*corev1.Node{
		facilityNode("det-a", []int{16, 16}, "ens1f0", 1, 100000), facilityNode("det-b", []int{16, 16}, "ens1f0", 1, 100000),
		facilityNode("det-c", []int{16, 16}, "ens1f0", 1, 100000), facilityNode("gw", []int{64, 64}, "ens1f0", 1, 400000),
	} {
		node, err := topology.FromLabels(n.Name, n.Labels)
		if err == nil {
			node, err = node.ForCodec("lz4")
		}
		if err != nil {
			t.Fatal(err)
		}
		w.nodes[n.Name] = node
	}
	return w
}

// facts are what gather would read for sp in this world.
func (w *decideWorld) facts(sp *v1beta1.StreamPipeline) facts {
	f := facts{gateway: w.nodes[sp.Spec.Gateway.Node], jobs: w.jobs, pods: w.pods, keysSecret: w.secret, senderAddresses: map[int][]string{}}
	for _, s := range sp.Spec.Senders {
		f.senders = append(f.senders, w.nodes[s.Node])
	}
	return f
}

// decide runs one pass over sp (stream ids assigned first, as Reconcile does) and, as execute
// would, makes the world what it decided: Jobs created (replaced ones stay until a later pass),
// deleted, and the key Secret written.
func (w *decideWorld) decide(t *testing.T, sp *v1beta1.StreamPipeline) (Decision, map[string]JobAction) {
	t.Helper()
	sp.AssignStreams()
	d, err := Decide(sp, w.facts(sp), w.opts)
	if err != nil {
		t.Fatal(err)
	}
	if d.Facts.Refusal != nil {
		t.Fatalf("refused: %s: %s", d.Facts.Refusal.Reason, d.Facts.Refusal.Message)
	}
	actions := map[string]JobAction{}
	for _, s := range d.Jobs {
		actions[s.Name] = s.Action
	}
	return d, actions
}

// run applies a decision to the world: the Jobs it creates exist, with their plan hash, and
// run a pod each (the kubelet's part); those it deletes are gone with their pods.
func (w *decideWorld) run(d Decision) {
	for _, s := range d.Jobs {
		switch s.Action {
		case JobCreate:
			j := s.Desired.DeepCopy()
			j.UID = types.UID("uid-" + j.Name)
			w.jobs[j.Name] = j
			w.pods = append(w.pods, corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: j.Name + "-pod", Labels: map[string]string{batchv1.JobNameLabel: j.Name},
				OwnerReferences: []metav1.OwnerReference{{Kind: "Job", Name: j.Name, UID: j.UID, Controller: new(true)}}},
				Status: corev1.PodStatus{Phase: corev1.PodRunning}})
		case JobDelete, JobReplace:
			delete(w.jobs, s.Name)
			w.pods = slices.DeleteFunc(w.pods, func(p corev1.Pod) bool { return p.Labels[batchv1.JobNameLabel] == s.Name })
		}
	}
	if d.Keys.write != nil {
		w.secret = d.Keys.write
	}
}

func twoSenders() *v1beta1.StreamPipeline {
	sp := &v1beta1.StreamPipeline{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "beamline", UID: "uid-p", Generation: 1},
		Spec: v1beta1.StreamPipelineSpec{
			Gateway: v1beta1.Gateway{Node: "gw", Network: v1beta1.DataNetwork{NIC: "ens1f0", Attachment: "hsn", Address: "10.215.0.100"}},
			Codec:   "lz4", Port: 5555, ExpectedRatio: "2.0",
		},
	}
	for _, n := range []string{"det-a", "det-b"} {
		sp.Spec.Senders = append(sp.Spec.Senders, v1beta1.Sender{Node: n, Source: v1beta1.Source{Synthetic: &v1beta1.SyntheticSource{Chunks: 1000}}})
	}
	return sp
}

// runningTwoSenders is a world where twoSenders' first pass has made its Jobs, each running a pod.
func runningTwoSenders(t *testing.T) (*decideWorld, *v1beta1.StreamPipeline) {
	t.Helper()
	w := newDecideWorld(t)
	sp := twoSenders()
	d, _ := w.decide(t, sp)
	w.run(d)
	sp.Status = d.Status
	return w, sp
}

// Every edit of a running pipeline's spec (and every upgrade of the operator's settings) decides
// what happens to each of its Jobs: kept, created, deleted, or replaced (its stream drains and
// resumes where it stopped). Stream ids never move: a Job named after a stream stays that
// detector's.
func TestDecideActsOnEveryEditOfARunningPipeline(t *testing.T) {
	const (
		s0, s1, s2 = "p-sender-0", "p-sender-1", "p-sender-2"
		g0, g1, g2 = "p-gateway-0", "p-gateway-1", "p-gateway-2"
	)
	all := func(a JobAction) map[string]JobAction {
		return map[string]JobAction{s0: a, s1: a, g0: a, g1: a}
	}
	// rolled: stream 0 is replaced first; stream 1 runs on and waits its turn (spec.rollout).
	rolled := map[string]JobAction{s0: JobReplace, g0: JobReplace, s1: JobRoll, g1: JobRoll}
	userKeys := func(w *decideWorld, sp *v1beta1.StreamPipeline) {
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "facility-keys", Namespace: sp.Namespace}, Data: map[string][]byte{}}
		pairs := [][2]string{{render.GatewaySecretKey, render.GatewayPublicKey}, {render.SenderSecretKey(0), render.SenderPublicKey(0)},
			{render.SenderSecretKey(1), render.SenderPublicKey(1)}}
		for _, p := range pairs {
			kp, err := curvekeys.New()
			if err != nil {
				t.Fatal(err)
			}
			sec.Data[p[0]], sec.Data[p[1]] = []byte(kp.Secret), []byte(kp.Public)
		}
		w.secret = sec
		sp.Spec.Security = &v1beta1.Security{KeysSecret: sec.Name}
	}
	cases := []struct {
		name string
		edit func(w *decideWorld, sp *v1beta1.StreamPipeline)
		want map[string]JobAction
		// streams are the stream ids of spec.senders after the edit.
		streams []int
	}{
		{"nothing changes", func(*decideWorld, *v1beta1.StreamPipeline) {}, all(JobKeep), []int{0, 1}},
		{"the operator is upgraded with a new agent image", func(w *decideWorld, _ *v1beta1.StreamPipeline) {
			w.opts.Render.AgentImage = "numastream/agent:1.1"
		}, rolled, []int{0, 1}},
		{"a sender is added", func(_ *decideWorld, sp *v1beta1.StreamPipeline) {
			sp.Spec.Senders = append(sp.Spec.Senders, v1beta1.Sender{Node: "det-c", Source: sp.Spec.Senders[0].Source})
		}, map[string]JobAction{s0: JobKeep, s1: JobKeep, g0: JobKeep, g1: JobKeep, s2: JobCreate, g2: JobCreate}, []int{0, 1, 2}},
		{"the first sender is removed", func(_ *decideWorld, sp *v1beta1.StreamPipeline) {
			sp.Spec.Senders = sp.Spec.Senders[1:]
		}, map[string]JobAction{s0: JobDelete, g0: JobDelete, s1: JobKeep, g1: JobKeep}, []int{1}},
		{"the last sender is removed", func(_ *decideWorld, sp *v1beta1.StreamPipeline) {
			sp.Spec.Senders = sp.Spec.Senders[:1]
		}, map[string]JobAction{s0: JobKeep, g0: JobKeep, s1: JobDelete, g1: JobDelete}, []int{0}},
		{"the senders are reordered", func(_ *decideWorld, sp *v1beta1.StreamPipeline) {
			slices.Reverse(sp.Spec.Senders)
		}, all(JobKeep), []int{1, 0}},
		{"one sender is replaced by another node", func(_ *decideWorld, sp *v1beta1.StreamPipeline) {
			sp.Spec.Senders[0].Node = "det-c"
		}, map[string]JobAction{s0: JobDelete, g0: JobDelete, s2: JobCreate, g2: JobCreate, s1: JobKeep, g1: JobKeep}, []int{2, 1}},
		{"one sender's source changes", func(_ *decideWorld, sp *v1beta1.StreamPipeline) {
			sp.Spec.Senders[1].Source.Synthetic.Chunks = 5000
		}, map[string]JobAction{s0: JobKeep, g0: JobKeep, s1: JobReplace, g1: JobKeep}, []int{0, 1}},
		{"the codec changes", func(_ *decideWorld, sp *v1beta1.StreamPipeline) { sp.Spec.Codec = "zstd" }, rolled, []int{0, 1}},
		{"the connections change", func(_ *decideWorld, sp *v1beta1.StreamPipeline) { sp.Spec.Connections = new(int32(3)) }, rolled, []int{0, 1}},
		{"a sink is added", func(_ *decideWorld, sp *v1beta1.StreamPipeline) {
			sp.Spec.Sink = &v1beta1.Sink{ZMQ: &v1beta1.ZMQEndpoint{Endpoint: "tcp://analysis:9000"}}
		}, map[string]JobAction{s0: JobKeep, s1: JobKeep, g0: JobReplace, g1: JobRoll}, []int{0, 1}},
		{"a spill is added", func(_ *decideWorld, sp *v1beta1.StreamPipeline) {
			sp.Spec.Spill = &v1beta1.Spill{MaxBytes: 1 << 30}
		}, map[string]JobAction{s0: JobReplace, s1: JobRoll, g0: JobKeep, g1: JobKeep}, []int{0, 1}},
		{"turning host networking on", func(_ *decideWorld, sp *v1beta1.StreamPipeline) { sp.Spec.HostNetwork = true }, rolled, []int{0, 1}},
		{"the data network's attachment changes", func(_ *decideWorld, sp *v1beta1.StreamPipeline) {
			sp.Spec.Gateway.Network.Attachment = "hsn-2"
		}, rolled, []int{0, 1}},
		{"the keys move to a Secret the user names", userKeys, rolled, []int{0, 1}},
		{"a key rotation is asked for", func(_ *decideWorld, sp *v1beta1.StreamPipeline) {
			sp.Annotations = map[string]string{v1beta1.AnnotationRotateKeys: "now"}
		}, rolled, []int{0, 1}},
		{"the operator is upgraded, the pipeline rolls every stream at once", func(w *decideWorld, sp *v1beta1.StreamPipeline) {
			w.opts.Render.AgentImage = "numastream/agent:1.1"
			sp.Spec.Rollout = &v1beta1.Rollout{MaxStreams: new(int32(0))}
		}, all(JobReplace), []int{0, 1}},
		{"the operator is upgraded, the pipeline rolls two streams at a time", func(w *decideWorld, sp *v1beta1.StreamPipeline) {
			w.opts.Render.AgentImage = "numastream/agent:1.1"
			sp.Spec.Rollout = &v1beta1.Rollout{MaxStreams: new(int32(2))}
		}, all(JobReplace), []int{0, 1}},
		// The streams' port blocks move into each other's on the nodes: all at once.
		{"host networking: the connections change", func(_ *decideWorld, sp *v1beta1.StreamPipeline) {
			sp.Spec.Connections = new(int32(3))
		}, all(JobReplace), []int{0, 1}},
		// Kept, and applied suspended: the Job controller stops the pods and the agents drain.
		{"host networking: a sender is added", func(_ *decideWorld, sp *v1beta1.StreamPipeline) {
			sp.Spec.Senders = append(sp.Spec.Senders, v1beta1.Sender{Node: "det-c", Source: sp.Spec.Senders[0].Source})
		}, map[string]JobAction{s0: JobKeep, s1: JobKeep, g0: JobKeep, g1: JobKeep, s2: JobCreate, g2: JobCreate}, []int{0, 1, 2}},
		{"host networking: the first sender is removed", func(_ *decideWorld, sp *v1beta1.StreamPipeline) {
			sp.Spec.Senders = sp.Spec.Senders[1:]
		}, map[string]JobAction{s0: JobDelete, g0: JobDelete, s1: JobKeep, g1: JobKeep}, []int{1}},
		{"host networking: the senders are reordered", func(_ *decideWorld, sp *v1beta1.StreamPipeline) {
			slices.Reverse(sp.Spec.Senders)
		}, all(JobKeep), []int{1, 0}},
		{"host networking: turned off", func(_ *decideWorld, sp *v1beta1.StreamPipeline) { sp.Spec.HostNetwork = false }, rolled, []int{0, 1}},
		{"the pipeline is suspended", func(_ *decideWorld, sp *v1beta1.StreamPipeline) { sp.Spec.Suspend = true }, all(JobKeep), []int{0, 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := newDecideWorld(t)
			sp := twoSenders()
			// "host network...": the pipeline runs with host networking before the edit (each
			// stream's slot holds its data and metrics ports on the nodes).
			sp.Spec.HostNetwork = strings.HasPrefix(tc.name, "host networking:")
			d, first := w.decide(t, sp)
			if !maps.Equal(first, map[string]JobAction{s0: JobCreate, s1: JobCreate, g0: JobCreate, g1: JobCreate}) {
				t.Fatalf("a new pipeline: %v", first)
			}
			w.run(d)
			sp.Status = d.Status
			if _, again := w.decide(t, sp); !maps.Equal(again, all(JobKeep)) {
				t.Fatalf("a second pass over what the first made: %v", again)
			}
			tc.edit(w, sp)
			sp.Generation++
			d, got := w.decide(t, sp)
			if !maps.Equal(got, tc.want) {
				t.Errorf("Job actions %v, want %v", got, tc.want)
			}
			if ids := sp.StreamIDs(); !slices.Equal(ids, tc.streams) {
				t.Errorf("stream ids %v, want %v", ids, tc.streams)
			}
			for _, s := range d.Jobs {
				if s.Desired != nil && ptr.Deref(s.Desired.Spec.Suspend, false) != sp.Spec.Suspend {
					t.Errorf("%s suspended %v, the pipeline %v", s.Name, ptr.Deref(s.Desired.Spec.Suspend, false), sp.Spec.Suspend)
				}
			}
			// Then the passes that follow: a replaced Job is created again with the new plan on
			// the next pass and its pod runs; a stream waiting its turn is replaced once the one
			// before runs; never more streams replaced at once than spec.rollout allows.
			limit := sp.Spec.RolloutMaxStreams()
			if sp.Spec.Suspend || strings.Contains(tc.name, "connections change") && sp.Spec.HostNetwork {
				limit = 0
			}
			for pass := 1; ; pass++ {
				if d.Facts.Replacing != slices.ContainsFunc(slices.Collect(maps.Values(got)), func(a JobAction) bool {
					return a == JobReplace || a == JobRoll || a == JobDeleting
				}) {
					t.Errorf("pass %d: Replacing %v with actions %v", pass, d.Facts.Replacing, got)
				}
				replacing := map[string]bool{}
				for name, a := range got {
					if a == JobReplace {
						replacing[name[strings.LastIndex(name, "-")+1:]] = true
					}
				}
				if limit > 0 && len(replacing) > limit {
					t.Errorf("pass %d: streams %v replaced at once, spec.rollout allows %d", pass, slices.Collect(maps.Keys(replacing)), limit)
				}
				if !slices.ContainsFunc(slices.Collect(maps.Values(got)), func(a JobAction) bool { return a != JobKeep }) {
					if len(d.Status.RollPending) > 0 {
						t.Errorf("settled, streams still waiting their turn: %v", d.Status.RollPending)
					}
					break
				}
				if pass > 8 {
					t.Fatalf("not settled after %d passes: %v", pass, got)
				}
				w.run(d)
				sp.Status = d.Status
				d, got = w.decide(t, sp)
			}
		})
	}
}

// A Job being deleted is waited for (its stream drains), a sender waiting for its gateway's
// data-network address is held (the one that runs goes on), and a re-plan that changes only CPUs
// resizes the one running pod in place, or replaces the Job when the kubelet cannot.
func TestDecideWaitsHoldsAndResizes(t *testing.T) {
	w, sp := runningTwoSenders(t)

	t.Run("a Job being deleted", func(t *testing.T) {
		j := w.jobs["p-gateway-1"].DeepCopy()
		now := metav1.Now()
		j.DeletionTimestamp = &now
		saved := w.jobs["p-gateway-1"]
		w.jobs["p-gateway-1"] = j
		defer func() { w.jobs["p-gateway-1"] = saved }()
		d, got := w.decide(t, sp.DeepCopy())
		if got["p-gateway-1"] != JobDeleting || got["p-gateway-0"] != JobKeep || !d.Facts.Replacing {
			t.Errorf("actions %v, replacing %v", got, d.Facts.Replacing)
		}
	})
	t.Run("senders wait for their gateway's address", func(t *testing.T) {
		held := sp.DeepCopy()
		held.Spec.Gateway.Network.Address = "" // from Multus once the gateway pod runs
		d, got := w.decide(t, held)
		if got["p-sender-0"] != JobHold || got["p-sender-1"] != JobHold || got["p-gateway-0"] == JobHold {
			t.Fatalf("actions %v", got)
		}
		for _, j := range d.Facts.Jobs {
			if strings.HasPrefix(j.Name, "p-sender-") && (j.Object == nil || j.HeldBack != "") {
				t.Errorf("a running sender held back as if it were not there: %+v", j)
			}
		}
	})
	t.Run("a re-plan that changes only CPUs", func(t *testing.T) {
		// Two connections and plain TCP: a higher ratio changes the compressing threads only.
		w := newDecideWorld(t)
		sp := twoSenders()
		sp.Spec.Connections, sp.Spec.Security = new(int32(2)), &v1beta1.Security{Mode: v1beta1.SecurityNone}
		d, _ := w.decide(t, sp)
		w.run(d)
		sp.Status = d.Status
		replanned := sp.DeepCopy()
		replanned.Status.Replan = &v1beta1.Replan{Reason: "observed ratio 3.5", Ratio: "3.5", ObservedAt: metav1.Now()}
		pods := []corev1.Pod{}
		for name := range w.jobs {
			p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name + "-x", Labels: map[string]string{batchv1.JobNameLabel: name}},
				Status: corev1.PodStatus{Phase: corev1.PodRunning}}
			pods = append(pods, p)
		}
		replanned.AssignStreams()
		f := w.facts(replanned)
		f.pods = pods
		d, err := Decide(replanned, f, w.opts)
		if err != nil || d.Facts.Refusal != nil {
			t.Fatal(err, d.Facts.Refusal)
		}
		if !resizable(sp.Status.Plan, d.Status.Plan) {
			t.Fatalf("the re-plan changed more than CPUs: %s -> %s", describePlan(sp.Status.Plan), describePlan(d.Status.Plan))
		}
		resized := 0
		for _, s := range d.Jobs {
			switch {
			case s.Action == JobResize && s.Pod != nil && s.Pod.Labels[batchv1.JobNameLabel] == s.Name:
				resized++
			case s.Action != JobKeep:
				t.Errorf("%s: %s", s.Name, s.Action)
			}
		}
		if resized == 0 || d.Replan == nil {
			t.Errorf("nothing resized in place (%d), replan %+v", resized, d.Replan)
		}
		// The kubelet said it cannot (exclusive CPUs without KEP-5554): replaced.
		for i := range f.pods {
			f.pods[i].Status.Conditions = []corev1.PodCondition{{Type: corev1.PodResizePending, Status: corev1.ConditionTrue, Reason: corev1.PodReasonInfeasible, Message: "static CPU manager"}}
		}
		for _, s := range d.Jobs {
			if s.Action == JobResize {
				j := f.jobs[s.Name].DeepCopy()
				j.Annotations[AnnotationResizedTo] = s.Desired.Annotations[render.AnnotationPlanHash]
				f.jobs[s.Name] = j
			}
		}
		d, _ = Decide(replanned, f, w.opts)
		for _, s := range d.Jobs {
			if s.Action == JobResize || s.Action == JobResized {
				t.Errorf("%s %s although the kubelet refused the resize", s.Name, s.Action)
			}
			if s.Action == JobReplace && (s.Event == nil || s.Event.Reason != "ResizeInfeasible") {
				t.Errorf("%s replaced without saying why: %+v", s.Name, s.Event)
			}
		}
	})
}

// A Job the Topology Manager refused is deleted after the new plan is applied, and the plan that
// follows asks one receiving core fewer, said in an event.
func TestDecideReplansATopologyRefusal(t *testing.T) {
	w, sp := runningTwoSenders(t)
	refused := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p-gateway-0-x", Labels: map[string]string{render.LabelRole: render.RoleGateway}},
		Spec: corev1.PodSpec{NodeName: "gw"}, Status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: ReasonTopologyAffinity}}
	f := w.facts(sp)
	f.pods = []corev1.Pod{refused}
	d, err := Decide(sp, f, w.opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.DeletePods) != 1 || d.DeletePods[0].Name != refused.Name {
		t.Errorf("pods to delete %v", d.DeletePods)
	}
	tr := d.Status.TopologyRejection
	if tr == nil || tr.ReceiveCores != sp.Status.Plan.Connections-1 || d.Status.Plan.Connections != tr.ReceiveCores {
		t.Errorf("rejection %+v, plan %d connections", tr, d.Status.Plan.Connections)
	}
	if len(d.Events) != 1 || d.Events[0].Reason != ReasonTopologyAffinity || !strings.Contains(d.Events[0].Message, fmt.Sprint(tr.ReceiveCores)) {
		t.Errorf("events %+v", d.Events)
	}
	if sp.Status.TopologyRejection != nil {
		t.Error("Decide changed the pipeline it was given")
	}
}

// A finished stream stays finished: a new agent image (or any edit) replaces the streams still
// running, one at a time, and leaves a stream whose sender's Job completed as it is — replacing
// it would run the stream again (its new sender resumes at the end and waits for a receiver
// that has nothing left to receive).
func TestDecideLeavesAFinishedStreamAlone(t *testing.T) {
	w, sp := runningTwoSenders(t)
	for _, name := range []string{"p-sender-1", "p-gateway-1"} {
		j := w.jobs[name]
		j.Status.Succeeded = 1
		j.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}
		for i := range w.pods {
			if w.pods[i].Labels[batchv1.JobNameLabel] == name {
				w.pods[i].Status.Phase = corev1.PodSucceeded
			}
		}
	}
	w.opts.Render.AgentImage = "numastream/agent:1.1"
	sp.Spec.Sink = &v1beta1.Sink{File: &v1beta1.FileSource{Claim: "data", Path: "p-{stream}.raw"}}
	sp.Generation++
	want := map[string]JobAction{"p-sender-0": JobReplace, "p-gateway-0": JobReplace, "p-sender-1": JobFinished, "p-gateway-1": JobFinished}
	d, got := w.decide(t, sp)
	if !maps.Equal(got, want) {
		t.Fatalf("actions %v, want %v", got, want)
	}
	for pass := 1; pass < 6; pass++ {
		w.run(d)
		sp.Status = d.Status
		d, got = w.decide(t, sp)
		if got["p-sender-1"] != JobFinished || got["p-gateway-1"] != JobFinished {
			t.Fatalf("pass %d: the finished stream: %v", pass, got)
		}
	}
	if got["p-sender-0"] != JobKeep || got["p-gateway-0"] != JobKeep || len(d.Status.RollPending) > 0 || d.Facts.Replacing {
		t.Errorf("settled: %v, roll pending %v, replacing %v", got, d.Status.RollPending, d.Facts.Replacing)
	}
}

// A key rotation of a stream reading a live detector: the old sender goes first and drains into
// its gateway, which waits, as does the new sender, while that pod is going (even once its Job is
// gone and before the garbage collector marks it); then the gateway is replaced and the new
// sender made. A stream of a source that waits is replaced all at once, as before.
func TestDecideReplacesALiveDetectorsSenderBeforeItsGateway(t *testing.T) {
	const s0, g0 = "p-sender-0", "p-gateway-0"
	w := newDecideWorld(t)
	sp := twoSenders()
	sp.Spec.Senders = sp.Spec.Senders[:1]
	sp.Spec.Senders[0].Source = v1beta1.Source{Stream2: &v1beta1.ZMQEndpoint{Endpoint: "tcp://dcu:31001"}}
	sp.Spec.Sink = &v1beta1.Sink{ZMQ: &v1beta1.ZMQEndpoint{Endpoint: "tcp://analysis:9000"}}
	d, _ := w.decide(t, sp)
	w.run(d)
	for i := range w.pods {
		w.pods[i].Labels[render.LabelRole], w.pods[i].Labels[render.LabelStream] = w.jobs[w.pods[i].Labels[batchv1.JobNameLabel]].Labels[render.LabelRole], "0"
	}
	sp.Status = d.Status
	rotated := sp.DeepCopy()
	rotated.Annotations = map[string]string{v1beta1.AnnotationRotateKeys: "now"}

	d, got := w.decide(t, rotated)
	if got[s0] != JobReplace || got[g0] != JobAfterSender || !d.Facts.Replacing {
		t.Fatalf("first pass %v (replacing %v): want the sender replaced, the gateway waiting", got, d.Facts.Replacing)
	}
	w.secret = d.Keys.write
	// The Job is gone; its pod drains, not yet marked by the garbage collector, then marked.
	oldPod := w.pods[slices.IndexFunc(w.pods, func(p corev1.Pod) bool { return p.Labels[batchv1.JobNameLabel] == s0 })]
	delete(w.jobs, s0)
	for _, marked := range []bool{false, true} {
		if marked {
			i := slices.IndexFunc(w.pods, func(p corev1.Pod) bool { return p.Name == oldPod.Name })
			w.pods[i].DeletionTimestamp = new(metav1.Now())
		}
		if _, got = w.decide(t, rotated); got[s0] != JobAfterSender || got[g0] != JobAfterSender {
			t.Fatalf("old sender draining (marked %v): %v, want the new sender and the gateway waiting", marked, got)
		}
	}
	w.pods = slices.DeleteFunc(w.pods, func(p corev1.Pod) bool { return p.Name == oldPod.Name })
	if _, got = w.decide(t, rotated); got[s0] != JobCreate || got[g0] != JobReplace {
		t.Fatalf("old sender gone: %v, want the sender made and the gateway replaced", got)
	}

	// A synthetic source waits for its sender: both at once.
	w2, synthetic := runningTwoSenders(t)
	synthetic.Annotations = map[string]string{v1beta1.AnnotationRotateKeys: "now"}
	synthetic.Spec.Rollout = &v1beta1.Rollout{MaxStreams: new(int32(2))}
	if _, got = w2.decide(t, synthetic); got[s0] != JobReplace || got[g0] != JobReplace {
		t.Errorf("synthetic source: %v, want both replaced at once", got)
	}
}

// A pipeline whose volume would be a whole StorageRoot (none of the node daemon's prefixes
// holds it) is refused unless the admin allows whole roots; under a prefix it gets a volume of
// its own directory.
func TestDecideRefusesAWholeRootUnlessTheAdminAllowsIt(t *testing.T) {
	w := newDecideWorld(t)
	root := &v1beta1.StorageRoot{ObjectMeta: metav1.ObjectMeta{Name: "scratch"}, Spec: v1beta1.StorageRootSpec{Path: "/scratch/numastream",
		Access: []v1beta1.StorageAccess{{Namespaces: []string{"*"}, Users: []v1beta1.IDRange{{Min: 0, Max: 1 << 31}}, Groups: []v1beta1.IDRange{{Min: 0, Max: 1 << 31}}}}}}
	mk := func() *v1beta1.StreamPipeline {
		sp := pipeline("beamline-7", "run", withGateway("gw"), withSenders("det-a"))
		sp.Spec.Sink = &v1beta1.Sink{File: &v1beta1.FileSource{Root: "scratch", Path: "run-1/x-{stream}.raw"}}
		sp.AssignStreams()
		return sp
	}
	hostPaths := func(d Decision) []string {
		var out []string
		for _, v := range d.Objects.Volumes {
			if v.PV != nil && v.PV.Spec.HostPath != nil && strings.HasPrefix(v.PV.Spec.HostPath.Path, "/scratch") {
				out = append(out, v.PV.Spec.HostPath.Path)
			}
		}
		return out
	}
	for _, c := range []struct {
		name     string
		prefixes []string
		whole    bool
		refused  bool
		volume   string
	}{
		{"no prefixes", nil, false, true, ""},
		{"another prefix", []string{"/data"}, false, true, ""},
		{"no prefixes, whole roots allowed", nil, true, false, "/scratch/numastream"},
		{"under a prefix", []string{"/scratch"}, false, false, "/scratch/numastream/run-1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			opts := w.opts
			opts.Render.StoragePrefixes, opts.Render.WholeRootVolumes = c.prefixes, c.whole
			f := w.facts(mk())
			f.roots = map[string]*v1beta1.StorageRoot{"scratch": root}
			d, err := Decide(mk(), f, opts)
			if err != nil {
				t.Fatal(err)
			}
			if r := d.Facts.Refusal; (r != nil) != c.refused {
				t.Fatalf("refusal %+v, want refused=%v", r, c.refused)
			} else if r != nil {
				if r.Reason != "StorageNotAllowed" || !strings.Contains(r.Message, "spec.sink.file.root") || !strings.Contains(r.Message, "/scratch/numastream") ||
					!strings.Contains(r.Message, "operator.wholeRootVolumes") {
					t.Errorf("refusal %s: %s; want StorageNotAllowed naming the field, the root's path and operator.wholeRootVolumes", r.Reason, r.Message)
				}
				if len(d.Objects.Jobs) != 0 || len(d.Objects.Volumes) != 0 {
					t.Errorf("a refused pipeline has objects to apply: %d Jobs, %d volumes", len(d.Objects.Jobs), len(d.Objects.Volumes))
				}
				return
			}
			if got := hostPaths(d); len(got) != 1 || got[0] != c.volume {
				t.Errorf("volumes of the root %v, want %s", got, c.volume)
			}
		})
	}
}
