package cli

import (
	"context"
	"fmt"
	"net/http"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	"k8s.io/streaming/pkg/httpstream"

	"github.com/numastream/numastream/internal/render"
)

// PreviewPod is the running gateway pod of the pipeline's stream and the port its decoding
// container serves the live preview on: the pod's loopback port, or with host networking its
// metrics port.
func PreviewPod(ctx context.Context, e Env, name string, stream int) (*corev1.Pod, int32, error) {
	sp, err := e.get(ctx, name)
	if err != nil {
		return nil, 0, err
	}
	if sp.Spec.Preview == nil {
		return nil, 0, fmt.Errorf("streampipeline %s/%s has no live preview: set spec.preview: {} (docs/preview.md)", e.Namespace, name)
	}
	pods, err := e.Pods.CoreV1().Pods(e.Namespace).List(ctx, metav1.ListOptions{LabelSelector: render.LabelPipeline + "=" + name + "," +
		render.LabelRole + "=" + render.RoleGateway + "," + render.LabelStream + "=" + strconv.Itoa(stream)})
	if err != nil {
		return nil, 0, err
	}
	var pod *corev1.Pod
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil &&
			(pod == nil || p.CreationTimestamp.After(pod.CreationTimestamp.Time)) {
			pod = p
		}
	}
	if pod == nil {
		return nil, 0, fmt.Errorf("streampipeline %s/%s: no running gateway pod of stream %d", e.Namespace, name, stream)
	}
	if !pod.Spec.HostNetwork {
		return pod, render.PreviewPort, nil // the pod's loopback, through port-forward
	}
	port := int32(render.DecompressMetricsPort)
	for _, c := range pod.Spec.Containers {
		if c.Name != render.DecompressContainer {
			continue
		}
		for _, p := range c.Ports {
			if p.Name == "metrics-dx" {
				port = p.ContainerPort
			}
		}
	}
	return pod, port, nil
}

// Preview forwards a local port (0: any free one) to the live preview of the pipeline's stream
// on its gateway pod, prints the page's address, and forwards until ctx ends.
func Preview(ctx context.Context, e Env, cfg *rest.Config, name string, stream, local int) error {
	pod, port, err := PreviewPod(ctx, e, name, stream)
	if err != nil {
		return err
	}
	url := e.Pods.CoreV1().RESTClient().Post().Resource("pods").Namespace(pod.Namespace).Name(pod.Name).SubResource("portforward").URL()
	transport, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		return err
	}
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, url)
	// Port forwarding over WebSockets where the API server speaks it, as kubectl does.
	if ws, err := portforward.NewSPDYOverWebsocketDialer(url, cfg); err == nil {
		dialer = portforward.NewFallbackDialer(ws, dialer, func(err error) bool {
			return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
		})
	}
	stop, ready := make(chan struct{}), make(chan struct{})
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{fmt.Sprintf("%d:%d", local, port)}, stop, ready, nil, e.Out)
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- fw.ForwardPorts() }()
	select {
	case <-ready:
	case err := <-done:
		return fmt.Errorf("port-forward to %s: %w", pod.Name, err)
	case <-ctx.Done():
		close(stop)
		return ctx.Err()
	}
	ports, err := fw.GetPorts()
	if err == nil && len(ports) != 1 {
		err = fmt.Errorf("%d ports forwarded", len(ports))
	}
	if err != nil {
		close(stop)
		return fmt.Errorf("port-forward to %s: %w", pod.Name, err)
	}
	fmt.Fprintf(e.Out, "live preview of %s/%s stream %d (pod %s): http://127.0.0.1:%d/preview (Ctrl-C ends it)\n",
		e.Namespace, name, stream, pod.Name, ports[0].Local)
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		close(stop)
		if err := <-done; err != nil {
			return fmt.Errorf("port-forward to %s: %w", pod.Name, err)
		}
		return nil
	}
}
