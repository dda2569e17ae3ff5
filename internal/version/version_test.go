package version

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The operator, the node daemon and the kubectl plugin, built as `make operator` builds them, say the repository's
// VERSION on --version and exit 0, answer --help with exit 0, and refuse an unknown flag with exit
// 2 naming it; the chart carries the same version.
func TestBinariesSayTheRepositorysVersion(t *testing.T) {
	root := filepath.Join("..", "..")
	raw, err := os.ReadFile(filepath.Join(root, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	want := strings.TrimSpace(string(raw))
	chart, err := os.ReadFile(filepath.Join(root, "charts", "numastream", "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"version: " + want, `appVersion: "` + want + `"`} {
		if !strings.Contains(string(chart), "\n"+line+"\n") {
			t.Errorf("Chart.yaml lacks %q: the chart and the binaries disagree on the version", line)
		}
	}
	dir := t.TempDir()
	for cmd, name := range map[string]string{"operator": "numastream-operator", "node-daemon": "numastream-node-daemon",
		"kubectl-numastream": "kubectl-numastream"} {
		bin := filepath.Join(dir, cmd)
		build := exec.Command("go", "build", "-ldflags", "-X github.com/numastream/numastream/internal/version.Version="+want,
			"-o", bin, "./cmd/"+cmd)
		build.Dir = root
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build ./cmd/%s: %v\n%s", cmd, err, out)
		}
		out, err := exec.Command(bin, "--version").Output()
		if err != nil || !strings.HasPrefix(string(out), name+" "+want+" (go") {
			t.Errorf("%s --version: %q, %v", cmd, out, err)
		}
		if out, err := exec.Command(bin, "--help").CombinedOutput(); err != nil || !strings.Contains(string(out), "-version") {
			t.Errorf("%s --help: %v\n%s", cmd, err, out)
		}
		out, err = exec.Command(bin, "--no-such-flag").CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(out), "no-such-flag") {
			t.Errorf("%s --no-such-flag: %v\n%s", cmd, err, out)
		}
	}
	if got := String("x"); !strings.HasPrefix(got, "x "+Version+" (go") {
		t.Errorf("String: %q", got)
	}
}
