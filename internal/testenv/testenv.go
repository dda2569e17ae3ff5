// Package testenv holds what the Go tests share: the external tools they need (the agent binary,
// helm, envtest's kube-apiserver), found from the environment `make` sets, and polling.
//
// A test that needs a tool skips, saying how to run it, when the tool is not configured; under
// `make` (NUMASTREAM_REQUIRE_*=1) a missing tool fails the test instead, so CI never passes a
// suite that did not run.
package testenv

import (
	"os"
	"testing"
	"time"
)

func need(t testing.TB, env, require, what string) string {
	t.Helper()
	v := os.Getenv(env)
	if v == "" {
		if os.Getenv(require) != "" {
			t.Fatalf("%s is not set: %s", env, what)
		}
		t.Skipf("%s is not set: run `make test-operator` (%s)", env, what)
	}
	return v
}

// Agent is the path of the numastream-agent binary.
func Agent(t testing.TB) string {
	return need(t, "NUMASTREAM_AGENT", "NUMASTREAM_REQUIRE_AGENT", "the C++ agent binary")
}

// Helm is the path of the helm binary.
func Helm(t testing.TB) string {
	return need(t, "NUMASTREAM_HELM", "NUMASTREAM_REQUIRE_ENVTEST", "helm built by hack/build-k8s-bins.sh")
}

// Envtest makes sure envtest can find kube-apiserver and etcd.
func Envtest(t testing.TB) {
	need(t, "KUBEBUILDER_ASSETS", "NUMASTREAM_REQUIRE_ENVTEST", "kube-apiserver and etcd built by hack/build-k8s-bins.sh")
}

// Eventually polls cond every poll until it holds or timeout passes; the failure names what was
// awaited and the last state cond reported.
func Eventually(t testing.TB, what string, timeout, poll time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for time.Now().Before(deadline) {
		ok, msg := cond()
		if ok {
			return
		}
		last = msg
		time.Sleep(poll)
	}
	t.Fatalf("%s: not within %s; last: %s", what, timeout, last)
}
