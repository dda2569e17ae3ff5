package v1beta1

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
		// slots: each stream keeps its port slot; a new one takes the lowest free slot.
		slots []int
		span  int
	}{
		{"a new pipeline numbers its senders in order", []string{"det-a", "det-b", "det-c"}, []int{0, 1, 2}, 3, []int{0, 1, 2}, 3},
		{"the first sender removed", []string{"det-b", "det-c"}, []int{1, 2}, 3, []int{1, 2}, 3},
		{"reordered", []string{"det-c", "det-b"}, []int{2, 1}, 3, []int{2, 1}, 3},
		{"a sender added in front", []string{"det-d", "det-c", "det-b"}, []int{3, 2, 1}, 4, []int{0, 2, 1}, 3},
		{"a removed sender comes back with a new id", []string{"det-d", "det-c", "det-b", "det-a"}, []int{3, 2, 1, 4}, 5, []int{0, 2, 1, 3}, 4},
		{"all but one removed", []string{"det-a"}, []int{4}, 5, []int{3}, 4},
		{"then two added", []string{"det-x", "det-a", "det-y"}, []int{5, 4, 6}, 7, []int{0, 3, 1}, 4},
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
		if got := sp.StreamSlots(); !reflect.DeepEqual(got, s.slots) || sp.SlotSpan() != s.span {
			t.Fatalf("%s: slots %v span %d, want %v span %d", s.edit, got, sp.SlotSpan(), s.slots, s.span)
		}
		for i, id := range s.want {
			if sp.StreamSlot(id) != s.slots[i] || *sp.Status.Senders[i].Slot != int32(s.slots[i]) {
				t.Errorf("%s: stream %d's slot %d, recorded %d, want %d", s.edit, id, sp.StreamSlot(id), *sp.Status.Senders[i].Slot, s.slots[i])
			}
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
	// A pipeline whose status has ids but no slots (written by the release before slots) keeps
	// the ports its senders' positions gave them: slots in spec order, whatever the ids.
	older := &StreamPipeline{}
	older.Spec.Senders = []Sender{{Node: "det-b"}, {Node: "det-c"}}
	older.Status.Senders = []SenderStream{{Node: "det-b", Stream: 1}, {Node: "det-c", Stream: 2}}
	if got := older.StreamSlots(); !reflect.DeepEqual(got, []int{0, 1}) {
		t.Errorf("ids without slots: slots %v, want their positions", got)
	}
}

// A pipeline expects chunks only when every sender's source says how many.
func TestExpectedChunksAreKnownOnlyWhenEverySourceCountsThem(t *testing.T) {
	synthetic := func(n int64) Sender {
		return Sender{Source: Source{Synthetic: &SyntheticSource{Chunks: n}}}
	}
	for _, c := range []struct {
		senders []Sender
		want    int64
	}{
		{[]Sender{synthetic(150)}, 150},
		{[]Sender{synthetic(150), synthetic(50)}, 200},
		{[]Sender{synthetic(150), synthetic(0)}, 0},                              // one endless
		{[]Sender{synthetic(150), {Source: Source{Stream2: &ZMQEndpoint{}}}}, 0}, // a detector
		{nil, 0},
	} {
		sp := &StreamPipeline{Spec: StreamPipelineSpec{Senders: c.senders}}
		if got := sp.ExpectedChunks(); got != c.want {
			t.Errorf("%d senders: %d expected, want %d", len(c.senders), got, c.want)
		}
	}
}
