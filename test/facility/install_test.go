package facility

import (
	"archive/tar"
	"compress/gzip"
	"crypto/tls"
	"crypto/x509"
	"debug/elf"
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
		if d := readOCIArchive(t, archives[0]).digest; d != pinned[c] {
			t.Errorf("%s: the chart pins %s, its archive's manifest is %s", c, pinned[c], d)
		}
	}
	t.Logf("the chart pins agent %s, operator %s", pinned["agent"], pinned["operator"])
	// Each image's SBOM, one per platform, names what the image runs: the agent's libraries, the
	// operator's modules.
	for c, want := range map[string][]string{
		"agent":    {"libzmq5", "libsodium23", "liblz4-1", "libhdf5-103-1", "github.com/numastream/numastream"},
		"operator": {"github.com/numastream/numastream", "sigs.k8s.io/controller-runtime", "k8s.io/client-go"},
	} {
		for _, arch := range releasePlatforms {
			if missing := sbomLacks(t, dir, c, arch, want); len(missing) > 0 {
				t.Errorf("the %s image's SBOM for %s lacks %v", c, arch, missing)
			}
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
		req.Header.Set("Accept", ociIndex+", "+ociManifest)
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

// sbomLacks: which of the packages the release's SPDX SBOM of an image does not list.
func sbomLacks(t *testing.T, dir, image, arch string, packages []string) []string {
	t.Helper()
	docs, _ := filepath.Glob(filepath.Join(dir, "sbom", "numastream-"+image+"-*-"+arch+".spdx.json"))
	if len(docs) != 1 {
		t.Fatalf("%d SBOMs of the %s image for %s in the release", len(docs), image, arch)
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

// sbomPurl: the package URL the release's SBOM of an image for arch gives a package.
func sbomPurl(t *testing.T, dir, image, arch, pkg string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "sbom", "numastream-"+image+"-"+strings.TrimPrefix(filepath.Base(dir), "numastream-")+"-"+arch+".spdx.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Packages []struct {
			Name         string `json:"name"`
			ExternalRefs []struct {
				Type    string `json:"referenceType"`
				Locator string `json:"referenceLocator"`
			} `json:"externalRefs"`
		} `json:"packages"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	for _, p := range doc.Packages {
		for _, r := range p.ExternalRefs {
			if p.Name == pkg && r.Type == "purl" {
				return r.Locator
			}
		}
	}
	return ""
}

// The platforms a release's images are built for (make release: PLATFORMS).
var releasePlatforms = []string{"amd64", "arm64"}

const (
	ociIndex    = "application/vnd.oci.image.index.v1+json"
	ociManifest = "application/vnd.oci.image.manifest.v1+json"
)

// Each image of the release is one index of linux/amd64 and linux/arm64, and the arm64 images
// are arm64 programs that run: their root filesystems, unpacked from the release's archives, run
// the agent, the node daemon and the operator through qemu (the kernel's binfmt, as on a build
// machine) — the agent with the arm64 libraries of its image, each saying the release's version.
func TestTheReleasesImagesAreMultiArchAndTheArm64OnesRun(t *testing.T) {
	dir := os.Getenv("RELEASE_DIR")
	if dir == "" {
		t.Fatal("RELEASE_DIR is not set: the box is installed from make release's files (make test-e2e-facility)")
	}
	version := strings.TrimPrefix(filepath.Base(dir), "numastream-")
	for c, programs := range map[string][]string{
		"agent":    {"/usr/local/bin/numastream-agent", "/usr/local/bin/node-daemon"},
		"operator": {"/operator"},
	} {
		archives, _ := filepath.Glob(filepath.Join(dir, "images", "numastream-"+c+"-*.oci.tar"))
		if len(archives) != 1 {
			t.Fatalf("%d %s archives in the release", len(archives), c)
		}
		img := readOCIArchive(t, archives[0])
		if got := img.platforms(); strings.Join(got, " ") != strings.Join(releasePlatforms, " ") {
			t.Fatalf("%s: the image index lists %v, want %v", c, got, releasePlatforms)
		}
		if c == "agent" {
			// syft read the arm64 image's own packages, not x86-64's.
			if purl := sbomPurl(t, dir, c, "arm64", "libzmq5"); !strings.Contains(purl, "arch=arm64") {
				t.Errorf("the agent image's SBOM for arm64 lists libzmq5 as %q", purl)
			}
		}
		root := img.unpack(t, "arm64")
		for _, program := range programs {
			f, err := elf.Open(filepath.Join(root, program))
			if err != nil {
				t.Fatalf("%s image for arm64: %s: %v", c, program, err)
			}
			machine := f.Machine
			_ = f.Close()
			if machine != elf.EM_AARCH64 {
				t.Errorf("%s image for arm64: %s is a program for %v", c, program, machine)
				continue
			}
			out, err := exec.Command("chroot", root, program, "--version").CombinedOutput()
			if err != nil || !strings.Contains(string(out), version) {
				t.Errorf("%s image for arm64: %s --version: %v\n%s (want %s)", c, program, err, out, version)
				continue
			}
			t.Logf("%s image for arm64: %s", c, strings.TrimSpace(string(out)))
		}
	}
}

// ociArchive is an OCI archive's image index (its digest, what a registry serves it as) and the
// small blobs (manifests, configs) read whole.
type ociArchive struct {
	path   string
	digest string
	index  struct {
		Manifests []ociDescriptor `json:"manifests"`
	}
	small map[string][]byte
}

type ociDescriptor struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Platform  struct {
		Architecture string `json:"architecture"`
		OS           string `json:"os"`
	} `json:"platform"`
}

func readOCIArchive(t *testing.T, path string) *ociArchive {
	t.Helper()
	a := &ociArchive{path: path, small: map[string][]byte{}}
	var top struct {
		Manifests []ociDescriptor `json:"manifests"`
	}
	a.each(t, func(name string, size int64, r io.Reader) {
		if name != "index.json" && (!strings.HasPrefix(name, "blobs/sha256/") || size > 1<<20) {
			return
		}
		raw, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		if name == "index.json" {
			if err := json.Unmarshal(raw, &top); err != nil {
				t.Fatalf("%s: index.json: %v", path, err)
			}
			return
		}
		a.small["sha256:"+strings.TrimPrefix(name, "blobs/sha256/")] = raw
	})
	if len(top.Manifests) != 1 || top.Manifests[0].MediaType != ociIndex {
		t.Fatalf("%s: index.json names %+v, want one image index", path, top.Manifests)
	}
	a.digest = top.Manifests[0].Digest
	if err := json.Unmarshal(a.small[a.digest], &a.index); err != nil {
		t.Fatalf("%s: the image index %s: %v", path, top.Manifests[0].Digest, err)
	}
	return a
}

// each calls fn with each member of the archive.
func (a *ociArchive) each(t *testing.T, fn func(name string, size int64, r io.Reader)) {
	t.Helper()
	f, err := os.Open(a.path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatalf("%s: %v", a.path, err)
		}
		fn(h.Name, h.Size, tr)
	}
}

func (a *ociArchive) platforms() []string {
	var out []string
	for _, m := range a.index.Manifests {
		out = append(out, m.Platform.Architecture)
	}
	return out
}

// unpack writes the image for arch's layers, in order, into a new directory (the way a container
// runtime does, less the whiteouts, which only hide files of lower layers).
func (a *ociArchive) unpack(t *testing.T, arch string) string {
	t.Helper()
	var manifest struct {
		Layers []struct{ Digest string } `json:"layers"`
	}
	for _, m := range a.index.Manifests {
		if m.Platform.Architecture == arch {
			if err := json.Unmarshal(a.small[m.Digest], &manifest); err != nil {
				t.Fatalf("%s: the %s manifest: %v", a.path, arch, err)
			}
		}
	}
	if len(manifest.Layers) == 0 {
		t.Fatalf("%s: no layers for %s", a.path, arch)
	}
	layers, root := t.TempDir(), t.TempDir()
	want := map[string]bool{}
	for _, l := range manifest.Layers {
		want[strings.TrimPrefix(l.Digest, "sha256:")] = true
	}
	a.each(t, func(name string, _ int64, r io.Reader) {
		if hexdigest := strings.TrimPrefix(name, "blobs/sha256/"); want[hexdigest] {
			f, err := os.Create(filepath.Join(layers, hexdigest))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(f, r); err != nil {
				t.Fatal(err)
			}
			_ = f.Close()
		}
	})
	for _, l := range manifest.Layers {
		// GNU tar reads gzip- or zstd-compressed layers as they are.
		cmd := exec.Command("tar", "-x", "--exclude=.wh.*", "-f", filepath.Join(layers, strings.TrimPrefix(l.Digest, "sha256:")), "-C", root)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: unpacking layer %s: %v\n%s", a.path, l.Digest, err, out)
		}
	}
	return root
}
