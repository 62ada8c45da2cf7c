"""hack/images/images.py's pure parts: the cache key, the OCI config/manifest/index documents, the
layer packer and the archive read back (no mmdebstrap, no network)."""
from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import os
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("images_builder", ROOT / "hack/images/images.py")
images = importlib.util.module_from_spec(_spec)
sys.modules["images_builder"] = images   # dataclasses look their module up there
_spec.loader.exec_module(images)

KEY_ARGS = dict(mirror="http://deb.example/debian", release_date="Sat, 11 Jul 2026 10:16:37 UTC",
                files_digest="f" * 64, builder_digest="b" * 64)


def test_cache_key_is_stable_and_depends_on_every_input():
    spec = images.SPECS["openmpi"]
    key = images.cache_key(spec, **KEY_ARGS)
    assert key == images.cache_key(spec, **KEY_ARGS) and len(key) == 16
    for name, value in [("mirror", "http://other/debian"), ("release_date", "Sun, 12 Jul 2026 10:00:00 UTC"),
                        ("files_digest", "0" * 64), ("builder_digest", "1" * 64)]:
        assert images.cache_key(spec, **{**KEY_ARGS, name: value}) != key, name
    assert images.cache_key(images.SPECS["service"], **KEY_ARGS) != key


def test_tree_digest_sees_content_names_and_exec_bit_but_not_bytecode(tmp_path):
    (tmp_path / "d").mkdir()
    f = tmp_path / "d" / "a.py"
    f.write_text("x = 1\n")
    first = images.tree_digest(tmp_path, ["d"])
    (tmp_path / "d" / "__pycache__").mkdir()
    (tmp_path / "d" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"junk")
    assert images.tree_digest(tmp_path, ["d"]) == first
    f.write_text("x = 2\n")
    second = images.tree_digest(tmp_path, ["d"])
    assert second != first
    os.chmod(f, 0o755)
    assert images.tree_digest(tmp_path, ["d"]) != second


def test_config_manifest_index():
    spec = images.SPECS["service"]
    diff_id = "sha256:" + "d" * 64
    config = images.image_config(spec, diff_id)
    assert config["config"]["User"] == "65532:65532"
    assert config["config"]["Entrypoint"] == ["trainjob-admission"]
    assert config["config"]["Cmd"] == ["serve", "--in-cluster", "--cert-dir", "/tls"]
    assert config["config"]["WorkingDir"] == "/"
    assert any(e.startswith("PATH=/opt/venv/bin:") for e in config["config"]["Env"])
    assert config["rootfs"] == {"type": "layers", "diff_ids": [diff_id]}
    assert config["created"] == "2023-11-14T22:13:20Z"
    cfg = images.canonical_json(config)
    manifest = images.image_manifest(cfg, "sha256:" + "e" * 64, 1234)
    assert manifest["config"] == {"mediaType": images.MEDIA_CONFIG,
                                  "digest": "sha256:" + hashlib.sha256(cfg).hexdigest(), "size": len(cfg)}
    assert manifest["layers"] == [{"mediaType": images.MEDIA_LAYER, "digest": "sha256:" + "e" * 64, "size": 1234}]
    ref = images.image_ref("service", "0123456789abcdef")
    assert ref == "localhost/trainjob-admission/service:0123456789abcdef"
    index = images.image_index(images.canonical_json(manifest), ref)
    (desc,) = index["manifests"]
    assert desc["mediaType"] == images.MEDIA_MANIFEST
    assert desc["annotations"] == {"org.opencontainers.image.ref.name": "0123456789abcdef",
                                   "io.containerd.image.name": ref}


def test_openmpi_spec_follows_trainer_mpi_conventions():
    cfg = images.image_config(images.SPECS["openmpi"], "sha256:" + "0" * 64)["config"]
    assert cfg["User"] == "1000:1000" and cfg["WorkingDir"] == "/home/mpiuser"
    assert cfg["Cmd"] == ["/usr/sbin/sshd", "-De", "-f", "/home/mpiuser/.sshd_config"]
    sshd = (ROOT / "hack/images/mpi/sshd_config").read_text()
    assert "Port 2222" in sshd and "HostKey /home/mpiuser/.ssh/id_rsa" in sshd and "StrictModes no" in sshd


def _rootfs(tmp_path):
    r = tmp_path / "rootfs"
    for d in ("etc", "usr/bin", "dev", "proc", "tmp", "var/cache/apt/archives"):
        (r / d).mkdir(parents=True)
    (r / "etc/hostname").write_text("x\n")
    (r / "usr/bin/tool").write_bytes(b"#!/bin/sh\n")
    os.chmod(r / "usr/bin/tool", 0o755)
    os.link(r / "usr/bin/tool", r / "usr/bin/tool2")
    os.symlink("usr/bin", r / "bin")
    (r / "tmp/junk").write_text("no")
    (r / "var/cache/apt/archives/x.deb").write_text("no")
    return r


def test_layer_is_sorted_clamped_deterministic_and_skips_caches(tmp_path):
    r = _rootfs(tmp_path)
    a, b = tmp_path / "a.tgz", tmp_path / "b.tgz"
    diff_a, dig_a, size_a = images.write_layer(r, a)
    os.utime(r / "etc/hostname", (2_000_000_000, 2_000_000_000))   # later than the epoch: clamped
    diff_b, dig_b, size_b = images.write_layer(r, b)
    assert (diff_a, dig_a, size_a) == (diff_b, dig_b, size_b)
    assert dig_a == "sha256:" + hashlib.sha256(a.read_bytes()).hexdigest() and size_a == a.stat().st_size
    raw = gzip.decompress(a.read_bytes())
    assert diff_a == "sha256:" + hashlib.sha256(raw).hexdigest()
    with tarfile.open(a) as t:
        members = {m.name: m for m in t.getmembers()}
    names = list(members)
    assert names == sorted(names)
    assert {"dev", "proc", "tmp", "var/cache/apt"} <= set(names)
    assert "tmp/junk" not in names and not any(n.startswith("var/cache/apt/") for n in names)
    assert members["bin"].issym() and members["bin"].linkname == "usr/bin"
    assert members["usr/bin/tool2"].islnk() and members["usr/bin/tool2"].linkname == "usr/bin/tool"
    assert members["usr/bin/tool"].mode & 0o111
    assert all(m.mtime <= images.SOURCE_DATE_EPOCH for m in members.values())


def test_archive_reads_back(tmp_path):
    r = _rootfs(tmp_path)
    layer = tmp_path / "layer.tgz"
    diff_id, digest, size = images.write_layer(r, layer)
    ref = images.image_ref("openmpi", "feedfacecafebeef")
    out = tmp_path / "openmpi.oci.tar"
    manifest_digest = images.write_oci_archive(out, images.SPECS["openmpi"], ref, layer, diff_id, digest, size)
    got = images.read_archive(out)
    assert got["ref"] == ref and got["manifest"] == manifest_digest
    assert got["layer"]["digest"] == digest and got["config"]["rootfs"]["diff_ids"] == [diff_id]
    with tarfile.open(out) as t:
        assert json.load(t.extractfile("oci-layout")) == {"imageLayoutVersion": "1.0.0"}
        assert t.getnames()[:2] == ["oci-layout", "index.json"]


@pytest.mark.parametrize("text, mirror", [
    ("Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n", "http://mirror.example/debian"),
    ("deb [arch=amd64] http://m.example/debian/ bookworm main\n", "http://m.example/debian"),
])
def test_apt_mirror_parsing(tmp_path, monkeypatch, text, mirror):
    monkeypatch.setattr(images, "_apt_source_files", lambda: [tmp_path / "s"])
    (tmp_path / "s").write_text(text)
    assert images.apt_mirror() == mirror


def test_the_service_image_is_configured_as_the_containerfile_says():
    """The project's Containerfile, read as Docker applies it: the image built here runs what a
    `podman build -f Containerfile` image runs, as the same user, with the same environment."""
    spec = images.SPECS["service"]
    assert spec.entrypoint == ("trainjob-admission",) and spec.cmd == ("serve", "--in-cluster", "--cert-dir", "/tls")
    assert spec.user == "65532:65532" and spec.ports == ("8443/tcp",) and spec.workdir == "/"
    assert spec.env == (f"PATH=/opt/venv/bin:{images.DEBIAN_PATH}", "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1")
    assert images.SERVICE_SOURCES == ("pyproject.toml", "requirements.lock", "README.md", "webhook", "policies",
                                      "certs")


def test_a_containerfile_is_read_stage_by_stage_and_unknown_steps_are_refused(tmp_path):
    path = tmp_path / "Containerfile"
    path.write_text("""ARG BASE=x
FROM ${BASE} AS build
WORKDIR /src
COPY a.toml b.lock ./
COPY pkg pkg
RUN make \\
    && make install
ENV FOO=build
FROM ${BASE}
COPY --from=build /opt /opt
ENV A=1 PATH=/opt/bin:$PATH
ENV B=${A}2
USER 10:20
EXPOSE 8443 9000/udp
ENTRYPOINT ["run"]
CMD ["serve", "--x"]
""")
    read = images.containerfile(path)
    assert read.sources == ("a.toml", "b.lock", "pkg")
    assert read.env == (f"PATH=/opt/bin:{images.DEBIAN_PATH}", "A=1", "B=12")  # the build stage's FOO is not in it
    assert (read.user, read.workdir, read.ports) == ("10:20", "/", ("8443/tcp", "9000/udp"))
    assert (read.entrypoint, read.cmd) == (("run",), ("serve", "--x"))
    path.write_text(path.read_text() + "HEALTHCHECK CMD true\n")
    with pytest.raises(ValueError, match="HEALTHCHECK is not an instruction"):
        images.containerfile(path)
