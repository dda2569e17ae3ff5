// Package scripts tests the shell helpers under hack/ that every long step goes through.
package scripts

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A long step is never silent: hack/heartbeat.sh says every HEARTBEAT_EVERY seconds that the
// step still runs, says when it finished, passes the step's own output (or keeps it in --log),
// and exits with the step's status.
func TestHeartbeatSaysALongStepStillRunsAndKeepsItsExitStatus(t *testing.T) {
	script := filepath.Join("..", "..", "hack", "heartbeat.sh")
	run := func(args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command("bash", append([]string{script}, args...)...)
		cmd.Env = append(os.Environ(), "HEARTBEAT_EVERY=1")
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return out.String(), errb.String(), code
	}
	out, beats, code := run("cold build", "--", "bash", "-c", "echo compiling; sleep 2.5; exit 3")
	if code != 3 || out != "compiling\n" {
		t.Errorf("exit %d, stdout %q: want the step's own 3 and its output", code, out)
	}
	if n := strings.Count(beats, "cold build: still running"); n < 2 || !strings.Contains(beats, "cold build: finished in") {
		t.Errorf("%d heartbeats, stderr:\n%s", n, beats)
	}
	log := filepath.Join(t.TempDir(), "step.log")
	out, beats, code = run("quiet step", "--log", log, "--", "bash", "-c", "echo to the log; sleep 1.5")
	got, _ := os.ReadFile(log)
	if code != 0 || out != "" || string(got) != "to the log\n" || !strings.Contains(beats, "quiet step: still running") {
		t.Errorf("--log: exit %d, stdout %q, log %q, stderr %q", code, out, got, beats)
	}
	if _, beats, _ = run("short step", "--", "true"); beats != "" {
		t.Errorf("a step shorter than the interval says nothing, got %q", beats)
	}
}
