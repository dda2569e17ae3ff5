package facility

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/render"
	"github.com/numastream/numastream/internal/storage"
	"github.com/numastream/numastream/internal/testenv"
)

// A real Prometheus scrapes the facility's agents the way the chart's PodMonitor asks (its
// selector, ports and relabelings, turned into Prometheus's configuration as the Prometheus
// Operator does) and the operator as its ServiceMonitor asks, and evaluates the chart's alert
// rules: every dashboard query and every metric an alert reads returns series from the running
// pipeline, and chunks lost for real (the gateway stopped while a paced sender's 1 MiB spill
// overflows) fire NumastreamDataMissing for that stream.
func TestPrometheusScrapesTheAgentsAndALossFiresItsAlert(t *testing.T) {
	mon := testenv.Monitoring(t)
	objs := chartObjects(t, "--set", "metrics.podMonitor.enabled=true", "--set", "metrics.serviceMonitor.enabled=true",
		"--set", "metrics.prometheusRule.enabled=true", "--set", "metrics.dashboard.enabled=true", "--set", "metrics.prometheusRule.for=10s",
		"--set", "metrics.prometheusRule.notPlannedFor=10s")
	dir := t.TempDir()
	token := scraperToken(t, dir)
	writeYAMLFile(t, filepath.Join(dir, "rules.yaml"), objs["PrometheusRule"].Object["spec"])
	config := map[string]any{
		"global":     map[string]any{"scrape_interval": "2s", "evaluation_interval": "2s"},
		"rule_files": []any{"rules.yaml"},
		"scrape_configs": append(podMonitorJobs(t, objs["PodMonitor"], kubeconfig, dir),
			serviceMonitorJob(t, objs["ServiceMonitor"], kubeconfig, token)),
	}
	writeYAMLFile(t, filepath.Join(dir, "prometheus.yml"), config)
	prom := startPrometheus(t, mon, dir)

	// A pipeline that never starts: its file sink names a StorageRoot the admin never made. The
	// operator's condition metric, scraped as its ServiceMonitor asks, fires NotPlanned.
	unplanned := start(t, pipeline(t, ns, "unplanned", 10, "  sink: {file: {root: no-such-root, path: \"x-{stream}.raw\"}}"))

	sp := pipeline(t, ns, "watched", 0, "")
	sp.Spec.Senders[0].Source.Synthetic.RateGbps = ptrInt32(1)
	sp.Spec.Spill = &v1beta1.Spill{MaxBytes: 1 << 20} // an emptyDir
	sp.Spec.Preview = &v1beta1.Preview{MaxSide: ptrInt32(64)}
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	defer deleteAndCheckGone(t, sp)
	gw, _ := flowing(t, sp, "the paced stream flowing", 5)

	// The live preview as a person opens it: kubectl numastream preview forwards a local port to
	// the gateway's decoding container through the API server and the kubelet.
	page, forward, stop := openPreview(t, sp)
	resp, err := http.Get(page + "/streams.json")
	if err != nil {
		t.Fatalf("GET %s/streams.json through the forward: %v", page, err)
	}
	list, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(list), `"stream":0`) {
		t.Errorf("the preview through kubectl numastream preview: %s: %s", resp.Status, list)
	}
	stop()
	t.Logf("%s: %s", strings.TrimSpace(forward.String()), list)
	// From the pod network (here the host, which the NetworkPolicy admits to the metrics ports):
	// the metrics ports answer nothing but the liveness probe's path without the operator's
	// token, and a wrong one is as good as none; with it, the metrics port serves no picture,
	// and the preview's port is the pod's loopback only. Over plain HTTP they serve only the
	// probe's path, whatever the token (which would have crossed the network in clear).
	dx := net.JoinHostPort(gw.Status.PodIP, strconv.Itoa(render.DecompressMetricsPort))
	agents, err := agentToken()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		scheme, path, bearer string
	}{{"https", "/metrics", ""}, {"https", "/metrics", agents[1:]}, {"https", "/metrics", agents}, {"https", "/healthz", ""},
		{"https", "/preview/streams.json", ""}, {"https", "/preview/streams.json", agents},
		{"http", "/healthz", ""}, {"http", "/metrics", agents}, {"http", "/preview/streams.json", agents}} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.scheme+"://"+dx+c.path, nil)
		if c.bearer != "" {
			req.Header.Set("Authorization", "Bearer "+c.bearer)
		}
		want := map[bool]int{true: http.StatusUnauthorized, false: http.StatusOK}[c.bearer != agents && c.path != "/healthz"]
		switch {
		case c.scheme == "http" && c.path != "/healthz":
			want = http.StatusForbidden
		case c.bearer == agents && strings.HasPrefix(c.path, "/preview"):
			want = http.StatusNotFound
		}
		resp, err := agentClient.Do(req)
		if err != nil || resp.StatusCode != want {
			t.Errorf("GET %s://%s%s (token %v): %v %v, want %d", c.scheme, dx, c.path, c.bearer == agents, resp, err, want)
		} else {
			_ = resp.Body.Close()
		}
	}
	loopback := net.JoinHostPort(gw.Status.PodIP, strconv.Itoa(render.PreviewPort))
	if c, err := net.DialTimeout("tcp", loopback, 5*time.Second); err == nil {
		_ = c.Close()
		t.Errorf("the preview's port answers on the pod's address %s: it is the loopback's only", loopback)
	}

	// Every dashboard query returns series from the live pipeline.
	dashboard := objs["ConfigMap"].Object["data"].(map[string]any)["numastream.json"].(string)
	queries, err := testenv.DashboardQueries([]byte(dashboard))
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range queries {
		eventually(t, "series for the dashboard's "+q, 90*time.Second, func() (bool, string) {
			n, err := prom.count(q)
			return n > 0, fmt.Sprint(n, " series ", err)
		})
	}
	// Every rule is loaded and evaluates; every metric an alert reads has series.
	rules := prom.rules(t)
	for name, health := range rules {
		if health != "ok" {
			t.Errorf("rule %s: %s", name, health)
		}
	}
	ruleText, _ := yaml.Marshal(objs["PrometheusRule"].Object["spec"])
	if want := uniq(regexp.MustCompile(`alert: (\S+)`).FindAllString(string(ruleText), -1)); len(rules) != len(want) {
		t.Errorf("%d rules loaded, the chart has %d: %v", len(rules), len(want), rules)
	}
	for _, metric := range uniq(regexp.MustCompile(`numastream_[a-z_]+`).FindAllString(string(ruleText), -1)) {
		eventually(t, "series of "+metric, 30*time.Second, func() (bool, string) {
			n, err := prom.count(metric)
			return n > 0, fmt.Sprint(n, " series ", err)
		})
	}
	if firing := prom.firing(t, "NumastreamDataMissing"); len(firing) > 0 {
		t.Fatalf("data missing before anything was lost: %v", firing)
	}

	// The gateway's receiving agent stops for 6 s (SIGSTOP: a gateway busy elsewhere); the paced
	// sender cannot wait, its 1 MiB spill overflows, and it declares the chunks it lost.
	pid := agentProcess(t, gw, "-relay.json")
	t.Logf("stopping the gateway's receiving agent (pid %d in pod %s) for 6 s", pid, gw.Name)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(6 * time.Second)
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	var alert map[string]string
	eventually(t, "NumastreamDataMissing firing for the stream", 90*time.Second, func() (bool, string) {
		for _, a := range prom.firing(t, "NumastreamDataMissing") {
			if a["namespace"] == ns && a["pipeline"] == sp.Name && a["stream"] == "0" {
				alert = a
				return true, ""
			}
		}
		lost, _ := prom.value(`max(numastream_chunks_lost{pipeline="watched"})`)
		return false, fmt.Sprintf("chunks lost %s", lost)
	})
	lost, _ := prom.value(`max(numastream_chunks_lost{pipeline="watched"})`)
	cur := get(t, sp)
	t.Logf("alert %v: %s chunks lost; the pipeline's status: lost %d, missing %v", alert, lost, cur.Status.Observed.ChunksLost, cur.Status.Observed.MissingChunks)

	eventually(t, "NumastreamPipelineNotPlanned firing for the pipeline held by its storage", 90*time.Second, func() (bool, string) {
		for _, a := range prom.firing(t, "NumastreamPipelineNotPlanned") {
			if a["namespace"] == ns && a["pipeline"] == unplanned.Name {
				alert = a
				return true, ""
			}
		}
		v, _ := prom.value(`max(numastream_pipeline_condition{pipeline="unplanned", type="Planned", status="False"})`)
		return false, "condition metric " + v
	})
	if alert["reason"] != storage.ReasonNotAllowed {
		t.Errorf("NotPlanned alert %v: want reason %s", alert, storage.ReasonNotAllowed)
	}
	t.Logf("alert %v for the pipeline that never started", alert)
}

// chartObjects renders the chart with the facility's values and extra flags, by kind.
func chartObjects(t *testing.T, args ...string) map[string]*unstructured.Unstructured {
	t.Helper()
	helm := os.Getenv("HELM")
	if helm == "" {
		t.Fatal("HELM is not set (make test-e2e-facility sets it)")
	}
	cmd := exec.Command(helm, append([]string{"template", "numastream", filepath.Join("..", "..", "charts", "numastream"),
		"--namespace", "numastream-system", "-f", "values.yaml"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr.String())
	}
	objs := map[string]*unstructured.Unstructured{}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			break
		}
		switch k := u.GetKind(); {
		case k == "ConfigMap" && !strings.HasSuffix(u.GetName(), "-dashboard"):
		case k != "":
			objs[k] = u
		}
	}
	for _, k := range []string{"PodMonitor", "ServiceMonitor", "PrometheusRule", "ConfigMap"} {
		if objs[k] == nil {
			t.Fatalf("the chart rendered no %s", k)
		}
	}
	return objs
}

// podMonitorJobs is a PodMonitor as Prometheus configuration, as the Prometheus Operator writes
// it: pod discovery in the namespaces it selects, the pods its selector matches (running ones),
// the container ports it names, the namespace/pod/container labels, then its own relabelings;
// the bearer token its authorization names, from that Secret of the PodMonitor's namespace (the
// Prometheus Operator inlines it; here a file under dir).
func podMonitorJobs(t *testing.T, pm *unstructured.Unstructured, kubeconfig, dir string) []any {
	t.Helper()
	var spec struct {
		NamespaceSelector struct{ Any bool } `json:"namespaceSelector"`
		Selector          struct {
			MatchLabels      map[string]string `json:"matchLabels"`
			MatchExpressions []struct{ Key, Operator string }
		} `json:"selector"`
		Endpoints []struct {
			Port      string `json:"port"`
			Interval  string `json:"interval"`
			Scheme    string `json:"scheme"`
			TLSConfig *struct {
				InsecureSkipVerify bool `json:"insecureSkipVerify"`
			} `json:"tlsConfig"`
			Relabelings []map[string]any `json:"relabelings"`
			Auth        *struct {
				Type        string
				Credentials struct{ Name, Key string }
			} `json:"authorization"`
		} `json:"podMetricsEndpoints"`
	}
	testenv.Convert(t, pm.Object["spec"], &spec)
	if !spec.NamespaceSelector.Any {
		t.Fatal("the PodMonitor does not select every namespace: translate its namespaces")
	}
	var jobs []any
	for _, ep := range spec.Endpoints {
		relabel := []any{
			map[string]any{"source_labels": []any{"__meta_kubernetes_pod_phase"}, "regex": "(Failed|Succeeded)", "action": "drop"},
			map[string]any{"source_labels": []any{"__meta_kubernetes_pod_container_port_name"}, "regex": ep.Port, "action": "keep"},
		}
		for k, v := range spec.Selector.MatchLabels {
			relabel = append(relabel, map[string]any{"source_labels": []any{"__meta_kubernetes_pod_label_" + sdName(k)}, "regex": v, "action": "keep"})
		}
		for _, e := range spec.Selector.MatchExpressions {
			if e.Operator != "Exists" {
				t.Fatalf("PodMonitor selector operator %s: translate it", e.Operator)
			}
			relabel = append(relabel, map[string]any{"source_labels": []any{"__meta_kubernetes_pod_labelpresent_" + sdName(e.Key)}, "regex": "true", "action": "keep"})
		}
		relabel = append(relabel,
			map[string]any{"source_labels": []any{"__meta_kubernetes_namespace"}, "target_label": "namespace"},
			map[string]any{"source_labels": []any{"__meta_kubernetes_pod_name"}, "target_label": "pod"},
			map[string]any{"source_labels": []any{"__meta_kubernetes_pod_container_name"}, "target_label": "container"})
		for _, r := range ep.Relabelings {
			out := map[string]any{}
			for k, v := range r {
				out[snake(k)] = v
			}
			relabel = append(relabel, out)
		}
		job := map[string]any{"job_name": "podMonitor/" + pm.GetName() + "/" + ep.Port, "scrape_interval": "2s",
			"kubernetes_sd_configs": []any{map[string]any{"role": "pod", "kubeconfig_file": kubeconfig}},
			"relabel_configs":       relabel}
		if ep.Scheme != "" {
			job["scheme"] = ep.Scheme
		}
		if ep.TLSConfig != nil {
			job["tls_config"] = map[string]any{"insecure_skip_verify": ep.TLSConfig.InsecureSkipVerify}
		}
		if a := ep.Auth; a != nil {
			secret, err := cs.CoreV1().Secrets(pm.GetNamespace()).Get(ctx, a.Credentials.Name, metav1.GetOptions{})
			if err != nil || len(secret.Data[a.Credentials.Key]) == 0 {
				t.Fatalf("the PodMonitor's %s credentials, Secret %s key %s: %v", a.Type, a.Credentials.Name, a.Credentials.Key, err)
			}
			file := filepath.Join(dir, "podmonitor-"+ep.Port+".token")
			if err := os.WriteFile(file, secret.Data[a.Credentials.Key], 0o600); err != nil {
				t.Fatal(err)
			}
			job["authorization"] = map[string]any{"type": a.Type, "credentials_file": file}
		}
		jobs = append(jobs, job)
	}
	return jobs
}

// openPreview opens the live preview of the pipeline's stream 0 as a person does: kubectl
// numastream preview forwards a local port to the gateway pod's loopback through the API server
// and the kubelet. The page's address, what the plugin printed, and stop (Ctrl-C, then its exit
// checked).
func openPreview(t *testing.T, sp *v1beta1.StreamPipeline) (string, *lockedBuffer, func()) {
	t.Helper()
	forward := &lockedBuffer{}
	preview := plugin(t, forward, "preview", sp.Name)
	var page string
	eventually(t, "kubectl numastream preview's address", 60*time.Second, func() (bool, string) {
		page = regexp.MustCompile(`http://127\.0\.0\.1:[0-9]+/preview`).FindString(forward.String())
		return page != "", forward.String()
	})
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		_ = preview.Process.Signal(syscall.SIGINT)
		if err := preview.Wait(); err != nil {
			t.Errorf("kubectl numastream preview after Ctrl-C: %v\n%s", err, forward.String())
		}
	}
	t.Cleanup(stop)
	return page, forward, stop
}

// scraperToken is what Prometheus's service account would scrape the operator with: a token of
// a service account bound to the chart's metrics-reader ClusterRole, in a file under dir. The
// operator's endpoint refuses a scrape without a token (401) and one whose account may not read
// it (403).
func scraperToken(t *testing.T, dir string) string {
	t.Helper()
	const nsName = "numastream-system"
	token := func(sa string) string {
		if _, err := cs.CoreV1().ServiceAccounts(nsName).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cs.CoreV1().ServiceAccounts(nsName).Delete(ctx, sa, metav1.DeleteOptions{}) })
		tr, err := cs.CoreV1().ServiceAccounts(nsName).CreateToken(ctx, sa, &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "facility-prometheus-metrics"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "numastream-operator-metrics-reader"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "facility-prometheus", Namespace: nsName}}}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.RbacV1().ClusterRoleBindings().Delete(ctx, binding.Name, metav1.DeleteOptions{}) })
	reader, stranger := token("facility-prometheus"), token("facility-stranger")
	var pods corev1.PodList
	if err := k8s.List(ctx, &pods, client.InNamespace(nsName), client.MatchingLabels{"app.kubernetes.io/component": "operator"}); err != nil || len(pods.Items) == 0 {
		t.Fatalf("the operator's pod: %v", err)
	}
	endpoint := "https://" + net.JoinHostPort(pods.Items[0].Status.PodIP, "8080") + "/metrics"
	scrape := func(bearer string) int {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, endpoint, nil)
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the operator's self-signed certificate
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("scraping %s: %v", endpoint, err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	var codes [3]int
	eventually(t, "the operator's metrics: 401 without a token, 403 for an account that may not read them, 200 for the reader", 30*time.Second, func() (bool, string) {
		codes = [3]int{scrape(""), scrape(stranger), scrape(reader)}
		return codes == [3]int{http.StatusUnauthorized, http.StatusForbidden, http.StatusOK}, fmt.Sprint(codes)
	})
	t.Logf("the operator's metrics over HTTPS: %d without a token, %d for another service account, %d for the metrics reader", codes[0], codes[1], codes[2])
	path := filepath.Join(dir, "scraper.token")
	if err := os.WriteFile(path, []byte(reader), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// serviceMonitorJob scrapes the operator's pods behind its ServiceMonitor's Service port
// (honouring the pipelines' labels as it asks), over HTTPS with the scraper's token when the
// ServiceMonitor asks for them (its bearerTokenFile is Prometheus's own: tokenFile here).
func serviceMonitorJob(t *testing.T, sm *unstructured.Unstructured, kubeconfig, tokenFile string) any {
	t.Helper()
	var spec struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		Endpoints []struct {
			Port            string `json:"port"`
			HonorLabels     bool   `json:"honorLabels"`
			Scheme          string `json:"scheme"`
			BearerTokenFile string `json:"bearerTokenFile"`
			TLSConfig       struct {
				InsecureSkipVerify bool `json:"insecureSkipVerify"`
			} `json:"tlsConfig"`
		} `json:"endpoints"`
	}
	testenv.Convert(t, sm.Object["spec"], &spec)
	relabel := []any{
		map[string]any{"source_labels": []any{"__meta_kubernetes_pod_container_port_name"}, "regex": spec.Endpoints[0].Port, "action": "keep"},
	}
	for k, v := range spec.Selector.MatchLabels {
		relabel = append(relabel, map[string]any{"source_labels": []any{"__meta_kubernetes_pod_label_" + sdName(k)}, "regex": v, "action": "keep"})
	}
	job := map[string]any{"job_name": "serviceMonitor/" + sm.GetName(), "scrape_interval": "2s", "honor_labels": spec.Endpoints[0].HonorLabels,
		"kubernetes_sd_configs": []any{map[string]any{"role": "pod", "kubeconfig_file": kubeconfig,
			"namespaces": map[string]any{"names": []any{sm.GetNamespace()}}}},
		"relabel_configs": relabel}
	if ep := spec.Endpoints[0]; ep.Scheme != "" {
		job["scheme"] = ep.Scheme
		job["tls_config"] = map[string]any{"insecure_skip_verify": ep.TLSConfig.InsecureSkipVerify}
		if ep.BearerTokenFile != "" {
			job["authorization"] = map[string]any{"credentials_file": tokenFile}
		}
	}
	return job
}

// sdName is a Kubernetes label name as Prometheus's service discovery spells it.
func sdName(label string) string {
	return regexp.MustCompile(`[^a-zA-Z0-9_]`).ReplaceAllString(label, "_")
}

// snake turns a PodMonitor's relabeling keys (sourceLabels) into Prometheus's (source_labels).
func snake(s string) string {
	return strings.ToLower(regexp.MustCompile(`([a-z])([A-Z])`).ReplaceAllString(s, "${1}_${2}"))
}

func writeYAMLFile(t *testing.T, path string, v any) {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err == nil {
		err = os.WriteFile(path, b, 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
}

func uniq(in []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range in {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// prometheus is a running Prometheus's HTTP API.
type prometheus struct{ url string }

func startPrometheus(t *testing.T, bin, dir string) prometheus {
	t.Helper()
	addr := "127.0.0.1:" + testenv.FreePort(t)
	logf, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(bin, "prometheus"), "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr)
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "prometheus.log"))
			t.Logf("prometheus log:\n%s", tail(string(b), 40))
		}
	})
	p := prometheus{url: "http://" + addr}
	eventually(t, "Prometheus ready", 60*time.Second, func() (bool, string) {
		r, err := http.Get(p.url + "/-/ready")
		if err != nil {
			return false, err.Error()
		}
		r.Body.Close()
		return r.StatusCode == 200, r.Status
	})
	return p
}

func (p prometheus) get(path string, q url.Values, out any) error {
	r, err := http.Get(p.url + path + "?" + q.Encode())
	if err != nil {
		return err
	}
	defer r.Body.Close()
	var env struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(r.Body).Decode(&env); err != nil {
		return err
	}
	if env.Status != "success" {
		return fmt.Errorf("%s: %s", path, env.Error)
	}
	return json.Unmarshal(env.Data, out)
}

// query is an instant query's series: labels and value.
func (p prometheus) query(q string) ([]struct {
	Metric map[string]string
	Value  []any
}, error) {
	var data struct {
		Result []struct {
			Metric map[string]string
			Value  []any
		}
	}
	err := p.get("/api/v1/query", url.Values{"query": {q}}, &data)
	return data.Result, err
}

func (p prometheus) count(q string) (int, error) {
	r, err := p.query(q)
	return len(r), err
}

// value is a one-series query's value ("" when it has none).
func (p prometheus) value(q string) (string, error) {
	r, err := p.query(q)
	if err != nil || len(r) == 0 || len(r[0].Value) != 2 {
		return "", err
	}
	return fmt.Sprint(r[0].Value[1]), nil
}

// rules are the loaded rules' health by name.
func (p prometheus) rules(t *testing.T) map[string]string {
	t.Helper()
	var data struct {
		Groups []struct {
			Rules []struct{ Name, Health, LastError string }
		}
	}
	if err := p.get("/api/v1/rules", nil, &data); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, g := range data.Groups {
		for _, r := range g.Rules {
			out[r.Name] = r.Health + " " + r.LastError
			if r.Health == "ok" {
				out[r.Name] = "ok"
			}
		}
	}
	return out
}

// firing are the labels of the alerts of that name firing now.
func (p prometheus) firing(t *testing.T, name string) []map[string]string {
	t.Helper()
	var data struct {
		Alerts []struct {
			Labels map[string]string
			State  string
		}
	}
	if err := p.get("/api/v1/alerts", nil, &data); err != nil {
		t.Fatal(err)
	}
	var out []map[string]string
	for _, a := range data.Alerts {
		if a.Labels["alertname"] == name && a.State == "firing" {
			out = append(out, a.Labels)
		}
	}
	return out
}

// agentProcess is the pid of the pod's agent whose command line names a configuration ending in
// suffix: found through its cgroup, since the box's containers run on this host. The cgroup
// names the pod's UID (the pod's cgroup) or, on a node without QoS cgroups (gateway-a,
// cgroupsPerQOS false), the container's ID.
func agentProcess(t *testing.T, p *corev1.Pod, suffix string) int {
	t.Helper()
	uid := string(p.UID)
	marks := []string{uid, strings.ReplaceAll(uid, "-", "_")}
	for _, c := range p.Status.ContainerStatuses {
		if _, id, ok := strings.Cut(c.ContainerID, "://"); ok && id != "" {
			marks = append(marks, id)
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, dir := range procs {
		cg, err := os.ReadFile(filepath.Join(dir, "cgroup"))
		if err != nil || !slices.ContainsFunc(marks, func(m string) bool { return strings.Contains(string(cg), m) }) {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join(dir, "cmdline"))
		args := strings.Split(string(cmd), "\x00")
		if len(args) > 0 && strings.HasSuffix(args[0], "numastream-agent") && strings.Contains(string(cmd), suffix) {
			var pid int
			fmt.Sscan(filepath.Base(dir), &pid)
			return pid
		}
	}
	t.Fatalf("no numastream-agent process with %q in pod %s (uid %s)", suffix, p.Name, uid)
	return 0
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
