// Package fakekubelet is the kubelet's device-plugin registration service on a real unix socket,
// for tests: it records every registration.
package fakekubelet

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Kubelet serves Registration on <dir>/kubelet.sock.
type Kubelet struct {
	pluginapi.UnimplementedRegistrationServer
	Registrations chan *pluginapi.RegisterRequest
	server        *grpc.Server
}

// Start listens on dir/kubelet.sock (replacing a previous socket, as a restarted kubelet does).
func Start(dir string, registrations chan *pluginapi.RegisterRequest) (*Kubelet, error) {
	path := filepath.Join(dir, "kubelet.sock")
	_ = os.Remove(path)
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	k := &Kubelet{Registrations: registrations, server: grpc.NewServer()}
	pluginapi.RegisterRegistrationServer(k.server, k)
	go func() { _ = k.server.Serve(lis) }()
	return k, nil
}

// Register records the request.
func (k *Kubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.Registrations <- r
	return &pluginapi.Empty{}, nil
}

// Stop stops serving and removes the socket.
func (k *Kubelet) Stop() { k.server.Stop() }

// Next waits for the next registration, nil after timeout.
func (k *Kubelet) Next(timeout time.Duration) *pluginapi.RegisterRequest {
	select {
	case r := <-k.Registrations:
		return r
	case <-time.After(timeout):
		return nil
	}
}
