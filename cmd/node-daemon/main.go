// Command node-daemon runs on every streaming-capable node (a DaemonSet): it publishes the node's
// NUMA and NIC facts and measured codec speeds as NFD labels, and serves the NIC-locality device
// plugin. See docs/node-labels.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/nodedaemon"
	"github.com/numastream/numastream/internal/nodelabels"
	"github.com/numastream/numastream/internal/version"
)

func main() {
	var (
		node        = flag.String("node-name", os.Getenv("NODE_NAME"), "this node's name (downward API)")
		namespace   = flag.String("namespace", os.Getenv("POD_NAMESPACE"), "namespace for the NodeFeature object")
		podName     = flag.String("pod-name", os.Getenv("POD_NAME"), "this pod's name, to find the owning DaemonSet")
		agent       = flag.String("agent", "/usr/local/bin/numastream-agent", "the agent binary")
		sysfs       = flag.String("sysfs-root", "/sys", "sysfs as mounted in the pod (read-only)")
		publish     = flag.String("publish", "nodefeature", "nodefeature (NFD NodeFeature API), features-d (NFD local source file) or both")
		featuresDir = flag.String("features-dir", "/etc/kubernetes/node-feature-discovery/features.d", "NFD's features.d directory")
		pluginDir   = flag.String("device-plugin-dir", "/var/lib/kubelet/device-plugins", "the kubelet's device-plugin directory")
		tokens      = flag.Int("tokens-per-nic", 16, "NIC-locality tokens per NIC (0 disables the device plugin)")
		interval    = flag.Duration("interval", time.Minute, "how often the topology is re-read")
		benchRounds = flag.Int("bench-rounds", 3, "rounds of the start-up codec calibration")
		addresses   = flag.Bool("publish-addresses", false, "publish each data NIC's IPv4 address (run with hostNetwork: the addresses of the host's network namespace), where hostNetwork senders reach a gateway")
		stateRoot   = flag.String("state-root", "", "the host's sender state root (/var/lib/numastream/streams) as mounted here: each StreamPipeline with a sender on this node gets its directory there, owned by its agents' user (empty: none, so no sender pod can start)")
		gcState     = flag.Bool("state-gc", true, "remove the state directories of deleted StreamPipelines under --state-root")
		prefixes    = flag.String("storage-prefixes", "", "comma-separated host directories under which this daemon makes each StreamPipeline's own directories of the StorageRoots it writes under (operator.hostPathPrefixes), mounted here under --host-storage; empty: none, and pipelines' volumes are whole roots")
		hostStorage = flag.String("host-storage", "/host/storage", "where the host's --storage-prefixes are mounted here: prefix P at this directory + P")
		nicRates    = flag.String("nic-rate", "", "declared data NICs and the rate of the path behind each, NIC=MBIT[,...]: published as the NIC's speed, virtual interfaces included")
	)
	opts := zap.Options{}
	health := flag.String("health-file", "", "where each round leaves its health record, for --probe (empty: none)")
	probe := flag.String("probe", "", "answer a probe from --health-file and exit: live (a round ended in time) or ready (and the node's facts are published)")
	opts.BindFlags(flag.CommandLine)
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println(version.String("numastream-node-daemon"))
		return
	}
	if *probe != "" {
		os.Exit(answerProbe(*probe, *health))
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	log := ctrl.Log.WithName("node-daemon")
	rates, err := nodelabels.ParseRates(*nicRates)
	if err != nil {
		fmt.Fprintln(os.Stderr, "node-daemon:", err)
		os.Exit(2)
	}
	var address func(string) string
	if *addresses {
		address = ipv4Of
	}
	st := storageFlags{stateRoot: *stateRoot, gc: *gcState, hostMount: *hostStorage}
	for _, p := range strings.Split(*prefixes, ",") {
		if p = strings.TrimSpace(p); p != "" {
			st.prefixes = append(st.prefixes, p)
		}
	}
	if err := run(log, *node, *namespace, *podName, *agent, *sysfs, *publish, *featuresDir, *pluginDir, *tokens, *interval, *benchRounds, rates, address, st, *health); err != nil {
		log.Error(err, "Node daemon failed")
		os.Exit(1)
	}
}

// answerProbe is the exit status of `--probe`: 0 when the health record says so, 1 with why not.
func answerProbe(kind, health string) int {
	if kind != "live" && kind != "ready" {
		fmt.Fprintf(os.Stderr, "node-daemon: --probe must be live or ready (got %q)\n", kind)
		return 2
	}
	if health == "" {
		fmt.Fprintln(os.Stderr, "node-daemon: --probe needs --health-file")
		return 2
	}
	if err := nodedaemon.Probe(health, kind == "ready", time.Now()); err != nil {
		fmt.Fprintln(os.Stderr, "node-daemon:", err)
		return 1
	}
	return 0
}

// stateGC removes the state directories of StreamPipelines that no longer exist.
func stateGC(root string, log logr.Logger) (*nodedaemon.StateGC, error) {
	scheme := runtime.NewScheme()
	if err := v1beta1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c, err := client.New(ctrl.GetConfigOrDie(), client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	return &nodedaemon.StateGC{Root: root, MinAge: 10 * time.Minute, Log: log, Live: func(ctx context.Context) (map[string]bool, error) {
		var list v1beta1.StreamPipelineList
		if err := c.List(ctx, &list); err != nil {
			return nil, err
		}
		live := map[string]bool{}
		for _, sp := range list.Items {
			live[string(sp.UID)] = true
		}
		return live, nil
	}}, nil
}

// storageFlags: where the daemon makes pipelines' directories on this node.
type storageFlags struct {
	stateRoot string // the senders' state root as mounted here ("" none)
	gc        bool   // remove the state of deleted pipelines
	prefixes  []string
	hostMount string
}

// prepareDirectories makes the state directories of the StreamPipelines with a sender on this
// node, and their own directories of the StorageRoots they write under here, as soon as the daemon
// sees them (a watch), so their pods find them when they start.
func prepareDirectories(ctx context.Context, st storageFlags, node string, log logr.Logger) error {
	scheme := runtime.NewScheme()
	if err := v1beta1.AddToScheme(scheme); err != nil {
		return err
	}
	c, err := cache.New(ctrl.GetConfigOrDie(), cache.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	inf, err := c.GetInformer(ctx, &v1beta1.StreamPipeline{})
	if err != nil {
		return err
	}
	state := &nodedaemon.StatePrep{Root: st.stateRoot, Node: node, Log: log}
	dirs := &nodedaemon.DirPrep{HostMount: st.hostMount, Prefixes: st.prefixes, Node: node, Log: log, Roots: func() map[string]*v1beta1.StorageRoot {
		var list v1beta1.StorageRootList
		out := map[string]*v1beta1.StorageRoot{}
		if err := c.List(ctx, &list); err != nil {
			log.Error(err, "Cannot read the StorageRoots")
		}
		for i := range list.Items {
			out[list.Items[i].Name] = &list.Items[i]
		}
		return out
	}}
	do := func(o any) {
		sp, ok := o.(*v1beta1.StreamPipeline)
		if !ok {
			return
		}
		if st.stateRoot != "" {
			if _, err := state.Prepare(sp); err != nil {
				log.Error(err, "Cannot prepare a pipeline's state directory", "pipeline", sp.Namespace+"/"+sp.Name)
			}
		}
		if len(st.prefixes) > 0 {
			if _, err := dirs.Prepare(sp); err != nil {
				log.Error(err, "Cannot make a pipeline's directory", "pipeline", sp.Namespace+"/"+sp.Name)
			}
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: do, UpdateFunc: func(_, o any) { do(o) },
	}); err != nil {
		return err
	}
	if len(st.prefixes) > 0 {
		// A root made (or moved) after its pipelines: make their directories then.
		roots, err := c.GetInformer(ctx, &v1beta1.StorageRoot{})
		if err != nil {
			return err
		}
		again := func(any) {
			var list v1beta1.StreamPipelineList
			if err := c.List(ctx, &list); err != nil {
				log.Error(err, "Cannot read the StreamPipelines")
			}
			for i := range list.Items {
				do(&list.Items[i])
			}
		}
		if _, err := roots.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc: again, UpdateFunc: func(_, o any) { again(o) },
		}); err != nil {
			return err
		}
	}
	go func() {
		if err := c.Start(ctx); err != nil {
			log.Error(err, "The StreamPipeline watch stopped")
		}
	}()
	return nil
}

// ipv4Of is the first global unicast IPv4 address of the interface ("" when it has none).
func ipv4Of(name string) string {
	iface, err := net.InterfaceByName(name)
	if err != nil {
		return ""
	}
	addrs, err := iface.Addrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && ipn.IP.IsGlobalUnicast() {
			return ipn.IP.To4().String()
		}
	}
	return ""
}

func run(log logr.Logger, node, namespace, podName, agent, sysfs, publish, featuresDir, pluginDir string, tokens int, interval time.Duration, benchRounds int, rates map[string]int64, address func(string) string, st storageFlags, health string) error {
	if node == "" {
		return fmt.Errorf("--node-name (or NODE_NAME) is required")
	}
	ctx := ctrl.SetupSignalHandler()
	d := &nodedaemon.Daemon{
		Agent:     nodedaemon.Agent{Path: agent, SysfsRoot: sysfs, BenchRounds: benchRounds},
		Interval:  interval,
		Tokens:    tokens,
		PluginDir: pluginDir,
		NICRates:  rates,
		Address:   address,
		Log:       log,

		HealthFile: health,
	}
	var c client.Client
	var owner *metav1.OwnerReference
	switch publish {
	case "nodefeature", "both":
		scheme := runtime.NewScheme()
		_ = clientgoscheme.AddToScheme(scheme)
		var err error
		if c, err = client.New(ctrl.GetConfigOrDie(), client.Options{Scheme: scheme}); err != nil {
			return err
		}
		if namespace == "" {
			return fmt.Errorf("--namespace (or POD_NAMESPACE) is required to publish a NodeFeature")
		}
		owner = daemonSetOf(ctx, c, namespace, podName)
		d.Publishers = append(d.Publishers, nodedaemon.NodeFeatureAPI{Client: c, Namespace: namespace, Node: node, Owner: owner})
		if publish == "nodefeature" {
			break
		}
		fallthrough
	case "features-d":
		d.Publishers = append(d.Publishers, nodedaemon.FeaturesDir{Dir: featuresDir})
	default:
		return fmt.Errorf("--publish must be nodefeature, features-d or both (got %q)", publish)
	}
	if st.stateRoot != "" || len(st.prefixes) > 0 {
		if err := prepareDirectories(ctx, st, node, log); err != nil {
			return err
		}
	}
	if st.stateRoot != "" && st.gc {
		gc, err := stateGC(st.stateRoot, log)
		if err != nil {
			return err
		}
		d.GC = gc
	}
	if err := d.Run(ctx); err != nil {
		return err
	}
	// Stopping because the chart is being uninstalled: take the labels back. A plain restart
	// (rolling update, node drain) keeps them, so pipelines are not re-planned for nothing.
	if owner != nil && uninstalling(c, namespace, owner.Name) {
		log.Info("DaemonSet is going away: removing the published node facts")
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return d.Unpublish(rctx)
	}
	return nil
}

// daemonSetOf finds the DaemonSet that owns this pod (nil outside a DaemonSet).
func daemonSetOf(ctx context.Context, c client.Client, namespace, pod string) *metav1.OwnerReference {
	if pod == "" {
		return nil
	}
	p := &corev1.Pod{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: pod}, p); err != nil {
		return nil
	}
	for _, ref := range p.OwnerReferences {
		if ref.Kind == "DaemonSet" && ref.Controller != nil && *ref.Controller {
			r := ref
			r.BlockOwnerDeletion = nil
			return &r
		}
	}
	return nil
}

func uninstalling(c client.Client, namespace, name string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ds := &appsv1.DaemonSet{}
	err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, ds)
	return apierrors.IsNotFound(err) || (err == nil && ds.DeletionTimestamp != nil)
}
