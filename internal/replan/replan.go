// Package replan decides when what a pipeline's agents observe has departed from what its plan
// assumed far enough, and for long enough, to plan it again: the operator's control loop
// (docs/adaptive.md, loop 2). Pure: the caller brings the readings and the clock.
package replan

import (
	"fmt"
	"math"
	"time"
)

const (
	// Threshold is the relative departure that counts: the observed compression ratio more than
	// 25% above or below the one the plan assumed.
	Threshold = 0.25
	// Confirm is the number of readings in a row that must depart before a re-plan, each within
	// Agree of the first of them: a ratio still moving (a stream mid-change) waits until it
	// settles.
	Confirm = 3
	Agree   = 0.10
	// Cooldown is the least time between two re-plans of one pipeline: its new pods must start
	// and be read before their figures mean anything.
	Cooldown = time.Minute
)

// Departure says how the observed ratio departs from the assumed one; empty when it does not
// (or when either is unknown).
func Departure(assumed, observed float64) string {
	if assumed <= 0 || observed <= 0 || math.IsNaN(observed) || math.IsInf(observed, 0) {
		return ""
	}
	if math.Abs(math.Log(observed/assumed)) <= math.Log(1+Threshold) {
		return ""
	}
	return fmt.Sprintf("observed compression ratio %.2f, the plan assumed %.2f (%+.0f%%)",
		observed, assumed, (observed/assumed-1)*100)
}

// Tracker counts, per pipeline, the readings in a row that departed, and when it last called
// for a re-plan.
type Tracker struct {
	streak map[string]int
	first  map[string]float64 // the value the streak started at
	last   map[string]time.Time
}

// NewTracker starts with no history.
func NewTracker() *Tracker {
	return &Tracker{streak: map[string]int{}, first: map[string]float64{}, last: map[string]time.Time{}}
}

// Observe records one reading of pipeline `key`: whether it departed, and the value read. True
// when this reading completes Confirm departing readings in a row that agree with each other and
// the last re-plan is at least Cooldown ago; the count then starts again.
func (t *Tracker) Observe(key string, departed bool, value float64, now time.Time) bool {
	if !departed {
		delete(t.streak, key)
		return false
	}
	if f, ok := t.first[key]; !ok || t.streak[key] == 0 || math.Abs(value-f) > Agree*f {
		t.streak[key] = 0
		t.first[key] = value
	}
	t.streak[key]++
	if t.streak[key] < Confirm {
		return false
	}
	if last, ok := t.last[key]; ok && now.Sub(last) < Cooldown {
		return false
	}
	delete(t.streak, key)
	t.last[key] = now
	return true
}

// Forget drops a pipeline's history (deleted, or re-planning turned off).
func (t *Tracker) Forget(key string) {
	delete(t.streak, key)
	delete(t.first, key)
	delete(t.last, key)
}
