package controllers

import (
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
)

// The operator's own metrics, next to controller-runtime's on its metrics endpoint. Counters are
// per namespace; the per-pipeline gauges are the plan's figures the dashboard and the alerts set
// the agents' figures against, and go when their pipeline goes, so the series stay as many as
// the pipelines there are (docs/monitoring.md).
var (
	reconciles = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "numastream_operator_reconciles_total", Help: "Reconciles of the StreamPipelines of a namespace."}, []string{"namespace"})
	observations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "numastream_operator_observations_total", Help: "Readings of the agents of a namespace's StreamPipelines."}, []string{"namespace"})
	observeErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "numastream_operator_observation_errors_total", Help: "Readings of a namespace's StreamPipelines' agents that failed."}, []string{"namespace"})
	applies = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "numastream_operator_applies_total",
		Help: "Objects of a namespace's StreamPipelines a pass would apply: applied (server-side apply), or unchanged (the cached copy already holds them)."}, []string{"namespace", "result"})
	predictedBits = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "numastream_pipeline_predicted_raw_bits_per_second",
		Help: "The plan's predicted raw rate of all of a pipeline's streams (0: not planned)."}, []string{"namespace", "pipeline"})
	topologyRefusals = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "numastream_pipeline_topology_refusals",
		Help: "Pods of the pipeline's current generation the kubelet's Topology Manager refused (status.topologyRejection)."}, []string{"namespace", "pipeline"})
	pipelineCondition = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "numastream_pipeline_condition",
		Help: "1 for each of a pipeline's conditions as its status has it: its type, status and reason (one series per type)."},
		[]string{"namespace", "pipeline", "type", "status", "reason"})
	// conditionSeries: each pipeline's condition series as last set, to drop the ones its
	// status no longer has.
	conditionSeries   = map[types.NamespacedName][][]string{}
	conditionSeriesMu sync.Mutex
)

func init() {
	ctrlmetrics.Registry.MustRegister(reconciles, applies, observations, observeErrors, predictedBits, topologyRefusals, pipelineCondition)
}

// setPipelineMetrics sets a pipeline's gauges from its status.
func setPipelineMetrics(sp *v1beta1.StreamPipeline) {
	var predicted, refused float64
	if p := sp.Status.Plan; p != nil && !sp.Spec.Suspend {
		predicted = float64(p.PredictedTotalMbps) * 1e6
	}
	if tr := sp.Status.TopologyRejection; tr != nil && tr.Generation == sp.Generation {
		refused = float64(len(tr.Pods))
	}
	predictedBits.WithLabelValues(sp.Namespace, sp.Name).Set(predicted)
	topologyRefusals.WithLabelValues(sp.Namespace, sp.Name).Set(refused)
	series := make([][]string, 0, len(sp.Status.Conditions))
	for _, c := range sp.Status.Conditions {
		series = append(series, []string{sp.Namespace, sp.Name, c.Type, string(c.Status), c.Reason})
	}
	key := types.NamespacedName{Namespace: sp.Namespace, Name: sp.Name}
	conditionSeriesMu.Lock()
	defer conditionSeriesMu.Unlock()
	for _, old := range conditionSeries[key] {
		if !slices.ContainsFunc(series, func(s []string) bool { return slices.Equal(s, old) }) {
			pipelineCondition.DeleteLabelValues(old...)
		}
	}
	for _, s := range series {
		pipelineCondition.WithLabelValues(s...).Set(1)
	}
	conditionSeries[key] = series
}

// forgetPipelineMetrics drops a deleted pipeline's gauges.
func forgetPipelineMetrics(namespace, name string) {
	predictedBits.DeleteLabelValues(namespace, name)
	topologyRefusals.DeleteLabelValues(namespace, name)
	key := types.NamespacedName{Namespace: namespace, Name: name}
	conditionSeriesMu.Lock()
	defer conditionSeriesMu.Unlock()
	for _, old := range conditionSeries[key] {
		pipelineCondition.DeleteLabelValues(old...)
	}
	delete(conditionSeries, key)
}
