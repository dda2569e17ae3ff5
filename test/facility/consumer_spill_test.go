package facility

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/render"
)

// The HPC site goes down while a pipeline writes a file at the facility and carries the stream
// on to it (spec.sinks[].onward with a spill on the gateway node's StorageRoot): the facility's
// file is written whole meanwhile, the backlog for the HPC site waits in the consumer's spill
// (status says how much), the sender stays for its stream's end; then the gateway pod is deleted
// (its node's reboot, say) with the backlog still in the spill. The next gateway pod of the Job
// hands the spill on first, the HPC site comes back, and both sites hold the same bytes.
func TestAConsumersSpillOutlivesItsGatewayPodAndReachesTheHPCSite(t *testing.T) {
	t0 := time.Now()
	agent := wan(t)
	dir := sinkDir(t, "backlog")
	site := newHPCSite(t, agent, "backlog-keys")
	const chunks = 160
	sp := paced(pipeline(t, ns, "backlog", chunks, ""))
	sp.Spec.ChunkBytes = 1 << 20
	sp.Spec.Security = &v1beta1.Security{Mode: v1beta1.SecurityCurve, KeysSecret: site.keys.Name}
	sp.Spec.Sinks = []v1beta1.Consumer{
		{Name: "archive", Sink: v1beta1.Sink{File: &v1beta1.FileSource{Root: storageRoot, Path: "backlog/here-{stream}.raw"}}},
		{Name: "hpc", Spill: &v1beta1.ConsumerSpill{MaxBytes: 1 << 30, Root: storageRoot, Path: "backlog/spill"},
			Sink: v1beta1.Sink{Onward: site.onwardTo(t)}},
	}
	start(t, sp)
	hop := onwardPlan(t, sp)
	far := inHPC(t, nil, agent, site.receiverArgs(hop.Connections)...)
	there := filepath.Join(site.dir, "there-0.raw")
	eventually(t, "the HPC site has a tenth of the stream", 180*time.Second, func() (bool, string) {
		n := fileSize(there + ".part")
		return n > chunks/10*sp.Spec.ChunkBytes, fmt.Sprintf("%d bytes there", n)
	})
	if err := far.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Logf("[%s] the HPC site's receiver stopped (SIGSTOP) with %d bytes written", time.Since(t0), fileSize(there+".part"))

	// The facility's file is written whole while the HPC site is down.
	here := filepath.Join(dir, "here-0.raw")
	whole := chunks * sp.Spec.ChunkBytes
	eventually(t, "the facility's file whole with the HPC site down", 180*time.Second, func() (bool, string) {
		n := max(fileSize(here), fileSize(here+".part"))
		return n == whole, fmt.Sprintf("%d of %d bytes", n, whole)
	})
	t.Logf("[%s] the facility's file is whole", time.Since(t0))
	cur := get(t, sp)
	spillDir := filepath.Join(dir, "spill", ns, sp.Name+"-"+string(cur.UID), "hpc", "stream-0")
	held := dirSize(t, spillDir)
	if held < 4*sp.Spec.ChunkBytes {
		t.Fatalf("the hop's spill %s holds %d bytes: the backlog should wait there", spillDir, held)
	}
	var observed int64
	eventually(t, "status.observed.consumers says what the hop's spill holds", 60*time.Second, func() (bool, string) {
		o := get(t, sp).Status.Observed
		if o == nil {
			return false, "no observation"
		}
		for _, k := range o.Consumers {
			if k.Name == "hpc" && k.SpillBytes > 0 {
				observed = k.SpillBytes
				return true, ""
			}
		}
		return false, fmt.Sprintf("consumers %+v", o.Consumers)
	})
	if p := running(t, sp, render.RoleSender); p == nil {
		t.Fatal("the sender ended with its stream still in the hop's spill: a gateway lost now could not end the stream")
	}
	gw := running(t, sp, render.RoleGateway)
	if gw == nil {
		t.Fatal("no running gateway pod")
	}
	t.Logf("[%s] the hop's spill holds %d bytes on %s (status: %d); the sender waits for its end",
		time.Since(t0), held, gateway, observed)
	if err := k8s.Delete(ctx, gw, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	var next *corev1.Pod
	eventually(t, "the next gateway pod runs", 120*time.Second, func() (bool, string) {
		next = running(t, sp, render.RoleGateway)
		return next != nil && next.UID != gw.UID, "waiting"
	})
	t.Logf("[%s] gateway pod %s deleted; %s runs", time.Since(t0), gw.Name, next.Name)
	if err := far.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	completed(t, sp, chunks, "Ready=True Completed with every chunk delivered")
	if err := far.Wait(); err != nil {
		t.Fatalf("the HPC site's receiver: %v", err)
	}
	sumHere, sizeHere := fileSum(t, here)
	sumThere, sizeThere := fileSum(t, there)
	if sumHere != sumThere || sizeHere != whole || sizeThere != whole {
		t.Errorf("the facility's file (%d bytes, sha256 %s) and the HPC site's (%d bytes, %s), want both %d bytes and equal",
			sizeHere, sumHere, sizeThere, sumThere, whole)
	}
	var last corev1.Pod
	for _, p := range pods(t, sp, render.RoleGateway) {
		if p.UID == next.UID {
			last = p
		}
	}
	g := summary(t, &last, render.DecompressContainer)
	each, _ := g["consumers"].([]any)
	if len(each) != 2 {
		t.Fatalf("gateway summary consumers: %v", g["consumers"])
	}
	spill, _ := each[1].(map[string]any)["spill"].(map[string]any)
	if num(spill, "recovered") == 0 || num(spill, "pending_bytes") != 0 {
		t.Errorf("the next gateway's hop: spill %v: want what the deleted pod spilled recovered and all of it handed on", spill)
	}
	t.Logf("[%s] the next gateway pod recovered %.0f chunks from the spill; both sites hold %d bytes, sha256 %s",
		time.Since(t0), num(spill, "recovered"), sizeHere, sumHere[:16])
}

func fileSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}

func dirSize(t *testing.T, dir string) int64 {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("%s: %v", dir, err)
	}
	var n int64
	for _, e := range entries {
		if info, err := e.Info(); err == nil && !strings.HasPrefix(e.Name(), ".") {
			n += info.Size()
		}
	}
	return n
}
