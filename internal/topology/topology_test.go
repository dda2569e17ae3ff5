package topology

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

func gatewayLabels() map[string]string {
	return map[string]string{
		LabelNUMANodes:          "2",
		NUMACPUsLabel(0):        "16",
		NUMACPUsLabel(1):        "16",
		NICNUMALabel("ens1f0"):  "1",
		NICSpeedLabel("ens1f0"): "200000",
		NICNUMALabel("eno1"):    "0",
		LabelCompressMBps:       "440",
		LabelDecompressMBps:     "1600",
		"feature.node.kubernetes.io/cpu-model.vendor_id": "Intel",
	}
}

func TestFromLabels(t *testing.T) {
	n, err := FromLabels("lynx-1", gatewayLabels())
	if err != nil {
		t.Fatal(err)
	}
	if len(n.NUMANodes) != 2 || n.TotalCPUs() != 32 {
		t.Fatalf("NUMA nodes %+v", n.NUMANodes)
	}
	nic, err := n.NIC("ens1f0")
	if err != nil || nic.NUMANode != 1 || nic.SpeedMbit != 200000 {
		t.Fatalf("ens1f0 = %+v, %v", nic, err)
	}
	if eno, _ := n.NIC("eno1"); eno.SpeedMbit != -1 {
		t.Fatalf("a NIC without a speed label has speed -1, got %d", eno.SpeedMbit)
	}
	if n.CompressMBps != 440 || n.DecompressMBps != 1600 {
		t.Fatalf("codec speeds %v %v", n.CompressMBps, n.DecompressMBps)
	}
}

func TestMissingOrBadLabelsAreNamed(t *testing.T) {
	cases := map[string]struct {
		mutate func(map[string]string)
		label  string
	}{
		"no NUMA count":           {func(l map[string]string) { delete(l, LabelNUMANodes) }, LabelNUMANodes},
		"NUMA count not a number": {func(l map[string]string) { l[LabelNUMANodes] = "two" }, LabelNUMANodes},
		"missing CPUs of node 1":  {func(l map[string]string) { delete(l, NUMACPUsLabel(1)) }, NUMACPUsLabel(1)},
		"no compress speed":       {func(l map[string]string) { delete(l, LabelCompressMBps) }, LabelCompressMBps},
		"negative CPUs":           {func(l map[string]string) { l[NUMACPUsLabel(0)] = "-1" }, NUMACPUsLabel(0)},
		"no CPUs at all": {func(l map[string]string) {
			l[NUMACPUsLabel(0)] = "0"
			l[NUMACPUsLabel(1)] = "0"
		}, NUMACPUsLabel(0)},
		"no decompress speed":               {func(l map[string]string) { delete(l, LabelDecompressMBps) }, LabelDecompressMBps},
		"NIC on a node that does not exist": {func(l map[string]string) { l[NICNUMALabel("ens1f0")] = "3" }, NICNUMALabel("ens1f0")},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			labels := gatewayLabels()
			tc.mutate(labels)
			_, err := FromLabels("lynx-1", labels)
			var missing *MissingLabelError
			if !errors.As(err, &missing) || missing.Label != tc.label {
				t.Fatalf("want missing %s, got %v", tc.label, err)
			}
			if !strings.Contains(err.Error(), "lynx-1") || !strings.Contains(err.Error(), tc.label) {
				t.Fatalf("message must name node and label: %v", err)
			}
		})
	}
}

func TestUnknownNICIsNamed(t *testing.T) {
	n, _ := FromLabels("lynx-1", gatewayLabels())
	_, err := n.NIC("ens9")
	if err == nil || !strings.Contains(err.Error(), NICNUMALabel("ens9")) {
		t.Fatalf("got %v", err)
	}
}

func TestOneAndEightNodes(t *testing.T) {
	for _, count := range []int{1, 8} {
		labels := map[string]string{LabelNUMANodes: itoa(count), LabelCompressMBps: "400", LabelDecompressMBps: "1500"}
		for i := 0; i < count; i++ {
			labels[NUMACPUsLabel(i)] = "8"
		}
		n, err := FromLabels("n", labels)
		if err != nil || len(n.NUMANodes) != count || n.TotalCPUs() != 8*count {
			t.Fatalf("%d nodes: %+v %v", count, n, err)
		}
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func TestBSLZ4PlansWithItsOwnMeasuredSpeeds(t *testing.T) {
	labels := gatewayLabels()
	n, err := FromLabels("lynx-1", labels)
	if err != nil {
		t.Fatal(err)
	}
	var missing *MissingLabelError
	if _, err := n.ForCodec("bslz4"); !errors.As(err, &missing) || missing.Label != LabelBSLZ4CompressMBps {
		t.Fatalf("a node without bslz4 calibration: %v, want the missing %s named", err, LabelBSLZ4CompressMBps)
	}
	labels[LabelBSLZ4CompressMBps], labels[LabelBSLZ4DecompressMBps] = "700", "1800"
	if n, err = FromLabels("lynx-1", labels); err != nil {
		t.Fatal(err)
	}
	bs, err := n.ForCodec("bslz4")
	if err != nil || bs.CompressMBps != 700 || bs.DecompressMBps != 1800 {
		t.Fatalf("bslz4 speeds %v %v (%v), want 700 1800", bs.CompressMBps, bs.DecompressMBps, err)
	}
	if lz, _ := n.ForCodec("lz4"); lz.CompressMBps != 440 || lz.DecompressMBps != 1600 {
		t.Fatalf("lz4 speeds changed: %v %v", lz.CompressMBps, lz.DecompressMBps)
	}
	labels[LabelBSLZ4DecompressMBps] = "fast"
	if _, err := FromLabels("lynx-1", labels); !errors.As(err, &missing) || missing.Label != LabelBSLZ4DecompressMBps {
		t.Fatalf("a bad bslz4 label: %v", err)
	}
}
