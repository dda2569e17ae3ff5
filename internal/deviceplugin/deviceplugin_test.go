package deviceplugin

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/numastream/numastream/internal/deviceplugin/fakekubelet"
)

func startKubelet(t *testing.T, dir string, got chan *pluginapi.RegisterRequest) *fakekubelet.Kubelet {
	t.Helper()
	k, err := fakekubelet.Start(dir, got)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func waitRegistration(t *testing.T, got chan *pluginapi.RegisterRequest) *pluginapi.RegisterRequest {
	t.Helper()
	select {
	case r := <-got:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("the plugin did not register")
		return nil
	}
}

func TestRegistersAdvertisesNUMALocalTokensAndAllocates(t *testing.T) {
	dir, err := os.MkdirTemp("/tmp", "dp-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	got := make(chan *pluginapi.RegisterRequest, 4)
	kubelet := startKubelet(t, dir, got)
	p := &Plugin{ResourceName: "numastream.io/nic-ens1f0", NIC: "ens1f0", NUMANode: 1, Tokens: 4,
		Dir: dir, Log: logr.Discard(), Poll: 50 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()

	reg := waitRegistration(t, got)
	if reg.ResourceName != "numastream.io/nic-ens1f0" || reg.Version != pluginapi.Version || reg.Endpoint != p.SocketName() {
		t.Fatalf("registration %+v", reg)
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, reg.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := pluginapi.NewDevicePluginClient(conn)
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	list, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Devices) != 4 {
		t.Fatalf("%d devices", len(list.Devices))
	}
	for _, d := range list.Devices {
		if d.Health != pluginapi.Healthy || len(d.Topology.Nodes) != 1 || d.Topology.Nodes[0].ID != 1 {
			t.Errorf("device %+v", d)
		}
	}
	resp, err := client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"ens1f0-2"}}}})
	if err != nil {
		t.Fatal(err)
	}
	env := resp.ContainerResponses[0].Envs
	if env[EnvNIC] != "ens1f0" || env[EnvNICNode] != "1" || env[EnvTokenIDs] != "ens1f0-2" {
		t.Errorf("envs %v", env)
	}
	if _, err := client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"eth9-0"}}}}); err == nil {
		t.Error("allocating a device the plugin does not own succeeded")
	}

	// The kubelet restarts: a new registration socket. The plugin registers again.
	kubelet.Stop()
	startKubelet(t, dir, got)
	reg = waitRegistration(t, got)
	if reg.ResourceName != "numastream.io/nic-ens1f0" {
		t.Fatalf("re-registration %+v", reg)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, p.SocketName())); !os.IsNotExist(err) {
		t.Error("the plugin left its socket behind")
	}
}

func TestWaitsForTheKubelet(t *testing.T) {
	dir, _ := os.MkdirTemp("/tmp", "dp-")
	defer os.RemoveAll(dir)
	p := &Plugin{ResourceName: "numastream.io/nic-eno1", NIC: "eno1", NUMANode: 0, Tokens: 1, Dir: dir, Log: logr.Discard(), Poll: 50 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	time.Sleep(200 * time.Millisecond)
	got := make(chan *pluginapi.RegisterRequest, 1)
	startKubelet(t, dir, got)
	waitRegistration(t, got)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
