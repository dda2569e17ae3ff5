#!/usr/bin/env bash
# What a release of numastream contains, built from this tree into OUT (default
# build/release/numastream-$VERSION):
#   images/numastream-agent-V.oci.tar, images/numastream-operator-V.oci.tar
#                          the Dockerfile's agent and operator images, OCI archives, each one
#                          image index of linux/amd64 and linux/arm64 (PLATFORMS)
#   numastream-V.tgz       the Helm chart, its images pinned by the digests of those archives
#   crds.yaml              the CustomResourceDefinitions (for GitOps tools that apply them apart)
#   sbom/numastream-C-V-ARCH.spdx.json
#                          each image's software bill of materials per architecture (SPDX 2.3, by syft)
#   RELEASE-NOTES.md       the CHANGELOG's section for V, the images' digests, how to install
#   SHA256SUMS             checksums of every file above
#
#   release.sh [OUT]        (VERSION from ./VERSION unless set)
#
# The images are pushed to a registry as they are (`skopeo copy --all --preserve-digests
# oci-archive:... docker://...`), so the digests the chart pins (the image indexes') are the
# registry's. PLATFORMS="amd64" makes a release of one architecture.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${VERSION:-$(cat VERSION)}
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] ||
  { echo "release: VERSION '$version' is not a semantic version (1.2.3 or 1.2.3-rc.1)" >&2; exit 2; }
out=${1:-build/release/numastream-$version}
helm=${HELM:-$HOME/.cache/numastream/k8s-1.36.4/helm}
[[ -x $helm ]] || { echo "release: helm is missing at $helm (make k8s-bins)" >&2; exit 1; }
work=$(mktemp -d)
export HELM_CACHE_HOME=$work/helm HELM_CONFIG_HOME=$work/helm HELM_DATA_HOME=$work/helm
trap 'rm -rf "$work"' EXIT
start=$SECONDS

rm -rf "$out"
mkdir -p "$out/images"
platforms=${PLATFORMS:-amd64 arm64}
PLATFORMS=$platforms IMAGE_FORMAT=oci-archive bash hack/images.sh "$work/images" "numastream/agent:$version" "numastream/operator:$version"
for c in agent operator; do
  mv "$work/images/$c.tar" "$out/images/numastream-$c-$version.oci.tar"
done

# The digest a registry gives an image pushed from an OCI archive: its image index's (or, of one
# architecture, its manifest's), the one entry of index.json.
digest_of() {
  python3 - "$1" <<'EOF'
import json, sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    index = json.load(t.extractfile("index.json"))
manifests = index.get("manifests", [])
if len(manifests) != 1 or not manifests[0].get("digest", "").startswith("sha256:"):
    sys.exit(f"{sys.argv[1]}: index.json names {len(manifests)} manifests, want one by sha256")
print(manifests[0]["digest"])
EOF
}
# An SBOM of each image for each architecture (SPDX 2.3 JSON): syft, built from the module proxy,
# reads the Debian packages and the Go binaries' modules in the archive.
syft=$(bash hack/build-go-tool.sh syft github.com/anchore/syft "${SYFT_VERSION:?SYFT_VERSION (the Makefile sets it)}" github.com/anchore/syft/cmd/syft)
mkdir -p "$out/sbom"
for c in agent operator; do
  for arch in $platforms; do
    SYFT_CHECK_FOR_APP_UPDATE=false "$syft" scan -q --platform "linux/$arch" "oci-archive:$out/images/numastream-$c-$version.oci.tar" \
      --source-name "numastream-$c" --source-version "$version" -o "spdx-json=$out/sbom/numastream-$c-$version-$arch.spdx.json" ||
      { echo "release: syft could not make the $c image's SBOM for $arch" >&2; exit 1; }
  done
done

agent_digest=$(digest_of "$out/images/numastream-agent-$version.oci.tar")
operator_digest=$(digest_of "$out/images/numastream-operator-$version.oci.tar")

# The chart, with both images pinned: the digests replace the two empty `digest: ""` values
# (agentImage's, then operator.image's); anything else is the chart as it is in the tree.
cp -r charts/numastream "$work/chart"
python3 - "$work/chart/values.yaml" "$agent_digest" "$operator_digest" <<'EOF'
import re, sys
path, agent, operator = sys.argv[1:]
text = open(path).read()
empty = re.compile(r'^(\s+digest: )""', re.M)
hits = empty.findall(text)
if len(hits) != 2:
    sys.exit(f"{path}: {len(hits)} empty image digests, want 2 (agentImage, operator.image)")
digests = iter([agent, operator])
open(path, "w").write(empty.sub(lambda m: m.group(1) + next(digests), text))
EOF
"$helm" package "$work/chart" --version "$version" --app-version "$version" -d "$out" >/dev/null
"$helm" lint "$out/numastream-$version.tgz" >"$work/lint.log" 2>&1 ||
  { cat "$work/lint.log"; echo "release: helm lint refused the packaged chart" >&2; exit 1; }
rendered=$("$helm" template numastream "$out/numastream-$version.tgz" -n numastream-system)
for want in "@$agent_digest" "@$operator_digest"; do
  grep -q -- "$want" <<<"$rendered" || { echo "release: the packaged chart does not render image $want" >&2; exit 1; }
done

cat config/crd/bases/*.yaml >"$out/crds.yaml"

# Release notes: the CHANGELOG's section for this version ("## V" up to the next "## ").
notes=$(awk -v v="$version" '
  /^## / { if (on) exit; if ($2 == v) on = 1 }
  on' CHANGELOG.md)
[[ -n $notes ]] || { echo "release: CHANGELOG.md has no section '## $version'" >&2; exit 1; }
{
  echo "# numastream $version"
  echo
  echo "| image | digest |"
  echo "| --- | --- |"
  echo "| \`numastream/agent:$version\` (agent pods, node daemon) | \`$agent_digest\` |"
  echo "| \`numastream/operator:$version\` | \`$operator_digest\` |"
  echo
  echo "Platforms: $(sed 's#[^ ]*#linux/&#g; s/ /, /g' <<<"$platforms") (one digest per image; a node pulls its own architecture's)."
  echo "Each image's SBOM per platform (SPDX 2.3) is in sbom/."
  echo "Install from these files: docs/install.md (\"Images into your registry\", \"Install\"). Verify them first:"
  echo "\`sha256sum -c SHA256SUMS\`."
  echo
  sed '1s/^## /## Changes in /' <<<"$notes"
} >"$out/RELEASE-NOTES.md"

(cd "$out" && find . -type f ! -name SHA256SUMS | sed 's#^\./##' | LC_ALL=C sort | xargs sha256sum >SHA256SUMS)
echo "release: $out in $((SECONDS - start)) s: $(cd "$out" && find . -type f | sed 's#^\./##' | LC_ALL=C sort | tr '\n' ' ')"
echo "release: agent $agent_digest, operator $operator_digest"
