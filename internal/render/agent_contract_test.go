package render

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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

// Every agent container the operator renders has the memory its agent allocates for its buffer
// pools at start (`check-config` prints it, from the agent's own sizing) and room for the rest of
// the program: a container short of it is OOM-killed the moment the agent pre-faults its pools
// (as a gateway with several consumers was, before the plan counted each consumer's buffers).
func TestEveryAgentContainerHoldsItsBufferPools(t *testing.T) {
	agent := testenv.Agent(t)
	const program = 128 << 20 // the agent itself: code, ZeroMQ, HDF5's caches, stacks
	dir := t.TempDir()
	for name, sp := range goldenCases() {
		objs, _ := renderFor(t, sp)
		for _, j := range objs.Jobs {
			for _, c := range j.Spec.Template.Spec.Containers {
				key := ""
				for i, a := range c.Args {
					if a == "--config" && i+1 < len(c.Args) {
						key = filepath.Base(c.Args[i+1])
					}
				}
				cfg, ok := objs.ConfigMap.Data[key]
				if !ok {
					t.Fatalf("%s/%s: no configuration %q", name, c.Name, key)
				}
				path := filepath.Join(dir, name+"-"+key)
				if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
					t.Fatal(err)
				}
				out, err := exec.Command(agent, "check-config", c.Args[0], "--config", path).CombinedOutput()
				if err != nil {
					t.Fatalf("%s/%s: %v\n%s", name, key, err, out)
				}
				var pools int64
				for _, line := range strings.Split(string(out), "\n") {
					if f := strings.Fields(line); len(f) > 3 && f[0] == "buffer" && f[1] == "pools:" {
						pools, _ = strconv.ParseInt(f[2], 10, 64)
					}
				}
				limit := c.Resources.Limits.Memory().Value()
				if limit < pools+program {
					t.Errorf("%s/%s (%s): memory %d MiB, its agent's buffer pools %d MiB + %d MiB for the program",
						name, c.Name, key, limit>>20, pools>>20, program>>20)
				} else {
					t.Logf("%s/%s: memory %d MiB, buffer pools %d MiB", name, c.Name, limit>>20, pools>>20)
				}
			}
		}
	}
}
