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

// Watch is one pipeline's count of departing readings in a row and when it last called for a
// re-plan. It is a value the caller keeps in the pipeline's status, so that a restarted operator
// or a new leader goes on counting where the last one stopped.
type Watch struct {
	Readings    int       // departing readings in a row that agree with First
	First       float64   // the value the streak started at
	LastReading time.Time // when the last reading was counted
	LastReplan  time.Time // when it last called for a re-plan (zero: never)
}

// Observe records one reading: whether it departed, and the value read. It returns the next Watch
// and true when this reading completes Confirm departing readings in a row that agree with each
// other and the last re-plan is at least Cooldown ago; the count then starts again.
func (w Watch) Observe(departed bool, value float64, now time.Time) (Watch, bool) {
	w.LastReading = now
	if !departed {
		w.Readings = 0
		return w, false
	}
	if w.Readings == 0 || math.Abs(value-w.First) > Agree*w.First {
		w.Readings, w.First = 0, value
	}
	w.Readings++
	if w.Readings < Confirm {
		return w, false
	}
	if !w.LastReplan.IsZero() && now.Sub(w.LastReplan) < Cooldown {
		return w, false
	}
	w.Readings, w.LastReplan = 0, now
	return w, true
}
