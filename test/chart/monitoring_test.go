package chart

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	sigsyaml "sigs.k8s.io/yaml"

	agentrender "github.com/numastream/numastream/internal/render"
	"github.com/numastream/numastream/internal/testenv"
)

// monitoring renders the chart with every monitoring object on, labelled for a
// kube-prometheus-stack release named kps.
func monitoring(t *testing.T, args ...string) []*unstructured.Unstructured {
	t.Helper()
	objs, err := render(t, append([]string{"--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.podMonitor.enabled=true",
		"--set", "metrics.prometheusRule.enabled=true", "--set", "metrics.dashboard.enabled=true", "--set", "metrics.labels.release=kps"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// The monitoring objects carry the labels a Prometheus selects them by, select the agents' pods
// and metrics ports, and are accepted by the Prometheus Operator's own CRD schemas (generated
// from its published API module), strictly: a field they do not know is refused.
func TestMonitoringObjectsAreLabelledAndAcceptedByThePrometheusOperatorsCRDs(t *testing.T) {
	crds := filepath.Join(testenv.Monitoring(t), "crds")
	testenv.Envtest(t)
	objs := monitoring(t)
	var mon []*unstructured.Unstructured
	for _, kind := range []string{"ServiceMonitor", "PodMonitor", "PrometheusRule"} {
		o := find(objs, kind, "")
		if o == nil {
			t.Fatalf("no %s", kind)
		}
		if o.GetLabels()["release"] != "kps" {
			t.Errorf("%s labels %v: metrics.labels not applied", kind, o.GetLabels())
		}
		mon = append(mon, o)
	}
	if o := find(objs, "ServiceMonitor", ""); !strings.Contains(toJSON(t, o), `"honorLabels":true`) {
		t.Error("the operator's ServiceMonitor does not honour the pipelines' namespace labels")
	}
	pm := find(objs, "PodMonitor", "")
	var spec struct {
		NamespaceSelector struct{ Any bool } `json:"namespaceSelector"`
		Selector          struct {
			MatchLabels      map[string]string `json:"matchLabels"`
			MatchExpressions []struct{ Key, Operator string }
		} `json:"selector"`
		Endpoints []struct {
			Port   string
			Scheme string
			Auth   struct {
				Type        string
				Credentials struct{ Name, Key string }
			} `json:"authorization"`
		} `json:"podMetricsEndpoints"`
	}
	testenv.Convert(t, pm.Object["spec"], &spec)
	// Each endpoint sends the token the operator gives its agents (the Secret its flag names),
	// over HTTPS (the agents serve it over nothing else).
	operatorArgs := toJSON(t, find(objs, "Deployment", "operator"))
	for _, ep := range spec.Endpoints {
		if a := ep.Auth; a.Type != "Bearer" || a.Credentials.Key != "token" || ep.Scheme != "https" ||
			!strings.Contains(operatorArgs, "--agent-metrics-secret="+a.Credentials.Name+`"`) {
			t.Errorf("PodMonitor endpoint %s (%s) authorization %+v; the operator's flags %s", ep.Port, ep.Scheme, a, operatorArgs)
		}
	}
	if !spec.NamespaceSelector.Any || spec.Selector.MatchLabels["app.kubernetes.io/managed-by"] != "numastream-operator" ||
		len(spec.Selector.MatchExpressions) != 1 || spec.Selector.MatchExpressions[0].Key != agentrender.LabelRole {
		t.Errorf("PodMonitor selects %+v", spec)
	}
	if len(spec.Endpoints) != 2 || spec.Endpoints[0].Port != "metrics" || spec.Endpoints[1].Port != "metrics-dx" {
		t.Errorf("PodMonitor scrapes %+v, the agents' ports are metrics and metrics-dx", spec.Endpoints)
	}
	if cm := find(objs, "ConfigMap", "dashboard"); cm == nil || cm.GetLabels()["grafana_dashboard"] != "1" {
		t.Errorf("dashboard ConfigMap %v", cm)
	}

	c := apiServer(t, &envtest.Environment{CRDInstallOptions: envtest.CRDInstallOptions{Paths: []string{crds}, ErrorIfPathMissing: true}})
	ctx := context.Background()
	strict := client.FieldValidation("Strict")
	for _, o := range mon {
		if err := c.Create(ctx, o.DeepCopy(), client.DryRunAll, strict); err != nil {
			t.Errorf("%s %s refused: %v", o.GetKind(), o.GetName(), err)
		}
	}
	typo := pm.DeepCopy()
	_ = unstructured.SetNestedField(typo.Object, true, "spec", "honourLabels")
	if err := c.Create(ctx, typo, client.DryRunAll, strict); err == nil || !strings.Contains(err.Error(), "honourLabels") {
		t.Errorf("a PodMonitor with an unknown field: %v", err)
	}
}

// Every alert fires on what it names and stays quiet otherwise (promtool's rule tests: series
// in, alerts out at given times), with the thresholds the values set.
func TestTheAlertsFireOnWhatTheyName(t *testing.T) {
	promtool := filepath.Join(testenv.Monitoring(t), "promtool")
	dir := t.TempDir()
	rules := find(monitoring(t, "--set", "metrics.prometheusRule.for=5m", "--set", "metrics.prometheusRule.notReadyFor=5m", "--set-json", "metrics.prometheusRule.rateBelowPlan=0.5"), "PrometheusRule", "")
	writeYAML(t, filepath.Join(dir, "rules.yaml"), rules.Object["spec"])
	if out, err := exec.Command(promtool, "check", "rules", filepath.Join(dir, "rules.yaml")).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	p := `namespace="beamline", pipeline="tomo", stream="0"`
	labels := map[string]any{"namespace": "beamline", "pipeline": "tomo", "stream": "0"}
	with := func(extra map[string]any) map[string]any {
		out := map[string]any{}
		for k, v := range labels {
			out[k] = v
		}
		for k, v := range extra {
			out[k] = v
		}
		return out
	}
	type alert = map[string]any
	fires := func(name string, at string, lbls map[string]any, summary, description string) alert {
		return alert{"eval_time": at, "alertname": name, "exp_alerts": []any{map[string]any{"exp_labels": lbls,
			"exp_annotations": map[string]any{"summary": summary, "description": description}}}}
	}
	quiet := func(name, at string) alert { return alert{"eval_time": at, "alertname": name, "exp_alerts": []any{}} }
	tests := []map[string]any{
		{"interval": "1m", "input_series": []any{
			map[string]any{"series": `numastream_chunks_lost{role="receive", ` + p + `}`, "values": "0 0 3 3"},
		}, "alert_rule_test": []any{
			quiet("NumastreamDataMissing", "1m"),
			fires("NumastreamDataMissing", "2m", with(map[string]any{"severity": "critical"}), "beamline/tomo stream 0: 3 chunks missing",
				"The gateway is missing chunks of the stream; status.observed.missingChunks and the DataLoss condition name them and why."),
		}},
		{"interval": "1m", "input_series": []any{
			map[string]any{"series": `numastream_chunks_corrupt_total{role="receive", ` + p + `}`, "values": "0 0 0 2 2"},
		}, "alert_rule_test": []any{
			quiet("NumastreamDataCorrupt", "2m"),
			fires("NumastreamDataCorrupt", "3m", with(map[string]any{"severity": "critical"}), "beamline/tomo stream 0: chunks failed verification",
				"Chunks arrived whose checksum did not match; they were not written. See docs/troubleshooting.md."),
		}},
		// Stalled: nothing received for 10 minutes of an unfinished stream; a finished one is not.
		{"interval": "1m", "input_series": []any{
			map[string]any{"series": `numastream_raw_bytes_total{role="receive", ` + p + `}`, "values": "0+1000x5 5000x15"},
			map[string]any{"series": `numastream_streams_complete{role="receive", ` + p + `}`, "values": "0x20"},
			map[string]any{"series": `numastream_raw_bytes_total{role="receive", namespace="beamline", pipeline="done", stream="0"}`, "values": "0+1000x5 5000x15"},
			map[string]any{"series": `numastream_streams_complete{role="receive", namespace="beamline", pipeline="done", stream="0"}`, "values": "0x5 1x15"},
		}, "alert_rule_test": []any{
			quiet("NumastreamStreamStalled", "6m"),
			fires("NumastreamStreamStalled", "15m", with(map[string]any{"severity": "warning"}), "beamline/tomo stream 0 has received nothing for 5m",
				"The sender is not sending (its source is quiet or it is not running) or the data network is down."),
		}},
		// 1 MB/s (8 Mbit/s) against a plan of 10 Gbit/s: below half the plan; against 10 Mbit/s: not.
		{"interval": "1m", "input_series": []any{
			map[string]any{"series": `numastream_raw_bytes_total{role="receive", ` + p + `}`, "values": "0+60000000x20"},
			map[string]any{"series": `numastream_pipeline_predicted_raw_bits_per_second{namespace="beamline", pipeline="tomo"}`, "values": "10000000000x20"},
			map[string]any{"series": `numastream_raw_bytes_total{role="receive", namespace="beamline", pipeline="paced", stream="0"}`, "values": "0+60000000x20"},
			map[string]any{"series": `numastream_pipeline_predicted_raw_bits_per_second{namespace="beamline", pipeline="paced"}`, "values": "10000000x20"},
		}, "alert_rule_test": []any{
			quiet("NumastreamRateBelowPlan", "4m"),
			fires("NumastreamRateBelowPlan", "10m", map[string]any{"namespace": "beamline", "pipeline": "tomo", "severity": "info"},
				"beamline/tomo runs below 50% of its plan",
				"A paced or quiet source explains it; else see the pipeline's status.observed.bottleneck against status.bottleneck."),
		}},
		{"interval": "1m", "input_series": []any{
			map[string]any{"series": `numastream_pipeline_topology_refusals{namespace="beamline", pipeline="tomo"}`, "values": "0 0 1 1"},
		}, "alert_rule_test": []any{
			quiet("NumastreamTopologyRefused", "1m"),
			fires("NumastreamTopologyRefused", "2m", map[string]any{"namespace": "beamline", "pipeline": "tomo", "severity": "warning"},
				"beamline/tomo: the kubelet's Topology Manager refused 1 pods",
				"The operator plans again with fewer receiving cores; status.topologyRejection names the pods."),
		}},
		// What never starts: held by a refusal (StorageNotAllowed) from the first minute; stalled;
		// not Ready past notReadyFor (5m here), but a suspended pipeline never.
		{"interval": "1m", "input_series": []any{
			map[string]any{"series": `numastream_pipeline_condition{namespace="beamline", pipeline="tomo", type="Planned", status="False", reason="StorageNotAllowed"}`, "values": "1x10"},
			map[string]any{"series": `numastream_pipeline_condition{namespace="beamline", pipeline="tomo", type="Stalled", status="True", reason="StorageNotAllowed"}`, "values": "1x10"},
			map[string]any{"series": `numastream_pipeline_condition{namespace="beamline", pipeline="tomo", type="Ready", status="False", reason="NotPlanned"}`, "values": "1x10"},
			map[string]any{"series": `numastream_pipeline_condition{namespace="beamline", pipeline="paused", type="Ready", status="False", reason="Suspended"}`, "values": "1x10"},
			map[string]any{"series": `numastream_pipeline_condition{namespace="beamline", pipeline="fine", type="Planned", status="True", reason="Planned"}`, "values": "1x10"},
		}, "alert_rule_test": []any{
			quiet("NumastreamPipelineNotPlanned", "1m"),
			fires("NumastreamPipelineNotPlanned", "3m", map[string]any{"namespace": "beamline", "pipeline": "tomo", "reason": "StorageNotAllowed", "severity": "warning"},
				"beamline/tomo is not planned: StorageNotAllowed",
				"No agent runs until the pipeline or the cluster changes; the Planned condition's message names the field or node (kubectl describe streampipeline)."),
			fires("NumastreamPipelineStalled", "3m", map[string]any{"namespace": "beamline", "pipeline": "tomo", "reason": "StorageNotAllowed", "severity": "warning"},
				"beamline/tomo is stalled: StorageNotAllowed",
				"The pipeline cannot converge without a change; the Stalled condition's message says what to change."),
			quiet("NumastreamPipelineNotReady", "4m"),
			fires("NumastreamPipelineNotReady", "6m", map[string]any{"namespace": "beamline", "pipeline": "tomo", "reason": "NotPlanned", "severity": "warning"},
				"beamline/tomo has not been Ready for 5m: NotPlanned",
				"See the pipeline's Ready condition and events (kubectl describe streampipeline); docs/troubleshooting.md lists the reasons."),
		}},
		{"interval": "1m", "input_series": []any{
			map[string]any{"series": `numastream_spill_bytes{role="send", ` + p + `}`, "values": "500 900 900 900"},
			map[string]any{"series": `numastream_spill_max_bytes{role="send", ` + p + `}`, "values": "1000x3"},
		}, "alert_rule_test": []any{
			quiet("NumastreamSpillFilling", "1m"),
			fires("NumastreamSpillFilling", "3m", with(map[string]any{"severity": "warning"}), "beamline/tomo stream 0: the spill is 90% full",
				"Chunks are lost when it is full and the source cannot wait: the gateway or the network is slower than the source."),
		}},
	}
	writeYAML(t, filepath.Join(dir, "tests.yaml"), map[string]any{"rule_files": []any{"rules.yaml"}, "evaluation_interval": "1m", "tests": tests})
	cmd := exec.Command(promtool, "test", "rules", "tests.yaml")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	// The tests can fail: a threshold the values move makes them.
	bad := find(monitoring(t, "--set-json", "metrics.prometheusRule.spillFull=0.95"), "PrometheusRule", "")
	writeYAML(t, filepath.Join(dir, "rules.yaml"), bad.Object["spec"])
	if out, err := cmd2(promtool, dir); err == nil || !strings.Contains(out, "NumastreamSpillFilling") {
		t.Errorf("spillFull=0.95 still fires at 90%%: %v\n%s", err, out)
	}
}

func cmd2(promtool, dir string) (string, error) {
	cmd := exec.Command(promtool, "test", "rules", "tests.yaml")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// The dashboard is Grafana JSON whose every query is valid PromQL over the metrics the agents and
// the operator export (docs/agent-metrics.md; the facility test runs them against live agents).
func TestTheDashboardsQueriesAreValidPromQL(t *testing.T) {
	promtool := filepath.Join(testenv.Monitoring(t), "promtool")
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	data := find(monitoring(t), "ConfigMap", "dashboard").Object["data"].(map[string]any)["numastream.json"].(string)
	if err := json.Unmarshal([]byte(data), &d); err != nil {
		t.Fatal(err)
	}
	queries, err := testenv.DashboardQueries([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	var rules []any
	for i, q := range queries {
		rules = append(rules, map[string]any{"record": "numastream:dashboard_query_" + string(rune('a'+i)), "expr": q})
	}
	if len(d.Panels) < 8 || len(rules) < len(d.Panels) {
		t.Fatalf("%d panels, %d queries", len(d.Panels), len(rules))
	}
	dir := t.TempDir()
	writeYAML(t, filepath.Join(dir, "queries.yaml"), map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if out, err := exec.Command(promtool, "check", "rules", filepath.Join(dir, "queries.yaml")).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules (the dashboard's queries): %v\n%s", err, out)
	}
	names := regexp.MustCompile(`numastream_[a-z_]+`).FindAllString(strings.Join(func() []string {
		var qs []string
		for _, r := range rules {
			qs = append(qs, r.(map[string]any)["expr"].(string))
		}
		return qs
	}(), " "), -1)
	doc, err := os.ReadFile("../../docs/agent-metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if !strings.Contains(string(doc), n) && n != "numastream_pipeline_predicted_raw_bits_per_second" {
			t.Errorf("the dashboard queries %s, which docs/agent-metrics.md does not list", n)
		}
	}
}

func writeYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := sigsyaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func toJSON(t *testing.T, o *unstructured.Unstructured) string {
	t.Helper()
	b, err := json.Marshal(o.Object)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
