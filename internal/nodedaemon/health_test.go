package nodedaemon

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
)

// refusing publishes nothing while refuse is set (an API server that cannot be reached).
type refusing struct{ refuse *atomic.Bool }

func (p refusing) Publish(context.Context, map[string]string) error {
	if p.refuse.Load() {
		return errors.New("nodefeatures.nfd.k8s-sigs.io: connection refused")
	}
	return nil
}
func (p refusing) Remove(context.Context) error { return nil }

// The probes read what the daemon's rounds leave: not alive before its first round (the
// calibration), alive but not ready while it cannot publish, ready once it has, and not alive
// when its rounds stop.
func TestTheProbesFollowTheDaemonsRounds(t *testing.T) {
	health := filepath.Join(t.TempDir(), "health")
	var refuse atomic.Bool
	refuse.Store(true)
	d := &Daemon{Agent: Agent{Path: agentPath(t), SysfsRoot: sysfsCopy(t, "paper-gateway"), BenchRounds: 1},
		Publishers: []Publisher{refusing{&refuse}}, Interval: 50 * time.Millisecond, HealthFile: health, Log: logr.Discard()}
	if err := Probe(health, false, time.Now()); err == nil || !strings.Contains(err.Error(), "no round has ended yet") {
		t.Errorf("before the first round, live: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	var stopped error
	stop := sync.OnceFunc(func() { cancel(); stopped = <-done })
	defer stop()
	until := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !ok(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("not within 30 s: %s", what)
			}
		}
	}
	until("a round", func() bool { _, err := os.Stat(health); return err == nil })
	if err := Probe(health, false, time.Now()); err != nil {
		t.Errorf("a daemon whose rounds end is alive: %v", err)
	}
	if err := Probe(health, true, time.Now()); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("ready while its facts cannot be published: %v", err)
	}
	refuse.Store(false)
	until("ready", func() bool { return Probe(health, true, time.Now()) == nil })
	// Its rounds stop: past the interval twice and the grace, it is stuck.
	stop()
	if stopped != nil {
		t.Errorf("the daemon stopped with %v", stopped)
	}
	if err := Probe(health, false, time.Now().Add(2*d.Interval+healthGrace+time.Second)); err == nil || !strings.Contains(err.Error(), "stuck") {
		t.Errorf("a daemon whose rounds stopped: %v", err)
	}
	if err := os.WriteFile(health, []byte("{half"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Probe(health, false, time.Now()); err == nil || !strings.Contains(err.Error(), "not the daemon's health record") {
		t.Errorf("a damaged record: %v", err)
	}
	if entries, _ := os.ReadDir(filepath.Dir(health)); len(entries) != 1 {
		t.Errorf("temporary files left beside the record: %v", entries)
	}
}
