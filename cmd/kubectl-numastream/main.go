// kubectl-numastream: a kubectl plugin (copy it onto the PATH; kubectl numastream ...) for the
// people who run pipelines: status, watch, logs, preview, and site-keys for far sites. It takes kubectl's connection flags
// (--kubeconfig, --context, -n/--namespace, ...).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/cli"
	"github.com/numastream/numastream/internal/version"
)

const usage = `kubectl numastream: a StreamPipeline as the people who run it read it

  kubectl numastream status NAME      the plan next to where the agents run, what arrived, each consumer, the conditions
  kubectl numastream watch NAME       a progress line (chunks of those expected, rate against the plan, ETA, lost)
                                      whenever it changes, until the pipeline completes or stalls
  kubectl numastream logs NAME        every agent container's log, each line prefixed with pod/container
  kubectl numastream preview NAME     forward a local port to the live preview of a stream's gateway and
                                      print its address (spec.preview on)
  kubectl numastream site-keys SITE   the gateway keys a RemoteSite's far receiver must admit, one per line;
                                      with --follow FILE, keep that allowed-keys file in step until stopped

Flags:
`

func main() {
	flags := pflag.NewFlagSet("kubectl-numastream", pflag.ContinueOnError)
	config := genericclioptions.NewConfigFlags(true)
	config.AddFlags(flags)
	interval := flags.Duration("interval", 2*time.Second, "watch, site-keys --follow: how often to read the status")
	follow := flags.String("follow", "", "site-keys: the far receiver's allowed-keys file to keep in step")
	tail := flags.Int64("tail", 0, "logs: the last lines of each container (0: all)")
	stream := flags.Int("stream", 0, "preview: the stream whose gateway to open")
	local := flags.Int("port", 0, "preview: the local port (0: any free one)")
	showVersion := flags.Bool("version", false, "print the version and exit")
	flags.Usage = func() {
		fmt.Fprint(os.Stderr, usage)
		flags.PrintDefaults()
	}
	if err := flags.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintf(os.Stderr, "kubectl numastream: %v (kubectl numastream --help lists the flags)\n", err)
		os.Exit(2)
	}
	if *showVersion {
		fmt.Println(version.String("kubectl-numastream"))
		return
	}
	args := flags.Args()
	if len(args) != 2 {
		flags.Usage()
		os.Exit(2)
	}
	if err := run(config, args[0], args[1], options{*interval, *tail, *stream, *local, *follow}); err != nil {
		fmt.Fprintf(os.Stderr, "kubectl numastream %s: %v\n", args[0], err)
		os.Exit(1)
	}
}

type options struct {
	interval     time.Duration
	tail         int64
	stream, port int
	follow       string
}

func run(config *genericclioptions.ConfigFlags, command, name string, o options) error {
	rest, err := config.ToRESTConfig()
	if err != nil {
		return err
	}
	ns, _, err := config.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := v1beta1.AddToScheme(scheme); err != nil {
		return err
	}
	c, err := client.New(rest, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	pods, err := kubernetes.NewForConfig(rest)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	env := cli.Env{Client: c, Pods: pods, Namespace: ns, Out: os.Stdout}
	switch command {
	case "status":
		return cli.Status(ctx, env, name)
	case "watch":
		return cli.Watch(ctx, env, name, o.interval)
	case "logs":
		return cli.Logs(ctx, env, name, o.tail)
	case "preview":
		return cli.Preview(ctx, env, rest, name, o.stream, o.port)
	case "site-keys":
		if o.follow != "" {
			return cli.FollowSiteKeys(ctx, env, name, o.follow, o.interval)
		}
		return cli.SiteKeys(ctx, env, name)
	}
	return fmt.Errorf("unknown command %q (status, watch, logs, preview or site-keys)", command)
}
