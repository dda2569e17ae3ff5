#!/usr/bin/env python3
"""One multi-arch image as an OCI archive, from an OCI layout holding it once per architecture.

    oci-index.py LAYOUT-DIR TAG OUT.tar ARCH...

LAYOUT-DIR is what `buildah push IMAGE oci:LAYOUT-DIR:ARCH` wrote for each ARCH. OUT.tar is an
OCI image layout (the oci-archive transport of skopeo, buildah and syft) whose index.json names
one image index, TAG, listing each architecture's manifest with its platform, read from that
manifest's own config (not from the ref). The archive is reproducible: sorted members, no times.
"""

import hashlib
import io
import json
import os
import sys
import tarfile

INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
REF = "org.opencontainers.image.ref.name"


def blob_path(layout, digest):
    algo, _, hexdigest = digest.partition(":")
    if algo != "sha256" or len(hexdigest) != 64:
        sys.exit(f"oci-index: {layout}: digest {digest!r} is not sha256")
    return os.path.join(layout, "blobs", algo, hexdigest)


def read_blob(layout, digest):
    with open(blob_path(layout, digest), "rb") as f:
        data = f.read()
    if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
        sys.exit(f"oci-index: {layout}: blob {digest} does not match its digest")
    return data


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    layout, tag, out, archs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    with open(os.path.join(layout, "index.json")) as f:
        by_ref = {m.get("annotations", {}).get(REF): m for m in json.load(f).get("manifests", [])}
    entries, blobs = [], set()
    for arch in archs:
        m = by_ref.get(arch)
        if m is None or m.get("mediaType") != MANIFEST:
            sys.exit(f"oci-index: {layout} has no image manifest for {arch} (refs: {sorted(k for k in by_ref if k)})")
        manifest = json.loads(read_blob(layout, m["digest"]))
        config = json.loads(read_blob(layout, manifest["config"]["digest"]))
        if config.get("architecture") != arch or config.get("os") != "linux":
            sys.exit(f"oci-index: the {arch} image of {tag} says it is {config.get('os')}/{config.get('architecture')}")
        platform = {"architecture": arch, "os": "linux"}
        if config.get("variant"):
            platform["variant"] = config["variant"]
        entries.append({"mediaType": MANIFEST, "digest": m["digest"], "size": m["size"], "platform": platform})
        blobs.update([m["digest"], manifest["config"]["digest"]] + [layer["digest"] for layer in manifest["layers"]])
    index = json.dumps({"schemaVersion": 2, "mediaType": INDEX, "manifests": entries}, indent=2).encode()
    index_digest = "sha256:" + hashlib.sha256(index).hexdigest()
    top = {
        "schemaVersion": 2,
        "manifests": [{"mediaType": INDEX, "digest": index_digest, "size": len(index), "annotations": {REF: tag}}],
    }

    def add(t, name, data=None, path=None):
        info = tarfile.TarInfo(name)
        info.mode, info.mtime = 0o644, 0
        if path is not None:
            info.size = os.path.getsize(path)
            with open(path, "rb") as f:
                t.addfile(info, f)
        else:
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))

    tmp = out + ".tmp"
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as t:
        add(t, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        add(t, "index.json", json.dumps(top).encode())
        add(t, "blobs/sha256/" + index_digest.split(":")[1], index)
        for digest in sorted(blobs):
            add(t, "blobs/sha256/" + digest.split(":")[1], path=blob_path(layout, digest))
    os.replace(tmp, out)
    print(f"oci-index: {tag} ({', '.join(archs)}) {index_digest}")


if __name__ == "__main__":
    main()
