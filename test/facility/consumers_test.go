package facility

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/render"
)

// One stream to three consumers at once (spec.sinks) on real pods: two lossless files and a live
// zmq view nobody reads (latest: it never holds the files back). While it runs, status says per
// consumer what each got (status.observed.consumers, from the gateway's own counts); when it
// ends, both files hold every chunk, byte for byte the same, and the gateway's summary names each
// consumer's count.
func TestOneStreamToTwoFilesAndALiveViewThatNobodyReads(t *testing.T) {
	const chunks = 120
	dir := sinkDir(t, "fanout")
	sp := paced(pipeline(t, ns, "fanout", chunks, ""))
	sp.Spec.Sinks = []v1beta1.Consumer{
		{Name: "archive", Sink: v1beta1.Sink{File: &v1beta1.FileSource{Root: storageRoot, Path: "fanout/a-{stream}.raw"}}},
		{Name: "copy", Sink: v1beta1.Sink{File: &v1beta1.FileSource{Root: storageRoot, Path: "fanout/b-{stream}.raw"}}},
		{Name: "live", Guarantee: v1beta1.GuaranteeLatest, Sink: v1beta1.Sink{ZMQ: &v1beta1.ZMQEndpoint{Endpoint: "tcp://127.0.0.1:7999"}}},
	}
	start(t, sp)

	var rows []v1beta1.ConsumerStatus
	eventually(t, "status.observed.consumers while the stream runs", 180*time.Second, func() (bool, string) {
		cur := get(t, sp)
		o := cur.Status.Observed
		if o == nil {
			var what []string
			for _, c := range cur.Status.Conditions {
				what = append(what, fmt.Sprintf("%s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message))
			}
			for _, p := range append(pods(t, sp, render.RoleGateway), pods(t, sp, render.RoleSender)...) {
				what = append(what, fmt.Sprintf("pod %s %s %s", p.Name, p.Status.Phase, p.Status.Message))
			}
			return false, "no observed status; " + strings.Join(what, "; ")
		}
		rows = o.Consumers
		got := map[string]int64{}
		for _, r := range rows {
			got[r.Name] = r.Chunks + r.PassedOver
		}
		return len(rows) == 3 && got["archive"] > 0 && got["copy"] > 0 && got["live"] > 0, fmt.Sprintf("consumers %+v", rows)
	})
	for _, r := range rows {
		t.Logf("status: stream %d consumer %-7s %-4s %-8s chunks %d, passed over %d, behind %d", r.Stream, r.Name, r.Kind, r.Guarantee,
			r.Chunks, r.PassedOver, r.Behind)
		if r.Guarantee == "lossless" && r.PassedOver != 0 {
			t.Errorf("lossless consumer %s passed over %d chunks", r.Name, r.PassedOver)
		}
	}

	eventually(t, "Ready=True Completed", 240*time.Second, func() (bool, string) {
		ready := meta.FindStatusCondition(get(t, sp).Status.Conditions, v1beta1.ConditionReady)
		return ready != nil && ready.Status == metav1.ConditionTrue && ready.Reason == "Completed", fmt.Sprintf("Ready %v", ready)
	})
	gw := pods(t, sp, render.RoleGateway)[0]
	got := summary(t, &gw, render.DecompressContainer)
	if num(got, "chunks") != chunks || num(got, "lost") != 0 || got["complete"] != true {
		t.Errorf("gateway summary: %v", got)
	}
	each, _ := got["consumers"].([]any)
	if len(each) != 3 {
		t.Fatalf("summary consumers %v", got["consumers"])
	}
	for i, c := range each {
		k := c.(map[string]any)
		t.Logf("summary: consumer %d (%s) %v %v: chunks %.0f, passed over %.0f, error %v", i, sp.Spec.Sinks[i].Name, k["kind"],
			k["guarantee"], num(k, "chunks"), num(k, "passed_over"), k["error"])
		if k["guarantee"] == "lossless" && (num(k, "chunks") != chunks || k["error"] != nil) {
			t.Errorf("lossless consumer %s: %v", sp.Spec.Sinks[i].Name, k)
		}
	}
	a, sizeA := fileSum(t, filepath.Join(dir, "a-0.raw"))
	b, sizeB := fileSum(t, filepath.Join(dir, "b-0.raw"))
	if float64(sizeA) != num(got, "raw_bytes") || sizeB != sizeA || a != b {
		t.Errorf("files of %d and %d bytes (sha256 %s, %s), the stream %.0f raw bytes", sizeA, sizeB, a, b, num(got, "raw_bytes"))
	} else {
		t.Logf("a-0.raw and b-0.raw: %d bytes each, identical (sha256 %s), every chunk of the stream", sizeA, a[:16])
	}
}

// fileSum is a file's sha256 and size.
func fileSum(t *testing.T, path string) (string, int64) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil)), n
}
