// Package cli is kubectl-numastream: what a person running a pipeline asks of it, read from the
// StreamPipeline's status and its pods (status, watch, logs).
package cli

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/conditions"
	"github.com/numastream/numastream/internal/render"
)

// Env is what a command reads from and writes to.
type Env struct {
	Client    client.Client
	Pods      kubernetes.Interface // logs
	Namespace string
	Out       io.Writer
}

func (e Env) get(ctx context.Context, name string) (*v1beta1.StreamPipeline, error) {
	sp := &v1beta1.StreamPipeline{}
	if err := e.Client.Get(ctx, client.ObjectKey{Namespace: e.Namespace, Name: name}, sp); err != nil {
		return nil, fmt.Errorf("streampipeline %s/%s: %w", e.Namespace, name, err)
	}
	return sp, nil
}

// Status prints the pipeline's plan next to what its agents report: the stages per node, where
// each stage runs and whether that is where it was planned, what arrived and what was lost, each
// consumer, the conditions.
func Status(ctx context.Context, e Env, name string) error {
	sp, err := e.get(ctx, name)
	if err != nil {
		return err
	}
	st := sp.Status
	w := e.Out
	ready := meta.FindStatusCondition(st.Conditions, v1beta1.ConditionReady)
	fmt.Fprintf(w, "streampipeline %s/%s: %s\n", sp.Namespace, sp.Name, conditionText(ready))
	if p := st.Plan; p != nil {
		fmt.Fprintf(w, "plan: %d connection(s); predicted %s Gbit/s raw, bottleneck %s; gateway NIC on NUMA node %d\n",
			p.Connections, orDash(st.PredictedGbps), orDash(p.Bottleneck), p.NICNUMANode)
		tw := table(w, "ROLE", "NODE", "CPUS", "STAGES")
		for _, n := range p.Nodes {
			var stages []string
			for _, s := range n.Stages {
				text := fmt.Sprintf("%s x%d @%s", s.Stage, s.Threads, s.NUMA)
				if s.RateMbps > 0 {
					text += fmt.Sprintf(" (%d Mbit/s)", s.RateMbps)
				}
				stages = append(stages, text)
			}
			row(tw, n.Role, n.Node, cpus(n), strings.Join(stages, ", "))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, o := range p.Onward {
			fmt.Fprintf(w, "onward hop %s (stream %d) to %s: %d connection(s), predicted %d Mbit/s, %s\n",
				o.Consumer, o.StreamID, hopTarget(sp, o.Consumer), o.Connections, o.PredictedMbps, orDash(o.Security))
		}
		if g := st.GatewayKey; g != nil {
			fmt.Fprintf(w, "gateway key (far sites admit it): %s\n", g.Public)
			if g.Next != "" {
				since := "-"
				if g.NextSince != nil {
					since = g.NextSince.UTC().Format(time.RFC3339)
				}
				fmt.Fprintf(w, "  next key, listed since %s for a rotation: %s\n", since, g.Next)
			}
		}
	} else {
		fmt.Fprintln(w, "plan: none yet")
	}
	o := st.Observed
	if o == nil {
		fmt.Fprintln(w, "observed: no agent has reported yet")
	} else {
		if len(o.Placement) > 0 {
			fmt.Fprintln(w, "placement (as the agents report it):")
			tw := table(w, "STREAM", "ROLE", "AGENT", "STAGE", "THREADS", "CPUS", "NUMA", "PLANNED", "ON-PLAN")
			for _, p := range o.Placement {
				row(tw, strconv.Itoa(int(p.Stream)), p.Role, orDash(p.Agent), p.Stage, strconv.Itoa(int(p.Threads)), p.CPUs, p.NUMANodes, p.Planned, yesNo(p.OnPlan))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
		}
		fmt.Fprintf(w, "observed: %d chunks delivered, %d lost, %d corrupt; raw %s Gbit/s%s, wire %s Gbit/s; NIC-local %s\n",
			o.ChunksDelivered, o.ChunksLost, o.ChunksCorrupt, orDash(o.RawGbps), ofPlan(o.RawGbps, st.PredictedGbps),
			orDash(o.WireGbps), nicLocal(o))
		for _, m := range o.MissingChunks {
			fmt.Fprintf(w, "  missing: %s\n", m)
		}
		for _, s := range o.IncompleteSeries {
			fmt.Fprintf(w, "  series incomplete: %s\n", s)
		}
		if len(o.Consumers) > 0 {
			fmt.Fprintln(w, "consumers:")
			tw := table(w, "STREAM", "NAME", "KIND", "GUARANTEE", "CHUNKS", "PASSED-OVER", "BEHIND", "SPILL")
			for _, c := range o.Consumers {
				row(tw, strconv.Itoa(int(c.Stream)), c.Name, c.Kind, c.Guarantee, strconv.FormatInt(c.Chunks, 10),
					strconv.FormatInt(c.PassedOver, 10), strconv.FormatInt(c.Behind, 10), bytesText(c.SpillBytes))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
		}
	}
	fmt.Fprintln(w, "conditions:")
	tw := table(w, "TYPE", "STATUS", "REASON", "MESSAGE")
	for _, c := range st.Conditions {
		row(tw, c.Type, string(c.Status), c.Reason, c.Message)
	}
	return tw.Flush()
}

// hopTarget is where the pipeline's onward consumer goes: its RemoteSite, or its endpoint.
func hopTarget(sp *v1beta1.StreamPipeline, consumer string) string {
	for _, k := range sp.Spec.Sinks {
		switch {
		case k.Name != consumer || k.Onward == nil:
		case k.Onward.Site != "":
			return "RemoteSite " + k.Onward.Site
		default:
			return k.Onward.Endpoint
		}
	}
	return "-"
}

// Progress is one line of watch: chunks delivered (of how many, when known), the rate against
// the plan, the time left at that rate, what was lost.
func Progress(sp *v1beta1.StreamPipeline, now time.Time) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[%s] %s:", now.Format("15:04:05"), sp.Name)
	o := sp.Status.Observed
	delivered, lost := int64(0), int64(0)
	raw := ""
	if o != nil {
		delivered, lost, raw = o.ChunksDelivered, o.ChunksLost, o.RawGbps
	}
	expected := sp.ExpectedChunks()
	if expected > 0 {
		fmt.Fprintf(&b, " %d/%d chunks (%d%%)", delivered+lost, expected, 100*(delivered+lost)/expected)
	} else {
		fmt.Fprintf(&b, " %d chunks", delivered)
	}
	fmt.Fprintf(&b, ", %s Gbit/s of %s planned", orDash(raw), orDash(sp.Status.PredictedGbps))
	if eta := remaining(sp, expected, delivered+lost, raw); eta != "" {
		fmt.Fprintf(&b, ", ETA %s", eta)
	}
	fmt.Fprintf(&b, ", lost %d", lost)
	ready := meta.FindStatusCondition(sp.Status.Conditions, v1beta1.ConditionReady)
	if ready != nil {
		fmt.Fprintf(&b, "; %s", ready.Reason)
	}
	return b.String()
}

// remaining is the time the chunks still to come take at the observed raw rate.
func remaining(sp *v1beta1.StreamPipeline, expected, done int64, raw string) string {
	gbps, err := strconv.ParseFloat(raw, 64)
	if expected == 0 || done >= expected || err != nil || gbps <= 0 {
		return ""
	}
	left := float64(expected-done) * float64(sp.Spec.ChunkBytes) * 8 / (gbps * 1e9)
	if left < 1 {
		return "<1s"
	}
	return (time.Duration(left*float64(time.Second)) + time.Second/2).Truncate(time.Second).String()
}

// Finished: the pipeline will make no more progress by itself (completed, or its Ready
// condition says it failed for good).
func Finished(sp *v1beta1.StreamPipeline) bool {
	ready := meta.FindStatusCondition(sp.Status.Conditions, v1beta1.ConditionReady)
	if ready != nil && ready.Reason == conditions.ReasonCompleted {
		return true
	}
	return meta.IsStatusConditionTrue(sp.Status.Conditions, conditions.Stalled)
}

// Watch prints a progress line every interval until the pipeline finishes (then its last line)
// or ctx ends.
func Watch(ctx context.Context, e Env, name string, interval time.Duration) error {
	last := ""
	for {
		sp, err := e.get(ctx, name)
		if err != nil {
			return err
		}
		line := Progress(sp, time.Now())
		if body := line[strings.Index(line, "]")+1:]; body != last {
			fmt.Fprintln(e.Out, line)
			last = body
		}
		if Finished(sp) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}

// Logs prints the log of every container of the pipeline's agent pods, each line prefixed with
// its pod and container.
func Logs(ctx context.Context, e Env, name string, tail int64) error {
	if _, err := e.get(ctx, name); err != nil {
		return err
	}
	pods, err := e.Pods.CoreV1().Pods(e.Namespace).List(ctx, metav1.ListOptions{LabelSelector: render.LabelPipeline + "=" + name})
	if err != nil {
		return err
	}
	if len(pods.Items) == 0 {
		fmt.Fprintf(e.Out, "streampipeline %s/%s has no pods\n", e.Namespace, name)
		return nil
	}
	for _, p := range pods.Items {
		for _, c := range append(append([]corev1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...) {
			opts := &corev1.PodLogOptions{Container: c.Name}
			if tail > 0 {
				opts.TailLines = &tail
			}
			b, err := e.Pods.CoreV1().Pods(p.Namespace).GetLogs(p.Name, opts).DoRaw(ctx)
			if err != nil {
				fmt.Fprintf(e.Out, "%s/%s: no log: %v\n", p.Name, c.Name, err)
				continue
			}
			for _, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
				if line != "" {
					fmt.Fprintf(e.Out, "%s/%s: %s\n", p.Name, c.Name, line)
				}
			}
		}
	}
	return nil
}

func table(w io.Writer, header ...string) *tabwriter.Writer {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row(tw, header...)
	return tw
}

func row(tw *tabwriter.Writer, cells ...string) {
	fmt.Fprintln(tw, "  "+strings.Join(cells, "\t"))
}

func conditionText(c *metav1.Condition) string {
	if c == nil {
		return "Ready unknown (the operator has not reconciled it)"
	}
	return fmt.Sprintf("Ready=%s (%s)", c.Status, c.Reason)
}

func cpus(n v1beta1.NodePlan) string {
	if n.SharedMilliCPU > 0 {
		return fmt.Sprintf("%d+%dm", n.CPUs, n.SharedMilliCPU)
	}
	return strconv.Itoa(int(n.CPUs))
}

func ofPlan(observed, predicted string) string {
	o, err1 := strconv.ParseFloat(observed, 64)
	p, err2 := strconv.ParseFloat(predicted, 64)
	if err1 != nil || err2 != nil || p <= 0 {
		return ""
	}
	return fmt.Sprintf(" (%.0f%% of the %s predicted)", 100*o/p, predicted)
}

func nicLocal(o *v1beta1.Observed) string {
	if o.NICLocalStreams != "" {
		return o.NICLocalStreams
	}
	if o.NICLocal == nil {
		return "-"
	}
	return yesNo(*o.NICLocal)
}

func bytesText(n int64) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
