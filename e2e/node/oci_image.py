#!/usr/bin/env python3
"""Builds an OCI image layout tar from files on this machine, for `ctr images import`.

No registry and no Docker engine: one gzip layer of a directory tree made from the given files,
an image config (entrypoint, cmd, user, working dir), a manifest, and an index whose annotation
`io.containerd.image.name` names the image. The tar is reproducible: same inputs, same bytes.

  oci_image.py --name docker.io/local/busybox:1 --out busybox.tar \
      --file /bin/busybox=/usr/bin/busybox --busybox-links /bin/busybox \
      --dir /tmp:1777 --entrypoint '["/bin/sh"]'

--file DEST=SRC copies SRC (following symlinks) to DEST; --dir DEST[:MODE] makes an empty directory;
--busybox-links PATH adds a symlink in /bin for every applet PATH reports (`PATH --list`);
--base-tar TAR puts an existing (uncompressed) tar, e.g. a Debian root file system, as a layer
under the files' layer (repeatable; two images on the same TAR share that layer).
"""
import argparse
import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile

EPOCH = 0  # every mtime in the layer: the same input gives the same digest


def add_parents(entries, path):
    parts = path.strip("/").split("/")[:-1]
    for i in range(1, len(parts) + 1):
        d = "/".join(parts[:i])
        entries.setdefault(d, ("dir", 0o755, None))


def layer_bytes(entries):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(entries):
            kind, mode, arg = entries[name]
            info = tarfile.TarInfo(name)
            info.mtime = EPOCH
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mode = mode
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "link":
                info.type = tarfile.SYMTYPE
                info.linkname = arg
                tar.addfile(info)
            else:
                with open(arg, "rb") as f:
                    data = f.read()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    uncompressed = raw.getvalue()
    return uncompressed, gzip_bytes(uncompressed)


def gzip_bytes(uncompressed):
    gz = io.BytesIO()
    with gzip.GzipFile(fileobj=gz, mode="wb", mtime=EPOCH, compresslevel=6) as g:
        g.write(uncompressed)
    return gz.getvalue()


def blob(store, data):
    digest = hashlib.sha256(data).hexdigest()
    store[digest] = data
    return {"digest": "sha256:" + digest, "size": len(data)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", required=True, help="full image name, e.g. docker.io/local/busybox:1")
    ap.add_argument("--out", required=True)
    ap.add_argument("--file", action="append", default=[], metavar="DEST=SRC")
    ap.add_argument("--dir", action="append", default=[], metavar="DEST[:MODE]")
    ap.add_argument("--busybox-links", metavar="PATH")
    ap.add_argument("--base-tar", action="append", default=[], metavar="TAR")
    ap.add_argument("--entrypoint", default="null", help="JSON list")
    ap.add_argument("--cmd", default="null", help="JSON list")
    ap.add_argument("--user", default="")
    ap.add_argument("--workdir", default="/")
    ap.add_argument("--env", action="append", default=["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"])
    args = ap.parse_args()

    entries = {}
    for spec in args.dir:
        dest, _, mode = spec.partition(":")
        add_parents(entries, dest + "/x")
        entries[dest.strip("/")] = ("dir", int(mode or "755", 8), None)
    for spec in args.file:
        dest, sep, src = spec.partition("=")
        if not sep or not dest.startswith("/"):
            sys.exit(f"oci_image.py: --file wants /DEST=SRC, got {spec!r}")
        if not os.path.isfile(src):
            sys.exit(f"oci_image.py: {src} is not a file")
        add_parents(entries, dest)
        mode = 0o755 if os.access(src, os.X_OK) else 0o644
        entries[dest.strip("/")] = ("file", mode, os.path.realpath(src))
    if args.busybox_links:
        host = next((s.partition("=")[2] for s in args.file if s.startswith(args.busybox_links + "=")), None)
        if host is None:
            sys.exit("oci_image.py: --busybox-links names a path not given with --file")
        applets = subprocess.run([host, "--list"], check=True, capture_output=True, text=True).stdout.split()
        add_parents(entries, "/bin/x")
        for applet in applets:
            entries.setdefault("bin/" + applet, ("link", 0o777, args.busybox_links))

    blobs = {}
    layers = []
    diff_ids = []
    for base in args.base_tar:
        with open(base, "rb") as f:
            base_raw = f.read()
        layer = blob(blobs, gzip_bytes(base_raw))
        layer["mediaType"] = "application/vnd.oci.image.layer.v1.tar+gzip"
        layers.append(layer)
        diff_ids.append("sha256:" + hashlib.sha256(base_raw).hexdigest())
        del base_raw
    uncompressed, compressed = layer_bytes(entries)
    layer = blob(blobs, compressed)
    layer["mediaType"] = "application/vnd.oci.image.layer.v1.tar+gzip"
    layers.append(layer)
    diff_ids.append("sha256:" + hashlib.sha256(uncompressed).hexdigest())
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": json.loads(args.entrypoint),
            "Cmd": json.loads(args.cmd),
            "Env": args.env,
            "User": args.user,
            "WorkingDir": args.workdir,
        },
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created_by": "e2e/node/oci_image.py"}],
    }
    cfg = blob(blobs, json.dumps(config, sort_keys=True).encode())
    cfg["mediaType"] = "application/vnd.oci.image.config.v1+json"
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": cfg, "layers": layers}
    man = blob(blobs, json.dumps(manifest, sort_keys=True).encode())
    man["mediaType"] = "application/vnd.oci.image.manifest.v1+json"
    man["annotations"] = {"io.containerd.image.name": args.name, "org.opencontainers.image.ref.name": args.name.rsplit(":", 1)[-1]}
    man["platform"] = {"architecture": "amd64", "os": "linux"}
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [man]}

    tmp = args.out + ".tmp"
    with tarfile.open(tmp, mode="w") as out:
        def put(name, data):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = EPOCH
            info.mode = 0o644
            out.addfile(info, io.BytesIO(data))
        put("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        put("index.json", json.dumps(index, sort_keys=True).encode())
        for digest in sorted(blobs):
            put("blobs/sha256/" + digest, blobs[digest])
    os.replace(tmp, args.out)
    print(f"{args.name} {man['digest']}")


if __name__ == "__main__":
    main()
