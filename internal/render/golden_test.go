package render

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	v1beta1 "github.com/numastream/numastream/api/v1beta1"
)

// goldenDir holds agent configurations as the operator renders them. The agent's own tests
// (agent/tests/config_test.cpp, GoldenConfigs) parse every file and check that each value means
// to the agent what it means here, so the Go types and the C++ parser cannot drift apart.
// NUMASTREAM_UPDATE_GOLDEN=1 rewrites them after an intended change.
const goldenDir = "../../agent/tests/golden"

func goldenCases() map[string]*v1beta1.StreamPipeline {
	rate := func(sp *v1beta1.StreamPipeline) {
		r := int32(25)
		sp.Spec.Senders[0].Source.Synthetic.RateGbps = &r
	}
	return map[string]*v1beta1.StreamPipeline{
		"synthetic-null": pipeline("synthetic-null", withStreams(2), rate),
		"file-file":      pipeline("file-file", withFileSource("scan"), withFileSink("s-{stream}.raw")),
		"zmq-zmq-os":     pipeline("zmq-zmq-os", withPlacement(v1beta1.PlacementOS), zmqEnds),
		"curve-endless":  pipeline("curve-endless", withCurve, endless),
		"authenticate": pipeline("authenticate", func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Security = &v1beta1.Security{Mode: v1beta1.SecurityAuthenticate}
		}),
		"hdf5-bslz4": pipeline("hdf5-bslz4", func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Codec = v1beta1.Codec("bslz4")
			sp.Spec.Senders[0].Source = v1beta1.Source{HDF5: &v1beta1.HDF5Dataset{Root: "scratch", Path: "tomo_0001.h5"}}
			sp.Spec.Sink = &v1beta1.Sink{HDF5: &v1beta1.HDF5Dataset{Root: "archive", Path: "scan-{stream}.h5",
				Dataset: "/entry/data/data", IO: "direct"}}
		}),
		"stream2-stream2": pipeline("stream2-stream2", func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Codec = v1beta1.Codec("bslz4")
			sp.Spec.Senders[0].Source = v1beta1.Source{Stream2: &v1beta1.ZMQEndpoint{Endpoint: "tcp://dcu-eiger2:31001"}}
			redeliver := int32(128)
			sp.Spec.Sink = &v1beta1.Sink{Stream2: &v1beta1.Stream2Sink{Port: 31001, Redeliver: &redeliver, AllowFrom: []string{"10.40.0.0/24"}}}
			side := int32(256)
			sp.Spec.Preview = &v1beta1.Preview{MaxSide: &side}
		}),
		"stream2-nxmx": pipeline("stream2-nxmx", func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Codec = v1beta1.Codec("bslz4")
			sp.Spec.Senders[0].Source = v1beta1.Source{Stream2: &v1beta1.ZMQEndpoint{Endpoint: "tcp://dcu-eiger2:31001"}}
			sp.Spec.Sink = &v1beta1.Sink{HDF5: &v1beta1.HDF5Dataset{Root: "archive", Path: "mx/{series}.h5",
				NXmx: &v1beta1.NXmxFiles{FramesPerFile: 500, Instrument: "BL-2", Source: "facility ring", Sample: "lysozyme"}}}
		}),
		// A detector's series to NXmx files, re-emitted for online analysis and shown live.
		"stream2-fanout": pipeline("stream2-fanout", func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Codec = v1beta1.Codec("bslz4")
			sp.Spec.Senders[0].Source = v1beta1.Source{Stream2: &v1beta1.ZMQEndpoint{Endpoint: "tcp://dcu-eiger2:31001"}}
			sp.Spec.Sinks = []v1beta1.Consumer{
				{Name: "files", Sink: v1beta1.Sink{HDF5: &v1beta1.HDF5Dataset{Root: "archive", Path: "mx/{series}.h5",
					NXmx: &v1beta1.NXmxFiles{FramesPerFile: 100}}}},
				{Name: "analysis", Guarantee: v1beta1.GuaranteeLossless, Sink: v1beta1.Sink{Stream2: &v1beta1.Stream2Sink{Port: 31002}}},
				{Name: "live", Guarantee: v1beta1.GuaranteeLatest, Sink: v1beta1.Sink{ZMQ: &v1beta1.ZMQEndpoint{Endpoint: "tcp://viewer:7000"}}},
			}
		}),
		// Files here and an encrypted, acknowledged hop to an HPC site 20 ms away losing 0.1%.
		"onward-hop": pipeline("onward-hop", withCurve, func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Sinks = []v1beta1.Consumer{
				{Name: "archive", Sink: v1beta1.Sink{File: &v1beta1.FileSource{Root: "archive", Path: "s-{stream}.raw"}}},
				{Name: "hpc", Spill: &v1beta1.ConsumerSpill{MaxBytes: 256 << 30, Root: "tape", Path: "hpc-backlog"},
					Sink: v1beta1.Sink{Onward: &v1beta1.OnwardSink{Endpoint: "tcp://dtn.hpc.example:7000",
						ServerKey: "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7",
						Link: &v1beta1.OnwardLink{BandwidthMbps: 10000, RoundTrip: &metav1.Duration{Duration: 20 * time.Millisecond},
							LossPercent: "0.1"}}}},
			}
		}),
		"hostnetwork-plain": pipeline("hostnetwork-plain", func(sp *v1beta1.StreamPipeline) {
			sp.Spec.HostNetwork = true
			sp.Spec.Security = &v1beta1.Security{Mode: v1beta1.SecurityNone, AllowFrom: []string{"10.50.0.0/16"}}
		}),
		"shuffle-lz4-idle": pipeline("shuffle-lz4-idle", func(sp *v1beta1.StreamPipeline) {
			sp.Spec.Codec = v1beta1.Codec("shuffle-lz4")
			idle := int32(120)
			sp.Spec.IdleTimeoutSeconds = &idle
		}),
	}
}

func zmqEnds(sp *v1beta1.StreamPipeline) {
	sp.Spec.Senders[0].Source = v1beta1.Source{ZMQ: &v1beta1.ZMQEndpoint{Endpoint: "tcp://daq-1:9999"}}
	sp.Spec.Sink = &v1beta1.Sink{ZMQ: &v1beta1.ZMQEndpoint{Endpoint: "tcp://analysis:7000"}}
	sp.Spec.Spill = &v1beta1.Spill{MaxBytes: 64 << 30}
	sp.Spec.Security = &v1beta1.Security{Mode: v1beta1.SecurityNone} // the opt-out: plain TCP
}

func endless(sp *v1beta1.StreamPipeline) { sp.Spec.Senders[0].Source.Synthetic.Chunks = 0 }

func TestRenderedConfigsMatchTheGoldenFiles(t *testing.T) {
	update := os.Getenv("NUMASTREAM_UPDATE_GOLDEN") == "1"
	want := map[string]bool{}
	for name, sp := range goldenCases() {
		objs, _ := renderFor(t, sp)
		for key, cfg := range objs.ConfigMap.Data {
			file := name + "." + key
			want[file] = true
			path := filepath.Join(goldenDir, file)
			if update {
				if err := os.MkdirAll(goldenDir, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(cfg+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				continue
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Errorf("%s: %v (NUMASTREAM_UPDATE_GOLDEN=1 writes it)", file, err)
				continue
			}
			if strings.TrimSpace(string(got)) != strings.TrimSpace(cfg) {
				t.Errorf("%s differs from what the operator renders now (NUMASTREAM_UPDATE_GOLDEN=1 after an intended change):\n%s", file, cfg)
			}
		}
	}
	entries, err := os.ReadDir(goldenDir)
	if err != nil {
		t.Fatal(err)
	}
	var stale []string
	for _, e := range entries {
		if !want[e.Name()] {
			stale = append(stale, e.Name())
		}
	}
	sort.Strings(stale)
	if len(stale) > 0 && !update {
		t.Errorf("golden files the operator no longer renders: %v", stale)
	}
	if len(want) < 12 {
		t.Errorf("only %d golden configurations", len(want))
	}
}
