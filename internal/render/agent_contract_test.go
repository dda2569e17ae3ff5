package render

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
	"github.com/numastream/numastream/internal/testenv"
)

// Every agent configuration the operator renders is accepted by the real agent binary
// (`numastream-agent check-config`), so the schema in docs/agent-config.md has one source of
// truth: the agent's parser. `make test-operator` builds the agent and sets NUMASTREAM_AGENT.
func TestRenderedConfigsPassTheAgentsValidation(t *testing.T) {
	agent := testenv.Agent(t)
	zmqSource := func(sp *v1beta1.StreamPipeline) {
		sp.Spec.Senders[1].Source = v1beta1.Source{ZMQ: &v1beta1.ZMQEndpoint{Endpoint: "tcp://daq-1:9999"}}
	}
	zmqSink := func(sp *v1beta1.StreamPipeline) {
		sp.Spec.Sink = &v1beta1.Sink{ZMQ: &v1beta1.ZMQEndpoint{Endpoint: "tcp://analysis:7000"}}
	}
	rate := func(sp *v1beta1.StreamPipeline) {
		sp.Spec.Senders[0].Source.Synthetic.RateGbps = new(int32)
		*sp.Spec.Senders[0].Source.Synthetic.RateGbps = 25
	}
	cases := map[string]*v1beta1.StreamPipeline{
		"synthetic, null sink":   pipeline("a", withStreams(2), rate),
		"file source, file sink": pipeline("b", withFileSource("/scratch/scan"), withFileSink("/archive/s-{stream}.raw")),
		"zmq source, zmq sink":   pipeline("c", withStreams(2), zmqSource, zmqSink),
		"os placement":           pipeline("d", withPlacement(v1beta1.PlacementOS)),
		"curve":                  pipeline("e", withStreams(2), withCurve),
		"authenticate": pipeline("f", func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Security = &v1beta1.Security{Mode: v1beta1.SecurityAuthenticate}
		}),
	}
	dir := t.TempDir()
	for name, sp := range cases {
		objs, _ := renderFor(t, sp)
		for key, cfg := range objs.ConfigMap.Data {
			path := filepath.Join(dir, sp.Name+"-"+key)
			if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
				t.Fatal(err)
			}
			role := "send"
			if strings.HasPrefix(key, RoleGateway) {
				role = "receive"
			}
			out, err := exec.Command(agent, "check-config", role, "--config", path).CombinedOutput()
			if err != nil {
				t.Errorf("%s: %s refused by the agent: %v\n%s\n%s", name, key, err, out, cfg)
			}
		}
	}
}
