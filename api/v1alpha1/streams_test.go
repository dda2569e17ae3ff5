package v1alpha1

import (
	"reflect"
	"testing"
)

// A sender keeps its stream id through every edit of spec.senders: removing or reordering
// others never renumbers it, and a new sender (also one that comes back) gets an id no sender had.
func TestStreamIDsSurviveEveryEditOfTheSenders(t *testing.T) {
	sp := &StreamPipeline{}
	set := func(nodes ...string) {
		sp.Spec.Senders = nil
		for _, n := range nodes {
			sp.Spec.Senders = append(sp.Spec.Senders, Sender{Node: n})
		}
	}
	steps := []struct {
		edit  string
		nodes []string
		want  []int
		next  int32
	}{
		{"a new pipeline numbers its senders in order", []string{"det-a", "det-b", "det-c"}, []int{0, 1, 2}, 3},
		{"the first sender removed", []string{"det-b", "det-c"}, []int{1, 2}, 3},
		{"reordered", []string{"det-c", "det-b"}, []int{2, 1}, 3},
		{"a sender added in front", []string{"det-d", "det-c", "det-b"}, []int{3, 2, 1}, 4},
		{"a removed sender comes back with a new id", []string{"det-d", "det-c", "det-b", "det-a"}, []int{3, 2, 1, 4}, 5},
		{"all but one removed", []string{"det-a"}, []int{4}, 5},
		{"then two added", []string{"det-x", "det-a", "det-y"}, []int{5, 4, 6}, 7},
	}
	for _, s := range steps {
		set(s.nodes...)
		if got := sp.StreamIDs(); !reflect.DeepEqual(got, s.want) {
			t.Fatalf("%s: ids %v before status is written, want %v", s.edit, got, s.want)
		}
		sp.AssignStreams()
		if got := sp.StreamIDs(); !reflect.DeepEqual(got, s.want) || sp.Status.NextStream != s.next {
			t.Fatalf("%s: ids %v next %d, want %v next %d", s.edit, got, sp.Status.NextStream, s.want, s.next)
		}
		for i, id := range s.want {
			if sp.SenderOfStream(id) != i {
				t.Errorf("%s: stream %d's sender is %d, want %d", s.edit, id, sp.SenderOfStream(id), i)
			}
		}
		if sp.SenderOfStream(99) != -1 {
			t.Errorf("%s: an unknown stream has a sender", s.edit)
		}
	}
	// A pipeline whose status was lost (restored from a backup without status) numbers from
	// nextStream when it is there, else from 0 like a new one.
	lost := &StreamPipeline{}
	lost.Spec.Senders = []Sender{{Node: "det-a"}, {Node: "det-b"}}
	if got := lost.StreamIDs(); !reflect.DeepEqual(got, []int{0, 1}) {
		t.Errorf("without status: %v", got)
	}
}
