// Command operator runs the StreamPipeline controller.
package main

import (
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/controllers"
	"github.com/numastream/numastream/internal/observe"
	"github.com/numastream/numastream/internal/render"
	"github.com/numastream/numastream/internal/version"
)

func main() {
	var (
		metricsAddr     = flag.String("metrics-bind-address", ":8080", "address of the operator's own metrics endpoint")
		metricsTLS      = flag.Bool("metrics-secure", true, "serve the operator's metrics over HTTPS to a client whose token the API server authenticates and authorizes for GET /metrics (TokenReview, SubjectAccessReview); false: plain HTTP to anyone who reaches the port")
		metricsCerts    = flag.String("metrics-cert-dir", "", "directory with the metrics endpoint's tls.crt and tls.key (empty: a self-signed certificate made at start)")
		probeAddr       = flag.String("health-probe-bind-address", ":8081", "address of the health probes")
		leaderElect     = flag.Bool("leader-elect", false, "use leader election so only one replica reconciles")
		agentImage      = flag.String("agent-image", "ghcr.io/numastream/agent:0.2.0", "image of the agent pods")
		pprofAddr       = flag.String("pprof-bind-address", "0", "address of Go's profiler (net/http/pprof), for finding where the operator's time goes; 0: off")
		observeEvery    = flag.Duration("observe-every", 15*time.Second, "how often running pipelines' agents are read for status (0: never)")
		workers         = flag.Int("workers", controllers.DefaultWorkers, "how many pipelines are reconciled at once")
		observePar      = flag.Int("observe-parallel", controllers.DefaultObserveParallel, "how many pipelines' agents the observer reads at once")
		netPolicy       = flag.Bool("network-policy", true, "give each pipeline a NetworkPolicy: only its sender pods reach its gateway's data ports")
		metricsFrom     = flag.String("metrics-from", "", "comma-separated namespaces whose pods, and address blocks (CIDR) which, may read the gateways' metrics ports under the NetworkPolicy (the operator's namespace, a monitoring one, a Prometheus outside the cluster); empty: every namespace")
		watchNS         = flag.String("watch-namespaces", "", "comma-separated namespaces whose StreamPipelines the operator drives (a namespace-scoped install: it writes only there); empty: every namespace")
		storagePrefixes = flag.String("storage-prefixes", "", "comma-separated host directories under which the node daemon makes each pipeline's own directory (operator.hostPathPrefixes): a pipeline's volume of a StorageRoot under one of them is its own directory of the root; a pipeline using any other root is refused (see --whole-root-volumes)")
		wholeRoots      = flag.Bool("whole-root-volumes", false, "let a pipeline's volume of a StorageRoot under none of --storage-prefixes be the whole root, every other pipeline's files in it (operator.wholeRootVolumes); false: such a pipeline is refused (StorageNotAllowed)")
		agentMetrics    = flag.String("agent-metrics-secret", "", "Secret (in --namespace) with the token the agents' metrics ports ask a client off the pod's loopback for (key token; made with a random token when missing); empty: they ask none")
		namespace       = flag.String("namespace", os.Getenv("POD_NAMESPACE"), "the operator's own namespace (of --agent-metrics-secret)")
		agentPods       = flag.String("agent-pods", "", `scheduling settings of every agent pod, JSON: {"tolerations":[...],"nodeSelector":{...},"priorityClassName":"...","imagePullSecrets":[{"name":"..."}]}`)
	)
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println(version.String("numastream-operator"))
		return
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	log := ctrl.Log.WithName("setup")

	if err := render.ParseMetricsFrom(splitList(*metricsFrom)); err != nil {
		log.Error(err, "--metrics-from takes namespace names and address blocks")
		os.Exit(2)
	}
	var pods v1beta1.PodSettings
	if *agentPods != "" {
		dec := json.NewDecoder(strings.NewReader(*agentPods))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&pods); err != nil {
			log.Error(err, "--agent-pods is not valid JSON pod settings", "value", *agentPods)
			os.Exit(2)
		}
		if _, ok := pods.NodeSelector[corev1.LabelHostname]; ok {
			log.Error(nil, "--agent-pods: nodeSelector must not set kubernetes.io/hostname (the plan names each pod's node)")
			os.Exit(2)
		}
	}

	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(v1beta1.AddToScheme(scheme))

	namespaces := controllers.ParseNamespaces(splitList(*watchNS))
	cfg := ctrl.GetConfigOrDie()
	metrics := metricsserver.Options{BindAddress: *metricsAddr}
	if *metricsTLS {
		// As kube-rbac-proxy does: the scraper's token, checked with the API server.
		metrics.SecureServing, metrics.CertDir = true, *metricsCerts
		metrics.FilterProvider = filters.WithAuthenticationAndAuthorization
		// No HTTP/2 (CVE-2023-44487, CVE-2023-39325: rapid reset); Prometheus scrapes over 1.1.
		metrics.TLSOpts = []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }}
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Cache:                  namespaces.CacheOptions(),
		Metrics:                metrics,
		HealthProbeBindAddress: *probeAddr,
		PprofBindAddress:       *pprofAddr,
		LeaderElection:         *leaderElect,
		LeaderElectionID:       "numastream-operator.numastream.io",
	})
	if err != nil {
		log.Error(err, "Cannot create the manager")
		os.Exit(1)
	}
	ctx := ctrl.SetupSignalHandler()
	agents := observe.NewObserver(5 * time.Second)
	tokenSHA256 := ""
	if *agentMetrics != "" {
		if *namespace == "" {
			log.Error(nil, "--agent-metrics-secret needs --namespace (or POD_NAMESPACE)")
			os.Exit(2)
		}
		direct, err := client.New(cfg, client.Options{Scheme: scheme})
		if err == nil {
			agents.Token, err = observe.MetricsToken(ctx, direct, *namespace, *agentMetrics)
		}
		if err != nil {
			log.Error(err, "Cannot read or make the agents' metrics token")
			os.Exit(1)
		}
		tokenSHA256 = observe.TokenSHA256(agents.Token)
	}
	r := &controllers.StreamPipelineReconciler{
		Client:   mgr.GetClient(),
		Scheme:   mgr.GetScheme(),
		Recorder: mgr.GetEventRecorder("numastream-operator"),
		Render: render.Options{AgentImage: *agentImage, NetworkPolicy: *netPolicy, MetricsFrom: splitList(*metricsFrom), Pods: pods,
			StoragePrefixes: splitList(*storagePrefixes), WholeRootVolumes: *wholeRoots, MetricsTokenSHA256: tokenSHA256},
		APIReader:  mgr.GetAPIReader(),
		Namespaces: namespaces,
		Workers:    *workers,
		Final:      agents.Observe,
	}
	if err := r.SetupWithManager(ctx, mgr); err != nil {
		log.Error(err, "Cannot set up the StreamPipeline controller")
		os.Exit(1)
	}
	if err := (&controllers.RemoteSiteReconciler{Client: mgr.GetClient(), Namespaces: namespaces}).SetupWithManager(mgr); err != nil {
		log.Error(err, "Cannot set up the RemoteSite controller")
		os.Exit(1)
	}
	if *observeEvery > 0 {
		obs := &controllers.Observer{Client: mgr.GetClient(), Read: agents.Observe, Every: *observeEvery, Namespaces: namespaces, Parallel: *observePar}
		if err := mgr.Add(obs); err != nil {
			log.Error(err, "Cannot add the observer")
			os.Exit(1)
		}
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		log.Error(err, "Cannot add the health check")
		os.Exit(1)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		log.Error(err, "Cannot add the ready check")
		os.Exit(1)
	}
	log.Info("Starting the manager")
	if err := mgr.Start(ctx); err != nil {
		log.Error(err, "Manager stopped")
		os.Exit(1)
	}
}

// splitList: the non-empty, trimmed items of a comma-separated list.
func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
