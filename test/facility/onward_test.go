package facility

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/render"
)

// An HPC site beside the facility in a box: its own network namespace (a transfer node), reached
// from gateway-a's node over a wide-area link (tests/delay_line.hpp: 20 ms round trip, 0.1% of
// packets lost, 200 Mbit/s, as TCP itself sees them), where a plain `numastream-agent receive`
// admits only the pipeline gateway's key.
const (
	hpcNS      = "nsfac-hpc"
	wanNear    = "10.216.0.1" // gateway-a's node end of the link
	wanFar     = "10.216.0.2" // the HPC transfer node
	wanRTT     = 20 * time.Millisecond
	wanLoss    = 0.001
	wanMbit    = 200
	farPort    = 7000
	podNetwork = "10.244.0.0/16" // the facility's pod networks (hack/facility.sh)
)

// A pipeline writes each chunk to a file at the facility and carries it on to an HPC site over
// the WAN (spec.sinks[].onward): the planner sizes the hop from the link's description and says
// what it predicts; the far receiver is killed mid-stream and restarted; nothing is lost (both
// files the same bytes, every chunk once), and the rate the far site saw is within the
// planner's prediction for the hop.
func TestAnOnwardHopToAnHPCSiteAcrossADelayedLossyLinkLosesNothing(t *testing.T) {
	agent := wan(t)
	dir := sinkDir(t, "onward")
	site := newHPCSite(t, agent, "onward-keys")
	far, keys := site.dir, site.keys
	const chunks = 240
	sp := paced(pipeline(t, ns, "onward", chunks, ""))
	sp.Spec.ChunkBytes = 1 << 20
	sp.Spec.Security = &v1beta1.Security{Mode: v1beta1.SecurityCurve, KeysSecret: keys.Name}
	sp.Spec.Sinks = []v1beta1.Consumer{
		{Name: "archive", Sink: v1beta1.Sink{File: &v1beta1.FileSource{Root: storageRoot, Path: "onward/here-{stream}.raw"}}},
		{Name: "hpc", Sink: v1beta1.Sink{Onward: site.onwardTo(t)}},
	}
	start(t, sp)
	hop := onwardPlan(t, sp)
	t.Logf("plan: onward hop %s: %d connection(s) of %d Mbit/s, predicted %d Mbit/s on the path, %d of the stream (limit %s); the pipeline's bottleneck %s",
		hop.Consumer, hop.Connections, hop.PerConnectionMbps, hop.PredictedPathMbps, hop.PredictedMbps, hop.Limit, get(t, sp).Status.Plan.Bottleneck)

	receiverArgs := site.receiverArgs(hop.Connections)
	first := inHPC(t, nil, agent, receiverArgs...)
	written := func() int64 {
		st, err := os.Stat(filepath.Join(far, "there-0.raw.part"))
		if err != nil {
			return 0
		}
		return st.Size()
	}
	eventually(t, "the far site has a third of the stream", 180*time.Second, func() (bool, string) {
		return written() > chunks/3*sp.Spec.ChunkBytes, fmt.Sprintf("%d bytes there", written())
	})
	_ = first.Process.Signal(syscall.SIGKILL)
	_ = first.Wait()
	t.Logf("far receiver SIGKILLed with %d bytes written", written())
	time.Sleep(time.Second)
	var out strings.Builder
	second := inHPC(t, &out, agent, receiverArgs...)
	completed(t, sp, chunks, "Ready=True Completed with every chunk delivered")
	if err := second.Wait(); err != nil {
		t.Fatalf("the restarted far receiver: %v\n%s", err, out.String())
	}
	there := lastJSON(out.String())
	if num(there, "lost") != 0 || there["complete"] != true || num(there, "chunks")+num(there, "delivered_before") != chunks {
		t.Errorf("far receiver summary: %v", there)
	}
	here, sizeHere := fileSum(t, filepath.Join(dir, "here-0.raw"))
	away, sizeAway := fileSum(t, filepath.Join(far, "there-0.raw"))
	if here != away || sizeHere != sizeAway || sizeHere == 0 {
		t.Errorf("the facility's file (%d bytes, sha256 %s) and the HPC site's (%d bytes, %s) differ", sizeHere, here, sizeAway, away)
	}
	gw := pods(t, sp, render.RoleGateway)[0]
	g := summary(t, &gw, render.DecompressContainer)
	each, _ := g["consumers"].([]any)
	if len(each) != 2 {
		t.Fatalf("gateway summary consumers: %v", g["consumers"])
	}
	onward := each[1].(map[string]any)
	if num(onward, "chunks") != chunks || onward["error"] != nil {
		t.Errorf("the onward consumer: %v", onward)
	}
	// The rate the far site took the rest of the stream at on the path (its own first-to-last
	// chunk; the hop carries the chunks compressed), against the planner's prediction for the
	// path: at most a tenth above it, at least half of it. The chunks came compressed as the
	// gateway got them: the far site's ratio is the gateway's.
	mbit := num(there, "wire_gbps") * 1000
	ratioHere, ratioThere := num(g, "ratio"), num(there, "ratio")
	t.Logf("far receiver: resumed after %.0f chunks, took %.0f more at %.0f Mbit/s on the path (predicted %d: %.2fx), %.0f Mbit/s of the stream (ratio %.2f, the gateway's %.2f); files %d bytes each, sha256 %s",
		num(there, "delivered_before"), num(there, "chunks"), mbit, hop.PredictedPathMbps, mbit/float64(hop.PredictedPathMbps),
		num(there, "raw_gbps")*1000, ratioThere, ratioHere, sizeHere, here[:16])
	if mbit > 1.1*float64(hop.PredictedPathMbps) || mbit < 0.5*float64(hop.PredictedPathMbps) {
		t.Errorf("the hop carried %.0f Mbit/s on the path, the planner predicted %d", mbit, hop.PredictedPathMbps)
	}
	if math.Abs(ratioThere-ratioHere) > 0.05*ratioHere {
		t.Errorf("the far site's chunks came at ratio %.2f, the gateway's at %.2f: the hop did not forward them compressed", ratioThere, ratioHere)
	}
}

// hpcSite is the HPC site's receiver keys and the pipeline's keys Secret, which holds the gateway
// key the far site admits.
type hpcSite struct {
	dir    string // the far receiver's keys (far.secret, allowed) and files
	public string // its public key, for spec.sinks[].onward.serverKey
	keys   *corev1.Secret
}

func newHPCSite(t *testing.T, agent, secret string) hpcSite {
	t.Helper()
	far := t.TempDir()
	run(t, agent, "keygen", "--out", filepath.Join(far, "far"))
	run(t, agent, "keygen", "--out", filepath.Join(far, "gateway"))
	run(t, agent, "keygen", "--out", filepath.Join(far, "sender"))
	gwPublic := strings.TrimSpace(read(t, filepath.Join(far, "gateway.public")))
	if err := os.WriteFile(filepath.Join(far, "allowed"), []byte(gwPublic+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	keys := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secret, Namespace: ns},
		Data: map[string][]byte{render.GatewaySecretKey: []byte(read(t, filepath.Join(far, "gateway.secret"))),
			render.GatewayPublicKey: []byte(gwPublic), render.SenderSecretKey(0): []byte(read(t, filepath.Join(far, "sender.secret"))),
			render.SenderPublicKey(0): []byte(read(t, filepath.Join(far, "sender.public")))}}
	if err := k8s.Create(ctx, keys); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(ctx, keys) })
	return hpcSite{dir: far, public: strings.TrimSpace(read(t, filepath.Join(far, "far.public"))), keys: keys}
}

// receiverArgs: a plain `numastream-agent receive` at the HPC site, on `connections` ports from
// farPort, writing there-{stream}.raw and admitting only the gateway's key.
func (s hpcSite) receiverArgs(connections int32) []string {
	return []string{"receive", "--endpoint", fmt.Sprintf("tcp://%s:%d", wanFar, farPort),
		"--connections", strconv.Itoa(int(connections)), "--sink", "file", "--sink-path", filepath.Join(s.dir, "there-{stream}.raw"),
		"--idle-timeout", "120", "--set", "security.curve.secret_key_file=" + filepath.Join(s.dir, "far.secret"),
		"--set", "security.curve.allowed_keys_file=" + filepath.Join(s.dir, "allowed")}
}

// onwardTo is the pipeline's consumer that carries the stream to the HPC site over the WAN.
func (s hpcSite) onwardTo(t *testing.T) *v1beta1.OnwardSink {
	return &v1beta1.OnwardSink{Endpoint: fmt.Sprintf("tcp://%s:%d", wanFar, farPort), ServerKey: s.public,
		Link: &v1beta1.OnwardLink{BandwidthMbps: wanMbit, RoundTrip: &metav1.Duration{Duration: wanRTT},
			LossPercent: strconv.FormatFloat(wanLoss*100, 'f', -1, 64), CongestionControl: congestionControl(t)}}
}

// onwardPlan is the planner's onward hop of the pipeline (its one), once in status.
func onwardPlan(t *testing.T, sp *v1beta1.StreamPipeline) v1beta1.OnwardPlan {
	t.Helper()
	var hop v1beta1.OnwardPlan
	eventually(t, "status.plan.onward", 120*time.Second, func() (bool, string) {
		p := get(t, sp).Status.Plan
		if p == nil || len(p.Onward) != 1 {
			return false, fmt.Sprintf("plan %+v", p)
		}
		hop = p.Onward[0]
		return true, ""
	})
	return hop
}

// wan makes the HPC site's namespace and the delay line to it from gateway-a's node; both go
// when the test ends. It returns the agent binary to run there.
func wan(t *testing.T) string {
	t.Helper()
	agent, tool := os.Getenv("NUMASTREAM_AGENT"), os.Getenv("NUMASTREAM_DELAY_LINE")
	if agent == "" || tool == "" {
		t.Fatal("NUMASTREAM_AGENT and NUMASTREAM_DELAY_LINE name the agent binary and the delay-line tool (make test-e2e-facility sets them)")
	}
	node := "nsfac-" + gateway
	_ = exec.Command("ip", "netns", "del", hpcNS).Run() // a killed earlier run's
	for _, c := range [][]string{{"ip", "netns", "add", hpcNS}, {"ip", "-n", hpcNS, "link", "set", "lo", "up"}} {
		run(t, c[0], c[1:]...)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", hpcNS).Run() })
	cmd := exec.Command(tool, node, hpcNS, wanNear, wanFar, strconv.FormatFloat(wanRTT.Seconds()*1000/2, 'f', -1, 64),
		strconv.FormatFloat(wanLoss, 'f', -1, 64), strconv.Itoa(wanMbit), "216")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || lines.Text() != "ready" {
		_ = cmd.Wait()
		t.Fatalf("delay-line did not start: %s", stderr.String())
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		if lines.Scan() {
			var c struct{ Carried, Dropped int64 }
			_ = json.Unmarshal(lines.Bytes(), &c)
			t.Logf("delay line: %d packets carried, %d dropped", c.Carried, c.Dropped)
		}
		_ = cmd.Wait()
	})
	// The far site answers the pods' addresses back over the link.
	run(t, "ip", "-n", hpcNS, "route", "add", podNetwork, "via", wanNear)
	return agent
}

// congestionControl is what gateway-a's pods' TCP uses (a new network namespace starts with the
// host's default), as the link description names it.
func congestionControl(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_congestion_control")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(b)) == "bbr" {
		return "bbr"
	}
	return "loss-based"
}

// inHPC starts the agent on the HPC site's transfer node, its output to `stdout` (if any);
// killed when the test ends.
func inHPC(t *testing.T, stdout *strings.Builder, agent string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", hpcNS, agent}, args...)...)
	if stdout != nil {
		cmd.Stdout = stdout
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Logf("far receiver's log:\n%s", tail(stderr.String(), 2000))
		}
	})
	return cmd
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
