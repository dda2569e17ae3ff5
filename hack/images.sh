#!/usr/bin/env bash
# Container images for the real nodes, as docker-archive tarballs that `ctr images import` takes
# (no registry is reachable and no container engine daemon runs here):
#   agent     the agent and the node daemon, user 65532, entrypoint numastream-agent
#   operator  the operator, user 65532, entrypoint /operator
#   sandbox   Debian's static busybox, tagged as containerd's sandbox (pause) image, and as a
#             shell image for checks
# Assembled from what `make agent operator` built: the same binaries, users and entrypoints as
# the Dockerfile's targets, with the agent's shared libraries copied from this Debian host.
#
#   images.sh OUT-DIR [AGENT-TAG [OPERATOR-TAG]]
set -euo pipefail
cd "$(dirname "$0")/.."
out=$1
agent_tag=${2:-numastream/agent:facility}
operator_tag=${3:-numastream/operator:facility}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

image() { # rootfs-dir config-json output-tar tag...
  local dir=$1 config=$2 tarball=$3; shift 3
  local img="$work/img"; rm -rf "$img"; mkdir -p "$img"
  tar -C "$dir" --owner=0 --group=0 -cf "$img/layer.tar" .
  local diff; diff=$(sha256sum "$img/layer.tar" | cut -d' ' -f1)
  sed "s/@DIFF@/$diff/" <<<"$config" >"$img/config.json"
  local tags; tags=$(printf '"%s",' "$@"); tags="[${tags%,}]"
  printf '[{"Config":"config.json","RepoTags":%s,"Layers":["layer.tar"]}]' "$tags" >"$img/manifest.json"
  tar -C "$img" -cf "$tarball" manifest.json config.json layer.tar
}

sandbox=$(containerd config default | sed -n 's/^ *sandbox_image = "\(.*\)"/\1/p')
bb="$work/rootfs-busybox"
mkdir -p "$bb/bin"
cp /bin/busybox "$bb/bin/"
for x in sh sleep cat env grep ls ip wc; do ln -sf busybox "$bb/bin/$x"; done
image "$bb" '{"architecture":"amd64","os":"linux","config":{"Entrypoint":["/bin/sleep","2147483647"],"Env":["PATH=/bin"]},"rootfs":{"type":"layers","diff_ids":["sha256:@DIFF@"]}}' \
  "$out/sandbox.tar" "$sandbox" local.numastream/busybox:1

ag="$work/rootfs-agent"
mkdir -p "$ag/usr/local/bin" "$ag/etc" "$ag/tmp"
cp bin/numastream-agent bin/node-daemon "$ag/usr/local/bin/"
ldd bin/numastream-agent | awk '/=>/ {print $3} /^\t\// {print $1}' | while read -r lib; do
  [[ -f "$lib" ]] && install -D "$lib" "$ag$lib"
done
echo "nonroot:x:65532:65532::/:/sbin/nologin" >"$ag/etc/passwd"
echo "nonroot:x:65532:" >"$ag/etc/group"
image "$ag" '{"architecture":"amd64","os":"linux","config":{"User":"65532:65532","Entrypoint":["/usr/local/bin/numastream-agent"],"Env":["PATH=/usr/local/bin"]},"rootfs":{"type":"layers","diff_ids":["sha256:@DIFF@"]}}' \
  "$out/agent.tar" "$agent_tag"

op="$work/rootfs-operator"
mkdir -p "$op/etc" "$op/tmp"
CGO_ENABLED=0 go build -o "$op/operator" ./cmd/operator
echo "nonroot:x:65532:65532::/:/sbin/nologin" >"$op/etc/passwd"
echo "nonroot:x:65532:" >"$op/etc/group"
image "$op" '{"architecture":"amd64","os":"linux","config":{"User":"65532:65532","Entrypoint":["/operator"]},"rootfs":{"type":"layers","diff_ids":["sha256:@DIFF@"]}}' \
  "$out/operator.tar" "$operator_tag"
echo "images: $(cd "$out" && ls -s --block-size=M *.tar | tr '\n' ' ') ($agent_tag, $operator_tag, $sandbox)"
