package facility

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
	newImage := agentImageTagged("upgraded")
	dir := sinkDir(t, "upgrade")
	sp := start(t, paced(pipeline(t, ns, "upgrade", chunks, "  sink: {file: {root: "+storageRoot+", path: \"upgrade/upgrade-{stream}.raw\"}}")))
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

// `helm upgrade` to a new agent image while an endless stream runs: the old gateway pod drains,
// the new pods run the new image and the stream goes on from where it stopped; suspended at the
// end, the two gateway pods' summaries account for every chunk exactly once (the second starts
// where the first stopped), none lost, duplicated or corrupt.
func TestAHelmUpgradeMidEndlessStreamDeliversEachChunkOnce(t *testing.T) {
	newImage := agentImageTagged("endless")
	sp := start(t, paced(pipeline(t, ns, "upgrade-endless", 0, "")))
	gw, n := flowing(t, sp, "the endless stream flowing on the installed image", 10)
	final := follow(t, gw, render.DecompressContainer)
	out := facilityScript(t, "upgrade-agent", "endless")
	defer facilityScript(t, "upgrade-agent", "facility")
	lives := []map[string]any{await(t, "the gateway pod the upgrade replaced", final)}
	t.Logf("helm upgrade after %.0f chunks: %s", n, strings.TrimSpace(out))
	var next *corev1.Pod
	eventually(t, "a gateway pod on the new image delivering", 180*time.Second, func() (bool, string) {
		next = running(t, sp, render.RoleGateway)
		if next == nil || next.Spec.Containers[0].Image != newImage {
			return false, "no running gateway pod on " + newImage
		}
		d, _, _ := delivered(t, next)
		return d > 10, fmt.Sprintf("%s delivered %.0f", next.Name, d)
	})
	if tx := running(t, sp, render.RoleSender); tx == nil || tx.Spec.Containers[0].Image != newImage {
		t.Errorf("the running sender pod is not on %s: %v", newImage, tx)
	}
	final = follow(t, next, render.DecompressContainer)
	setSuspend(t, sp, true)
	lives = append(lives, await(t, "the new gateway pod, suspended", final))
	total := eachChunkOnce(t, lives)
	t.Logf("endless stream through the upgrade: %.0f chunks, each delivered exactly once across %d gateway pods (the second on %s)", total, len(lives), newImage)
}
