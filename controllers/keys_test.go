package controllers

import (
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/curvekeys"
	"github.com/numastream/numastream/internal/render"
)

// The operator's keys are made again when a new rotate-keys value is asked for, or when
// rotateEvery has passed since they were made; never otherwise, and the next rotation is
// scheduled for when it falls due.
func TestKeyRotationFallsDueOnDemandAndOnSchedule(t *testing.T) {
	made := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{
		AnnotationKeysRotatedAt: made.Format(time.RFC3339), AnnotationKeysRotatedFor: "a"}}}
	sp := func(asked string, every time.Duration) *v1beta1.StreamPipeline {
		p := &v1beta1.StreamPipeline{}
		if asked != "" {
			p.Annotations = map[string]string{v1beta1.AnnotationRotateKeys: asked}
		}
		if every > 0 {
			p.Spec.Security = &v1beta1.Security{RotateEvery: &metav1.Duration{Duration: every}}
		}
		return p
	}
	cases := []struct {
		name string
		sp   *v1beta1.StreamPipeline
		now  time.Time
		due  bool
		next time.Duration
	}{
		{"nothing asked", sp("", 0), made.Add(1000 * time.Hour), false, 0},
		{"the value they were made for", sp("a", 0), made.Add(time.Hour), false, 0},
		{"a new value", sp("b", 0), made.Add(time.Minute), true, 0},
		{"not yet due", sp("a", 24*time.Hour), made.Add(23 * time.Hour), false, time.Hour},
		{"due", sp("a", 24*time.Hour), made.Add(24 * time.Hour), true, time.Second},
	}
	for _, c := range cases {
		why := rotationDue(c.sp, sec, c.now)
		if (why != "") != c.due {
			t.Errorf("%s: due %q, want %v", c.name, why, c.due)
		}
		if got := nextRotation(c.sp, sec, c.now); got != c.next {
			t.Errorf("%s: next rotation in %v, want %v", c.name, got, c.next)
		}
	}
}

// A Secret at the operator's name that the operator did not make (someone in the namespace made
// it first, with keys they know) is refused by name, never adopted; the one it made is its own.
func TestAKeysSecretSomeoneElseMadeIsNotAdopted(t *testing.T) {
	sp := &v1beta1.StreamPipeline{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "beamline", UID: "uid-p"}}
	pair := func() (curvekeys.KeyPair, error) { return curvekeys.New() }
	made, err := decideKeys(sp, nil, siteLead{}, time.Now(), pair)
	if err != nil || made.write == nil || !made.create {
		t.Fatalf("no Secret made for a pipeline without one: %+v, %v", made, err)
	}
	if !metav1.IsControlledBy(made.write, sp) {
		t.Fatalf("the Secret the operator makes is not owned by its pipeline: %v", made.write.OwnerReferences)
	}
	if d, err := decideKeys(sp, made.write, siteLead{}, time.Now(), pair); err != nil || d.write != nil {
		t.Errorf("the operator's own Secret read back: %+v, %v", d, err)
	}
	planted := made.write.DeepCopy()
	planted.OwnerReferences = nil
	_, err = decideKeys(sp, planted, siteLead{}, time.Now(), pair)
	var np *notPlannedError
	if !errors.As(err, &np) || np.reason != ReasonKeys || !strings.Contains(err.Error(), "p-curve-keys exists and is not this pipeline's") {
		t.Errorf("a Secret at the operator's name made by someone else: %v", err)
	}
	other := made.write.DeepCopy()
	other.OwnerReferences[0].UID = "uid-of-a-deleted-pipeline-of-the-same-name"
	if _, err := decideKeys(sp, other, siteLead{}, time.Now(), pair); !errors.As(err, &np) {
		t.Errorf("a Secret owned by another pipeline object of the same name was adopted")
	}
}

// A pipeline that sends to a RemoteSite rotates in two steps: the gateway's next key is listed
// first (the agents keep their keys, the site's status lists both), and only once the site's
// keyPropagation has passed does the rotation use it: the gateway's new key is the one listed,
// the senders' are new, and nothing is listed as next any more. Taken back before then, the
// listed key goes.
func TestARotationListsTheGatewaysNextKeyForTheFarSiteBeforeUsingIt(t *testing.T) {
	far, _ := curvekeys.New()
	sp := &v1beta1.StreamPipeline{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "beamline", UID: "uid-p"},
		Spec: v1beta1.StreamPipelineSpec{Senders: []v1beta1.Sender{{Node: "det"}},
			Sinks: []v1beta1.Consumer{{Name: "hpc", Sink: v1beta1.Sink{Onward: &v1beta1.OnwardSink{Site: "dtn"}}}}}}
	sp.AssignStreams()
	site := &v1beta1.RemoteSite{ObjectMeta: metav1.ObjectMeta{Name: "dtn", Namespace: "beamline"},
		Spec: v1beta1.RemoteSiteSpec{Endpoint: "tcp://dtn:7000", ServerKey: far.Public, KeyPropagation: &metav1.Duration{Duration: time.Minute}}}
	lead, err := useSites(sp, map[string]*v1beta1.RemoteSite{"dtn": site})
	if err != nil || sp.Spec.Sinks[0].Onward.Endpoint != "tcp://dtn:7000" || sp.Spec.Sinks[0].Onward.ServerKey != far.Public {
		t.Fatalf("the site's endpoint and key in the hop: %+v, %v", sp.Spec.Sinks[0].Onward, err)
	}
	if _, err := useSites(sp.DeepCopy(), nil); err == nil || !strings.Contains(err.Error(), "RemoteSite beamline/dtn does not exist") {
		t.Errorf("a missing site: %v", err)
	}
	pair := func() (curvekeys.KeyPair, error) { return curvekeys.New() }
	t0 := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	made, err := decideKeys(sp, nil, lead, t0, pair)
	if err != nil || made.keys.gatewayKey == nil || made.keys.gatewayKey.Next != "" {
		t.Fatalf("a new pipeline's keys: %+v, %v", made.keys.gatewayKey, err)
	}
	sec, old := made.write, made.keys
	sp.Annotations = map[string]string{v1beta1.AnnotationRotateKeys: "now"}

	listed, err := decideKeys(sp, sec, lead, t0.Add(time.Hour), pair)
	if err != nil || listed.write == nil || listed.rotated != "" || listed.listed == "" {
		t.Fatalf("asked for a rotation: %+v, %v", listed, err)
	}
	next := listed.keys.gatewayKey
	if next.Public != old.gatewayKey.Public || next.Next == "" || next.NextSince == nil || !next.NextSince.Time.Equal(t0.Add(time.Hour)) {
		t.Errorf("the gateway's keys while the next is listed: %+v (before %+v)", next, old.gatewayKey)
	}
	if listed.keys.hashes[0] != old.hashes[0] {
		t.Errorf("the agents' keys changed before the far site had time to admit the next one")
	}
	if listed.keys.nextRotation != time.Minute {
		t.Errorf("the pass after listing comes in %v, want the site's keyPropagation", listed.keys.nextRotation)
	}
	sec = listed.write

	waiting, err := decideKeys(sp, sec, lead, t0.Add(time.Hour+40*time.Second), pair)
	if err != nil || waiting.write != nil || waiting.keys.hashes[0] != old.hashes[0] || waiting.keys.nextRotation != 20*time.Second {
		t.Errorf("40 s into a 1 min propagation: write %v, next pass in %v, %v", waiting.write != nil, waiting.keys.nextRotation, err)
	}

	used, err := decideKeys(sp, sec, lead, t0.Add(time.Hour+time.Minute), pair)
	if err != nil || used.write == nil || used.rotated == "" {
		t.Fatalf("after the propagation: %+v, %v", used, err)
	}
	if g := used.keys.gatewayKey; g.Public != next.Next || g.Next != "" || g.NextSince != nil {
		t.Errorf("the gateway after the rotation: %+v, want the listed key %s and no next", g, next.Next)
	}
	if string(used.write.Data[render.SenderPublicKey(0)]) == string(sec.Data[render.SenderPublicKey(0)]) || used.keys.hashes[0] == old.hashes[0] {
		t.Errorf("the sender's keys were not made again, or the stream's agents keep their keys")
	}
	if again, err := decideKeys(sp, used.write, lead, t0.Add(2*time.Hour), pair); err != nil || again.write != nil {
		t.Errorf("once rotated, the next pass: %+v, %v", again.write, err)
	}

	// On a schedule (rotateEvery) that fell due: the pass after listing comes when the listed key
	// may be used, not every second meanwhile.
	scheduled := sp.DeepCopy()
	scheduled.Annotations = nil
	scheduled.Spec.Security = &v1beta1.Security{RotateEvery: &metav1.Duration{Duration: time.Hour}}
	due, err := decideKeys(scheduled, used.write, lead, t0.Add(5*time.Hour), pair)
	if err != nil || due.listed == "" || due.keys.nextRotation != time.Minute {
		t.Errorf("a scheduled rotation: listed %q, the next pass in %v (want the site's minute), %v", due.listed, due.keys.nextRotation, err)
	}
	if mid, err := decideKeys(scheduled, due.write, lead, t0.Add(5*time.Hour+20*time.Second), pair); err != nil || mid.keys.nextRotation != 40*time.Second {
		t.Errorf("a scheduled rotation 20 s into its key's propagation: the next pass in %v, want 40s (%v)", mid.keys.nextRotation, err)
	}

	sp.Annotations[v1beta1.AnnotationRotateKeys] = "again"
	relisted, _ := decideKeys(sp, used.write, lead, t0.Add(3*time.Hour), pair)
	sp.Annotations[v1beta1.AnnotationRotateKeys] = "now"
	taken, err := decideKeys(sp, relisted.write, lead, t0.Add(3*time.Hour+time.Second), pair)
	if err != nil || taken.write == nil || taken.keys.gatewayKey.Next != "" || taken.write.Annotations[AnnotationNextListedAt] != "" {
		t.Errorf("a rotation asked for and taken back before the key was used: %+v, %v", taken.keys.gatewayKey, err)
	}
}

// A RemoteSite lists the keys of the pipelines that name it, and only theirs: current and next,
// by pipeline; a pipeline being deleted or without keys is left out.
func TestARemoteSiteAdmitsThePipelinesThatNameIt(t *testing.T) {
	at := metav1.NewTime(time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC))
	hop := func(name, site string, key *v1beta1.GatewayKey) v1beta1.StreamPipeline {
		sp := v1beta1.StreamPipeline{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:   v1beta1.StreamPipelineSpec{Sinks: []v1beta1.Consumer{{Sink: v1beta1.Sink{Onward: &v1beta1.OnwardSink{Site: site}}}}},
			Status: v1beta1.StreamPipelineStatus{GatewayKey: key}}
		return sp
	}
	gone := hop("gone", "dtn", &v1beta1.GatewayKey{Public: "G"})
	gone.DeletionTimestamp = &at
	keys := admittedKeys("dtn", []v1beta1.StreamPipeline{
		hop("zeta", "dtn", &v1beta1.GatewayKey{Public: "Z"}),
		hop("alpha", "dtn", &v1beta1.GatewayKey{Public: "A", Next: "A2", NextSince: &at}),
		hop("other", "elsewhere", &v1beta1.GatewayKey{Public: "O"}),
		hop("new", "dtn", nil),
		gone,
	})
	want := []v1beta1.AdmittedKey{{Pipeline: "alpha", Key: "A", Use: "current"}, {Pipeline: "alpha", Key: "A2", Use: "next", Since: &at},
		{Pipeline: "zeta", Key: "Z", Use: "current"}}
	if len(keys) != len(want) {
		t.Fatalf("admitted %+v, want %+v", keys, want)
	}
	for i := range want {
		if keys[i].Pipeline != want[i].Pipeline || keys[i].Key != want[i].Key || keys[i].Use != want[i].Use || (want[i].Since == nil) != (keys[i].Since == nil) {
			t.Errorf("admitted[%d] %+v, want %+v", i, keys[i], want[i])
		}
	}
}
