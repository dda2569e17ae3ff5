package facility

import (
	"archive/tar"
	"compress/gzip"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// The box's registry (hack/facility.sh): where a release's images are pushed and pulled from.
const (
	registry   = "10.212.0.1:5000"
	pullSecret = "numastream-registry"
)

// installedAgentImage is the agent image the chart installed, read before any test upgrades it:
// the node daemon's, so every node has it.
var installedAgentImage string

func readInstalledAgentImage() error {
	ds := &appsv1.DaemonSet{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: "numastream-system", Name: "numastream-node-daemon"}, ds); err != nil {
		return fmt.Errorf("the node daemon's DaemonSet: %w", err)
	}
	installedAgentImage = ds.Spec.Template.Spec.Containers[0].Image
	return nil
}

// runsInstalledAgentImage makes the pod run the installed agent image as any pod of a namespace
// must once the image came from a registry with credentials: with the pull secret, which the
// namespace gets as an admin gives it (a copy of the operator's). The kubelet checks that a pod
// may pull an image it pulled with credentials before, even one already on the node.
func runsInstalledAgentImage(t *testing.T, p *corev1.Pod) {
	t.Helper()
	for i := range p.Spec.Containers {
		p.Spec.Containers[i].Image, p.Spec.Containers[i].ImagePullPolicy = installedAgentImage, corev1.PullIfNotPresent
	}
	src := &corev1.Secret{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: "numastream-system", Name: pullSecret}, src); err != nil {
		if apierrors.IsNotFound(err) {
			return // installed from the tree's images: nothing to pull
		}
		t.Fatal(err)
	}
	cp := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: pullSecret, Namespace: p.Namespace}, Type: src.Type, Data: src.Data}
	if err := k8s.Create(ctx, cp); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	p.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: pullSecret}}
}

// agentImageTagged is the installed agent image's repository with another tag: what
// `facility.sh upgrade-agent TAG` upgrades to.
func agentImageTagged(tag string) string {
	repo := installedAgentImage
	if at := strings.Index(repo, "@"); at >= 0 {
		repo = repo[:at]
	} else if colon := strings.LastIndex(repo, ":"); colon > strings.LastIndex(repo, "/") {
		repo = repo[:colon]
	}
	return repo + ":" + tag
}

// The box installs as a facility does from a release: make release's files pass their
// checksums, the registry holds the images under the digests the packaged chart pins and
// serves them only with credentials, and the operator and node daemon run exactly those images,
// pulled with the pull secret.
func TestTheBoxRunsTheReleaseFromItsRegistry(t *testing.T) {
	dir := os.Getenv("RELEASE_DIR")
	if dir == "" {
		t.Fatal("RELEASE_DIR is not set: the box is installed from make release's files (make test-e2e-facility)")
	}
	cmd := exec.Command("sha256sum", "--quiet", "-c", "SHA256SUMS")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sha256sum -c SHA256SUMS in %s: %v\n%s", dir, err, out)
	}
	pinned := chartDigests(t, dir)
	for _, c := range []string{"agent", "operator"} {
		archives, _ := filepath.Glob(filepath.Join(dir, "images", "numastream-"+c+"-*.oci.tar"))
		if len(archives) != 1 {
			t.Fatalf("%d %s archives in the release", len(archives), c)
		}
		if d := archiveDigest(t, archives[0]); d != pinned[c] {
			t.Errorf("%s: the chart pins %s, its archive's manifest is %s", c, pinned[c], d)
		}
	}
	t.Logf("the chart pins agent %s, operator %s", pinned["agent"], pinned["operator"])
	// Each image's SBOM names what the image runs: the agent's libraries, the operator's modules.
	for c, want := range map[string][]string{
		"agent":    {"libzmq5", "libsodium23", "liblz4-1", "libhdf5-103-1", "github.com/numastream/numastream"},
		"operator": {"github.com/numastream/numastream", "sigs.k8s.io/controller-runtime", "k8s.io/client-go"},
	} {
		if missing := sbomLacks(t, dir, c, want); len(missing) > 0 {
			t.Errorf("the %s image's SBOM lacks %v", c, missing)
		}
	}

	if want := registry + "/numastream/agent@" + pinned["agent"]; installedAgentImage != want {
		t.Errorf("the node daemon was installed with %s, want %s", installedAgentImage, want)
	}
	var pods corev1.PodList
	if err := k8s.List(ctx, &pods, client.InNamespace("numastream-system")); err != nil {
		t.Fatal(err)
	}
	ran := map[string]int{}
	for _, p := range pods.Items {
		component := p.Labels["app.kubernetes.io/component"]
		c := map[string]string{"operator": "operator", "node-daemon": "agent"}[component]
		if c == "" || p.Status.Phase != corev1.PodRunning {
			continue
		}
		want := registry + "/numastream/" + c + "@" + pinned[c]
		if p.Spec.Containers[0].Image != want {
			continue // a node daemon an upgrade test rolled to a tag
		}
		if len(p.Spec.ImagePullSecrets) == 0 || p.Spec.ImagePullSecrets[0].Name != pullSecret {
			t.Errorf("pod %s: pull secrets %v, want %s", p.Name, p.Spec.ImagePullSecrets, pullSecret)
		}
		for _, s := range p.Status.ContainerStatuses {
			if !strings.HasSuffix(s.ImageID, "@"+pinned[c]) {
				t.Errorf("pod %s container %s runs image %s, want digest %s", p.Name, s.Name, s.ImageID, pinned[c])
			}
		}
		ran[component]++
	}
	if ran["operator"] == 0 || ran["node-daemon"] == 0 {
		t.Errorf("running from the release's digests: %v, want the operator and node daemons", ran)
	}
	t.Logf("running the release's images, pulled from %s: %v", registry, ran)

	// The registry: no manifest without credentials; with them, the digest the chart pins.
	fac := os.Getenv("FACILITY_DIR")
	if fac == "" {
		fac = "/tmp/numastream-facility"
	}
	ca, err := os.ReadFile(filepath.Join(fac, "registry", "certs", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	password, err := os.ReadFile(filepath.Join(fac, "registry", "password"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}}
	get := func(user string) (int, string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodHead,
			"https://"+registry+"/v2/numastream/agent/manifests/"+pinned["agent"], nil)
		req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json")
		if user != "" {
			req.SetBasicAuth(user, strings.TrimSpace(string(password)))
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Docker-Content-Digest")
	}
	if code, _ := get(""); code != http.StatusUnauthorized {
		t.Errorf("the agent's manifest without credentials: HTTP %d, want 401", code)
	}
	if code, d := get("facility"); code != http.StatusOK || d != pinned["agent"] {
		t.Errorf("the agent's manifest with credentials: HTTP %d digest %q, want 200 %s", code, d, pinned["agent"])
	}
}

// chartDigests: the image digests the release's packaged chart pins (its values.yaml).
func chartDigests(t *testing.T, dir string) map[string]string {
	t.Helper()
	charts, _ := filepath.Glob(filepath.Join(dir, "numastream-*.tgz"))
	if len(charts) != 1 {
		t.Fatalf("%d charts in %s", len(charts), dir)
	}
	f, err := os.Open(charts[0])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("%s: no numastream/values.yaml (%v)", charts[0], err)
		}
		if h.Name != "numastream/values.yaml" {
			continue
		}
		raw, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		var v struct {
			AgentImage struct{ Digest string } `json:"agentImage"`
			Operator   struct {
				Image struct{ Digest string } `json:"image"`
			} `json:"operator"`
		}
		if err := yaml.Unmarshal(raw, &v); err != nil {
			t.Fatal(err)
		}
		return map[string]string{"agent": v.AgentImage.Digest, "operator": v.Operator.Image.Digest}
	}
}

// archiveDigest: the manifest an OCI archive's index.json names.
func archiveDigest(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("%s: no index.json (%v)", path, err)
		}
		if h.Name != "index.json" {
			continue
		}
		var index struct {
			Manifests []struct{ Digest string } `json:"manifests"`
		}
		if err := json.NewDecoder(tr).Decode(&index); err != nil || len(index.Manifests) != 1 {
			t.Fatalf("%s: index.json %+v %v", path, index, err)
		}
		return index.Manifests[0].Digest
	}
}

// sbomLacks: which of the packages the release's SPDX SBOM of an image does not list.
func sbomLacks(t *testing.T, dir, image string, packages []string) []string {
	t.Helper()
	docs, _ := filepath.Glob(filepath.Join(dir, "sbom", "numastream-"+image+"-*.spdx.json"))
	if len(docs) != 1 {
		t.Fatalf("%d SBOMs of the %s image in the release", len(docs), image)
	}
	raw, err := os.ReadFile(docs[0])
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		SPDXVersion string `json:"spdxVersion"`
		Packages    []struct {
			Name string `json:"name"`
		} `json:"packages"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil || doc.SPDXVersion != "SPDX-2.3" {
		t.Fatalf("%s: %s %v", docs[0], doc.SPDXVersion, err)
	}
	listed := map[string]bool{}
	for _, p := range doc.Packages {
		listed[p.Name] = true
	}
	var missing []string
	for _, p := range packages {
		if !listed[p] {
			missing = append(missing, p)
		}
	}
	return missing
}
