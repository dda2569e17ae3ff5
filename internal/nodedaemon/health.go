package nodedaemon

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Health is what the daemon leaves after each round for its probes (it listens on no port: with
// hostNetwork a port would be one more on the node). The kubelet runs `node-daemon --probe` in
// the container, which reads it back.
type Health struct {
	// At is when the round ended.
	At time.Time `json:"at"`
	// NextBy: a daemon that has not ended another round by then is stuck (its interval, twice,
	// plus a grace for the API server's timeouts).
	NextBy time.Time `json:"nextBy"`
	// Error is why the round could not publish the node's facts ("" when they are out).
	Error string `json:"error,omitempty"`
}

// healthGrace is what a round may take beyond the interval: publishing waits on the API server.
const healthGrace = 30 * time.Second

// roundHealth is the health a round ending at `at` leaves.
func roundHealth(at time.Time, interval time.Duration, err error) Health {
	h := Health{At: at, NextBy: at.Add(2*interval + healthGrace)}
	if err != nil {
		h.Error = err.Error()
	}
	return h
}

// WriteHealth replaces the file at path with h, whole (a probe never reads half of it).
func WriteHealth(path string, h Health) error {
	b, err := json.Marshal(h)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".health-*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := tmp.Write(b); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// Probe answers the kubelet's probe from the health file: nil when the daemon is alive (it ended
// a round in time) and, for readiness, has its node's facts published; otherwise why not.
func Probe(path string, ready bool, now time.Time) error {
	b, err := os.ReadFile(path) //nolint:gosec // G304: the health file the daemon was started with
	if os.IsNotExist(err) {
		return fmt.Errorf("no round has ended yet (the codec calibration runs first): %s does not exist", path)
	}
	if err != nil {
		return err
	}
	var h Health
	if err := json.Unmarshal(b, &h); err != nil || h.At.IsZero() {
		return fmt.Errorf("%s is not the daemon's health record: %q", path, b)
	}
	if now.After(h.NextBy) {
		return fmt.Errorf("stuck: the last round ended at %s and the next was due by %s", h.At.Format(time.RFC3339), h.NextBy.Format(time.RFC3339))
	}
	if ready && h.Error != "" {
		return fmt.Errorf("the node's facts are not published: %s", h.Error)
	}
	return nil
}
