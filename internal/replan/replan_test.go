package replan

import (
	"strings"
	"testing"
	"time"
)

func TestDepartureBeyondTheThresholdEitherWay(t *testing.T) {
	for _, c := range []struct {
		assumed, observed float64
		departs           bool
	}{
		{2, 2, false}, {2, 2.4, false}, {2, 1.7, false}, // within 25%
		{2, 3.5, true}, {3.5, 2, true}, {2, 2.6, true}, {2, 1.5, true},
		{2, 0, false}, {0, 2, false}, // unknown
	} {
		got := Departure(c.assumed, c.observed)
		if (got != "") != c.departs {
			t.Errorf("Departure(%v, %v) = %q", c.assumed, c.observed, got)
		}
	}
	if got := Departure(2, 3.5); !strings.Contains(got, "observed compression ratio 3.50, the plan assumed 2.00 (+75%)") {
		t.Errorf("%q", got)
	}
}

func TestConfirmedThenCooledDown(t *testing.T) {
	var w Watch
	now := time.Unix(0, 0)
	step := func(departed bool) bool {
		now = now.Add(10 * time.Second)
		var replan bool
		w, replan = w.Observe(departed, 3.5, now)
		return replan
	}
	if first, second := step(true), step(true); first || second {
		t.Fatal("re-planned before three readings in a row")
	}
	if !step(true) {
		t.Fatal("three departing readings should re-plan")
	}
	// Departing again at once: within the cooldown nothing happens, however long the streak.
	for i := 0; i < 4; i++ {
		if step(true) {
			t.Fatalf("re-planned %d readings after the last one, inside the cooldown", i+1)
		}
	}
	now = now.Add(Cooldown)
	if !step(true) {
		t.Fatal("after the cooldown, a confirmed departure re-plans again")
	}
	// A reading that does not depart resets the count.
	now = now.Add(Cooldown)
	for i, departed := range []bool{true, true, false, true, true} {
		if step(departed) {
			t.Fatalf("an interrupted streak must not re-plan (reading %d)", i+1)
		}
	}
	if !step(true) {
		t.Fatal("three in a row after the interruption")
	}
	// A Watch carried over (from status, by another operator) goes on counting.
	w, _ = w.Observe(true, 3.5, now.Add(Cooldown))
	carried := w
	if _, replan := carried.Observe(true, 3.5, now.Add(Cooldown+time.Second)); replan {
		t.Fatal("two readings re-planned")
	}
	carried, _ = carried.Observe(true, 3.5, now.Add(Cooldown+time.Second))
	if _, replan := carried.Observe(true, 3.5, now.Add(Cooldown+2*time.Second)); !replan {
		t.Fatal("the third reading, counted by whoever holds the Watch, re-plans")
	}
}

func TestAMovingValueWaitsUntilItSettles(t *testing.T) {
	var w Watch
	now := time.Unix(0, 0)
	for i, v := range []float64{2.6, 2.9, 3.3, 3.7, 3.7} {
		now = now.Add(10 * time.Second)
		var replan bool
		if w, replan = w.Observe(true, v, now); replan {
			t.Fatalf("re-planned at reading %d (%.1f) while the ratio still moved", i, v)
		}
	}
	if _, replan := w.Observe(true, 3.65, now.Add(10*time.Second)); !replan {
		t.Fatal("three readings within 10% of each other should re-plan")
	}
}
