{{/* Chart name. */}}
{{- define "numastream.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name. */}}
{{- define "numastream.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "numastream.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "numastream.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* Common labels. */}}
{{- define "numastream.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "numastream.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels of one component. */}}
{{- define "numastream.selectorLabels" -}}
app.kubernetes.io/name: {{ include "numastream.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* An image by digest when one is given (what a release pins), else by tag. */}}
{{- define "numastream.image" -}}
{{- if .image.digest -}}
{{ .image.repository }}@{{ .image.digest }}
{{- else -}}
{{ .image.repository }}:{{ .image.tag | default .appVersion }}
{{- end }}
{{- end }}
{{- define "numastream.agentImage" -}}
{{ include "numastream.image" (dict "image" .Values.agentImage "appVersion" .Chart.AppVersion) }}
{{- end }}
{{- define "numastream.operatorImage" -}}
{{ include "numastream.image" (dict "image" .Values.operator.image "appVersion" .Chart.AppVersion) }}
{{- end }}

{{/* numastream's alert rules (PrometheusRule spec; also a plain Prometheus rule file). */}}
{{- define "numastream.alertGroups" -}}
{{- $r := .Values.metrics.prometheusRule -}}
groups:
  - name: numastream
    rules:
      - alert: NumastreamDataMissing
        # chunks_lost counts chunks announced (or below the highest sequence seen) and not
        # delivered, including those a sender declared gone (spill full, a live source restarted).
        expr: max by (namespace, pipeline, stream) (numastream_chunks_lost{role="receive"}) > 0
        labels: {severity: critical}
        annotations:
          summary: "{{`{{ $labels.namespace }}/{{ $labels.pipeline }}`}} stream {{`{{ $labels.stream }}`}}: {{`{{ $value }}`}} chunks missing"
          description: "The gateway is missing chunks of the stream; status.observed.missingChunks and the DataLoss condition name them and why."
      - alert: NumastreamDataCorrupt
        expr: max by (namespace, pipeline, stream) (increase(numastream_chunks_corrupt_total{role="receive"}[5m])) > 0
        labels: {severity: critical}
        annotations:
          summary: "{{`{{ $labels.namespace }}/{{ $labels.pipeline }}`}} stream {{`{{ $labels.stream }}`}}: chunks failed verification"
          description: "Chunks arrived whose checksum did not match; they were not written. See docs/troubleshooting.md."
      - alert: NumastreamStreamStalled
        # A gateway that has not finished its stream and received nothing over the window.
        expr: |-
          sum by (namespace, pipeline, stream) (rate(numastream_raw_bytes_total{role="receive"}[2m])) == 0
            and on (namespace, pipeline, stream) max by (namespace, pipeline, stream) (numastream_streams_complete{role="receive"}) == 0
        for: {{ $r.for }}
        labels: {severity: warning}
        annotations:
          summary: "{{`{{ $labels.namespace }}/{{ $labels.pipeline }}`}} stream {{`{{ $labels.stream }}`}} has received nothing for {{ $r.for }}"
          description: "The sender is not sending (its source is quiet or it is not running) or the data network is down."
      - alert: NumastreamRateBelowPlan
        # The observed raw rate of all of a pipeline's streams against the plan's prediction
        # (the operator's numastream_pipeline_predicted_raw_bits_per_second).
        expr: |-
          sum by (namespace, pipeline) (rate(numastream_raw_bytes_total{role="receive"}[2m])) * 8
            < on (namespace, pipeline) {{ $r.rateBelowPlan }} * max by (namespace, pipeline) (numastream_pipeline_predicted_raw_bits_per_second > 0)
        for: {{ $r.for }}
        labels: {severity: info}
        annotations:
          summary: "{{`{{ $labels.namespace }}/{{ $labels.pipeline }}`}} runs below {{ mulf $r.rateBelowPlan 100 }}% of its plan"
          description: "A paced or quiet source explains it; else see the pipeline's status.observed.bottleneck against status.bottleneck."
      - alert: NumastreamTopologyRefused
        expr: max by (namespace, pipeline) (numastream_pipeline_topology_refusals) > 0
        labels: {severity: warning}
        annotations:
          summary: "{{`{{ $labels.namespace }}/{{ $labels.pipeline }}`}}: the kubelet's Topology Manager refused {{`{{ $value }}`}} pods"
          description: "The operator plans again with fewer receiving cores; status.topologyRejection names the pods."
      - alert: NumastreamPipelineNotPlanned
        # The operator made no pods: a refused manifest, storage not allowed, keys, node labels.
        expr: max by (namespace, pipeline, reason) (numastream_pipeline_condition{type="Planned", status="False"}) == 1
        for: {{ $r.notPlannedFor }}
        labels: {severity: warning}
        annotations:
          summary: "{{`{{ $labels.namespace }}/{{ $labels.pipeline }}`}} is not planned: {{`{{ $labels.reason }}`}}"
          description: "No agent runs until the pipeline or the cluster changes; the Planned condition's message names the field or node (kubectl describe streampipeline)."
      - alert: NumastreamPipelineStalled
        # kstatus Stalled: the operator cannot go on without a person.
        expr: max by (namespace, pipeline, reason) (numastream_pipeline_condition{type="Stalled", status="True"}) == 1
        for: {{ $r.notPlannedFor }}
        labels: {severity: warning}
        annotations:
          summary: "{{`{{ $labels.namespace }}/{{ $labels.pipeline }}`}} is stalled: {{`{{ $labels.reason }}`}}"
          description: "The pipeline cannot converge without a change; the Stalled condition's message says what to change."
      - alert: NumastreamPipelineNotReady
        # Not Ready for longer than a start takes (pods pending, images pulling, agents failing); a
        # suspended pipeline is not Ready by intent.
        expr: max by (namespace, pipeline, reason) (numastream_pipeline_condition{type="Ready", status="False", reason!="Suspended"}) == 1
        for: {{ $r.notReadyFor }}
        labels: {severity: warning}
        annotations:
          summary: "{{`{{ $labels.namespace }}/{{ $labels.pipeline }}`}} has not been Ready for {{ $r.notReadyFor }}: {{`{{ $labels.reason }}`}}"
          description: "See the pipeline's Ready condition and events (kubectl describe streampipeline); docs/troubleshooting.md lists the reasons."
      - alert: NumastreamSpillFilling
        expr: max by (namespace, pipeline, stream) (numastream_spill_bytes{role="send"} / (numastream_spill_max_bytes{role="send"} > 0)) > {{ $r.spillFull }}
        for: 1m
        labels: {severity: warning}
        annotations:
          summary: "{{`{{ $labels.namespace }}/{{ $labels.pipeline }}`}} stream {{`{{ $labels.stream }}`}}: the spill is {{`{{ $value | humanizePercentage }}`}} full"
          description: "Chunks are lost when it is full and the source cannot wait: the gateway or the network is slower than the source."
{{- end }}
