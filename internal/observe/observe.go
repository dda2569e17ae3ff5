// Package status reads what the agents report (their Prometheus metrics) and turns it into the
// StreamPipeline's observed figures: rates, integrity counts, and whether the receiving threads
// really run on the NIC's NUMA node.
package observe

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/render"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Sample is one Prometheus sample.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Parse reads the Prometheus text exposition format with Prometheus's own parser, one Sample
// per counter, gauge or untyped sample (the agents write no summaries or histograms).
func Parse(r io.Reader) ([]Sample, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	names := make([]string, 0, len(families))
	for name := range families {
		names = append(names, name)
	}
	sort.Strings(names)
	var out []Sample
	for _, name := range names {
		for _, m := range families[name].GetMetric() {
			s := Sample{Name: name, Labels: map[string]string{}}
			for _, l := range m.GetLabel() {
				s.Labels[l.GetName()] = l.GetValue()
			}
			switch {
			case m.Counter != nil:
				s.Value = m.GetCounter().GetValue()
			case m.Gauge != nil:
				s.Value = m.GetGauge().GetValue()
			case m.Untyped != nil:
				s.Value = m.GetUntyped().GetValue()
			default:
				continue
			}
			out = append(out, s)
		}
	}
	return out, nil
}

// Receiver is what one receiving agent reports.
type Receiver struct {
	RawBytes, WireBytes      float64
	Delivered, Lost, Corrupt float64
	// DeliveredBefore is what earlier instances of the stream's receiver delivered (the resuming
	// sender tells): the stream's total is DeliveredBefore + Delivered, across pod restarts.
	DeliveredBefore float64
	NICLocal        *bool
	// SeriesCompleted: Stream V2 series its sink completed. SeriesIncomplete: those it saw end
	// incomplete; IncompleteSeries names the last of them (oldest first).
	SeriesCompleted  float64
	SeriesIncomplete float64
	IncompleteSeries []string
	// DeclaredMissing: of Lost, the chunks their senders declared gone; Gaps names the last of them.
	DeclaredMissing float64
	Gaps            []string
	// Unwritten: delivered chunks the sink could not keep (counted in Lost as well).
	Unwritten float64
	// DecompressBytes and DecompressBusy: the raw bytes the decompressing stage produced and the
	// thread-seconds it worked for them (its measured speed per thread).
	DecompressBytes, DecompressBusy float64
}

// FromSamples extracts a receiver's figures: counts from the verifying receiver (role
// "receive"); NIC locality from whichever agent holds the NIC (in a gateway pod, the relaying
// receiving container, role "relay").
func FromSamples(samples []Sample) Receiver {
	var r Receiver
	var named, gaps []string
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
		case "numastream_chunks_delivered_before":
			r.DeliveredBefore = s.Value
		case "numastream_stream2_series_completed_total":
			r.SeriesCompleted = s.Value
		case "numastream_stream2_series_incomplete_total":
			r.SeriesIncomplete = s.Value
		case "numastream_stage_bytes_total":
			if s.Labels["stage"] == "decompress" && s.Labels["direction"] == "out" {
				r.DecompressBytes = s.Value
			}
		case "numastream_stage_busy_seconds_total":
			if s.Labels["stage"] == "decompress" {
				r.DecompressBusy = s.Value
			}
		case "numastream_chunks_declared_missing":
			r.DeclaredMissing = s.Value
		case "numastream_gaps_last":
			order, _ := strconv.Atoi(s.Labels["order"])
			for len(gaps) <= order {
				gaps = append(gaps, "")
			}
			gaps[order] = s.Labels["gap"]
		case "numastream_stream2_series_incomplete_last":
			order, _ := strconv.Atoi(s.Labels["order"])
			for len(named) <= order {
				named = append(named, "")
			}
			named[order] = s.Labels["series"]
		}
	}
	for _, n := range named {
		if n != "" {
			r.IncompleteSeries = append(r.IncompleteSeries, n)
		}
	}
	for _, g := range gaps {
		if g != "" {
			r.Gaps = append(r.Gaps, g)
		}
	}
	return r
}

// exitSummary is what an agent leaves as its container's termination message when it exits
// (numastream-agent --summary-file /dev/termination-log): the run's final counts and mean rates.
type exitSummary struct {
	Role      string  `json:"role"`
	Chunks    float64 `json:"chunks"`
	Before    float64 `json:"delivered_before"`
	Lost      float64 `json:"lost"`
	Corrupt   float64 `json:"corrupt"`
	RawBytes  float64 `json:"raw_bytes"`
	WireBytes float64 `json:"wire_bytes"`
	RawGbps   float64 `json:"raw_gbps"`
	WireGbps  float64 `json:"wire_gbps"`
	NICLocal  *bool   `json:"nic_local"`
	// Stream V2 series that ended complete, incomplete, and the last incomplete ones by name.
	SeriesCompleted  float64  `json:"stream2_series_completed"`
	SeriesIncomplete float64  `json:"stream2_series_incomplete"`
	IncompleteSeries []string `json:"stream2_series_incomplete_last"`
	// Chunks their senders declared gone, and the last declared gaps by name.
	DeclaredMissing float64  `json:"declared_missing"`
	Gaps            []string `json:"gaps_last"`
	// Delivered chunks the sink could not keep (in lost too).
	Unwritten float64 `json:"unwritten"`
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
	r := Receiver{RawBytes: v.RawBytes, WireBytes: v.WireBytes, Delivered: v.Chunks, DeliveredBefore: v.Before, Lost: v.Lost, Corrupt: v.Corrupt,
		SeriesCompleted: v.SeriesCompleted, SeriesIncomplete: v.SeriesIncomplete, IncompleteSeries: v.IncompleteSeries, DeclaredMissing: v.DeclaredMissing, Gaps: v.Gaps,
		Unwritten: v.Unwritten}
	if rx, ok := summaries[render.ReceiveContainer]; ok && rx.NICLocal != nil {
		r.NICLocal = rx.NICLocal
	}
	return r, v.RawGbps, v.WireGbps, true
}

// minRateWindow: readings closer than this (a reconcile triggered by a pod event right after a
// scrape) keep the rate of the last longer window instead of dividing noise by a tiny interval.
const minRateWindow = MinRateWindow

// MinRateWindow is the shortest window rates are computed over: two readings of a pod closer
// than this report the same rates.
const MinRateWindow = time.Second

// Observer reads the gateway agents of a pipeline and keeps the previous reading per pod to turn
// byte counters into rates.
type Observer struct {
	mu     sync.Mutex
	client *http.Client
	prev   map[string]reading
	// URL builds the metrics URL of one port of a pod (tests point it at a local server).
	URL func(pod *corev1.Pod, port int32) string
	// Token is sent as a bearer token to the agents' metrics ports (the operator's metrics
	// token), over HTTPS (the agents' certificates are their own, made at their start: not
	// verified); empty: none, over plain HTTP.
	Token string
	now   func() time.Time
}

type reading struct {
	at                time.Time
	raw, wire         float64
	rawRate, wireRate float64
	// the decompressing stage's counters, and what they changed by over the window
	dBytes, dBusy         float64
	dBytesRate, dBusyRate float64
	// every stage's counters, and their loads over the window
	stages map[string]stageTimes
	loads  map[string]Load
	// a sender's spill: bytes held now, chunks lost
	spillBytes, spillLost float64
	// where the agents' threads run now
	threads []threadRow
	// what each consumer of several sinks got (numastream_consumer_*)
	consumers []consumerRow
}

// NewObserver reads agents with the given timeout per request.
func NewObserver(timeout time.Duration) *Observer {
	o := &Observer{
		client: &http.Client{Timeout: timeout, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}}}, //nolint:gosec // the agents' self-made certificates
		prev: map[string]reading{},
		now:  time.Now,
	}
	o.URL = func(p *corev1.Pod, port int32) string {
		scheme := "http://"
		if o.Token != "" {
			scheme = "https://" // an agent asking for the token serves it over TLS only
		}
		return scheme + net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(port))) + "/metrics"
	}
	return o
}

// MaxMetricsBytes bounds what the operator reads from one agent's /metrics (an agent writes a few
// KiB; a pod answering on that port with more is not believed, and not allowed to fill the
// operator's memory).
const MaxMetricsBytes = 4 << 20

func (o *Observer) fetch(ctx context.Context, url string) ([]Sample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	if o.Token != "" {
		req.Header.Set("Authorization", "Bearer "+o.Token)
	}
	resp, err := o.client.Do(req) // bounded in time by the client's timeout
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("metrics %s: %s", url, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxMetricsBytes+1))
	if err != nil {
		return nil, fmt.Errorf("metrics %s: %w", url, err)
	}
	if len(body) > MaxMetricsBytes {
		return nil, fmt.Errorf("metrics %s: more than %d bytes, not read", url, MaxMetricsBytes)
	}
	return Parse(bytes.NewReader(body))
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
func (o *Observer) scrape(ctx context.Context, p *corev1.Pod) (Receiver, reading, error) {
	var samples []Sample
	for _, port := range metricsPorts(p) {
		got, err := o.fetch(ctx, o.URL(p, port))
		if err != nil {
			return Receiver{}, reading{}, fmt.Errorf("agent %s:%d: %w", p.Name, port, err)
		}
		samples = append(samples, got...)
	}
	r := FromSamples(samples)
	now := o.now()
	cur := reading{at: now, raw: r.RawBytes, wire: r.WireBytes, dBytes: r.DecompressBytes, dBusy: r.DecompressBusy,
		stages: stageCounters(samples)}
	cur.spillBytes, cur.spillLost = spill(samples)
	threads := threadRows(samples)
	consumers := consumerRows(samples)
	if prev, ok := o.prev[string(p.UID)]; ok {
		if dt := now.Sub(prev.at); dt >= minRateWindow {
			cur.rawRate = (r.RawBytes - prev.raw) * 8 / dt.Seconds() / 1e9
			cur.wireRate = (r.WireBytes - prev.wire) * 8 / dt.Seconds() / 1e9
			cur.dBytesRate = (r.DecompressBytes - prev.dBytes) / dt.Seconds()
			cur.dBusyRate = (r.DecompressBusy - prev.dBusy) / dt.Seconds()
			cur.loads = loads(prev.stages, cur.stages, dt.Seconds())
		} else {
			spillBytes, spillLost := cur.spillBytes, cur.spillLost
			cur = prev // too short a window: keep the last one's rates
			cur.spillBytes, cur.spillLost = spillBytes, spillLost
		}
	}
	cur.threads, cur.consumers = threads, consumers
	o.prev[string(p.UID)] = cur
	return r, cur, nil
}

// Observe reads, for each stream of the pipeline, its newest gateway pod that has something to
// report (the losses of earlier pods of the stream reach it as gaps the sender declares), and sums
// the streams: a running pod from its agents' metrics (rates over the interval
// since the last reading), a pod whose verifying agent has exited from the summary it left (final
// counts, the run's mean rates). A stream's delivered count includes what earlier gateway pods of
// the stream delivered (the resuming sender reports it), so it survives restarts and is never
// counted twice. Nil when no gateway pod has anything to report yet.
func (o *Observer) Observe(ctx context.Context, sp *v1beta1.StreamPipeline, pods []corev1.Pod) (*v1beta1.Observed, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.forget(o.now().Add(-forgetAfter))
	var gateways, senders []*corev1.Pod
	for i := range pods {
		switch pods[i].Labels[render.LabelRole] {
		case render.RoleGateway:
			gateways = append(gateways, &pods[i])
		case render.RoleSender:
			senders = append(senders, &pods[i])
		}
	}
	stageLoads := map[string]Load{}
	var spillBytes, spillLost float64
	sort.SliceStable(gateways, func(a, b int) bool {
		ta, tb := gateways[a].CreationTimestamp, gateways[b].CreationTimestamp
		return tb.Before(&ta)
	})
	var total Receiver
	var rawRate, wireRate float64
	// Running streams only: their rates over the last window give the ratio and the speed now.
	var liveRaw, liveWire, dBytes, dBusy float64
	done := map[string]bool{}
	series := map[string]v1beta1.PodSeries{} // by pod UID, read now
	allLocal, anyKnown := true, false
	localStreams, knownStreams := 0, 0
	var placement []v1beta1.StagePlacement
	var consumers []v1beta1.ConsumerStatus
	for _, p := range gateways {
		stream := p.Labels[render.LabelStream]
		if done[stream] {
			// An earlier gateway pod of the stream: what it delivered the newest one counts (the
			// resuming sender reports it as delivered before), and chunks it settled without keeping
			// them (corrupt, or past its sink) it named to the sender as discarded, which declared
			// them gone to the newest one: that one reports them missing, however this pod ended.
			// The series it completed are its own: from its summary, from its agents while it
			// drains, else as last read.
			r, _, _, ok := exited(p)
			if !ok && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
				var err error
				r, _, err = o.scrape(ctx, p)
				ok = err == nil // it may be going: its last reading stands
			}
			if ok {
				series[string(p.UID)] = seriesOf(r)
			}
			continue
		}
		r, raw, wire, ok := exited(p)
		if !ok {
			if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
				continue
			}
			rr, cur, err := o.scrape(ctx, p)
			if err != nil {
				return nil, err
			}
			r, raw, wire = rr, cur.rawRate, cur.wireRate
			placement = append(placement, placementOf(sp.Status.Plan, "gateway", streamID(p), cur.threads)...)
			consumers = append(consumers, consumersOf(sp, streamID(p), cur.consumers)...)
			liveRaw += cur.rawRate
			liveWire += cur.wireRate
			dBytes += cur.dBytesRate
			dBusy += cur.dBusyRate
			mergeLoads(stageLoads, cur.loads)
		}
		done[stream] = true
		series[string(p.UID)] = seriesOf(r)
		rawRate += raw
		wireRate += wire
		total.RawBytes += r.RawBytes
		total.WireBytes += r.WireBytes
		total.Delivered += r.Delivered + r.DeliveredBefore
		total.Lost += r.Lost
		total.Corrupt += r.Corrupt
		total.IncompleteSeries = append(total.IncompleteSeries, r.IncompleteSeries...)
		total.DeclaredMissing += r.DeclaredMissing
		total.Gaps = append(total.Gaps, r.Gaps...)
		if r.NICLocal != nil {
			anyKnown = true
			allLocal = allLocal && *r.NICLocal
			knownStreams++
			if *r.NICLocal {
				localStreams++
			}
		}
	}
	if len(done) == 0 {
		return nil, nil
	}
	// The senders' stages, for the bottleneck: a sender that cannot be read only leaves its
	// stages out.
	for _, p := range senders {
		if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" || p.DeletionTimestamp != nil {
			continue
		}
		if _, cur, err := o.scrape(ctx, p); err == nil {
			placement = append(placement, placementOf(sp.Status.Plan, "sender", streamID(p), cur.threads)...)
			mergeLoads(stageLoads, cur.loads)
			spillBytes += cur.spillBytes
			spillLost += cur.spillLost
		}
	}
	t := metav1.NewTime(o.now())
	obs := &v1beta1.Observed{
		RawGbps:         fmt.Sprintf("%.2f", rawRate),
		WireGbps:        fmt.Sprintf("%.2f", wireRate),
		ChunksDelivered: int64(total.Delivered),
		ChunksLost:      int64(total.Lost),
		ChunksCorrupt:   int64(total.Corrupt),
		UpdatedAt:       &t,
	}
	if anyKnown {
		obs.NICLocal = &allLocal
		obs.NICLocalStreams = fmt.Sprintf("%d/%d", localStreams, knownStreams)
	}
	sort.SliceStable(placement, func(a, b int) bool {
		x, y := placement[a], placement[b]
		if x.Stream != y.Stream {
			return x.Stream < y.Stream
		}
		return x.Role > y.Role // the sender's stages, then the gateway's
	})
	if len(placement) > 256 {
		placement = placement[:256]
	}
	// Where the agents ran stays in status once none runs (a finished pipeline's pods report
	// nothing): the last placement they reported.
	if len(placement) == 0 && sp.Status.Observed != nil {
		placement = sp.Status.Observed.Placement
	}
	obs.Placement = placement
	if len(consumers) > 512 {
		consumers = consumers[:512]
	}
	obs.Consumers = consumers
	if liveWire > 0 && liveRaw > 0 {
		obs.Ratio = fmt.Sprintf("%.2f", liveRaw/liveWire)
	}
	obs.Bottleneck, obs.BottleneckDetail = Bottleneck(stageLoads)
	obs.SpillBytes, obs.SpillLost = int64(spillBytes), int64(spillLost)
	// A window in which the decompressors worked at least a tenth of a thread-second per second.
	if dBusy >= 0.1 && dBytes > 0 {
		obs.DecompressMBps = fmt.Sprintf("%.0f", dBytes/dBusy/1e6)
	}
	streams := map[int32]bool{}
	for _, id := range sp.StreamIDs() {
		streams[int32(id)] = true
	}
	obs.SeriesByPod, obs.SeriesBeforePods = carrySeries(sp.Status.Observed, gateways, series, streams)
	all := ptr.Deref(obs.SeriesBeforePods, v1beta1.PodSeries{})
	for _, c := range obs.SeriesByPod {
		fold(&all, c)
	}
	obs.SeriesCompleted, obs.SeriesIncomplete = all.Completed, all.Incomplete
	// What every gateway pod delivered itself, summed, when that is more than the newest pods say
	// with what their resuming senders report as delivered before: a sender that reads a live
	// detector starts afresh, and reports nothing before it.
	obs.ChunksDelivered = max(obs.ChunksDelivered, all.Delivered)
	obs.ChunksDeclaredMissing = int64(total.DeclaredMissing)
	if n := len(total.Gaps); n > 0 {
		obs.MissingChunks = total.Gaps[max(0, n-5):]
	}
	if n := len(total.IncompleteSeries); n > 0 {
		obs.IncompleteSeries = total.IncompleteSeries[max(0, n-5):]
	}
	return obs, nil
}

// seriesOf is what one gateway pod's reading counts of the Stream V2 series.
func seriesOf(r Receiver) v1beta1.PodSeries {
	return v1beta1.PodSeries{Completed: int64(r.SeriesCompleted), Incomplete: int64(r.SeriesIncomplete), Delivered: int64(r.Delivered)}
}

// maxSeriesPods bounds status.observed.seriesByPod; the oldest pods beyond it are folded into
// seriesBeforePods.
const maxSeriesPods = 64

// carrySeries keeps the Stream V2 series and deliveries of every gateway pod the pipeline had:
// each present pod's counts as read now (or, for a pod not read now, as last recorded in prev),
// and what pods that are gone counted, folded into one entry; the deliveries of a gone pod only
// if its stream is one of streams (the pipeline's now: a removed sender's chunks leave the
// count with its pods). gateways are newest first.
func carrySeries(prev *v1beta1.Observed, gateways []*corev1.Pod, read map[string]v1beta1.PodSeries, streams map[int32]bool) ([]v1beta1.PodSeries, *v1beta1.PodSeries) {
	var before v1beta1.PodSeries
	last := map[string]v1beta1.PodSeries{}
	if prev != nil {
		before = ptr.Deref(prev.SeriesBeforePods, v1beta1.PodSeries{})
		for _, e := range prev.SeriesByPod {
			last[e.UID] = e
		}
	}
	var byPod []v1beta1.PodSeries
	for _, p := range gateways {
		uid := string(p.UID)
		c, ok := read[uid]
		if was, seen := last[uid]; seen {
			// A pod's counts only grow: a reading below the last (a summary without them) is not
			// taken.
			c.Completed, c.Incomplete, c.Delivered = max(c.Completed, was.Completed), max(c.Incomplete, was.Incomplete), max(c.Delivered, was.Delivered)
			ok = true
		}
		delete(last, uid)
		if ok && (c.Completed > 0 || c.Incomplete > 0 || c.Delivered > 0) {
			c.UID, c.Stream = uid, streamID(p)
			byPod = append(byPod, c)
		}
	}
	for _, c := range last { // pods that are gone
		if !streams[c.Stream] {
			c.Delivered = 0
		}
		fold(&before, c)
	}
	for len(byPod) > maxSeriesPods {
		fold(&before, byPod[len(byPod)-1])
		byPod = byPod[:len(byPod)-1]
	}
	if before == (v1beta1.PodSeries{}) {
		return byPod, nil
	}
	return byPod, &before
}

// fold adds a pod's counts to those of the pods gone.
func fold(before *v1beta1.PodSeries, c v1beta1.PodSeries) {
	before.Completed += c.Completed
	before.Incomplete += c.Incomplete
	before.Delivered += c.Delivered
	before.Stream = 0
}

// forgetAfter: readings of pods not read for this long (deleted, or of deleted pipelines) are
// dropped.
const forgetAfter = 10 * time.Minute

func (o *Observer) forget(before time.Time) {
	for uid, r := range o.prev {
		if r.at.Before(before) {
			delete(o.prev, uid)
		}
	}
}

// streamID is a pod's stream, from its label (-1 when it has none).
func streamID(p *corev1.Pod) int32 {
	id, err := strconv.ParseInt(p.Labels[render.LabelStream], 10, 32)
	if err != nil {
		return -1
	}
	return int32(id)
}
