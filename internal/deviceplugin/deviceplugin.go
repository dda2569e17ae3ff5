// Package deviceplugin serves a kubelet device plugin (deviceplugin/v1beta1) that advertises
// NIC-locality tokens: resource numastream.io/nic-<ifname>, each token's TopologyInfo the NIC's
// NUMA node. A container that requests one is placed by Topology Manager on CPUs of that node
// (Topology Manager aligns exclusive CPUs only with device resources that report a NUMA node; a
// plain NIC is not one). Allocate tells the container which NIC it was aligned with.
package deviceplugin

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Environment variables Allocate sets in the container.
const (
	EnvNIC      = "NUMASTREAM_NIC"
	EnvNICNode  = "NUMASTREAM_NIC_NUMA_NODE"
	EnvTokenIDs = "NUMASTREAM_NIC_TOKENS" //nolint:gosec // G101: the name of a variable listing device tokens (NIC slots), no secret
)

// Plugin advertises the locality tokens of one NIC.
type Plugin struct {
	ResourceName string // e.g. numastream.io/nic-ens1f0
	NIC          string
	NUMANode     int
	Tokens       int
	// Dir is the kubelet's device-plugin directory; KubeletSocket is the registration socket in it.
	Dir           string
	KubeletSocket string
	Log           logr.Logger
	// Poll is how often the plugin checks that the kubelet (and its own socket) are still there.
	Poll time.Duration

	pluginapi.UnimplementedDevicePluginServer
	mu    sync.Mutex
	stops []chan struct{}
}

// SocketName is the plugin's socket file in Dir.
func (p *Plugin) SocketName() string {
	return "numastream-" + strings.NewReplacer("/", "-", ".", "-").Replace(p.ResourceName) + ".sock"
}

func (p *Plugin) devices() []*pluginapi.Device {
	out := make([]*pluginapi.Device, 0, p.Tokens)
	for i := 0; i < p.Tokens; i++ {
		out = append(out, &pluginapi.Device{
			ID:       fmt.Sprintf("%s-%d", p.NIC, i),
			Health:   pluginapi.Healthy,
			Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(p.NUMANode)}}},
		})
	}
	return out
}

// GetDevicePluginOptions: no pre-start hook, no preferred allocation (tokens are identical).
func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch sends the tokens, then keeps the stream open until the plugin stops.
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices()}); err != nil {
		return err
	}
	stop := make(chan struct{})
	p.mu.Lock()
	p.stops = append(p.stops, stop)
	p.mu.Unlock()
	select {
	case <-stream.Context().Done():
	case <-stop:
	}
	return nil
}

// GetPreferredAllocation is not offered (see GetDevicePluginOptions).
func (p *Plugin) GetPreferredAllocation(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return &pluginapi.PreferredAllocationResponse{}, nil
}

// Allocate tells each container which NIC (and NUMA node) its CPUs were aligned with.
func (p *Plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.GetContainerRequests() {
		for _, id := range c.GetDevicesIds() {
			if !strings.HasPrefix(id, p.NIC+"-") {
				return nil, fmt.Errorf("unknown device %q for resource %s", id, p.ResourceName)
			}
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{
				EnvNIC:      p.NIC,
				EnvNICNode:  strconv.Itoa(p.NUMANode),
				EnvTokenIDs: strings.Join(c.GetDevicesIds(), ","),
			},
		})
	}
	return resp, nil
}

// PreStartContainer is not needed.
func (p *Plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// Run serves and registers until ctx ends. When the kubelet restarts (its socket is recreated,
// or it removed the plugin's socket, as it does on start) the plugin serves and registers again.
func (p *Plugin) Run(ctx context.Context) error {
	if p.Poll == 0 {
		p.Poll = time.Second
	}
	if p.KubeletSocket == "" {
		p.KubeletSocket = filepath.Base(pluginapi.KubeletSocket)
	}
	for {
		server, err := p.serve()
		if err != nil {
			return err
		}
		kubelet := filepath.Join(p.Dir, p.KubeletSocket)
		ino, err := p.register(ctx, kubelet)
		if err != nil {
			p.stop(server)
			if ctx.Err() != nil {
				return nil //nolint:nilerr // cancelled: the daemon is stopping, not failing
			}
			return err
		}
		p.Log.Info("Registered with the kubelet", "resource", p.ResourceName, "numaNode", p.NUMANode, "tokens", p.Tokens)
		restart := p.watch(ctx, kubelet, ino)
		p.stop(server)
		if !restart {
			return nil
		}
		p.Log.Info("Kubelet restarted: registering again", "resource", p.ResourceName)
	}
}

func (p *Plugin) serve() (*grpc.Server, error) {
	path := filepath.Join(p.Dir, p.SocketName())
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	s := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(s, p)
	go func() { _ = s.Serve(lis) }()
	return s, nil
}

func (p *Plugin) stop(s *grpc.Server) {
	p.mu.Lock()
	for _, c := range p.stops {
		close(c)
	}
	p.stops = nil
	p.mu.Unlock()
	s.Stop()
	_ = os.Remove(filepath.Join(p.Dir, p.SocketName()))
}

// register waits for the kubelet's socket and registers; returns the socket's identity.
func (p *Plugin) register(ctx context.Context, kubelet string) (identity, error) {
	for {
		ino, ok := inode(kubelet)
		if ok {
			conn, err := grpc.NewClient("unix://"+kubelet, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return identity{}, err
			}
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err = pluginapi.NewRegistrationClient(conn).Register(rctx, &pluginapi.RegisterRequest{
				Version:      pluginapi.Version,
				Endpoint:     p.SocketName(),
				ResourceName: p.ResourceName,
				Options:      &pluginapi.DevicePluginOptions{},
			})
			cancel()
			_ = conn.Close() // the registration's answer is what counts; the connection is done
			if err == nil {
				return ino, nil
			}
			p.Log.Info("Kubelet refused the registration; retrying", "resource", p.ResourceName, "error", err.Error())
		}
		select {
		case <-ctx.Done():
			return identity{}, ctx.Err()
		case <-time.After(p.Poll):
		}
	}
}

// watch returns true when the plugin must register again, false when ctx ended.
func (p *Plugin) watch(ctx context.Context, kubelet string, ino identity) bool {
	own := filepath.Join(p.Dir, p.SocketName())
	for {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(p.Poll):
		}
		now, ok := inode(kubelet)
		if _, err := os.Stat(own); err != nil || !ok || now != ino {
			return true
		}
	}
}

// identity tells one socket file from its replacement: inode and change time (an inode number
// alone is often reused at once).
type identity struct {
	ino   uint64
	ctime int64
}

func inode(path string) (identity, bool) {
	fi, err := os.Stat(path)
	if err != nil {
		return identity{}, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return identity{ctime: fi.ModTime().UnixNano()}, true
	}
	return identity{ino: st.Ino, ctime: st.Ctim.Nano()}, true
}
