package facility

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/render"
)

// With host networking no NetworkPolicy applies: the gateway admits only its own sender node.
// A plain (security none) host-network stream from detector-a to gateway-a's data NIC runs to
// completion, while a sender on the host (10.212.0.1, not detector-a) that dials the gateway's
// data port on the node's address is refused by address, and the gateway counts it.
func TestAHostNetworkGatewayAdmitsOnlyItsSenderNode(t *testing.T) {
	agent := os.Getenv("NUMASTREAM_AGENT")
	if agent == "" {
		t.Fatal("NUMASTREAM_AGENT is not set (make test-e2e-facility sets it)")
	}
	const chunks, port = 150, 7100
	sp := pipeline(t, ns, "hostnet", chunks, "")
	sp.Spec.HostNetwork = true
	sp.Spec.Port = port
	sp.Spec.Gateway.Network.Attachment, sp.Spec.Gateway.Network.SenderAttachment = "", ""
	sp.Spec.Security = &v1beta1.Security{Mode: v1beta1.SecurityNone} // the address is the only check
	sp.Spec.Senders[0].Source.Synthetic.RateGbps = ptrInt32(1)       // paced: the stranger comes mid-stream
	if err := k8s.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	defer deleteAndCheckGone(t, sp)
	gw, n := flowing(t, sp, "the host-network stream flowing", 5)
	if !gw.Spec.HostNetwork {
		t.Fatalf("gateway pod %s is not on the host network", gw.Name)
	}
	// The stranger: the same agent, from the host, to the gateway node's address.
	stranger := exec.Command(agent, "send", "--endpoint", fmt.Sprintf("tcp://%s:%d", gw.Status.PodIP, port),
		"--chunks", "3", "--set", "stream_id=9", "--set", "timeouts.connect_s=15", "--set", "chunk_bytes=1048576")
	out, err := stranger.CombinedOutput()
	if code := stranger.ProcessState.ExitCode(); err == nil || code != 1 || !strings.Contains(string(out), "security.allow_from") {
		t.Errorf("a sender from the host: exit %d (%v), want 1 naming security.allow_from:\n%s", code, err, out)
	}
	rxPort := containerPort(gw, "metrics", 0)
	if rxPort == 0 || rxPort == render.MetricsPort {
		t.Fatalf("gateway receiving container metrics port %d: want its own, not %d", rxPort, render.MetricsPort)
	}
	samples, err := agentSamples(t, gw, rxPort)
	if err != nil {
		t.Fatal(err)
	}
	refused := -1.0
	for _, s := range samples {
		if s.Name == "numastream_connections_rejected_total" && s.Labels["reason"] == "address" {
			refused = s.Value
		}
	}
	if refused < 1 {
		t.Errorf("the gateway counted %v connections refused by address, want at least 1", refused)
	}
	cur := completed(t, sp, chunks, "Ready=True Completed with the stranger refused")
	if o := cur.Status.Observed; o.ChunksLost != 0 || o.ChunksCorrupt != 0 || o.ChunksDelivered != chunks {
		t.Errorf("observed %+v", o)
	}
	t.Logf("host-network gateway %s (%s): the stranger from the host was refused (%.0f by address) after %.0f chunks; the stream completed: %d delivered, %d lost; endpoint %v",
		gw.Name, gw.Status.PodIP, refused, n, cur.Status.Observed.ChunksDelivered, cur.Status.Observed.ChunksLost, cur.Status.Endpoints)
}
