package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/render"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
)

// staleReads answers a Get of one pipeline with an older copy of it, as an informer's cache
// that has not seen the latest write yet does.
type staleReads struct {
	client.Client
	stale *v1beta1.StreamPipeline
}

func (c staleReads) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if sp, ok := obj.(*v1beta1.StreamPipeline); ok && key == client.ObjectKeyFromObject(c.stale) {
		c.stale.DeepCopyInto(sp)
		return nil
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

// Two versions of a pipeline each add a sender; a pass over the older one would give its new
// sender the same stream id the latest gave another (its Jobs, keys and files named after
// it). That pass writes its status with the version it read, is refused (conflict), and
// names nothing: no Job, no configuration for the sender only it has.
func TestAPassOverAStaleCopyGivesNoStreamIdAndNamesNothing(t *testing.T) {
	needEnvtest(t)
	gatewayAndSenders(t, "lynx-stale")
	ns := namespace(t)
	sp := pipeline(ns, "ids", withGateway("lynx-stale"), withSenders("updraft-1", "updraft-2"))
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	cur := &v1beta1.StreamPipeline{}
	eventually(t, "streams 0 and 1 given", func() (bool, string) {
		_ = k8s.Get(ctx, client.ObjectKeyFromObject(sp), cur)
		return cur.Status.NextStream == 2, fmt.Sprintf("%+v next %d", cur.Status.Senders, cur.Status.NextStream)
	})
	// The copy a cache could hold: polaris-1 added (not yet given a stream).
	stale := cur.DeepCopy()
	withSenders("updraft-1", "updraft-2", "polaris-1")(stale)
	// The latest: polaris-2 added instead, and given stream 2.
	updateSpec(t, sp, withSenders("updraft-1", "updraft-2", "polaris-2"))
	eventually(t, "stream 2 given to polaris-2", func() (bool, string) {
		_ = k8s.Get(ctx, client.ObjectKeyFromObject(sp), cur)
		for _, s := range cur.Status.Senders {
			if s.Stream == 2 {
				return s.Node == "polaris-2", fmt.Sprintf("%+v next %d", cur.Status.Senders, cur.Status.NextStream)
			}
		}
		return false, fmt.Sprintf("%+v next %d", cur.Status.Senders, cur.Status.NextStream)
	})
	eventually(t, "the latest's sender Job for stream 2", func() (bool, string) {
		j := &batchv1.Job{}
		err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "ids-sender-2"}, j)
		return err == nil, "no Job yet"
	})

	r := &StreamPipelineReconciler{
		Client: staleReads{Client: cached, stale: stale}, Scheme: k8s.Scheme(), Recorder: events.NewFakeRecorder(64),
		Render: render.Options{AgentImage: "numastream/agent:test", NetworkPolicy: true, WholeRootVolumes: true},
	}
	_, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(sp)})
	if !apierrors.IsConflict(err) {
		t.Fatalf("a pass over a stale copy: %v, want a conflict", err)
	}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(sp), cur); err != nil {
		t.Fatal(err)
	}
	for _, s := range cur.Status.Senders {
		if s.Node == "polaris-1" {
			t.Errorf("the stale copy's sender was given stream %d: %s", s.Stream, fmt.Sprintf("%+v next %d", cur.Status.Senders, cur.Status.NextStream))
		}
	}
	j := &batchv1.Job{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "ids-sender-2"}, j); err != nil {
		t.Fatal(err)
	}
	if node := j.Spec.Template.Spec.NodeSelector[corev1.LabelHostname]; node != "polaris-2" {
		t.Errorf("stream 2's sender Job runs on %s after the stale pass, want polaris-2", node)
	}
	cm := &corev1.ConfigMap{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "ids-agent"}, cm); err != nil {
		t.Fatal(err)
	}
	for name, text := range cm.Data {
		if strings.Contains(text, "polaris-1") {
			t.Errorf("the agents' configuration %s names the stale copy's sender", name)
		}
	}
}
