"""Container images built on this machine from Debian packages, written as OCI image archives that
`ctr -n k8s.io images import` (containerd 2.x) accepts; cached by content.

    python hack/images/images.py build [--out DIR] [--only NAME]   # prints NAME ARCHIVE REF per image
    python hack/images/images.py list [--out DIR]

From Python (the cluster tier): `images.build_all() -> {name: (archive_path, ref)}`.

Each image is one Debian bookworm rootfs made by mmdebstrap (variant minbase, no Recommends, no
docs), customised in a chroot, and packed by this file into a single gzip layer. The tag is a hash
of every input (mirror, the suite's Release date, package list, the files copied in, for the
service its source tree and requirements.lock, and this file), so a second build prints 'cached'.

- openmpi: openssh-server + openmpi-bin + python3-mpi4py and hack/images/mpi/ring.py, user mpiuser
  (uid 1000), sshd config at /home/mpiuser/.sshd_config (port 2222): the conventions of Trainer
  v2.3.0's MPI runtimes. mpi4py rather than a C program: a C build needs libopenmpi-dev, which
  pulls gfortran and gcc into a second rootfs (far more to download than python3 + mpi4py).
- service: from the Containerfile (`containerfile()`): its COPY sources, and its final stage's
  ENV, USER, WORKDIR, EXPOSE, ENTRYPOINT and CMD become the image's; its FROM is this Debian rootfs
  (python3, python3-venv) and its RUN is done in a chroot (a venv at /opt/venv with
  `pip install -c requirements.lock .` from PyPI), because podman cannot start a container here:
  runc fails to set RLIMIT_NOFILE without CAP_SYS_RESOURCE.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
OUT_ENV = "TRAINJOB_IMAGES_OUT"
DEFAULT_OUT = HERE / "out"
SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# Fixed, not the wall clock: mmdebstrap clamps file times to it and the config's `created` uses it.
SOURCE_DATE_EPOCH = 1700000000
REPO_PREFIX = "localhost/trainjob-admission"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
# Only what each image runs; apt never adds Recommends.
MMDEBSTRAP_OPTS = [
    "--variant=minbase",
    "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",  # usr-is-merged, not usrmerge (+perl)
    "--aptopt=APT::Install-Recommends \"false\"",
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-include=/usr/share/doc/*/copyright",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
    "--dpkgopt=path-exclude=/usr/share/info/*",
]
# Paths whose contents are never packed (mount points and caches); the directories themselves are.
SKIP_CONTENTS = ("dev", "proc", "sys", "tmp", "run", "var/cache/apt", "var/lib/apt/lists", "var/log")
DEBIAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # the rootfs's PATH: what $PATH is


@dataclass(frozen=True)
class Containerfile:
    """What the image takes from a Containerfile: the build stage's COPY sources (repo-relative)
    and the final stage's config, as Docker applies it (ENV in order, with $VAR from what is set)."""

    sources: tuple[str, ...]
    env: tuple[str, ...]
    user: str
    workdir: str
    ports: tuple[str, ...]
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]


def containerfile(path: Path = ROOT / "Containerfile") -> Containerfile:
    """The subset of the Dockerfile grammar the project's Containerfile uses: ARG, FROM (stages),
    WORKDIR, COPY (``--from`` copies between stages), RUN, ENV k=v..., USER, EXPOSE, ENTRYPOINT
    and CMD in exec (JSON) form; anything else is refused, so the file cannot grow a step this
    build would silently skip."""
    logical: list[str] = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if logical and logical[-1].endswith("\\"):
            logical[-1] = logical[-1][:-1] + " " + line
        elif line and not line.startswith("#"):
            logical.append(line)
    sources: list[str] = []
    env: dict[str, str] = {"PATH": DEBIAN_PATH}
    final = dict(user="root", workdir="/", ports=(), entrypoint=(), cmd=())
    for text in logical:
        op, _, rest = text.partition(" ")
        op = op.upper()
        if op == "FROM":  # a new stage: only the last one's config is the image's
            env, final = {"PATH": DEBIAN_PATH}, dict(user="root", workdir="/", ports=(), entrypoint=(), cmd=())
        elif op == "COPY":
            args = rest.split()
            if not args[0].startswith("--from"):
                sources += args[:-1]
        elif op == "ENV":
            for pair in re.findall(r'(\w+)=(\S+)', rest):
                env[pair[0]] = re.sub(r"\$(\w+)|\$\{(\w+)\}", lambda m: env.get(m[1] or m[2], ""), pair[1])
        elif op in ("USER", "WORKDIR"):
            final[op.lower()] = rest.strip()
        elif op == "EXPOSE":
            final["ports"] = tuple(p if "/" in p else f"{p}/tcp" for p in rest.split())
        elif op in ("ENTRYPOINT", "CMD"):
            final[op.lower()] = tuple(json.loads(rest))
        elif op not in ("ARG", "RUN"):
            raise ValueError(f"{path}: {op} is not an instruction hack/images/images.py builds")
    return Containerfile(tuple(sources), tuple(f"{k}={v}" for k, v in env.items()), **final)


SERVICE = containerfile()
SERVICE_SOURCES = SERVICE.sources


@dataclass(frozen=True)
class ImageSpec:
    name: str
    packages: tuple[str, ...]
    files: tuple[str, ...]          # repo-relative files/dirs whose content goes into the key
    user: str
    env: tuple[str, ...]
    workdir: str
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    ports: tuple[str, ...] = ()
    labels: dict = field(default_factory=dict)


SPECS = {
    "openmpi": ImageSpec(
        name="openmpi",
        packages=("openssh-server", "openmpi-bin", "python3-mpi4py"),
        files=("hack/images/mpi",),
        user="1000:1000",
        env=("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/home/mpiuser"),
        workdir="/home/mpiuser",
        cmd=("/usr/sbin/sshd", "-De", "-f", "/home/mpiuser/.sshd_config"),
        ports=("2222/tcp",),
    ),
    # containerd's sandbox image (registry.k8s.io/pause cannot be pulled here): hack/images/pause/pause.go,
    # built static with the machine's Go, alone in the layer
    "pause": ImageSpec(
        name="pause",
        packages=(),
        files=("hack/images/pause",),
        user="65535:65535",
        env=(),
        workdir="/",
        entrypoint=("/pause",),
    ),
    "service": ImageSpec(  # the Containerfile's, on this rootfs (module doc)
        name="service",
        packages=("python3", "python3-venv"),
        files=("Containerfile",) + SERVICE_SOURCES,
        user=SERVICE.user,
        env=SERVICE.env,
        workdir=SERVICE.workdir,
        entrypoint=SERVICE.entrypoint,
        cmd=SERVICE.cmd,
        ports=SERVICE.ports,
    ),
}


# --- pure parts: digests, cache key, OCI documents --------------------------------------------------

def sha256_bytes(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical_json(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def tree_digest(root: Path, rels) -> str:
    """Digest of file names, modes (exec bit) and contents under `rels` (files or directories)."""
    h = hashlib.sha256()
    for rel in sorted(rels):
        p = root / rel
        paths = [p] if p.is_file() else sorted(x for x in p.rglob("*") if x.is_file())
        for f in paths:
            r = f.relative_to(root).as_posix()
            if "__pycache__" in f.parts or f.suffix in (".pyc", ".pyo") or ".egg-info" in r:
                continue
            h.update(r.encode() + b"\0" + (b"x" if os.access(f, os.X_OK) else b"-") + b"\0")
            h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def cache_key(spec: ImageSpec, *, mirror: str, release_date: str, files_digest: str, builder_digest: str) -> str:
    """The image's tag: 16 hex digits of a hash over everything that decides its content."""
    doc = {"name": spec.name, "suite": SUITE, "mirror": mirror, "release": release_date,
           "packages": sorted(spec.packages), "mmdebstrap": MMDEBSTRAP_OPTS, "files": files_digest,
           "builder": builder_digest, "epoch": SOURCE_DATE_EPOCH,
           "config": [spec.user, list(spec.env), spec.workdir, list(spec.entrypoint), list(spec.cmd)]}
    return hashlib.sha256(canonical_json(doc)).hexdigest()[:16]


def image_ref(name: str, tag: str) -> str:
    return f"{REPO_PREFIX}/{name}:{tag}"


def image_config(spec: ImageSpec, diff_id: str, *, created: int = SOURCE_DATE_EPOCH) -> dict:
    cfg = {"User": spec.user, "Env": list(spec.env), "WorkingDir": spec.workdir}
    if spec.entrypoint:
        cfg["Entrypoint"] = list(spec.entrypoint)
    if spec.cmd:
        cfg["Cmd"] = list(spec.cmd)
    if spec.ports:
        cfg["ExposedPorts"] = {p: {} for p in spec.ports}
    if spec.labels:
        cfg["Labels"] = dict(spec.labels)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created))
    return {"created": stamp, "architecture": "amd64", "os": "linux", "config": cfg,
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created": stamp, "created_by": f"hack/images/images.py {spec.name}: " + (
               f"mmdebstrap {SUITE} + {' '.join(spec.packages)}" if spec.packages else "go build")}]}


def descriptor(media_type: str, data_or_digest, size: int | None = None, annotations=None) -> dict:
    if isinstance(data_or_digest, bytes):
        d = {"mediaType": media_type, "digest": sha256_bytes(data_or_digest), "size": len(data_or_digest)}
    else:
        d = {"mediaType": media_type, "digest": data_or_digest, "size": size}
    if annotations:
        d["annotations"] = annotations
    return d


def image_manifest(config_bytes: bytes, layer_digest: str, layer_size: int) -> dict:
    return {"schemaVersion": 2, "mediaType": MEDIA_MANIFEST,
            "config": descriptor(MEDIA_CONFIG, config_bytes),
            "layers": [descriptor(MEDIA_LAYER, layer_digest, layer_size)]}


def image_index(manifest_bytes: bytes, ref: str) -> dict:
    tag = ref.rsplit(":", 1)[1]
    return {"schemaVersion": 2, "mediaType": MEDIA_INDEX,
            "manifests": [descriptor(MEDIA_MANIFEST, manifest_bytes, annotations={
                "org.opencontainers.image.ref.name": tag,   # OCI convention: the tag
                "io.containerd.image.name": ref,            # what `ctr images import` names it
            })]}


# --- layer and archive -----------------------------------------------------------------------------

def _skip(rel: str) -> bool:
    return any(rel.startswith(p + "/") for p in SKIP_CONTENTS)


def write_layer(rootfs: Path, tar_path: Path, *, mtime: int = SOURCE_DATE_EPOCH) -> tuple[str, str, int]:
    """Pack `rootfs` into a gzip tar layer (sorted, times clamped, numeric owners).
    Returns (diff_id of the uncompressed tar, digest of the gzip blob, blob size)."""
    raw = hashlib.sha256()
    blob = hashlib.sha256()

    class Tee(io.RawIOBase):
        def __init__(self, f):
            self.f, self.n = f, 0

        def writable(self):
            return True

        def write(self, b):
            blob.update(b)
            self.n += len(b)
            return self.f.write(b)

    class RawHash(io.RawIOBase):
        def __init__(self, gz):
            self.gz = gz

        def writable(self):
            return True

        def write(self, b):
            raw.update(b)
            return self.gz.write(b)

    with open(tar_path, "wb") as f:
        tee = Tee(f)
        with gzip.GzipFile(filename="", mode="wb", fileobj=tee, mtime=0, compresslevel=6) as gz:
            with tarfile.open(fileobj=RawHash(gz), mode="w|", format=tarfile.PAX_FORMAT) as tar:
                entries = []
                for dirpath, dirnames, filenames in os.walk(rootfs):
                    rel_dir = os.path.relpath(dirpath, rootfs)
                    rel_dir = "" if rel_dir == "." else rel_dir
                    if rel_dir and _skip(rel_dir + "/x") and rel_dir not in SKIP_CONTENTS:
                        dirnames[:] = []
                        continue
                    for n in dirnames + filenames:
                        rel = f"{rel_dir}/{n}" if rel_dir else n
                        if not _skip(rel):
                            entries.append(rel)
                    if rel_dir in SKIP_CONTENTS:
                        dirnames[:] = []
                for rel in sorted(entries):
                    p = rootfs / rel
                    ti = tar.gettarinfo(str(p), arcname=rel)
                    if ti is None:   # sockets
                        continue
                    ti.mtime = min(int(ti.mtime), mtime)
                    ti.uname = ti.gname = ""
                    if ti.isreg():
                        with open(p, "rb") as fh:
                            tar.addfile(ti, fh)
                    else:
                        tar.addfile(ti)
    return "sha256:" + raw.hexdigest(), "sha256:" + blob.hexdigest(), tee.n


def write_oci_archive(out: Path, spec: ImageSpec, ref: str, layer_path: Path, diff_id: str,
                      layer_digest: str, layer_size: int) -> str:
    """An OCI image layout as one tar: oci-layout, index.json, blobs/sha256/*. Returns the manifest digest."""
    config = canonical_json(image_config(spec, diff_id))
    manifest = canonical_json(image_manifest(config, layer_digest, layer_size))
    index = canonical_json(image_index(manifest, ref))
    tmp = out.with_suffix(".partial")

    def add_bytes(tar, name, data):
        ti = tarfile.TarInfo(name)
        ti.size, ti.mtime, ti.mode = len(data), SOURCE_DATE_EPOCH, 0o644
        tar.addfile(ti, io.BytesIO(data))

    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        add_bytes(tar, "oci-layout", canonical_json({"imageLayoutVersion": "1.0.0"}))
        add_bytes(tar, "index.json", index)
        for d in ("blobs", "blobs/sha256"):
            ti = tarfile.TarInfo(d)
            ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, 0o755, SOURCE_DATE_EPOCH
            tar.addfile(ti)
        add_bytes(tar, "blobs/sha256/" + sha256_bytes(config)[7:], config)
        add_bytes(tar, "blobs/sha256/" + sha256_bytes(manifest)[7:], manifest)
        ti = tarfile.TarInfo("blobs/sha256/" + layer_digest[7:])
        ti.size, ti.mtime, ti.mode = layer_size, SOURCE_DATE_EPOCH, 0o644
        with open(layer_path, "rb") as fh:
            tar.addfile(ti, fh)
    os.replace(tmp, out)
    return sha256_bytes(manifest)


def read_archive(path: Path) -> dict:
    """Read an archive back and check it: every digest and size in index -> manifest -> config/layer."""
    with tarfile.open(path) as tar:
        names = set(tar.getnames())
        assert "oci-layout" in names and "index.json" in names, names
        index = json.load(tar.extractfile("index.json"))
        (mdesc,) = index["manifests"]

        def blob(desc):
            data = tar.extractfile("blobs/sha256/" + desc["digest"][7:]).read()
            assert sha256_bytes(data) == desc["digest"] and len(data) == desc["size"], desc
            return data

        manifest = json.loads(blob(mdesc))
        config = json.loads(blob(manifest["config"]))
        ldesc = manifest["layers"][0]
        m = tar.getmember("blobs/sha256/" + ldesc["digest"][7:])
        assert m.size == ldesc["size"], (m.size, ldesc)
    return {"ref": mdesc["annotations"]["io.containerd.image.name"], "manifest": mdesc["digest"],
            "config": config, "layer": ldesc}


# --- inputs ----------------------------------------------------------------------------------------

def _apt_source_files() -> list[Path]:
    return sorted(Path("/etc/apt/sources.list.d").glob("*.sources")) + [Path("/etc/apt/sources.list")]


def apt_mirror() -> str:
    """The mirror the machine's apt uses (deb822 or one-line sources), else deb.debian.org."""
    for f in _apt_source_files():
        try:
            text = f.read_text()
        except OSError:
            continue
        for m in re.finditer(r"^URIs:\s*(\S+)", text, re.M):
            if "security" not in m.group(1):
                return m.group(1).rstrip("/")
        for m in re.finditer(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+\S+", text, re.M):
            if "security" not in m.group(1):
                return m.group(1).rstrip("/")
    return DEFAULT_MIRROR


def release_date(mirror: str, suite: str = SUITE) -> str:
    with urllib.request.urlopen(f"{mirror}/dists/{suite}/InRelease", timeout=30) as r:
        head = r.read(4096).decode("utf-8", "replace")
    m = re.search(r"^Date:\s*(.+)$", head, re.M)
    if not m:
        raise RuntimeError(f"no Date in {mirror}/dists/{suite}/InRelease")
    return m.group(1).strip()


def out_dir(arg: str | None = None) -> Path:
    return Path(arg or os.environ.get(OUT_ENV) or DEFAULT_OUT)


def _archive(out: Path, name: str, tag: str) -> Path:
    return out / f"{name}-{tag}.oci.tar"


def _log(msg: str) -> None:
    print(f"images: {msg}", file=sys.stderr, flush=True)


def _run(cmd, **kw):
    _log("+ " + " ".join(map(str, cmd)))
    subprocess.run(cmd, check=True, **kw)


# --- building --------------------------------------------------------------------------------------

def _mmdebstrap(spec: ImageSpec, rootfs: Path, mirror: str) -> None:
    if not shutil.which("mmdebstrap"):
        _run(["apt-get", "install", "-y", "-q", "mmdebstrap"])
    hooks = []
    if shutil.which("eatmydata"):   # no fsync while dpkg unpacks: ~1/3 faster
        hooks.append("--hook-dir=/usr/share/mmdebstrap/hooks/eatmydata")
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(SOURCE_DATE_EPOCH))
    _run(["mmdebstrap", "--quiet", *MMDEBSTRAP_OPTS, *hooks, "--format=directory",
          "--include=" + ",".join(spec.packages), SUITE, str(rootfs), mirror], env=env)


def _chroot(rootfs: Path, *cmd: str) -> None:
    _run(["chroot", str(rootfs), *cmd])


def _pause_rootfs(rootfs: Path) -> None:
    rootfs.mkdir(parents=True)
    env = dict(os.environ, CGO_ENABLED="0", GOOS="linux", GOARCH="amd64", GOMAXPROCS="1", GOTOOLCHAIN="local",
               GOFLAGS="-buildvcs=false", GO111MODULE="off")
    _run(["nice", "-n", "10", "go", "build", "-trimpath", "-ldflags=-s -w -buildid=", "-o", str(rootfs / "pause"),
          str(HERE / "pause/pause.go")], env=env)


def _customize_openmpi(rootfs: Path) -> None:
    _chroot(rootfs, "useradd", "--create-home", "--uid", "1000", "--user-group", "--shell", "/bin/bash", "mpiuser")
    _chroot(rootfs, "usermod", "-p", "*", "mpiuser")    # no password, but not a locked account
    for key in rootfs.glob("etc/ssh/ssh_host_*"):      # the host key is the job's, from the Secret
        key.unlink()
    home = rootfs / "home/mpiuser"
    shutil.copyfile(HERE / "mpi/sshd_config", home / ".sshd_config")
    (home / ".ssh").mkdir(mode=0o700)
    for p in (home / ".sshd_config", home / ".ssh"):
        os.chown(p, 1000, 1000)
    shutil.copyfile(HERE / "mpi/ssh_config", rootfs / "etc/ssh/ssh_config.d/mpi.conf")
    (rootfs / "opt/mpi").mkdir(parents=True)
    shutil.copyfile(HERE / "mpi/ring.py", rootfs / "opt/mpi/ring.py")


def _customize_service(rootfs: Path) -> None:
    src = rootfs / "src"
    src.mkdir()
    for rel in SERVICE_SOURCES:
        p = ROOT / rel
        if p.is_dir():
            shutil.copytree(p, src / rel, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copyfile(p, src / rel)
    resolv = rootfs / "etc/resolv.conf"
    had = resolv.exists() or resolv.is_symlink()
    if had:
        resolv.rename(rootfs / "etc/resolv.conf.img")
    shutil.copyfile("/etc/resolv.conf", resolv)
    # PyPI is reached through this machine's TLS proxy: pip in the chroot trusts the host's CA bundle
    shutil.copyfile(os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt", src / "host-ca.crt")
    # a clean environment: the host's *_CA_BUNDLE / SSL_CERT_* variables name files the chroot lacks
    pip_env = {k: v for k, v in os.environ.items() if k.lower().endswith("_proxy")}
    pip_env.update(PATH="/usr/sbin:/usr/bin:/sbin:/bin", HOME="/root", LANG="C.UTF-8",
                   PIP_CERT="/src/host-ca.crt", PIP_DISABLE_PIP_VERSION_CHECK="1")
    try:
        _chroot(rootfs, "python3", "-m", "venv", "/opt/venv")
        # pip's isolated build environment ignores PIP_CERT here, so the build backend is installed
        # first (pinned) and the project is built without isolation
        _run(["chroot", str(rootfs), "/opt/venv/bin/pip", "install", "-q", "--no-cache-dir",
              "setuptools==80.9.0", "wheel==0.45.1"], env=pip_env)
        _run(["chroot", str(rootfs), "/opt/venv/bin/pip", "install", "--no-build-isolation", "-q", "--no-cache-dir", "--disable-pip-version-check",
                "--no-compile", "-c", "/src/requirements.lock", "/src"], env=pip_env)
        _chroot(rootfs, "/opt/venv/bin/python", "-m", "compileall", "-q", "--invalidation-mode",
                "unchecked-hash", "/opt/venv")
    finally:
        resolv.unlink()
        if had:
            (rootfs / "etc/resolv.conf.img").rename(resolv)
    shutil.rmtree(src)


CUSTOMIZE = {"openmpi": _customize_openmpi, "service": _customize_service}


def _inputs(spec: ImageSpec, mirror: str | None = None) -> dict:
    mirror = mirror or apt_mirror()
    files = tree_digest(ROOT, spec.files)
    builder = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    rel = release_date(mirror)
    tag = cache_key(spec, mirror=mirror, release_date=rel, files_digest=files, builder_digest=builder)
    return {"mirror": mirror, "release": rel, "tag": tag}


def build(name: str, out: Path | None = None) -> tuple[Path, str]:
    spec = SPECS[name]
    out = out_dir(str(out) if out else None)
    out.mkdir(parents=True, exist_ok=True)
    inp = _inputs(spec)
    tag, ref = inp["tag"], image_ref(name, inp["tag"])
    archive = _archive(out, name, tag)
    meta = archive.with_name(f"{name}-{tag}.json")
    if archive.exists() and meta.exists():
        _log(f"{name}: cached {archive}")
        print(f"cached {name} {archive} {ref}", flush=True)
        return archive, ref
    if os.geteuid() != 0:
        raise SystemExit("images: building needs root (mmdebstrap root mode and chroot)")
    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f"images-{name}-", dir=os.environ.get("TMPDIR", "/tmp")))
    try:
        rootfs = work / "rootfs"
        if spec.packages:
            _mmdebstrap(spec, rootfs, inp["mirror"])
        else:
            _pause_rootfs(rootfs)
        t_rootfs = time.monotonic() - t0
        packages = ""
        if spec.packages:
            CUSTOMIZE[name](rootfs)
            packages = subprocess.run(["dpkg-query", "--admindir", str(rootfs / "var/lib/dpkg"), "-W"],
                                      check=True, capture_output=True, text=True).stdout
        pip = ""
        if name == "service":
            pip = subprocess.run(["chroot", str(rootfs), "/opt/venv/bin/pip", "freeze", "--all"],
                                 check=True, capture_output=True, text=True).stdout
        t_custom = time.monotonic() - t0
        layer = work / "layer.tar.gz"
        diff_id, layer_digest, layer_size = write_layer(rootfs, layer)
        manifest_digest = write_oci_archive(archive.with_suffix(".tmp"), spec, ref, layer, diff_id,
                                            layer_digest, layer_size)
        os.replace(archive.with_suffix(".tmp"), archive)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    took = time.monotonic() - t0
    meta.write_text(json.dumps({
        "name": name, "ref": ref, "archive": archive.name, "manifest": manifest_digest,
        "layer": layer_digest, "layer_size": layer_size, "diff_id": diff_id, **inp,
        "seconds": {"rootfs": round(t_rootfs, 1), "customize": round(t_custom - t_rootfs, 1),
                    "pack": round(took - t_custom, 1), "total": round(took, 1)},
        "packages": packages.split("\n")[:-1], "pip": pip.split("\n")[:-1],
    }, indent=1) + "\n")
    for stale in out.glob(f"{name}-*"):  # earlier builds of this image: a tag never comes back
        if stale.name.split(".")[0] != f"{name}-{tag}":
            stale.unlink()
    _log(f"{name}: built {archive} ({archive.stat().st_size / 2**20:.1f} MiB) in {took:.0f}s")
    print(f"built {name} {archive} {ref}", flush=True)
    return archive, ref


def build_all(out: Path | None = None, names=None) -> dict[str, tuple[Path, str]]:
    """Build (or reuse) every image; {name: (archive path, image ref)}."""
    return {n: build(n, out) for n in (names or SPECS)}


def list_images(out: Path | None = None) -> list[dict]:
    out = out_dir(str(out) if out else None)
    return [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="images.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build the images not already cached")
    b.add_argument("--out", help=f"output directory (default ${OUT_ENV} or {DEFAULT_OUT})")
    b.add_argument("--only", action="append", choices=sorted(SPECS))
    ls = sub.add_parser("list", help="the archives in the output directory")
    ls.add_argument("--out")
    args = ap.parse_args(argv)
    if args.cmd == "build":
        build_all(Path(args.out) if args.out else None, args.only)
    else:
        for m in list_images(Path(args.out) if args.out else None):
            print(m["name"], m["archive"], m["ref"], m["layer_size"], m["seconds"]["total"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
