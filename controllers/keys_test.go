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
	made, err := decideKeys(sp, nil, time.Now(), pair)
	if err != nil || made.write == nil || !made.create {
		t.Fatalf("no Secret made for a pipeline without one: %+v, %v", made, err)
	}
	if !metav1.IsControlledBy(made.write, sp) {
		t.Fatalf("the Secret the operator makes is not owned by its pipeline: %v", made.write.OwnerReferences)
	}
	if d, err := decideKeys(sp, made.write, time.Now(), pair); err != nil || d.write != nil {
		t.Errorf("the operator's own Secret read back: %+v, %v", d, err)
	}
	planted := made.write.DeepCopy()
	planted.OwnerReferences = nil
	_, err = decideKeys(sp, planted, time.Now(), pair)
	var np *notPlannedError
	if !errors.As(err, &np) || np.reason != ReasonKeys || !strings.Contains(err.Error(), "p-curve-keys exists and is not this pipeline's") {
		t.Errorf("a Secret at the operator's name made by someone else: %v", err)
	}
	other := made.write.DeepCopy()
	other.OwnerReferences[0].UID = "uid-of-a-deleted-pipeline-of-the-same-name"
	if _, err := decideKeys(sp, other, time.Now(), pair); !errors.As(err, &np) {
		t.Errorf("a Secret owned by another pipeline object of the same name was adopted")
	}
}
