package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/numastream/numastream/api/v1alpha1"
	"github.com/numastream/numastream/internal/planner"
	"github.com/numastream/numastream/internal/render"
	"github.com/numastream/numastream/internal/topology"
)

// facts are the only reads the planner depends on.
type facts struct {
	senders   []topology.Node
	gateway   topology.Node
	gatewayIP string
	// dataAddresses: each running gateway pod's address on the data network, by stream.
	dataAddresses map[int]string
	held          map[int]int
	heldStreams   int
}

type notPlannedError struct {
	reason string
	err    error
}

func (e *notPlannedError) Error() string { return e.err.Error() }

func (r *StreamPipelineReconciler) gather(ctx context.Context, sp *v1alpha1.StreamPipeline) (facts, error) {
	var f facts
	read := func(name string) (topology.Node, error) {
		node := &corev1.Node{}
		if err := r.Get(ctx, types.NamespacedName{Name: name}, node); err != nil {
			if apierrors.IsNotFound(err) {
				return topology.Node{}, &notPlannedError{ReasonNodeNotFound, fmt.Errorf("node %s does not exist", name)}
			}
			return topology.Node{}, err
		}
		t, err := topology.FromLabels(name, node.Labels)
		if err != nil {
			return t, &notPlannedError{ReasonMissingNodeLabels, err}
		}
		if cpu, ok := node.Status.Allocatable[corev1.ResourceCPU]; ok {
			t.AllocatableCPUs = int(cpu.MilliValue() / 1000)
		}
		if name == sp.Spec.Gateway.Node {
			for _, a := range node.Status.Addresses {
				if a.Type == corev1.NodeInternalIP && f.gatewayIP == "" {
					f.gatewayIP = a.Address
				}
			}
		}
		return t, nil
	}
	for _, s := range sp.Spec.Senders {
		t, err := read(s.Node)
		if err != nil {
			return f, err
		}
		f.senders = append(f.senders, t)
	}
	gw, err := read(sp.Spec.Gateway.Node)
	if err != nil {
		return f, err
	}
	f.gateway = gw
	if f.dataAddresses, err = r.gatewayDataAddresses(ctx, sp); err != nil {
		return f, err
	}
	f.held, f.heldStreams, err = r.heldOnGateway(ctx, sp)
	return f, err
}

// gatewayDataAddresses reads, from each running gateway pod, the address Multus gave it on the
// data network (k8s.v1.cni.cncf.io/network-status).
func (r *StreamPipelineReconciler) gatewayDataAddresses(ctx context.Context, sp *v1alpha1.StreamPipeline) (map[int]string, error) {
	attachment := sp.Spec.Gateway.Network.Attachment
	if attachment == "" || sp.Spec.Gateway.Network.Address != "" {
		return nil, nil
	}
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(sp.Namespace),
		client.MatchingLabels{render.LabelPipeline: sp.Name, render.LabelRole: render.RoleGateway}); err != nil {
		return nil, err
	}
	out := map[int]string{}
	for i := range pods.Items {
		p := &pods.Items[i]
		stream, err := strconv.Atoi(p.Labels[render.LabelStream])
		running := p.Status.Phase == corev1.PodRunning || p.Status.Phase == corev1.PodSucceeded
		if err != nil || p.DeletionTimestamp != nil || !running {
			continue
		}
		if addr := networkStatusAddress(p, sp.Namespace, attachment); addr != "" {
			out[stream] = addr
		}
	}
	return out, nil
}

// networkStatusAddress is the pod's first address on the attachment ("name" or "namespace/name")
// in its Multus network-status annotation; "" when not there.
func networkStatusAddress(p *corev1.Pod, namespace, attachment string) string {
	var status []struct {
		Name string   `json:"name"`
		IPs  []string `json:"ips"`
	}
	if err := json.Unmarshal([]byte(p.Annotations[NetworkStatusAnnotation]), &status); err != nil {
		return ""
	}
	if !strings.Contains(attachment, "/") {
		attachment = namespace + "/" + attachment
	}
	for _, s := range status {
		if s.Name == attachment && len(s.IPs) > 0 {
			return s.IPs[0]
		}
	}
	return ""
}

// heldOnGateway sums the gateway cores that older pipelines hold. Age decides who keeps cores
// when they run out, so a plan never flips back and forth between two pipelines.
func (r *StreamPipelineReconciler) heldOnGateway(ctx context.Context, sp *v1alpha1.StreamPipeline) (map[int]int, int, error) {
	var list v1alpha1.StreamPipelineList
	if err := r.List(ctx, &list, client.MatchingFields{indexGateway: sp.Spec.Gateway.Node}); err != nil {
		return nil, 0, err
	}
	held, streams := map[int]int{}, 0
	for i := range list.Items {
		o := &list.Items[i]
		if o.UID == sp.UID || o.Spec.Suspend || o.Status.Plan == nil || !older(o, sp) ||
			!meta.IsStatusConditionTrue(o.Status.Conditions, v1alpha1.ConditionPlanned) {
			continue
		}
		for _, c := range o.Status.Plan.GatewayCores {
			held[int(c.NUMANode)] += int(c.Cores)
		}
		streams += len(o.Spec.Senders)
	}
	return held, streams, nil
}

func older(a, b *v1alpha1.StreamPipeline) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
}

func request(sp *v1alpha1.StreamPipeline, f facts) planner.Request {
	ratio, _ := strconv.ParseFloat(sp.Spec.ExpectedRatio, 64)
	if ratio <= 0 {
		ratio = 2
	}
	req := planner.Request{
		Senders: f.senders, Gateway: f.gateway, GatewayNIC: sp.Spec.Gateway.Network.NIC,
		Ratio: ratio, Mode: planner.NUMAAware, Held: f.held, HeldStreams: f.heldStreams,
		HasSink: sp.Spec.Sink != nil && (sp.Spec.Sink.File != nil || sp.Spec.Sink.ZMQ != nil),
		Port:    int(sp.Spec.Port),
	}
	if sp.Spec.Placement == v1alpha1.PlacementOS {
		req.Mode = planner.OS
	}
	if sp.Spec.Connections != nil {
		req.Connections = int(*sp.Spec.Connections)
	}
	if t := sp.Spec.Threads; t != nil {
		if t.Compress != nil {
			req.CompressThreads = int(*t.Compress)
		}
		if t.Decompress != nil {
			req.DecompressThreads = int(*t.Decompress)
		}
	}
	if sp.Spec.TargetGbps != nil {
		req.TargetMbit = float64(*sp.Spec.TargetGbps) * 1000
	}
	return req
}
