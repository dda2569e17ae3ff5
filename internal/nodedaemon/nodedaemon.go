// Package nodedaemon is numastream's per-node daemon: it asks the agent for the node's topology
// and codec speeds, publishes them as node labels through node-feature-discovery (a NodeFeature
// object, or a features.d file), keeps them current, and serves one NIC-locality device plugin
// per NIC whose NUMA node is known.
package nodedaemon

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/numastream/numastream/internal/deviceplugin"
	"github.com/numastream/numastream/internal/nodelabels"
	"github.com/numastream/numastream/internal/topology"
)

// Agent runs the agent binary for facts.
type Agent struct {
	Path        string
	SysfsRoot   string
	BenchRounds int
}

func (a Agent) run(ctx context.Context, args ...string) ([]byte, error) {
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, a.Path, args...) //nolint:gosec // G204: the agent binary the daemon was configured with
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s %v: %w: %s", a.Path, args, err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out, nil
}

// Topology is `numastream-agent topology`.
func (a Agent) Topology(ctx context.Context) (nodelabels.AgentTopology, error) {
	args := []string{"topology"}
	if a.SysfsRoot != "" {
		args = append(args, "--sysfs-root", a.SysfsRoot)
	}
	out, err := a.run(ctx, args...)
	if err != nil {
		return nodelabels.AgentTopology{}, err
	}
	return nodelabels.ParseTopology(out)
}

// Bench is a short pinned `numastream-agent bench codec --json`.
func (a Agent) Bench(ctx context.Context) (nodelabels.AgentBench, error) {
	rounds := max(a.BenchRounds, 1)
	out, err := a.run(ctx, "bench", "codec", "--json", "--rounds", strconv.Itoa(rounds))
	if err != nil {
		return nodelabels.AgentBench{}, err
	}
	return nodelabels.ParseBench(out)
}

// Publisher makes labels visible to NFD.
type Publisher interface {
	Publish(ctx context.Context, labels map[string]string) error
	Remove(ctx context.Context) error
}

// FeaturesDir writes NFD's local feature file, atomically (write, then rename).
type FeaturesDir struct {
	Dir  string
	Name string // file name, default "numastream"
}

func (f FeaturesDir) path() string {
	name := f.Name
	if name == "" {
		name = "numastream"
	}
	return filepath.Join(f.Dir, name)
}

// Publish replaces the file.
func (f FeaturesDir) Publish(_ context.Context, labels map[string]string) error {
	tmp, err := os.CreateTemp(f.Dir, ".numastream-*")
	if err != nil {
		return fmt.Errorf("features.d: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(nodelabels.FeaturesFile(labels)); err != nil {
		_ = tmp.Close() // the write's error is the one to report
		return fmt.Errorf("features.d: %w", err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		_ = tmp.Close() // the chmod's error is the one to report
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), f.path())
}

// Remove deletes the file.
func (f FeaturesDir) Remove(context.Context) error {
	if err := os.Remove(f.path()); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

// NodeFeatureGVK is NFD's NodeFeature kind.
var NodeFeatureGVK = schema.GroupVersionKind{Group: "nfd.k8s-sigs.io", Version: "v1alpha1", Kind: "NodeFeature"}

// NodeFeatureAPI publishes a NodeFeature object for this node (server-side apply). Owned by
// the daemon's DaemonSet, so uninstalling the chart garbage-collects it and NFD drops the labels.
type NodeFeatureAPI struct {
	Client    client.Client
	Namespace string
	Node      string
	Owner     *metav1.OwnerReference
}

// ObjectName is the NodeFeature's name for a node.
func ObjectName(node string) string { return "numastream-" + node }

func (n NodeFeatureAPI) object(labels map[string]string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(NodeFeatureGVK)
	u.SetNamespace(n.Namespace)
	u.SetName(ObjectName(n.Node))
	// NFD reads this label to know which node the features describe.
	u.SetLabels(map[string]string{"nfd.node.kubernetes.io/node-name": n.Node})
	if n.Owner != nil {
		u.SetOwnerReferences([]metav1.OwnerReference{*n.Owner})
	}
	spec := map[string]any{}
	lbl := map[string]any{}
	for k, v := range labels {
		lbl[k] = v
	}
	spec["labels"] = lbl
	u.Object["spec"] = spec
	return u
}

// Publish creates or replaces the object's labels.
func (n NodeFeatureAPI) Publish(ctx context.Context, labels map[string]string) error {
	return n.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(n.object(labels)),
		client.FieldOwner("numastream-node-daemon"), client.ForceOwnership)
}

// Remove deletes the object.
func (n NodeFeatureAPI) Remove(ctx context.Context) error {
	err := n.Client.Delete(ctx, n.object(nil))
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// Daemon ties it together.
type Daemon struct {
	Agent      Agent
	Publishers []Publisher
	Interval   time.Duration
	// Device plugins: tokens per NIC (0 disables them) and the kubelet's plugin directory.
	Tokens    int
	PluginDir string
	// NICRates are declared data NICs and the rate of the path behind each, Mbit/s
	// (nodelabels.Declare).
	NICRates map[string]int64
	// Address returns a NIC's IPv4 address in the daemon's network namespace ("" when it has
	// none); set when the daemon runs with hostNetwork, so the labels say where hostNetwork
	// senders reach a gateway's data NIC. Nil: no addresses are published.
	Address func(nic string) string
	// GC removes the state directories of deleted pipelines at every interval (nil: never).
	GC *StateGC
	// HealthFile gets each round's Health, for the probes ("": none).
	HealthFile string
	Log        logr.Logger

	published map[string]string
	plugins   map[string]context.CancelFunc
	wg        sync.WaitGroup
}

// Run measures the codec once, then publishes and serves until ctx ends, re-reading the
// topology every Interval.
func (d *Daemon) Run(ctx context.Context) error {
	bench, err := d.Agent.Bench(ctx)
	if err != nil {
		return fmt.Errorf("codec calibration: %w", err)
	}
	d.Log.Info("Measured codec speeds", "compressMBps", bench.Codec.CompressMBps, "decompressMBps", bench.Codec.DecompressMBps)
	d.plugins = map[string]context.CancelFunc{}
	defer d.stopPlugins()
	for {
		published := d.Once(ctx, &bench)
		if published != nil {
			if ctx.Err() != nil {
				return nil
			}
			d.Log.Error(published, "Cannot publish node facts; retrying")
		}
		if d.GC != nil {
			if _, err := d.GC.Once(ctx); err != nil && ctx.Err() == nil {
				d.Log.Error(err, "Cannot remove the state of deleted pipelines; retrying")
			}
		}
		if d.HealthFile != "" {
			if err := WriteHealth(d.HealthFile, roundHealth(time.Now(), d.Interval, published)); err != nil {
				d.Log.Error(err, "Cannot write the health record; the probes will fail")
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(d.Interval):
		}
	}
}

// Once reads the topology and publishes it when it changed; it (re)starts device plugins for
// the NICs it finds.
func (d *Daemon) Once(ctx context.Context, bench *nodelabels.AgentBench) error {
	topo, err := d.Agent.Topology(ctx)
	if err != nil {
		return err
	}
	topo = nodelabels.Declare(topo, d.NICRates)
	if d.Address != nil {
		for i := range topo.NICs {
			topo.NICs[i].Address = d.Address(topo.NICs[i].Name)
		}
	}
	labels := nodelabels.Labels(topo, bench)
	if !maps.Equal(labels, d.published) {
		for _, p := range d.Publishers {
			if err := p.Publish(ctx, labels); err != nil {
				return err
			}
		}
		d.Log.Info("Published node facts", "labels", len(labels))
		d.published = labels
	}
	if d.Tokens > 0 && d.plugins != nil {
		d.syncPlugins(ctx, nodelabels.NICs(topo))
	}
	return nil
}

func (d *Daemon) syncPlugins(ctx context.Context, nics []nodelabels.LocalNIC) {
	want := map[string]nodelabels.LocalNIC{}
	for _, n := range nics {
		want[n.Name+"@"+strconv.Itoa(n.NUMANode)] = n
	}
	for key, cancel := range d.plugins {
		if _, ok := want[key]; !ok {
			cancel()
			delete(d.plugins, key)
		}
	}
	for key, n := range want {
		if _, ok := d.plugins[key]; ok {
			continue
		}
		pctx, cancel := context.WithCancel(ctx)
		d.plugins[key] = cancel
		p := &deviceplugin.Plugin{ResourceName: topology.NICResource(n.Name), NIC: n.Name, NUMANode: n.NUMANode,
			Tokens: d.Tokens, Dir: d.PluginDir, Log: d.Log.WithValues("nic", n.Name)}
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			if err := p.Run(pctx); err != nil {
				d.Log.Error(err, "Device plugin stopped", "nic", n.Name)
			}
		}()
	}
}

func (d *Daemon) stopPlugins() {
	for _, cancel := range d.plugins {
		cancel()
	}
	d.wg.Wait()
}

// Unpublish removes everything the daemon published (on uninstall).
func (d *Daemon) Unpublish(ctx context.Context) error {
	var first error
	for _, p := range d.Publishers {
		if err := p.Remove(ctx); err != nil && first == nil {
			first = err
		}
	}
	return first
}
