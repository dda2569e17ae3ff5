// Package testenv holds what the Go tests share: the external tools they need (the agent binary,
// helm, envtest's kube-apiserver), found from the environment `make` sets, and polling.
//
// A test that needs a tool skips, saying how to run it, when the tool is not configured; under
// `make` (NUMASTREAM_REQUIRE_*=1) a missing tool fails the test instead, so CI never passes a
// suite that did not run.
package testenv

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
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

// Monitoring is the directory hack/build-monitoring-bins.sh fills: prometheus, promtool and the
// Prometheus Operator's CRDs (crds/).
func Monitoring(t testing.TB) string {
	return need(t, "NUMASTREAM_MONITORING_BIN", "NUMASTREAM_REQUIRE_ENVTEST",
		"Prometheus, promtool and the Prometheus Operator's CRDs built by hack/build-monitoring-bins.sh (make monitoring-bins)")
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

// Condition waits until the StreamPipeline has condition ctype with status (and reason, unless
// empty) and returns the pipeline as last read.
func Condition(ctx context.Context, t testing.TB, c client.Client, sp *v1beta1.StreamPipeline, ctype string,
	status metav1.ConditionStatus, reason string, timeout, poll time.Duration) *v1beta1.StreamPipeline {
	t.Helper()
	cur := &v1beta1.StreamPipeline{}
	Eventually(t, fmt.Sprintf("%s %s=%s (%s)", sp.Name, ctype, status, reason), timeout, poll, func() (bool, string) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(sp), cur); err != nil {
			return false, err.Error()
		}
		cond := meta.FindStatusCondition(cur.Status.Conditions, ctype)
		if cond == nil {
			return false, "no condition"
		}
		return cond.Status == status && (reason == "" || cond.Reason == reason), cond.Reason + ": " + cond.Message
	})
	return cur
}

// FreePort is a TCP port on 127.0.0.1 that nothing listens on right now, below the kernel's
// ephemeral range (outgoing connections take their source ports there, and one could take a port
// found free before its listener binds it) and below Kubernetes' NodePort range (30000-32767).
func FreePort(t testing.TB) string {
	t.Helper()
	high := min(30000, ephemeralLow())
	for range 200 {
		port := 15000 + rand.IntN(high-15000)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue
		}
		_ = l.Close()
		return strconv.Itoa(port)
	}
	t.Fatal("no free port below the ephemeral range")
	return ""
}

// ephemeralLow is the first port of the kernel's ephemeral range (32768 when it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	fields := strings.Fields(string(b))
	if len(fields) == 0 {
		return 32768
	}
	n, err := strconv.Atoi(fields[0])
	if err != nil || n <= 15000 {
		return 32768
	}
	return n
}

// ClusterClient connects to the cluster of a kubeconfig with a client that knows the core types
// and StreamPipeline; the REST config is returned for other clients.
func ClusterClient(kubeconfig string) (client.Client, *rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, nil, err
	}
	// Tests poll (and watch in the background) faster than client-go's default 5 requests a
	// second per resource, which would queue a watcher's readings behind a test's own.
	cfg.QPS, cfg.Burst = 100, 200
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, nil, err
	}
	if err := v1beta1.AddToScheme(scheme); err != nil {
		return nil, nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	return c, cfg, err
}

// Convert turns in into out through JSON (e.g. an unstructured object's field into a typed
// struct).
func Convert(t testing.TB, in, out any) {
	t.Helper()
	b, err := json.Marshal(in)
	if err == nil {
		err = json.Unmarshal(b, out)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// DashboardQueries are a Grafana dashboard's queries with its variables given values a plain
// Prometheus takes: every namespace and pipeline, a 1m rate interval.
func DashboardQueries(dashboard []byte) ([]string, error) {
	var d struct {
		Panels []struct{ Targets []struct{ Expr string } }
	}
	if err := json.Unmarshal(dashboard, &d); err != nil {
		return nil, err
	}
	r := strings.NewReplacer("$namespace", ".*", "$pipeline", ".*", "$__rate_interval", "1m")
	var out []string
	for _, p := range d.Panels {
		for _, q := range p.Targets {
			out = append(out, r.Replace(q.Expr))
		}
	}
	return out, nil
}
