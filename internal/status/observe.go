// Package status reads what the agents report (their Prometheus metrics) and turns it into the
// StreamPipeline's observed figures: rates, integrity counts, and whether the receiving threads
// really run on the NIC's NUMA node.
package status

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/numastream/numastream/api/v1alpha1"
	"github.com/numastream/numastream/internal/render"
)

// Sample is one Prometheus sample.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Parse reads the Prometheus text format (the subset the agent writes: no timestamps,
// no exemplars). Malformed lines are errors naming the line.
func Parse(r io.Reader) ([]Sample, error) {
	var out []Sample
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		s, err := parseLine(text)
		if err != nil {
			return nil, fmt.Errorf("metrics line %d: %w", line, err)
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

func parseLine(text string) (Sample, error) {
	s := Sample{Labels: map[string]string{}}
	rest := text
	if i := strings.IndexAny(rest, "{ "); i < 0 {
		return s, fmt.Errorf("no value in %q", text)
	} else {
		s.Name, rest = rest[:i], rest[i:]
	}
	if strings.HasPrefix(rest, "{") {
		end := strings.LastIndex(rest, "}")
		if end < 0 {
			return s, fmt.Errorf("unclosed labels in %q", text)
		}
		for _, kv := range splitLabels(rest[1:end]) {
			eq := strings.Index(kv, "=")
			if eq <= 0 {
				return s, fmt.Errorf("bad label %q", kv)
			}
			v, err := strconv.Unquote(kv[eq+1:])
			if err != nil {
				return s, fmt.Errorf("bad label value %q", kv)
			}
			s.Labels[kv[:eq]] = v
		}
		rest = rest[end+1:]
	}
	f := strings.Fields(rest)
	if len(f) < 1 {
		return s, fmt.Errorf("no value in %q", text)
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return s, fmt.Errorf("bad value in %q", text)
	}
	s.Value = v
	return s, nil
}

// splitLabels splits a="x",b="y" on commas outside quotes.
func splitLabels(s string) []string {
	var out []string
	inQuote, start := false, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			inQuote = !inQuote
		case ',':
			if !inQuote {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	if strings.TrimSpace(s[start:]) != "" {
		out = append(out, s[start:])
	}
	return out
}

// Receiver is what one receiving agent reports.
type Receiver struct {
	RawBytes, WireBytes      float64
	Delivered, Lost, Corrupt float64
	NICLocal                 *bool
}

// FromSamples extracts a receiver's figures: counts from the verifying receiver (role
// "receive"); NIC locality from whichever agent holds the NIC (in a gateway pod, the relaying
// receiving container, role "relay").
func FromSamples(samples []Sample) Receiver {
	var r Receiver
	for _, s := range samples {
		if s.Name == "numastream_nic_local" && (s.Labels["role"] == "receive" || s.Labels["role"] == "relay") {
			if s.Value >= 0 {
				v := s.Value == 1 && (r.NICLocal == nil || *r.NICLocal)
				r.NICLocal = &v
			}
			continue
		}
		if s.Labels["role"] != "receive" {
			continue
		}
		switch s.Name {
		case "numastream_raw_bytes_total":
			r.RawBytes = s.Value
		case "numastream_wire_bytes_total":
			r.WireBytes = s.Value
		case "numastream_chunks_delivered_total":
			r.Delivered = s.Value
		case "numastream_chunks_lost":
			r.Lost = s.Value
		case "numastream_chunks_corrupt_total":
			r.Corrupt = s.Value
		}
	}
	return r
}

// exitSummary is what an agent leaves as its container's termination message when it exits
// (numastream-agent --summary-file /dev/termination-log): the run's final counts and mean rates.
type exitSummary struct {
	Role      string  `json:"role"`
	Chunks    float64 `json:"chunks"`
	Lost      float64 `json:"lost"`
	Corrupt   float64 `json:"corrupt"`
	RawBytes  float64 `json:"raw_bytes"`
	WireBytes float64 `json:"wire_bytes"`
	RawGbps   float64 `json:"raw_gbps"`
	WireGbps  float64 `json:"wire_gbps"`
	NICLocal  *bool   `json:"nic_local"`
}

// exited reads a gateway pod whose verifying container has exited: its counts and the run's
// mean rates from that container's summary, NIC locality from the receiving container's. False
// when the verifying container still runs or left no summary.
func exited(p *corev1.Pod) (Receiver, float64, float64, bool) {
	summaries := map[string]exitSummary{}
	for _, cs := range p.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil && strings.HasPrefix(strings.TrimSpace(t.Message), "{") {
			var s exitSummary
			if json.Unmarshal([]byte(t.Message), &s) == nil {
				summaries[cs.Name] = s
			}
		}
	}
	v, ok := summaries[render.DecompressContainer]
	if !ok || v.Role != "receive" {
		return Receiver{}, 0, 0, false
	}
	r := Receiver{RawBytes: v.RawBytes, WireBytes: v.WireBytes, Delivered: v.Chunks, Lost: v.Lost, Corrupt: v.Corrupt}
	if rx, ok := summaries[render.ReceiveContainer]; ok && rx.NICLocal != nil {
		r.NICLocal = rx.NICLocal
	}
	return r, v.RawGbps, v.WireGbps, true
}

// minRateWindow: readings closer than this (a reconcile triggered by a pod event right after a
// scrape) keep the rate of the last longer window instead of dividing noise by a tiny interval.
const minRateWindow = time.Second

// Observer reads the gateway agents of a pipeline and keeps the previous reading per pod to turn
// byte counters into rates.
type Observer struct {
	mu     sync.Mutex
	client *http.Client
	prev   map[string]reading
	// URL builds the metrics URL of one port of a pod (tests point it at a local server).
	URL func(pod *corev1.Pod, port int32) string
	now func() time.Time
}

type reading struct {
	at                time.Time
	raw, wire         float64
	rawRate, wireRate float64
}

// NewObserver reads agents with the given timeout per request.
func NewObserver(timeout time.Duration) *Observer {
	return &Observer{
		client: &http.Client{Timeout: timeout},
		prev:   map[string]reading{},
		URL: func(p *corev1.Pod, port int32) string {
			return "http://" + net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(port))) + "/metrics"
		},
		now: time.Now,
	}
}

func (o *Observer) fetch(ctx context.Context, url string) ([]Sample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := o.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return Parse(resp.Body)
}

// metricsPorts are the pod's container ports named "metrics" or "metrics-*"; the default
// metrics port when none is declared.
func metricsPorts(p *corev1.Pod) []int32 {
	var out []int32
	for _, c := range p.Spec.Containers {
		for _, port := range c.Ports {
			if port.Name == "metrics" || strings.HasPrefix(port.Name, "metrics-") {
				out = append(out, port.ContainerPort)
			}
		}
	}
	if len(out) == 0 {
		out = append(out, render.MetricsPort)
	}
	return out
}

// scrape reads a running gateway pod's agents; the rates come from the byte counters' change
// since the previous reading of the same pod.
func (o *Observer) scrape(ctx context.Context, p *corev1.Pod) (Receiver, float64, float64, error) {
	var samples []Sample
	for _, port := range metricsPorts(p) {
		got, err := o.fetch(ctx, o.URL(p, port))
		if err != nil {
			return Receiver{}, 0, 0, fmt.Errorf("agent %s:%d: %w", p.Name, port, err)
		}
		samples = append(samples, got...)
	}
	r := FromSamples(samples)
	now := o.now()
	cur := reading{at: now, raw: r.RawBytes, wire: r.WireBytes}
	if prev, ok := o.prev[string(p.UID)]; ok {
		if dt := now.Sub(prev.at); dt >= minRateWindow {
			cur.rawRate = (r.RawBytes - prev.raw) * 8 / dt.Seconds() / 1e9
			cur.wireRate = (r.WireBytes - prev.wire) * 8 / dt.Seconds() / 1e9
		} else {
			cur = prev // too short a window: keep the last one
		}
	}
	o.prev[string(p.UID)] = cur
	return r, cur.rawRate, cur.wireRate, nil
}

// Observe reads every gateway pod of the pipeline and sums their figures: a running pod from its
// agents' metrics (rates over the interval since the last reading), a pod whose verifying agent
// has exited from the summary it left (final counts, the run's mean rates). Nil when no gateway
// pod has anything to report yet.
func (o *Observer) Observe(ctx context.Context, sp *v1alpha1.StreamPipeline, pods []corev1.Pod) (*v1alpha1.Observed, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var total Receiver
	var rawRate, wireRate float64
	seen := 0
	allLocal, anyKnown := true, false
	for i := range pods {
		p := &pods[i]
		if p.Labels[render.LabelRole] != render.RoleGateway {
			continue
		}
		r, raw, wire, ok := exited(p)
		if !ok {
			if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
				continue
			}
			var err error
			if r, raw, wire, err = o.scrape(ctx, p); err != nil {
				return nil, err
			}
		}
		seen++
		rawRate += raw
		wireRate += wire
		total.RawBytes += r.RawBytes
		total.WireBytes += r.WireBytes
		total.Delivered += r.Delivered
		total.Lost += r.Lost
		total.Corrupt += r.Corrupt
		if r.NICLocal != nil {
			anyKnown = true
			allLocal = allLocal && *r.NICLocal
		}
	}
	if seen == 0 {
		return nil, nil
	}
	t := metav1.NewTime(o.now())
	obs := &v1alpha1.Observed{
		RawGbps:         fmt.Sprintf("%.2f", rawRate),
		WireGbps:        fmt.Sprintf("%.2f", wireRate),
		ChunksDelivered: int64(total.Delivered),
		ChunksLost:      int64(total.Lost),
		ChunksCorrupt:   int64(total.Corrupt),
		UpdatedAt:       &t,
	}
	if anyKnown {
		obs.NICLocal = &allLocal
	}
	return obs, nil
}
