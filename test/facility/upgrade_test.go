package facility

import (
	"path/filepath"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/numastream/numastream/internal/render"
)

// `helm upgrade` to a new agent image while a stream runs: the operator (restarted by the
// upgrade, with the new image) replaces the pipeline's Jobs, each agent drains and the new pods
// resume the stream; the file ends with every chunk once, the status counts none lost, and the
// pods that finished the stream run the new image.
func TestAHelmUpgradeToANewAgentImageMidStreamLosesNothing(t *testing.T) {
	const chunks = 120
	const newImage = "numastream/agent:upgraded"
	dir := sinkDir(t, "upgrade")
	sp := pipeline(t, ns, "upgrade", chunks, "  sink: {file: {root: "+storageRoot+", path: \"upgrade/upgrade-{stream}.raw\"}}")
	sp.Spec.Senders[0].Source.Synthetic.RateGbps = ptrInt32(1) // paced, so the upgrade lands mid-stream
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	defer deleteAndCheckGone(t, sp)
	gw, n := flowing(t, sp, "the stream flowing on the installed image", 10)
	if img := gw.Spec.Containers[0].Image; img == newImage {
		t.Fatalf("the gateway already runs %s", img)
	}
	out := facilityScript(t, "upgrade-agent", "upgraded")
	defer facilityScript(t, "upgrade-agent", "facility")
	t.Logf("helm upgrade after %s delivered %.0f of %d chunks: %s", gw.Name, n, chunks, strings.TrimSpace(out))

	cur := completed(t, sp, chunks, "Ready=True Completed after the upgrade")
	// Every Job now carries the new image, and a pod of each role finished the stream on it.
	var jobs batchv1.JobList
	if err := k8s.List(ctx, &jobs, client.InNamespace(ns), client.MatchingLabels{render.LabelPipeline: sp.Name}); err != nil {
		t.Fatal(err)
	}
	for _, j := range jobs.Items {
		for _, c := range j.Spec.Template.Spec.Containers {
			if c.Image != newImage {
				t.Errorf("job %s container %s: image %s, want %s", j.Name, c.Name, c.Image, newImage)
			}
		}
	}
	finished := map[string]string{}
	for _, role := range []string{render.RoleSender, render.RoleGateway} {
		for _, p := range pods(t, sp, role) {
			if p.Status.Phase == corev1.PodSucceeded && p.Spec.Containers[0].Image == newImage {
				finished[role] = p.Name
			}
		}
		if finished[role] == "" {
			t.Errorf("no %s pod finished the stream on %s", role, newImage)
		}
	}
	size := wholeAndNothingLost(t, cur, filepath.Join(dir, "upgrade-0.raw"), chunks)
	t.Logf("after the upgrade: Completed, %d chunks delivered, lost %d; upgrade-0.raw holds %d bytes; finished on the new image: %v",
		cur.Status.Observed.ChunksDelivered, cur.Status.Observed.ChunksLost, size, finished)
}
