#!/usr/bin/env python3
"""A real Kubernetes control plane on loopback for the cluster test tier.

Subcommands (run with .venv/bin/python hack/cluster/cluster.py CMD):
  gomod   regenerate hack/cluster/tools/go.mod (or tools-old/go.mod, --stack oldest) from the pins
  build   build every component from Go modules into hack/cluster/bin/ (cached by version);
          --stack newest|oldest|all (default: $TJA_STACK, else newest)
  up      start etcd, kube-apiserver, kube-controller-manager, kube-scheduler, KWOK,
          the JobSet controller, the Trainer controller manager and Kueue; no-op if already up
  down    stop every process `up` started and remove nothing but the processes
  status  print what runs and where
  env     print shell exports (KUBECONFIG, KUBECTL, ...) for the running cluster
  test    build both stacks + up + pytest tests/cluster + down, on the newest stack, then the
          tests marked `oldest` on the oldest (the oldest built beside the newest's tests)

Two stacks: the newest (VERSIONS) and the oldest this machine builds (OLDEST); $TJA_STACK picks
the one `up`, `status` and the tests use (newest by default), one at a time, on the same ports.
Everything listens on 127.0.0.1 only.  State lives in hack/cluster/run/ (git-ignored).
Importable: tests use `register_webhook`, `issue_serving_cert`, `kubectl`, `apply_objects` from here.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import hashlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import realnode  # noqa: E402  (hack/cluster/realnode.py: the real node beside the KWOK nodes)
REPO = HERE.parent.parent
BIN = HERE / "bin"
RUN = HERE / "run"
TOOLS = HERE / "tools"  # the Go wrapper module
TOOLS_OLD = HERE / "tools-old"  # the oldest stack's Kubernetes

# ---------------------------------------------------------------------------------------------
# Versions: the one place they are pinned.  tools/go.mod is generated from this by `gomod`,
# and `build` refuses to run when go.mod disagrees.
# ---------------------------------------------------------------------------------------------
VERSIONS = {
    "kubernetes": "v1.36.3",  # kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kubelet, kube-proxy
    "etcd": "v3.6.8",  # the etcd server k8s.io/kubernetes v1.36.3 itself resolves
    "kwok": "v0.8.0",
    "jobset": "v0.12.0",
    "trainer": "v2.3.0",
    "mpi-operator": "v0.7.0",  # CRD only (legacy kubeflow.org/v2beta1 MPIJob); nothing is built
    "cel-spec": "v0.25.1",  # the cel-spec conformance suite (tests/unit/test_cel_conformance.py); nothing is built
    # Trainer releases before v2.2, read only for their TrainJob CRD: the service refuses to start on them
    # (policies/k8s/versions.py TRAINER_OLDEST; tests/unit/test_versions.py)
    "trainer-v2.1": "v2.1.0",  # spec.podTemplateOverrides
    "trainer-v2.0": "v2.0.0",  # spec.podSpecOverrides
    # Pod Security admission's fixtures (tests/unit/test_podsecurity_upstream.py); the staging
    # module of "kubernetes", nothing is built from it here
    "pod-security-admission": "v0.36.3",
}
MODULES = {
    "kubernetes": "k8s.io/kubernetes",
    "etcd": "go.etcd.io/etcd/server/v3",
    "kwok": "sigs.k8s.io/kwok",
    "jobset": "sigs.k8s.io/jobset",
    "trainer": "github.com/kubeflow/trainer/v2",
    "mpi-operator": "github.com/kubeflow/mpi-operator",
    "cel-spec": "cel.dev/expr",
    "trainer-v2.1": "github.com/kubeflow/trainer/v2",
    "trainer-v2.0": "github.com/kubeflow/trainer/v2",
    "kueue": "sigs.k8s.io/kueue",  # built in its own module (OWN_MODULES); its version is per stack
    "pod-security-admission": "k8s.io/pod-security-admission",
}
# Modules read for manifests only. They stay out of tools/go.mod: a `require` would merge their
# module graph (mpi-operator pulls golangci-lint, kind, volcano) into the build and could move
# the versions our binaries are built from.  Their content is pinned by the go.sum hash here,
# checked by module_dir() after the download.
DATA_MODULES = {
    "mpi-operator": "h1:ID1eyzAFOMofgynEvfy4//S3q7Ra1OSexrggb1VcC1o=",
    "cel-spec": "h1:1KrZg61W6TWSxuNZ37Xy49ps13NUovb66QLprthtwi4=",
    "trainer-v2.1": "h1:jRABD9ZYToamNH2atHze3L/VC/v6KCAqUEqsOQOjVTg=",
    "trainer-v2.0": "h1:mnQSR9iPKItxyUR8mq66XsmxqKNVHwr9YYOB7BTU9dU=",
    "pod-security-admission": "h1:nWRx42eQwSkapa0TPwtho35adfSziRmPYuzwU+4xPpo=",
}
BUILD_MODULES = {k: m for k, m in MODULES.items() if k not in DATA_MODULES and k in VERSIONS}

# The oldest stack this machine can build from the module proxy with its Go toolchain (docs/testing.md
# "The oldest stack"): what the platforms we serve run at the low end of the supported range
# (docs/deploy.md "Supported versions"). Kubernetes from tools-old/go.mod; Trainer v2.2.0 and the
# JobSet its go.mod pins and Kueue v0.14.0 each in its own module (OWN_MODULES);
# etcd and KWOK are the newest stack's binaries (neither is what is tested).
OLDEST = {
    "kubernetes": "v1.33.13",  # the oldest that installs Trainer v2.2's CRDs and whose staging modules the proxy serves (docs/testing.md "The oldest stack")
    "trainer": "v2.2.0",  # the oldest with spec.runtimePatches
    "jobset": "v0.11.1",  # what Trainer v2.2.0's go.mod requires
    "kueue": "v0.14.0",  # the newest Kueue that serves only kueue.x-k8s.io/v1beta1 (v1beta2 came in v0.15)
}
STACKS = ("newest", "oldest")
STACK = os.environ.get("TJA_STACK") or "newest"  # the stack up, status, env and the tests use
if STACK not in STACKS:
    raise SystemExit(f"TJA_STACK={STACK!r}: one of {', '.join(STACKS)}")


def staging_version(k8s: str = VERSIONS["kubernetes"]) -> str:
    """k8s.io/kubernetes v1.X.Y publishes its staging modules (k8s.io/api, ...) as v0.X.Y."""
    major, minor, patch = k8s.lstrip("v").split(".")
    return f"v0.{minor}.{patch}"


# component -> (main package, version key, name `go build -o DIR/` gives the binary)
COMPONENTS = {
    "etcd": ("go.etcd.io/etcd/server/v3", "etcd", "server"),
    "kube-apiserver": ("k8s.io/kubernetes/cmd/kube-apiserver", "kubernetes", "kube-apiserver"),
    "kube-controller-manager": (
        "k8s.io/kubernetes/cmd/kube-controller-manager", "kubernetes", "kube-controller-manager"),
    "kube-scheduler": ("k8s.io/kubernetes/cmd/kube-scheduler", "kubernetes", "kube-scheduler"),
    "kubectl": ("k8s.io/kubernetes/cmd/kubectl", "kubernetes", "kubectl"),
    # the real node (hack/cluster/realnode.py): one kubelet and the kube-proxy that routes its
    # pods' Service traffic (the in-cluster API server address among it)
    "kubelet": ("k8s.io/kubernetes/cmd/kubelet", "kubernetes", "kubelet"),
    "kube-proxy": ("k8s.io/kubernetes/cmd/kube-proxy", "kubernetes", "kube-proxy"),
    "kwok": ("sigs.k8s.io/kwok/cmd/kwok", "kwok", "kwok"),
    "jobset": ("sigs.k8s.io/jobset", "jobset", "jobset"),
    "trainer-controller-manager": (
        "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager", "trainer",
        "trainer-controller-manager"),
}
# The oldest stack's components built from tools-old/go.mod; its JobSet and Trainer are built in
# their own modules (OWN_MODULES, by key here), etcd and KWOK are the newest's (binary()).
OLD_COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
OLD_CONTROLLERS = {"jobset": "jobset-v0.11", "trainer-controller-manager": "trainer-v2.2"}


@dataclass(frozen=True)
class MainBuild:
    """One wrapper module and the binaries one `go build` makes from it."""

    stack: str
    tools: Path
    versions: dict  # key -> version, for the modules it requires
    components: tuple[str, ...]
    stamp: str  # bin/ file holding its fingerprint

    @property
    def modules(self) -> dict:
        return {k: BUILD_MODULES[k] for k in self.versions if k in BUILD_MODULES}


MAIN_BUILDS = {
    "newest": MainBuild("newest", TOOLS, {k: VERSIONS[k] for k in BUILD_MODULES}, tuple(COMPONENTS), ".fingerprint"),
    "oldest": MainBuild("oldest", TOOLS_OLD, {"kubernetes": OLDEST["kubernetes"]}, OLD_COMPONENTS, ".fingerprint-oldest"),
}

# Fixed loopback ports (a busy one is replaced by a free one at `up`; see run/state.json).
# All below 32768: Linux gives client sockets ports from 32768-60999 (ip_local_port_range), and a
# listener cannot bind a port a long-lived client connection (the API server's to etcd) already holds.
DEFAULT_PORTS = {
    "etcd-client": 23790,
    "etcd-peer": 23800,
    "apiserver": 6443,  # kubeadm's: the port base's NetworkPolicy lets the service's pods reach (docs/deploy.md)
    "controller-manager": 26257,
    "scheduler": 26259,
    "kwok": 26247,
    "jobset-webhook": 26543,
    "jobset-metrics": 26580,
    "jobset-health": 26581,
    "trainer-webhook": 26643,
    "trainer-metrics": 26680,
    "trainer-health": 26681,
    "kueue-webhook": 26743,
    "kueue-metrics": 26780,
    "kueue-health": 26781,
    # the real node (realnode.py); the kubelet listens on its bridge address, the rest on loopback
    "kubelet": 26250,
    "kubelet-healthz": 26248,
    "kube-proxy-metrics": 26249,
    "kube-proxy-healthz": 26256,
    "coredns-health": 26253,
    "coredns-ready": 26254,
    "kube-router-health": 26255,
}

LOOPBACK = "127.0.0.1"
SERVICE_CIDR = "10.96.0.0/16"  # virtual only: nothing here routes or is ever contacted

# Fake nodes that KWOK keeps Ready, of several shapes (the schedulability pre-check and GPU node
# targeting): four untainted 8-GPU nodes (32 GPUs, so the docs' over-quota job meets the quota
# before it meets the nodes), a CPU-only node, and GPU nodes tainted as the NVIDIA GPU operator's
# clusters often are, labelled with their product. Keys other than name, labels and
# taints are the node's capacity (= allocatable).
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
NODES = [
    *({"name": f"kwok-node-{i}", "cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "8", "pods": "110",
       "labels": {"nvidia.com/gpu.present": "true"}} for i in range(4)),
    {"name": "kwok-cpu-0", "cpu": "16", "memory": "64Gi", "pods": "110", "labels": {}},
    *({"name": f"kwok-a100-{i}", "cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8", "pods": "110",
       "labels": {"nvidia.com/gpu.present": "true", GPU_PRODUCT_LABEL: "NVIDIA-A100-SXM4-80GB"},
       "taints": [GPU_TAINT]} for i in range(2)),
    {"name": "kwok-l4-0", "cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "4", "pods": "110",
     "labels": {"nvidia.com/gpu.present": "true", GPU_PRODUCT_LABEL: "NVIDIA-L4"}, "taints": [GPU_TAINT]},
]


def node_capacity(node: dict) -> dict:
    return {k: v for k, v in node.items() if k not in ("name", "labels", "taints")}


NAMESPACES = {"team-a": "alice", "team-b": "bob"}


def log(msg: str) -> None:
    try:
        print(f"[cluster] {msg}", flush=True)
    except (BrokenPipeError, OSError):  # a closed stdout must never abort up/down half-way
        pass


# ---------------------------------------------------------------------------------------------
# Go toolchain and build
# ---------------------------------------------------------------------------------------------
def find_go() -> str | None:
    """The go binary: $GO if set, else PATH, then /usr/local/go/bin/go; None when there is none."""
    if "GO" in os.environ:  # an explicit GO= wins, even when it points nowhere (GO=none)
        cands = (os.environ["GO"],)
    else:
        cands = (shutil.which("go"), "/usr/local/go/bin/go")
    for cand in cands:
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def go_env(go: str) -> dict:
    env = dict(os.environ)
    env.update(
        GOTOOLCHAIN="local",  # never download a toolchain
        GOWORK="off",
        CGO_ENABLED="0",  # static binaries, no C compiler needed
        GOFLAGS="-buildvcs=false -mod=readonly",  # never rewrite the committed go.mod/go.sum
    )
    env["PATH"] = str(Path(go).parent) + os.pathsep + env.get("PATH", "")
    return env


def binary(component: str, stack: str | None = None) -> Path:
    """Where ``component`` of ``stack`` (default: the active one) is built."""
    _, vkey, _ = COMPONENTS[component]
    if (stack or STACK) == "oldest":
        if component in OLD_COMPONENTS:
            return BIN / f"{component}-{OLDEST['kubernetes']}"
        if component in OLD_CONTROLLERS:
            return own_module_binary(OLD_CONTROLLERS[component])
    return BIN / f"{component}-{VERSIONS[vkey]}"


def ldflags(build: MainBuild | None = None) -> str:
    build = build or MAIN_BUILDS["newest"]
    k8s = build.versions["kubernetes"]
    major, minor, _ = k8s.lstrip("v").split(".")
    parts = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        parts += [
            f"-X={pkg}.gitVersion={k8s}",
            f"-X={pkg}.gitMajor={major}",
            f"-X={pkg}.gitMinor={minor}",
            f"-X={pkg}.gitTreeState=clean",
            f"-X={pkg}.buildDate=1970-01-01T00:00:00Z",
        ]
    if "kwok" in build.versions:
        parts += [
            f"-X=sigs.k8s.io/kwok/pkg/consts.Version={build.versions['kwok']}",
            f"-X=sigs.k8s.io/jobset/pkg/version.GitVersion={build.versions['jobset']}",
        ]
    return " ".join(parts)


def _gomod_requires(build: MainBuild) -> dict:
    """module -> version from the build's go.mod's direct require lines."""
    out = {}
    for line in (build.tools / "go.mod").read_text().splitlines():
        f = line.split()
        if len(f) >= 2 and f[0] in build.modules.values() and f[1].startswith("v"):
            out[f[0]] = f[1]
    return out


def check_gomod(build: MainBuild | None = None) -> None:
    build = build or MAIN_BUILDS["newest"]
    req = _gomod_requires(build)
    bad = [f"{m}: go.mod has {req.get(m)}, the pin is {build.versions[k]}"
           for k, m in build.modules.items() if req.get(m) != build.versions[k]]
    text = (build.tools / "go.mod").read_text()
    staging = staging_version(build.versions["kubernetes"])
    if f"=> k8s.io/api {staging}" not in text:
        bad.append(f"replace block is not at {staging}")
    if bad:
        flag = "" if build.stack == "newest" else f" --stack {build.stack}"
        raise SystemExit(f"{build.tools.relative_to(REPO)}/go.mod is out of date with its pins "
                         f"(run: .venv/bin/python hack/cluster/cluster.py gomod{flag}):\n  " + "\n  ".join(bad))


def fingerprint(go: str, build: MainBuild | None = None) -> str:
    build = build or MAIN_BUILDS["newest"]
    h = hashlib.sha256()
    h.update((build.tools / "go.mod").read_bytes())
    h.update((build.tools / "go.sum").read_bytes())
    h.update(ldflags(build).encode())
    h.update(subprocess.run([go, "version"], capture_output=True, text=True, timeout=60).stdout.encode())
    return h.hexdigest()[:16]


def cmd_gomod(args=None) -> int:
    """Write the stack's go.mod from its pins; the replace list comes from k8s.io/kubernetes' go.mod."""
    build = MAIN_BUILDS[_stack_arg(args, default="newest")]
    go = find_go()
    if not go:
        raise SystemExit("go not found")
    env = go_env(go)
    k8s = f"{MODULES['kubernetes']}@{build.versions['kubernetes']}"
    info = json.loads(subprocess.run([go, "mod", "download", "-json", k8s], env=env, check=True,
                                     capture_output=True, text=True, timeout=600).stdout)
    staging = []
    for line in Path(info["GoMod"]).read_text().splitlines():
        f = line.split()
        if len(f) == 3 and f[1] == "=>" and f[2].startswith("./staging/"):
            staging.append(f[0])
    sv = staging_version(build.versions["kubernetes"])
    what = ("etcd, kube-apiserver,\n// kube-controller-manager, kube-scheduler, kubectl, KWOK, the JobSet controller and the\n"
            "// Trainer controller manager" if build.stack == "newest" else
            f"the oldest stack's kube-apiserver,\n// kube-controller-manager, kube-scheduler and kubectl "
            f"({build.versions['kubernetes']})")
    lines = [
        f"// Wrapper module for the cluster test tier: builds {what} in one `go build`, so shared packages compile once.",
        f"// Generated by `hack/cluster/cluster.py gomod{'' if build.stack == 'newest' else ' --stack ' + build.stack}` "
        "from its pins; the replace",
        "// block maps every k8s.io staging module of k8s.io/kubernetes to its published version.",
        f"module trainjob-admission/hack/cluster/{build.tools.name}",
        "",
        "go 1.26.0",
        "",
        "require (",
        *[f"\t{m} {build.versions[k]}" for k, m in sorted(build.modules.items(), key=lambda km: km[1])],
        ")",
        "",
        "tool (",
        *[f"\t{p}" for p in sorted({COMPONENTS[c][0] for c in build.components})],
        ")",
        "",
        "replace (",
        *[f"\t{m} => {m} {sv}" for m in sorted(staging)],
        ")",
        "",
    ]
    (build.tools / "go.mod").write_text("\n".join(lines))
    subprocess.run([go, "mod", "tidy"], cwd=build.tools, env=env, check=True, timeout=1800)
    log(f"{build.tools.name}/go.mod regenerated; commit go.mod and go.sum")
    return 0


def _stack_arg(args, default: str | None = None) -> str:
    return getattr(args, "stack", None) or default or STACK


def _main_built(stack: str = "newest") -> bool:
    go, build = find_go(), MAIN_BUILDS[stack]
    stamp = BIN / build.stamp
    if not all(binary(c, stack).exists() for c in build.components) or not stamp.exists():
        return False
    return go is None or stamp.read_text().strip() == fingerprint(go, build)


def built(stack: str | None = None) -> bool:
    """Everything ``stack`` (default: the active one) runs is in bin/; the oldest also runs the newest's etcd and KWOK."""
    stack = stack or STACK
    shared = all(binary(c, "newest").exists() for c in ("etcd", "kwok")) if stack == "oldest" else True
    return shared and _main_built(stack) and all(own_module_binary(n).exists() for n in wanted_own_modules(stack))


def cmd_build(args=None) -> int:
    """Build the stack(s) --stack names: newest, oldest or all (default: $TJA_STACK, else newest)."""
    which = _stack_arg(args)
    stacks = STACKS if which == "all" else (which,)
    if "oldest" in stacks and "newest" not in stacks and not all(binary(c, "newest").exists() for c in ("etcd", "kwok")):
        stacks = ("newest", *stacks)  # its etcd and KWOK are the newest's
    for stack in stacks:
        rc = _build_stack(stack)
        if rc:
            return rc
    return 0


def _build_stack(stack: str) -> int:
    build = MAIN_BUILDS[stack]
    check_gomod(build)
    if stack == "newest":
        realnode.install_host_tools(log)
    if built(stack):  # without Go, prebuilt binaries are used as they are
        log(f"build: {stack} stack cached, nothing to do ({BIN})")
        return 0
    go = find_go()
    if not go:
        log("SKIP: no Go toolchain (set GO=/path/to/go or put go on PATH); cannot build")
        return 3
    t0 = time.monotonic()
    if not _main_built(stack):
        _build_main(go, build)
    for name in wanted_own_modules(stack):  # a second build each, after the main one
        build_own_module(name)
    if stack == "newest" and realnode.unsupported_reason() is None:
        node_images()
    if stack == "oldest":
        (BIN / ".build-seconds-oldest").write_text(f"{time.monotonic() - t0:.0f}\n")
    return 0


def _build_main(go: str, build: MainBuild) -> None:
    """Every binary of ``build`` from its go.mod in one `go build`, so shared packages compile once.
    The oldest stack's builds at nice 19: it is built beside the newest stack's tests (cmd_test)."""
    BIN.mkdir(parents=True, exist_ok=True)
    env = go_env(go)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=BIN))
    pkgs = sorted({COMPONENTS[c][0] for c in build.components})
    cmd = [go, "build", "-p", "2", "-trimpath", "-ldflags", ldflags(build), "-o", str(tmp) + "/", *pkgs]
    if build.stack != "newest":
        cmd = ["nice", "-n", "19", *cmd]
    log(f"build: {build.stack} stack, {len(pkgs)} main packages in one go build "
        f"(GOCACHE={env.get('GOCACHE') or 'default'})")
    t0 = time.monotonic()
    try:
        subprocess.run(cmd, cwd=build.tools, env=env, check=True, timeout=5400)
        for comp in build.components:
            os.replace(tmp / COMPONENTS[comp][2], binary(comp, build.stack))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    (BIN / build.stamp).write_text(fingerprint(go, build) + "\n")
    dt = time.monotonic() - t0
    if build.stack == "newest":
        (BIN / ".build-seconds").write_text(f"{dt:.0f}\n")
    log(f"build: {build.stack} stack done in {dt:.0f} s -> {BIN}")


# Components built inside their own module directory: their go.mod resolves a module graph other
# than tools/go.mod's (Kyverno has a replace directive and is on k8s.io v0.35; Kueue requires
# Trainer v2.2.1 and k8s.io v0.36.2), so neither a `require` in tools/go.mod nor `go install
# mod@ver` would build what they release.  The proxy here serves no checksum-database entry for
# them, so each download is pinned by its go.sum hash instead, as DATA_MODULES are; their
# dependencies are verified by their own go.sum.  Cached under bin/ by version.
#   cpus / nice  how hard the build may use the machine (the test tier may run beside it)
#   edits        {file in the module: (text, replacement)}, applied to a copy of the module made
#                for the build; each text must occur exactly once
#   bench_only   `build` and `make test` never build it (bench/cluster.py --peers does)
#   stack        the stack that runs it (default newest); name: the bin/ name when the key is not it
KUEUE_METRICS_EDIT = {"cmd/kueue/main.go": ('metricsCertPath := "/etc/kueue/metrics/certs"',
                                            'metricsCertPath := os.Getenv("KUEUE_METRICS_CERT_DIR")')}
OWN_MODULES = {
    "kueue": {
        "module": "sigs.k8s.io/kueue", "version": "v0.19.0",
        "sum": "h1:5yCu85qsJhvUVVxE0Csw546DDBcRwUXpBEOmEFlws34=", "main": "./cmd/kueue",
        "ldflags": "-X=sigs.k8s.io/kueue/pkg/version.GitVersion=v0.19.0", "cpus": 2, "nice": 5,
        # Without internal cert management the manager reads its metrics serving cert from a fixed
        # /etc/kueue/metrics/certs (cmd/kueue/main.go) and exits when it is missing; the one edit
        # takes that directory from $KUEUE_METRICS_CERT_DIR so nothing outside run/ is written.
        "edits": KUEUE_METRICS_EDIT,
    },
    # The oldest stack (OLDEST): Trainer v2.2.0, the JobSet its go.mod pins (v0.11.1: it cannot join
    # Trainer's module graph, whose controller-runtime v0.23 changed the webhook builder JobSet v0.11
    # calls, and Trainer's go.sum lacks what JobSet's main imports) and Kueue v0.14.0, with the same
    # edit as v0.19.0's (its main.go has the line). At nice 19: cmd_test builds them beside the
    # newest stack's tests.
    "trainer-v2.2": {
        "module": "github.com/kubeflow/trainer/v2", "version": OLDEST["trainer"], "name": "trainer-controller-manager",
        "sum": "h1:whChZckEtycLo1UKH/M0hiNaCUozbLvf9JrgmMv+TAg=", "main": "./cmd/trainer-controller-manager",
        "cpus": 2, "nice": 19, "stack": "oldest",
    },
    "jobset-v0.11": {
        "module": "sigs.k8s.io/jobset", "version": OLDEST["jobset"], "name": "jobset",
        "sum": "h1:WgLEBnXTeX+4MxfVkIbfm4jIVgjvIY6Jfaei2okxKNk=", "main": ".",
        "ldflags": f"-X=sigs.k8s.io/jobset/pkg/version.GitVersion={OLDEST['jobset']}",
        "cpus": 2, "nice": 19, "stack": "oldest",
    },
    "kueue-v0.14": {
        "module": "sigs.k8s.io/kueue", "version": OLDEST["kueue"], "name": "kueue",
        "sum": "h1:lDR34L42/k17opLfkZbZ+taymLaPpryj3ZBbvKqs/N4=", "main": "./cmd/kueue",
        "ldflags": f"-X=sigs.k8s.io/kueue/pkg/version.GitVersion={OLDEST['kueue']}", "cpus": 2, "nice": 19,
        "edits": KUEUE_METRICS_EDIT, "stack": "oldest",
    },
    # The real node (realnode.py); built only where it can run (realnode.unsupported_reason()).
    "containerd": {
        "module": "github.com/containerd/containerd/v2", "version": "v2.2.9",
        "sum": "h1:ddw9THGOXhcKnHORjkKoXtazPjwtcPwmqk8AVyRpfZw=",
        "mains": ["./cmd/containerd", "./cmd/ctr", "./cmd/containerd-shim-runc-v2"],
        "ldflags": "-X=github.com/containerd/containerd/v2/version.Version=v2.2.9",
        "cpus": 2, "nice": 5, "real_node": True,
    },
    "coredns": {
        "module": "github.com/coredns/coredns", "version": "v1.15.0",
        "sum": "h1:OBT+OEyHVdUiVxPhrNlC5XZVq3RkSxzQXfZQ76gm5ck=", "main": ".",
        "ldflags": "-X=github.com/coredns/coredns/coremain.GitCommit=v1.15.0", "cpus": 2, "nice": 5,
        "real_node": True,
        # only the plugins realnode.corefile() uses: coredns.go imports all ~60 (cloud SDKs among
        # them), which costs 130 s more CPU to build
        "edits": {"coredns.go": ('_ "github.com/coredns/coredns/core/plugin" // Plug in CoreDNS.',
                                 "\n\t".join(f'_ "github.com/coredns/coredns/plugin/{p}"' for p in (
                                     "bind", "cache", "errors", "forward", "health", "kubernetes",
                                     "log", "loop", "ready", "reload")))},
    },
    "kube-router": {  # NetworkPolicy enforcement only; v1.6.1 is the newest release the proxy serves
        "module": "github.com/cloudnativelabs/kube-router", "version": "v1.6.1",
        "sum": "h1:b+DzpRig0UyZN/EOEWejai3VCiG3z3Lm4vfNYLv102Q=", "main": "./cmd/kube-router",
        "ldflags": "-X=github.com/cloudnativelabs/kube-router/pkg/version.Version=v1.6.1 "
                   "-X=github.com/cloudnativelabs/kube-router/pkg/version.BuildDate=1970-01-01T00:00:00Z",
        "cpus": 2, "nice": 5, "real_node": True,
    },
    "kyverno": {
        "module": "github.com/kyverno/kyverno", "version": "v1.17.0",
        "sum": "h1:QaM5dRtMgGjBYFf4bbyP+li5ND4j8lvCNOCc8ayHTXU=", "main": "./cmd/kyverno",
        "cpus": 1, "nice": 10, "bench_only": True,
    },
}


CLUSTER_OWN_MODULES = [n for n, spec in OWN_MODULES.items() if not spec.get("bench_only")]


def wanted_own_modules(stack: str | None = None) -> list[str]:
    """The modules `build` and `up` need here for ``stack``: the real node's only where it can run."""
    stack = stack or STACK
    return [n for n in CLUSTER_OWN_MODULES if OWN_MODULES[n].get("stack", "newest") == stack
            and (not OWN_MODULES[n].get("real_node") or realnode.unsupported_reason() is None)]


# The stack's Kueue, by its OWN_MODULES key
KUEUE_MODULE = {"newest": "kueue", "oldest": "kueue-v0.14"}


def own_module_binary(name: str) -> Path:
    """The binary, or for a module with several `mains` the directory holding them by their names."""
    spec = OWN_MODULES[name]
    return BIN / f"{spec.get('name', name)}-{spec['version']}"


def own_module_dir(name: str) -> Path:
    """OWN_MODULES[name] in the Go module cache, downloaded and checked against the pinned hash."""
    spec = OWN_MODULES[name]
    go = find_go()
    if not go:
        return _module_cache_dir(spec["module"], spec["version"])
    env = go_env(go) | {"GONOSUMDB": spec["module"]}
    ref = f"{spec['module']}@{spec['version']}"
    info = json.loads(subprocess.run([go, "mod", "download", "-json", ref], cwd=TOOLS, env=env,
                                     capture_output=True, text=True, timeout=600).stdout or "{}")
    if info.get("Sum") != spec["sum"]:
        raise RuntimeError(f"{ref}: {info.get('Error') or 'hash ' + str(info.get('Sum'))}, pinned {spec['sum']}")
    return Path(info["Dir"])


def _edited_copy(src: Path, edits: dict, tmp: Path) -> Path:
    """The module as built: src itself, or a copy in tmp with the edits applied (Go refuses
    `-overlay` on files in the module cache, and the cache is read-only)."""
    if not edits:
        return src
    dst = tmp / "src"
    shutil.copytree(src, dst)
    for d, _, _ in os.walk(dst):  # the cache's directories are read-only; let rmtree remove the copy
        os.chmod(d, 0o755)
    for rel, (old, new) in edits.items():
        path = dst / rel
        text = path.read_text()
        if text.count(old) != 1:
            raise RuntimeError(f"{src / rel}: expected {old!r} once, found it {text.count(old)} times")
        os.chmod(path, 0o644)
        path.write_text(text.replace(old, new))
    return dst


def build_own_module(name: str) -> Path:
    """Build OWN_MODULES[name] in its module directory (no-op when bin/ has it), at low priority."""
    spec, out = OWN_MODULES[name], own_module_binary(name)
    if out.exists():
        return out
    src = own_module_dir(name)
    BIN.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".build-{name}-", dir=BIN))
    cpus = str(spec["cpus"])
    env = go_env(find_go()) | {"GOMAXPROCS": cpus}
    log(f"build: {spec['module']}@{spec['version']} in its own module ({cpus} CPU, nice {spec['nice']})")
    t0 = time.monotonic()
    try:
        mains = spec.get("mains")
        target = tmp / "out" if mains else tmp / name
        subprocess.run(["nice", "-n", str(spec["nice"]), find_go(), "build", "-p", cpus, "-trimpath",
                        "-ldflags", " ".join(["-s", "-w", spec.get("ldflags", "")]).strip(),
                        "-o", str(target) + ("/" if mains else ""), *(mains or [spec["main"]])],
                       cwd=_edited_copy(src, spec.get("edits", {}), tmp), env=env, check=True, timeout=7200)
        os.replace(target, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"build: {out.name} done in {time.monotonic() - t0:.0f} s")
    return out


# ---------------------------------------------------------------------------------------------
# Module cache: upstream CRDs, webhook manifests and runtimes are read from there at `up`
# ---------------------------------------------------------------------------------------------
def _escape_module_path(mod: str) -> str:
    return "".join("!" + c.lower() if c.isupper() else c for c in mod)


def stack_versions(stack: str | None = None) -> dict:
    """Every pinned version ``stack`` (default: the active one) reads or runs, by MODULES key."""
    stack = stack or STACK
    return VERSIONS | {"kueue": OWN_MODULES[KUEUE_MODULE[stack]]["version"]} | (OLDEST if stack == "oldest" else {})


def module_dir(key: str, stack: str | None = None) -> Path:
    """Directory of MODULES[key] at ``stack``'s version (default: the active stack's) in the Go
    module cache (downloaded if needed)."""
    if key == "kueue":  # built in its own module: downloaded and checked as OWN_MODULES says
        return own_module_dir(KUEUE_MODULE[stack or STACK])
    mod, ver = MODULES[key], stack_versions(stack)[key]
    go = find_go()
    if go:
        out = subprocess.run([go, "mod", "download", "-json", f"{mod}@{ver}"], cwd=TOOLS,
                             env=go_env(go), capture_output=True, text=True, timeout=600)
        if out.returncode == 0:
            info = json.loads(out.stdout)
            d = info.get("Dir")
            if key in DATA_MODULES and info.get("Sum") != DATA_MODULES[key]:
                raise RuntimeError(f"{mod}@{ver} in the module cache has hash {info.get('Sum')}, "
                                   f"pinned {DATA_MODULES[key]} (hack/cluster/cluster.py DATA_MODULES)")
            if d and Path(d).is_dir():
                return Path(d)
    return _module_cache_dir(mod, ver)


def _module_cache_dir(mod: str, ver: str) -> Path:
    """Where the Go module cache keeps mod@ver (for prebuilt binaries run without Go)."""
    cache = os.environ.get("GOMODCACHE") or str(Path(os.environ.get("GOPATH") or Path.home() / "go") / "pkg" / "mod")
    d = Path(cache) / f"{_escape_module_path(mod)}@{ver}"
    if not d.is_dir():
        raise RuntimeError(f"{mod}@{ver} is not in the Go module cache ({d}); run `make cluster-build`")
    return d


def _yaml_docs(path: Path) -> list:
    import yaml
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: 8x faster on the 650 KB MPIJob CRD
    return [d for d in yaml.load_all(path.read_text(), Loader=loader) if d]


def _kustomization(dirpath: Path) -> dict:
    import yaml
    return yaml.safe_load((dirpath / "kustomization.yaml").read_text()) or {}


def _resource_files(dirpath: Path) -> list:
    """Plain files listed under `resources:` of a kustomization (sub-kustomizations skipped)."""
    return [dirpath / r for r in _kustomization(dirpath).get("resources", []) if (dirpath / r).is_file()]


def _json_pointer(doc, pointer: str):
    parts = [p.replace("~1", "/").replace("~0", "~") for p in pointer.lstrip("/").split("/")]
    for part in parts[:-1]:
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc, parts[-1]


def _json_patch(doc, ops: list):
    """The subset of RFC 6902 (add/replace/remove) that upstream kustomize patches use."""
    for op in ops:
        parent, key = _json_pointer(doc, op["path"])
        if isinstance(parent, list):
            idx = len(parent) if key == "-" else int(key)
            if op["op"] == "add":
                parent.insert(idx, op["value"])
            elif op["op"] == "replace":
                parent[idx] = op["value"]
            elif op["op"] == "remove":
                del parent[idx]
        else:
            if op["op"] in ("add", "replace"):
                parent[key] = op["value"]
            elif op["op"] == "remove":
                del parent[key]
    return doc


def upstream_webhooks(dirpath: Path, port: int, ca_pem: bytes, prefix: str) -> list:
    """Webhook configurations of an upstream kustomize dir, rewritten to URL webhooks on loopback.

    The kustomization's JSON6902 patches are applied, then every `clientConfig.service` becomes
    `clientConfig.url: https://127.0.0.1:PORT<path>` with our CA as caBundle.
    """
    import base64
    kinds = {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
    objs = [d for f in _resource_files(dirpath) for d in _yaml_docs(f) if d.get("kind") in kinds]
    originals = [o["metadata"]["name"] for o in objs]
    for patch in _kustomization(dirpath).get("patches", []):
        tgt = patch.get("target") or {}
        if "path" not in patch:
            continue
        ops = _yaml_docs(dirpath / patch["path"])
        ops = ops[0] if len(ops) == 1 and isinstance(ops[0], list) else ops
        if not isinstance(ops, list) or not all(isinstance(o, dict) and "op" in o for o in ops):
            continue  # strategic-merge patches do not occur in the webhook dirs we read
        for obj, orig in zip(objs, originals):
            if tgt.get("kind") == obj["kind"] and tgt.get("name", orig) == orig:
                _json_patch(obj, ops)
    for obj in objs:
        obj["metadata"] = {"name": f"{prefix}-{obj['metadata']['name']}",
                           "labels": {"app.kubernetes.io/managed-by": "trainjob-admission-cluster"}}
        for wh in obj["webhooks"]:
            path = wh["clientConfig"].get("service", {}).get("path", "/")
            wh["clientConfig"] = {"url": f"https://{LOOPBACK}:{port}{path}",
                                  "caBundle": base64.b64encode(ca_pem).decode()}
    return objs


# ---------------------------------------------------------------------------------------------
# PKI: one CA signs the apiserver, the webhooks of JobSet/Trainer and every client identity
# ---------------------------------------------------------------------------------------------
class PKI:
    def __init__(self, root: Path):
        self.root = root
        self.ca_crt = root / "ca.crt"
        self.ca_key = root / "ca.key"

    def create_ca(self, cn: str = "trainjob-admission-test-ca") -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
        self.root.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(hours=1))
                .not_valid_after(now + datetime.timedelta(days=30))
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False,
                                             encipher_only=False, decipher_only=False), critical=True)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
                .sign(key, hashes.SHA256()))
        self._write(self.ca_crt, self.ca_key, cert, key)

    @staticmethod
    def _write(crt: Path, keyp: Path, cert, key) -> None:
        from cryptography.hazmat.primitives import serialization
        crt.parent.mkdir(parents=True, exist_ok=True)
        crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        keyp.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
        os.chmod(keyp, 0o600)

    def issue(self, crt: Path, keyp: Path, cn: str, orgs=(), hosts=(), server=False, client=False):
        """Write a leaf cert/key signed by the CA. hosts: DNS names and IP addresses (SANs)."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
        ca_cert = x509.load_pem_x509_certificate(self.ca_crt.read_bytes())
        ca_key = serialization.load_pem_private_key(self.ca_key.read_bytes(), None)
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
        now = datetime.datetime.now(datetime.timezone.utc)
        usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + \
                 ([ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
        b = (x509.CertificateBuilder().subject_name(x509.Name(attrs)).issuer_name(ca_cert.subject)
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(hours=1))
             .not_valid_after(now + datetime.timedelta(days=30))
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
             .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False,
                                          content_commitment=False, data_encipherment=False,
                                          key_agreement=False, key_cert_sign=False, crl_sign=False,
                                          encipher_only=False, decipher_only=False), critical=True)
             .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
             .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                            critical=False))
        if hosts:
            sans = []
            for h in hosts:
                try:
                    sans.append(x509.IPAddress(ipaddress.ip_address(h)))
                except ValueError:
                    sans.append(x509.DNSName(h))
            b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        self._write(crt, keyp, b.sign(ca_key, hashes.SHA256()), key)
        return crt, keyp

    def service_account_keys(self):
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        key = ec.generate_private_key(ec.SECP256R1())
        (self.root / "sa.key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        (self.root / "sa.pub").write_bytes(key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))


def issue_serving_cert(out_dir, hosts=(LOOPBACK, "localhost"), name: str = "webhook"):
    """Issue a TLS serving cert from the running cluster's CA (for a webhook served on the host).

    Returns (cert_path, key_path, ca_pem_bytes); pass ca_pem_bytes to register_webhook().
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pki = PKI(RUN / "pki")
    pki.issue(out / f"{name}.crt", out / f"{name}.key", cn=name, hosts=hosts, server=True)
    return out / f"{name}.crt", out / f"{name}.key", pki.ca_crt.read_bytes()


def write_kubeconfig(path: Path, server: str, ca_pem: bytes, crt: Path, key: Path, user: str,
                     namespace: str | None = None) -> Path:
    import base64
    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
    ctx = {"cluster": "trainjob-admission", "user": user}
    if namespace:
        ctx["namespace"] = namespace
    cfg = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "trainjob-admission",
                      "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)}}],
        "users": [{"name": user, "user": {"client-certificate-data": b64(crt.read_bytes()),
                                           "client-key-data": b64(key.read_bytes())}}],
        "contexts": [{"name": f"{user}@trainjob-admission", "context": ctx}],
        "current-context": f"{user}@trainjob-admission",
    }
    path.write_text(json.dumps(cfg, indent=1))
    os.chmod(path, 0o600)
    return path


# ---------------------------------------------------------------------------------------------
# Paths of a running cluster
# ---------------------------------------------------------------------------------------------
STATE = RUN / "state.json"
LOCK = HERE / "bin" / ".cluster.lock"
ADMIN_KUBECONFIG = RUN / "admin.kubeconfig"  # kubernetes-admin, group system:masters
USER_A_KUBECONFIG = RUN / "user-a.kubeconfig"  # alice: ClusterRole edit in namespace team-a only
USER_B_KUBECONFIG = RUN / "user-b.kubeconfig"  # bob:   ClusterRole edit in namespace team-b only
CA_CERT = RUN / "pki" / "ca.crt"
# The CA of the client certificate kube-apiserver presents to admission webhooks (a CA of its own,
# so no user's or component's client certificate passes for the API server): `serve --client-ca`.
WEBHOOK_CLIENT_CA = RUN / "pki" / "webhook-clients" / "ca.crt"
WEBHOOK_CLIENT_CN = "kube-apiserver-webhook-client"
KUBECTL = binary("kubectl")


def kubectl(*args, kubeconfig=ADMIN_KUBECONFIG, check=True, input=None, timeout=120):
    """Run the built kubectl v1.36 against the cluster; returns CompletedProcess (text)."""
    cmd = [str(KUBECTL), f"--kubeconfig={kubeconfig}", "--request-timeout=60s", *map(str, args)]
    p = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(map(str, args))} failed ({p.returncode}):\n{p.stderr}{p.stdout}")
    return p


def apply_objects(objs, kubeconfig=ADMIN_KUBECONFIG, server_side=False, timeout=120):
    body = "\n".join(json.dumps(o) for o in objs)
    extra = ["--server-side", "--force-conflicts", "--field-manager=trainjob-admission-cluster"] if server_side else []
    return kubectl("apply", *extra, "-f", "-", kubeconfig=kubeconfig, input=body, timeout=timeout)


def _load_state() -> dict:
    try:
        return json.loads(STATE.read_text())
    except (OSError, ValueError):
        return {}


def _save_state(state: dict) -> None:
    tmp = STATE.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
    os.replace(tmp, STATE)


def _ssl_context(client: bool = True) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(CA_CERT))
    if client:
        ctx.load_cert_chain(str(RUN / "pki" / "admin.crt"), str(RUN / "pki" / "admin.key"))
    return ctx


def _get(url: str, timeout: float = 3.0, ctx=None) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=ctx) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (OSError, ssl.SSLError) as e:
        return 0, str(e)


class ComponentDied(RuntimeError):
    pass


def _wait(what: str, pred, timeout: float, interval: float = 0.25):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = pred()
            if last:
                return last
        except ComponentDied:
            raise
        except Exception as e:  # noqa: BLE001 - keep polling, report the last error
            last = e
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


# ---------------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------------
def _port_in_use(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((LOOPBACK, port)) == 0


def _pick_ports() -> dict:
    ports, taken = {}, set()
    for name, port in DEFAULT_PORTS.items():
        if _port_in_use(port) or port in taken:
            with socket.socket() as s:
                s.bind((LOOPBACK, 0))
                port = s.getsockname()[1]
            log(f"port {DEFAULT_PORTS[name]} ({name}) is busy; using {port}")
        ports[name] = port
        taken.add(port)
    return ports


def _cmdline(pid: int) -> list:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reap if it is our own child
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _is_ours(pid: int, exe: str | None = None) -> bool:
    """A process is ours when it runs one of the binaries in hack/cluster/bin."""
    cmd = _cmdline(pid)
    if not cmd or not cmd[0]:
        return False
    if exe is not None:
        return cmd[0] == exe
    return cmd[0].startswith(str(BIN) + os.sep)


def _stop_pid(pid: int, name: str, timeout: float = 5.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)  # each component leads its own process group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
        deadline = time.monotonic() + (timeout if sig == signal.SIGTERM else 5)
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)
        if not _alive(pid):
            return
        if sig == signal.SIGTERM:
            log(f"{name} (pid {pid}) still running {timeout:.0f} s after SIGTERM; sending SIGKILL")
    raise RuntimeError(f"could not stop {name} (pid {pid})")


def _stray_pids() -> list:
    """PIDs running binaries from hack/cluster/bin (left behind by a crashed run)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid() and _is_ours(int(d.name)):
            out.append(int(d.name))
    return out


def _stop_all(state: dict) -> None:
    procs = state.get("procs", {})
    for name in reversed(list(procs)):
        pid, exe = procs[name]["pid"], procs[name]["exe"]
        if _alive(pid) and _is_ours(pid, exe):
            _stop_pid(pid, name)
    for pid in _stray_pids():
        log(f"stopping stray {_cmdline(pid)[0]} (pid {pid})")
        _stop_pid(pid, "stray")


def _spawn(state: dict, name: str, argv: list, env: dict | None = None) -> None:
    logdir = RUN / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    full_env = dict(os.environ)
    for k in ("KUBECONFIG", "HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
        full_env.pop(k, None)
    full_env["NO_PROXY"] = full_env["no_proxy"] = "127.0.0.1,localhost"
    full_env.update(env or {})
    with open(logdir / f"{name}.log", "ab") as logf:
        p = subprocess.Popen([str(a) for a in argv], stdin=subprocess.DEVNULL, stdout=logf,
                             stderr=subprocess.STDOUT, env=full_env, cwd=str(RUN),
                             start_new_session=True)
    state.setdefault("procs", {})[name] = {"pid": p.pid, "exe": str(argv[0])}
    _save_state(state)


def _check_running(state: dict) -> None:
    for name, p in state.get("procs", {}).items():
        if not _alive(p["pid"]):
            tail = (RUN / "logs" / f"{name}.log").read_text(errors="replace")[-3000:]
            raise ComponentDied(f"{name} exited during start-up; last log lines:\n{tail}")


# ---------------------------------------------------------------------------------------------
# up / down
# ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _locked(timeout: float = 600):
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK, "a+") as f:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError("another cluster.py holds hack/cluster/bin/.cluster.lock")
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def is_up() -> bool:
    """True when run/state.json says up, every process lives and the apiserver is ready."""
    state = _load_state()
    if state.get("status") != "up" or not state.get("webhook_client_ca"):  # no CA: started by an older cluster.py
        return False
    if state.get("stack", "newest") != STACK:  # the other stack is up: `up` stops it and starts this one
        return False
    for p in state.get("procs", {}).values():
        if not (_alive(p["pid"]) and _is_ours(p["pid"], p["exe"])):
            return False
    code, _ = _get(f"https://{LOOPBACK}:{state['ports']['apiserver']}/readyz", ctx=_ssl_context())
    return code == 200


def status() -> dict:
    """The state of the running cluster (ports, pids, kubeconfig paths); {} when down."""
    return _load_state() if is_up() else {}


def _apiserver_url(ports: dict) -> str:
    return f"https://{LOOPBACK}:{ports['apiserver']}"


def _bootstrap_objects() -> list:
    objs = []
    for who in ("kwok-controller", "jobset-controller", "trainer-controller"):
        objs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                     "metadata": {"name": f"tja-test:{who}"},
                     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                 "name": "cluster-admin"},
                     "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": who}]})
    # Let the `edit` role cover the CRDs users of this product touch (aggregated into edit/admin).
    objs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                 "metadata": {"name": "tja-test:trainer-edit",
                              "labels": {"rbac.authorization.k8s.io/aggregate-to-edit": "true",
                                         "rbac.authorization.k8s.io/aggregate-to-admin": "true"}},
                 "rules": [{"apiGroups": ["trainer.kubeflow.org"],
                            "resources": ["trainjobs", "trainingruntimes"],
                            "verbs": ["get", "list", "watch", "create", "update", "patch", "delete",
                                      "deletecollection"]},
                           {"apiGroups": ["trainer.kubeflow.org"], "resources": ["trainjobs/status"],
                            "verbs": ["get"]},
                           {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"],
                            "verbs": ["get", "list", "watch"]}]})
    for ns, user in NAMESPACES.items():
        objs.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        objs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                     "metadata": {"name": f"{user}-edit", "namespace": ns},
                     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                 "name": "edit"},
                     "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})
    # Everyone may read the installed ClusterTrainingRuntimes (cluster-scoped, so not via edit).
    objs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                 "metadata": {"name": "tja-test:runtime-reader"},
                 "rules": [{"apiGroups": ["trainer.kubeflow.org"], "resources": ["clustertrainingruntimes"],
                            "verbs": ["get", "list", "watch"]}]})
    objs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                 "metadata": {"name": "tja-test:runtime-reader"},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                             "name": "tja-test:runtime-reader"},
                 "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                               "name": "system:authenticated"}]})
    return objs


def _node_objects() -> list:
    out = []
    for n in NODES:
        res = node_capacity(n)
        out.append({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": n["name"],
                                 "labels": {"type": "kwok", "kubernetes.io/hostname": n["name"],
                                            "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", **n["labels"]},
                                 "annotations": {"kwok.x-k8s.io/node": "fake"}},
                    "spec": {"taints": n.get("taints", [])},
                    "status": {"capacity": res, "allocatable": res}})
    return out


def _mpi_runtimes(trainer_dir: Path) -> list:
    """The ClusterTrainingRuntimes shipped in the trainer module whose mlPolicy is MPI."""
    rdir = trainer_dir / "manifests" / "base" / "runtimes"
    out = []
    for f in _resource_files(rdir):
        for d in _yaml_docs(f):
            if d.get("kind") == "ClusterTrainingRuntime" and "mpi" in (d.get("spec", {}).get("mlPolicy") or {}):
                out.append(d)
    if not out:
        raise RuntimeError(f"no MPI ClusterTrainingRuntime found under {rdir}")
    return out


def mpijob_crd_file() -> Path:
    """The legacy kubeflow.org/v2beta1 MPIJob CRD from the pinned mpi-operator module."""
    return module_dir("mpi-operator") / "manifests" / "base" / "kubeflow.org_mpijobs.yaml"


def install_mpijob_crd(kubeconfig=ADMIN_KUBECONFIG) -> str:
    """Apply the MPIJob CRD (idempotent; `up` does it too) and wait until it is served."""
    return install_crd(mpijob_crd_file(), kubeconfig)


def install_crd(path: Path, kubeconfig=ADMIN_KUBECONFIG) -> str:
    """Apply the CRD in ``path`` (idempotent) and wait until its group is in discovery."""
    crd = _yaml_docs(path)[0]
    apply_objects([crd], kubeconfig=kubeconfig, server_side=True)
    name, group = crd["metadata"]["name"], crd["spec"]["group"]
    kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{name}", kubeconfig=kubeconfig,
            timeout=90)
    _wait(f"{name} in discovery", lambda: kubectl(
        "api-resources", f"--api-group={group}", "-o", "name", kubeconfig=kubeconfig,
        check=False).stdout.strip(), 60)
    return name


def policyreport_crd_file() -> Path:
    """The wgpolicyk8s.io/v1alpha2 PolicyReport CRD (what `trainjob-admission audit --write-reports`
    writes) from the pinned Kyverno module: the proxy serves no sigs.k8s.io/wg-policy-prototypes."""
    return own_module_dir("kyverno") / "config" / "crds" / "policyreport" / "wgpolicyk8s.io_policyreports.yaml"


# ---------------------------------------------------------------------------------------------
# Kueue: its manager with the TrainJob integration, its CRDs, RBAC and webhooks from its module
# ---------------------------------------------------------------------------------------------
KUEUE_NAMESPACE = "kueue-system"  # the namespace Kueue's configuration names (events only here)
KUEUE_IDENTITY = "kueue-controller"
# Of Kueue's webhooks only those for its own kinds and the TrainJob integration's are registered:
# the others serve integrations this cluster does not enable (batch/Job, Pod, RayJob, ...).
KUEUE_TRAINJOB_WEBHOOKS = ("mtrainjob.kb.io", "vtrainjob.kb.io")
# Kueue's kustomization gives its job webhooks this selector (the namespaces it never manages).
KUEUE_JOB_NAMESPACE_SELECTOR = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                                      "values": ["kube-system", KUEUE_NAMESPACE]}]}


def kueue_webhooks(kueue_dir: Path, port: int, ca_pem: bytes) -> list:
    """Kueue's webhook configurations on loopback, cut to its own kinds and TrainJob."""
    objs = upstream_webhooks(kueue_dir / "config/components/webhook", port, ca_pem, "kueue")
    for obj in objs:
        kept = []
        for wh in obj["webhooks"]:
            if wh["name"] in KUEUE_TRAINJOB_WEBHOOKS:
                kept.append(dict(wh, namespaceSelector=KUEUE_JOB_NAMESPACE_SELECTOR))
            elif {g for r in wh.get("rules", []) for g in r.get("apiGroups", [])} == {"kueue.x-k8s.io"}:
                kept.append(wh)
        obj["webhooks"] = kept
    return objs


def kueue_objects(kueue_dir: Path) -> list:
    """Kueue's namespace and its manager's roles (read from the module: the ClusterRole, and the
    Role on Secrets in Kueue's namespace) bound to KUEUE_IDENTITY."""
    objs: list = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUEUE_NAMESPACE}}]
    for f in ("role.yaml", "manager_secrets_role.yaml"):  # v0.14 has no Role on Secrets
        path = kueue_dir / "config/components/rbac" / f
        for role in _yaml_docs(path) if path.exists() else []:
            name = f"tja-test:kueue-{role['metadata']['name']}"
            meta = {"name": name} | ({"namespace": KUEUE_NAMESPACE} if role["kind"] == "Role" else {})
            role["metadata"] = meta
            objs += [role, {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": f"{role['kind']}Binding",
                            "metadata": meta,
                            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role["kind"], "name": name},
                            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                          "name": KUEUE_IDENTITY}]}]
    return objs


def kueue_crd_files(kueue_dir: Path) -> list:
    """The CRD bases (v1beta2 stored from v0.15; v0.14's serve v1beta1 alone); the conversion-webhook
    patches are left out: nothing here writes the older v1beta1 where v1beta2 is stored."""
    return sorted((kueue_dir / "config/components/crd/bases").glob("*.yaml"))


def kueue_config(ports: dict) -> dict:
    """Kueue's Configuration (v1beta2 from v0.15, v1beta1 before, the same fields here): one
    replica, certificates from our CA, all on loopback."""
    return {
        "apiVersion": f"config.kueue.x-k8s.io/{'v1beta1' if STACK == 'oldest' else 'v1beta2'}", "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"port": ports["kueue-webhook"], "host": LOOPBACK, "certDir": str(RUN / "kueue/certs")},
        "metrics": {"bindAddress": f"{LOOPBACK}:{ports['kueue-metrics']}"},
        "health": {"healthProbeBindAddress": f"{LOOPBACK}:{ports['kueue-health']}"},
        "integrations": {"frameworks": ["trainer.kubeflow.org/trainjob"]},
        # on by default; it serves an aggregated API, which would need an APIService and a Service
        "featureGates": {"VisibilityOnDemand": False},
    }


def _webhook_admission_config() -> Path:
    """kube-apiserver's --admission-control-config-file: both webhook plugins present a client
    certificate (WEBHOOK_CLIENT_CN, from WEBHOOK_CLIENT_CA) to every webhook. The kubeconfig's user
    is "*" because the services under test listen on ports picked per test, and a user is matched
    by the webhook's host:port (k8s.io/apiserver pkg/util/webhook/authentication.go). Trainer's
    and JobSet's webhooks request no client certificate, so Go's TLS client sends them none."""
    pki = PKI(WEBHOOK_CLIENT_CA.parent)
    pki.create_ca("trainjob-admission-test-webhook-client-ca")
    crt, key = pki.issue(pki.root / "kube-apiserver.crt", pki.root / "kube-apiserver.key", WEBHOOK_CLIENT_CN,
                         client=True)
    kubeconfig = RUN / "webhook-admission.kubeconfig"
    kubeconfig.write_text(json.dumps({"apiVersion": "v1", "kind": "Config", "users": [
        {"name": "*", "user": {"client-certificate": str(crt), "client-key": str(key)}}]}, indent=1))
    plugin = {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "WebhookAdmissionConfiguration",
              "kubeConfigFile": str(kubeconfig)}
    config = RUN / "admission-config.json"
    config.write_text(json.dumps({"apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration",
                                  "plugins": [{"name": name, "configuration": plugin} for name in
                                              ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook")]}, indent=1))
    return config


def up(timeout: float = 300) -> dict:
    """Start the whole control plane (no-op when it is already up). Returns the state dict."""
    with _locked():
        if is_up():
            log("up: already running (no-op)")
            return _load_state()
        if not built():
            raise RuntimeError("binaries are not built; run `make cluster-build` first")
        old = _load_state()
        if old or _stray_pids():
            log("up: cleaning a stale run (crashed or half-started)")
            _stop_real_node(old)
            _stop_all(old)
        if (RUN / "realnode").exists():
            realnode.teardown_host(RUN, binary("kube-proxy"), log)
        if RUN.exists():
            shutil.rmtree(RUN)
        RUN.mkdir(parents=True)
        t0 = time.monotonic()
        try:
            state = _start(t0, timeout)
        except BaseException:
            log(f"up: failed; stopping what was started (logs kept in {RUN / 'logs'})")
            with contextlib.suppress(Exception):
                _stop_all(_load_state())
            st = _load_state()
            if st:
                st["status"] = "failed"
                _save_state(st)
            raise
        return state


def _start(t0: float, timeout: float) -> dict:
    deadline = t0 + timeout
    left = lambda: max(5.0, deadline - time.monotonic())  # noqa: E731
    ports = _pick_ports()
    why_not = realnode.unsupported_reason() or ("the oldest stack has none" if STACK == "oldest" else None)
    real_node = why_not is None and os.environ.get("TJA_REAL_NODE", "1") != "0"
    if not real_node:
        log(f"up: no real node ({why_not or 'TJA_REAL_NODE=0'}); its tests will skip")
    state = {"status": "starting", "stack": STACK, "ports": ports, "procs": {},
             "versions": stack_versions() | {n: OWN_MODULES[n]["version"] for n in wanted_own_modules()},
             "real_node_skipped": None if real_node else (why_not or "TJA_REAL_NODE=0"),
             "apiserver": _apiserver_url(ports), "kubectl": str(KUBECTL),
             "kubeconfigs": {"admin": str(ADMIN_KUBECONFIG), "user-a": str(USER_A_KUBECONFIG),
                             "user-b": str(USER_B_KUBECONFIG)},
             "ca": str(CA_CERT), "webhook_client_ca": str(WEBHOOK_CLIENT_CA), "nodes": NODES,
             "namespaces": NAMESPACES}
    _save_state(state)

    # -- certificates and kubeconfigs
    pki = PKI(RUN / "pki")
    pki.create_ca()
    pki.service_account_keys()
    ca_pem = pki.ca_crt.read_bytes()
    server = _apiserver_url(ports)
    pki.issue(RUN / "pki/apiserver.crt", RUN / "pki/apiserver.key", "kube-apiserver", server=True,
              hosts=(LOOPBACK, "localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                     "kubernetes.default.svc.cluster.local",
                     str(next(ipaddress.ip_network(SERVICE_CIDR).hosts()))))
    identities = {
        "admin": ("kubernetes-admin", ["system:masters"], ADMIN_KUBECONFIG, None),
        "user-a": ("alice", [], USER_A_KUBECONFIG, "team-a"),
        "user-b": ("bob", [], USER_B_KUBECONFIG, "team-b"),
        "kube-controller-manager": ("system:kube-controller-manager", [], RUN / "kube-controller-manager.kubeconfig", None),
        "kube-scheduler": ("system:kube-scheduler", [], RUN / "kube-scheduler.kubeconfig", None),
        "kwok": ("kwok-controller", [], RUN / "kwok.kubeconfig", None),
        "jobset": ("jobset-controller", [], RUN / "jobset.kubeconfig", None),
        "trainer": ("trainer-controller", [], RUN / "trainer.kubeconfig", None),
        "kueue": (KUEUE_IDENTITY, [], RUN / "kueue.kubeconfig", None),
    }
    if real_node:  # how the API server authenticates to the kubelet (logs, exec)
        pki.issue(RUN / "pki/kube-apiserver-kubelet-client.crt", RUN / "pki/kube-apiserver-kubelet-client.key",
                  "kube-apiserver-kubelet-client", ["system:masters"], client=True)
    for ident, (cn, orgs, kc, ns) in identities.items():
        crt, key = pki.issue(RUN / f"pki/{ident}.crt", RUN / f"pki/{ident}.key", cn, orgs, client=True)
        write_kubeconfig(kc, server, ca_pem, crt, key, cn, ns)
    pki.issue(RUN / "pki/front-proxy-client.crt", RUN / "pki/front-proxy-client.key", "front-proxy-client",
              client=True)
    admission_config = _webhook_admission_config()
    (RUN / "jobset/certs").mkdir(parents=True)
    pki.issue(RUN / "jobset/certs/tls.crt", RUN / "jobset/certs/tls.key", "jobset-webhook",
              hosts=(LOOPBACK, "localhost"), server=True)
    (RUN / "jobset/metrics-certs").mkdir(parents=True)
    pki.issue(RUN / "jobset/metrics-certs/tls.crt", RUN / "jobset/metrics-certs/tls.key", "jobset-metrics",
              hosts=(LOOPBACK, "localhost"), server=True)
    # controller-runtime's default CertDir is $TMPDIR/k8s-webhook-server/serving-certs
    tdir = RUN / "trainer/tmp/k8s-webhook-server/serving-certs"
    tdir.mkdir(parents=True)
    pki.issue(tdir / "tls.crt", tdir / "tls.key", "trainer-webhook", hosts=(LOOPBACK, "localhost"), server=True)
    for sub, cn in (("certs", "kueue-webhook"), ("metrics-certs", "kueue-metrics")):
        (RUN / "kueue" / sub).mkdir(parents=True)
        pki.issue(RUN / f"kueue/{sub}/tls.crt", RUN / f"kueue/{sub}/tls.key", cn, hosts=(LOOPBACK, "localhost"),
                  server=True)
    log(f"up: certificates and kubeconfigs ready ({time.monotonic() - t0:.1f} s)")

    # -- etcd
    p = ports
    _spawn(state, "etcd", [
        binary("etcd"), "--name=default", f"--data-dir={RUN / 'etcd-data'}",
        f"--listen-client-urls=http://{LOOPBACK}:{p['etcd-client']}",
        f"--advertise-client-urls=http://{LOOPBACK}:{p['etcd-client']}",
        f"--listen-peer-urls=http://{LOOPBACK}:{p['etcd-peer']}",
        f"--initial-advertise-peer-urls=http://{LOOPBACK}:{p['etcd-peer']}",
        f"--initial-cluster=default=http://{LOOPBACK}:{p['etcd-peer']}",
        "--unsafe-no-fsync=true", "--log-level=warn", "--quota-backend-bytes=4294967296"])
    _wait("etcd /health", lambda: (_check_running(state), _get(f"http://{LOOPBACK}:{p['etcd-client']}/health")[0] == 200)[1], left())
    log(f"up: etcd ready ({time.monotonic() - t0:.1f} s)")

    # -- kube-apiserver
    pki_dir = RUN / "pki"
    _spawn(state, "kube-apiserver", [
        binary("kube-apiserver"),
        f"--etcd-servers=http://{LOOPBACK}:{p['etcd-client']}",
        # with the real node its pods reach the API server at the bridge address (kube-proxy takes the
        # `kubernetes` ClusterIP there); without it nothing but loopback listens
        f"--bind-address={'0.0.0.0' if real_node else LOOPBACK}", f"--advertise-address={LOOPBACK}",
        f"--secure-port={p['apiserver']}",
        *(["--enable-aggregator-routing=true",  # webhook Services are called at their endpoints (pod IPs)
           f"--kubelet-client-certificate={pki_dir / 'kube-apiserver-kubelet-client.crt'}",
           f"--kubelet-client-key={pki_dir / 'kube-apiserver-kubelet-client.key'}",
           f"--kubelet-certificate-authority={pki.ca_crt}",
           "--kubelet-preferred-address-types=InternalIP"] if real_node else []),
        f"--cert-dir={RUN / 'apiserver'}",
        f"--tls-cert-file={pki_dir / 'apiserver.crt'}", f"--tls-private-key-file={pki_dir / 'apiserver.key'}",
        f"--client-ca-file={pki.ca_crt}",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NamespaceLifecycle,LimitRanger,ServiceAccount,NodeRestriction,"
        "DefaultTolerationSeconds,PodSecurity,Priority,MutatingAdmissionWebhook,"
        "ValidatingAdmissionWebhook,ResourceQuota",
        f"--admission-control-config-file={admission_config}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki_dir / 'sa.pub'}",
        f"--service-account-signing-key-file={pki_dir / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--endpoint-reconciler-type=none",  # endpoints may not hold loopback addresses
        # front-proxy (aggregation) identity, so the extension-apiserver-authentication CA is complete
        f"--requestheader-client-ca-file={pki.ca_crt}", "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki_dir / 'front-proxy-client.crt'}",
        f"--proxy-client-key-file={pki_dir / 'front-proxy-client.key'}",
        "--allow-privileged=true", "--profiling=false", "--v=1"])
    _wait("kube-apiserver /readyz", lambda: (_check_running(state), _get(f"{server}/readyz", ctx=_ssl_context())[0] == 200)[1], left())
    log(f"up: kube-apiserver ready at {server} ({time.monotonic() - t0:.1f} s)")

    # -- objects that must exist before the controllers start
    apply_objects(_bootstrap_objects())
    apply_objects(_node_objects())
    for n in NODES:  # status is not taken from a create; set capacity explicitly
        res = node_capacity(n)
        kubectl("patch", "node", n["name"], "--subresource=status", "--type=merge",
                "-p", json.dumps({"status": {"capacity": res, "allocatable": res}}))
    jobset_dir, trainer_dir, kueue_dir = module_dir("jobset"), module_dir("trainer"), module_dir("kueue")
    apply_objects(kueue_objects(kueue_dir))
    crd_files = _resource_files(jobset_dir / "config/components/crd/bases") if (
        jobset_dir / "config/components/crd/bases/kustomization.yaml").exists() else sorted(
        (jobset_dir / "config/components/crd/bases").glob("*.yaml"))
    crd_files += _resource_files(trainer_dir / "manifests/base/crds")
    crd_files.append(mpijob_crd_file())
    crd_files += kueue_crd_files(kueue_dir)
    crds = [d for f in crd_files for d in _yaml_docs(f)]
    apply_objects(crds, server_side=True)
    # Trainer's manager stops (no error logged: its setup goroutine exits first) when a kind it
    # watches is not served yet; a busy machine establishes CRDs a second or more after the apply.
    _wait("the upstream CRDs to be established", lambda: kubectl(
        "wait", "--for=condition=Established", "--timeout=5s",
        *[f"crd/{d['metadata']['name']}" for d in crds if d.get("kind") == "CustomResourceDefinition"],
        check=False, timeout=30).returncode == 0, left(), interval=0.5)
    log(f"up: RBAC, namespaces, {len(NODES)} nodes and {len(crd_files)} upstream CRDs applied "
        f"({time.monotonic() - t0:.1f} s)")

    # -- controllers
    _spawn(state, "kube-controller-manager", [
        binary("kube-controller-manager"),
        f"--kubeconfig={RUN / 'kube-controller-manager.kubeconfig'}",
        f"--authentication-kubeconfig={RUN / 'kube-controller-manager.kubeconfig'}",
        f"--authorization-kubeconfig={RUN / 'kube-controller-manager.kubeconfig'}",
        f"--bind-address={LOOPBACK}", f"--secure-port={p['controller-manager']}",
        f"--cert-dir={RUN / 'kube-controller-manager'}",
        "--controllers=*", "--leader-elect=false", "--use-service-account-credentials=true",
        f"--service-account-private-key-file={pki_dir / 'sa.key'}", f"--root-ca-file={pki.ca_crt}",
        f"--cluster-signing-cert-file={pki.ca_crt}", f"--cluster-signing-key-file={pki.ca_key}",
        "--allocate-node-cidrs=false", "--profiling=false", "--v=1"])
    _spawn(state, "kube-scheduler", [
        binary("kube-scheduler"),
        f"--kubeconfig={RUN / 'kube-scheduler.kubeconfig'}",
        f"--authentication-kubeconfig={RUN / 'kube-scheduler.kubeconfig'}",
        f"--authorization-kubeconfig={RUN / 'kube-scheduler.kubeconfig'}",
        f"--bind-address={LOOPBACK}", f"--secure-port={p['scheduler']}",
        f"--cert-dir={RUN / 'kube-scheduler'}", "--leader-elect=false", "--profiling=false", "--v=1"])
    kwok_cfg = RUN / "kwok" / "kwok.yaml"
    kwok_cfg.parent.mkdir(parents=True)
    kwok_cfg.write_text(json.dumps({
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration",
        "options": {"manageNodesWithLabelSelector": "type=kwok", "nodeIP": LOOPBACK,
                    "cidr": "10.244.0.1/16", "serverAddress": f"{LOOPBACK}:{p['kwok']}",
                    "nodeLeaseDurationSeconds": 40, "nodeLeaseParallelism": 4,
                    # the config loader does not default these, so spell them out
                    "podPlayStageParallelism": 4, "nodePlayStageParallelism": 4,
                    "podsOnNodeSyncParallelism": 2, "enablePodsOnNodeSyncListPager": True,
                    "enableDebuggingHandlers": False, "enableProfilingHandler": False,
                    "enableContentionProfiling": False}}) + "\n---\n" + (HERE / "kwok/stages.yaml").read_text())
    _spawn(state, "kwok", [binary("kwok"), f"--kubeconfig={RUN / 'kwok.kubeconfig'}", f"--config={kwok_cfg}"],
           env={"HOME": str(RUN / "kwok")})

    kubectl("wait", "--for=condition=Established", "--timeout=60s",
            *[f"crd/{d['metadata']['name']}" for f in crd_files for d in _yaml_docs(f)], timeout=90)
    # ...and served by discovery, which the controllers read once at start
    _wait("trainer.kubeflow.org, jobset.x-k8s.io and kueue.x-k8s.io in discovery", lambda: all(
        kubectl("api-resources", f"--api-group={g}", "-o", "name", check=False).stdout.strip()
        for g in ("trainer.kubeflow.org", "jobset.x-k8s.io", "kueue.x-k8s.io")), left())
    jobset_cfg = RUN / "jobset" / "config.yaml"
    jobset_cfg.write_text(json.dumps({
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1", "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"port": p["jobset-webhook"], "host": LOOPBACK, "certDir": str(RUN / "jobset/certs")},
        "metrics": {"bindAddress": f"{LOOPBACK}:{p['jobset-metrics']}", "certDir": str(RUN / "jobset/metrics-certs")},
        "health": {"healthProbeBindAddress": f"{LOOPBACK}:{p['jobset-health']}"}}))
    controllers = {"jobset": ([binary("jobset"), f"--config={jobset_cfg}"],
                              {"KUBECONFIG": str(RUN / "jobset.kubeconfig"), "TMPDIR": str(RUN / "jobset")})}
    trainer_cfg = RUN / "trainer" / "config.yaml"
    trainer_cfg.write_text(json.dumps({
        "apiVersion": "config.trainer.kubeflow.org/v1alpha1", "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "certManagement": {"enable": False},
        "webhook": {"port": p["trainer-webhook"], "host": LOOPBACK},
        "metrics": {"bindAddress": f"{LOOPBACK}:{p['trainer-metrics']}", "secureServing": False},
        "health": {"healthProbeBindAddress": f"{LOOPBACK}:{p['trainer-health']}",
                   "readinessEndpointName": "readyz", "livenessEndpointName": "healthz"}}))
    controllers["trainer-controller-manager"] = (
        [binary("trainer-controller-manager"), f"--config={trainer_cfg}"],
        {"KUBECONFIG": str(RUN / "trainer.kubeconfig"), "TMPDIR": str(RUN / "trainer/tmp")})
    kueue_cfg = RUN / "kueue" / "config.yaml"
    kueue_cfg.write_text(json.dumps(kueue_config(p)))
    controllers["kueue"] = ([own_module_binary(KUEUE_MODULE[STACK]), f"--config={kueue_cfg}"],
                            {"KUBECONFIG": str(RUN / "kueue.kubeconfig"),
                             "KUEUE_METRICS_CERT_DIR": str(RUN / "kueue/metrics-certs")})
    for name, (argv, env) in controllers.items():
        _spawn(state, name, argv, env=env)
    restarted: set[str] = set()

    def healthy(url: str, insecure) -> bool:
        try:
            _check_running(state)
        except ComponentDied:
            dead = [n for n in controllers if n not in restarted and not _alive(state["procs"][n]["pid"])]
            if not dead:
                raise
            for n in dead:  # seen once in CI: Trainer's manager stopped 1 s after start, no error logged
                log(f"up: {n} exited during start-up; starting it once more (log: {RUN / 'logs' / n}.log)")
                restarted.add(n)
                _spawn(state, n, controllers[n][0], env=controllers[n][1])
            return False
        return _get(url, ctx=insecure)[0] == 200

    for name, url in (("jobset", f"http://{LOOPBACK}:{p['jobset-health']}/readyz"),
                      ("trainer", f"http://{LOOPBACK}:{p['trainer-health']}/readyz"),
                      ("kueue", f"http://{LOOPBACK}:{p['kueue-health']}/readyz"),
                      ("kube-controller-manager", f"https://{LOOPBACK}:{p['controller-manager']}/healthz"),
                      ("kube-scheduler", f"https://{LOOPBACK}:{p['scheduler']}/healthz")):
        insecure = ssl._create_unverified_context() if url.startswith("https") else None  # self-signed
        _wait(f"{name} {url}", lambda: healthy(url, insecure), left())
    log(f"up: controllers healthy ({time.monotonic() - t0:.1f} s)")

    # -- their admission webhooks, as URL webhooks on loopback with our CA
    hooks = upstream_webhooks(jobset_dir / "config/components/webhook", p["jobset-webhook"], ca_pem, "jobset")
    hooks += upstream_webhooks(trainer_dir / "manifests/base/webhook", p["trainer-webhook"], ca_pem, "trainer")
    hooks += kueue_webhooks(kueue_dir, p["kueue-webhook"], ca_pem)
    apply_objects(hooks)
    runtimes = _mpi_runtimes(trainer_dir)
    _wait("ClusterTrainingRuntimes accepted by the Trainer webhook",
          lambda: apply_objects(runtimes, server_side=True).returncode == 0, left(), interval=1.0)
    state["runtimes"] = [r["metadata"]["name"] for r in runtimes]

    def nodes_ready():
        items = json.loads(kubectl("get", "nodes", "-o", "json").stdout)["items"]
        ok = [n for n in items if any(c["type"] == "Ready" and c["status"] == "True"
                                      for c in n["status"].get("conditions", []))
              and not any(t["key"].startswith("node.kubernetes.io/") for t in n["spec"].get("taints", []))]
        return len([n for n in ok if n["metadata"]["name"] != realnode.REAL_NODE]) == len(NODES)
    _wait("KWOK nodes Ready (without the node controller's not-ready taints)", lambda: (_check_running(state), nodes_ready())[1], left(), interval=0.5)
    if real_node:
        realnode.start(sys.modules[__name__], state, pki, node_images(), left)
    for ns in NAMESPACES:
        _wait(f"serviceaccount default in {ns}",
              lambda: kubectl("get", "sa", "default", "-n", ns, check=False).returncode == 0, left())
    state["status"] = "up"
    state["start_seconds"] = round(time.monotonic() - t0, 1)
    _save_state(state)
    log(f"up: ready in {state['start_seconds']} s  (KUBECONFIG={ADMIN_KUBECONFIG})")
    return state


def node_images() -> dict:
    """name -> (archive, ref) of the real node's images (hack/images/images.py), built if missing."""
    if "trainjob_images" not in sys.modules:
        import importlib.util
        spec = importlib.util.spec_from_file_location("trainjob_images", REPO / "hack" / "images" / "images.py")
        sys.modules["trainjob_images"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["trainjob_images"])
    return sys.modules["trainjob_images"].build_all()


def _stop_real_node(state: dict) -> None:
    """The kubelet first (it would restart what is stopped), then every pod's containers, while
    containerd still runs to stop them."""
    kubelet = state.get("procs", {}).get("kubelet")
    if kubelet and _alive(kubelet["pid"]) and _is_ours(kubelet["pid"], kubelet["exe"]):
        _stop_pid(kubelet["pid"], "kubelet")
    ctd = state.get("procs", {}).get("containerd")
    if ctd and _alive(ctd["pid"]):
        realnode.stop_containers(own_module_binary("containerd") / "ctr", RUN)


def down() -> None:
    """Stop every process `up` started (and strays from hack/cluster/bin); logs stay in run/logs."""
    with _locked():
        state = _load_state()
        _stop_real_node(state)
        _stop_all(state)
        if (RUN / "realnode").exists():
            realnode.teardown_host(RUN, binary("kube-proxy"), log)
        busy = [f"{n}:{port}" for n, port in (state.get("ports") or {}).items() if _port_in_use(port)]
        if state:
            state["status"] = "down"
            _save_state(state)
        if busy:
            raise RuntimeError(f"ports still listening after down: {', '.join(busy)}")
        log("down: all control-plane processes stopped")


# ---------------------------------------------------------------------------------------------
# Registering a webhook that runs on the host (the product under test)
# ---------------------------------------------------------------------------------------------
TRAINJOB_RULES = [
    {"apiGroups": ["trainer.kubeflow.org"], "apiVersions": ["v1alpha1"],
     "operations": ["CREATE", "UPDATE"], "resources": ["trainjobs"], "scope": "Namespaced"},
    {"apiGroups": ["kubeflow.org"], "apiVersions": ["v2beta1"],
     "operations": ["CREATE", "UPDATE"], "resources": ["mpijobs"], "scope": "Namespaced"},
]


def register_webhook(name: str, url: str, ca_bundle_pem: bytes | str, *, mutating: bool = True,
                     validating: bool = True, mutate_path: str = "/mutate",
                     validate_path: str = "/validate", rules: list | None = None,
                     failure_policy: str = "Fail", side_effects: str = "None",
                     timeout_seconds: int = 10, namespace_selector: dict | None = None,
                     object_selector: dict | None = None, reinvocation_policy: str = "Never",
                     match_conditions: list | None = None,
                     kubeconfig=ADMIN_KUBECONFIG, settle_seconds: float = 1.0) -> list:
    """Point the apiserver at a webhook served on the host; returns [(kind, name), ...].

    name            object name of the Mutating/ValidatingWebhookConfiguration (both use it)
    url             https://127.0.0.1:PORT (base; the paths below are appended)
    ca_bundle_pem   PEM of the CA that signed the webhook's serving cert (bytes or str)
    mutating / validating  which configurations to create (mutate_path / validate_path)
    rules           admissionregistration/v1 RuleWithOperations list; default TRAINJOB_RULES:
                    trainer.kubeflow.org/v1alpha1 trainjobs and kubeflow.org/v2beta1 mpijobs,
                    CREATE and UPDATE; the mutating entry gets their CREATE only, as
                    manifests/base/webhooks.yaml registers /mutate (and is not made
                    for rules without CREATE)
    failure_policy  "Fail" or "Ignore";  side_effects "None" or "NoneOnDryRun"
    namespace_selector / object_selector  LabelSelector dicts (default: match everything)
    match_conditions  [{"name", "expression"}] CEL matchConditions (default: none), e.g. to split
                    requests between replicas by the object's name
    settle_seconds  pause after creation so the apiserver's informer has the new config

    The webhook names are "<mutate|validate>.<name>.admission.test". Remove the objects again
    with unregister_webhook(name) (the conftest fixture `register_webhook` does it for you).
    """
    import base64
    if isinstance(ca_bundle_pem, str):
        ca_bundle_pem = ca_bundle_pem.encode()
    if not url.startswith(f"https://{LOOPBACK}:") and not url.startswith("https://localhost:"):
        raise ValueError("webhook url must be https on loopback")
    common = {
        "admissionReviewVersions": ["v1"], "sideEffects": side_effects, "failurePolicy": failure_policy,
        "timeoutSeconds": timeout_seconds, "matchPolicy": "Equivalent",
        "rules": rules if rules is not None else TRAINJOB_RULES,
        "namespaceSelector": namespace_selector or {}, "objectSelector": object_selector or {},
    }
    if match_conditions:
        common["matchConditions"] = match_conditions
    objs = []
    for kind, enabled, path, op in (("MutatingWebhookConfiguration", mutating, mutate_path, "mutate"),
                                    ("ValidatingWebhookConfiguration", validating, validate_path, "validate")):
        if not enabled:
            continue
        wh = dict(common, name=f"{op}.{name}.admission.test",
                  clientConfig={"url": url.rstrip("/") + path,
                                "caBundle": base64.b64encode(ca_bundle_pem).decode()})
        if kind.startswith("Mutating"):
            wh["reinvocationPolicy"] = reinvocation_policy
            wh["rules"] = [{**r, "operations": ["CREATE"]} for r in common["rules"]
                           if {"CREATE", "*"} & set(r["operations"])]
            if not wh["rules"]:
                continue
        objs.append({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
                     "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "trainjob-admission-tests"}},
                     "webhooks": [wh]})
    apply_objects(objs, kubeconfig=kubeconfig)
    if settle_seconds:
        time.sleep(settle_seconds)
    return [(o["kind"], name) for o in objs]


def unregister_webhook(name: str, kubeconfig=ADMIN_KUBECONFIG) -> None:
    """Delete the Mutating/ValidatingWebhookConfiguration called `name` (missing ones are fine)."""
    kubectl("delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration",
            f"--field-selector=metadata.name={name}", "--ignore-not-found", "--wait=true",
            kubeconfig=kubeconfig)


# ---------------------------------------------------------------------------------------------
# Subcommands
# ---------------------------------------------------------------------------------------------
def cmd_up(_args=None) -> int:
    if not built():
        rc = cmd_build()
        if rc:
            return rc
    up()
    return 0


def cmd_down(_args=None) -> int:
    down()
    return 0


def cmd_status(_args=None) -> int:
    st = _load_state()
    if not st:
        print("down (no state)")
        return 1
    running = is_up()
    recorded = st.get("status")
    print("status: up" if running else
          f"status: NOT healthy (state file says {recorded!r}; `up` will clean and restart)"
          if recorded == "up" else f"status: {recorded}")
    for name, p in st.get("procs", {}).items():
        print(f"  {name:28s} pid {p['pid']:>7}  {'alive' if _alive(p['pid']) else 'dead'}")
    for name, port in st.get("ports", {}).items():
        print(f"  port {name:22s} {LOOPBACK}:{port}")
    for k, v in st.get("kubeconfigs", {}).items():
        print(f"  kubeconfig {k:16s} {v}")
    return 0 if running else 1


def cmd_env(_args=None) -> int:
    st = _load_state()
    if not st:
        print("# cluster is down", file=sys.stderr)
        return 1
    print(f"export KUBECONFIG={ADMIN_KUBECONFIG}")
    print(f"export KUBECTL={KUBECTL}")
    print(f"export TJA_APISERVER={st['apiserver']}")
    print(f"export TJA_CLUSTER_CA={CA_CERT}")
    print(f"export TJA_USER_A_KUBECONFIG={USER_A_KUBECONFIG}")
    print(f"export TJA_USER_B_KUBECONFIG={USER_B_KUBECONFIG}")
    return 0


# What each stack runs of tests/cluster: every cluster test on the newest, those marked `oldest`
# (the core end-to-end cases, docs/testing.md "The oldest stack") on the oldest.
STACK_TESTS = {"newest": "cluster", "oldest": "cluster and oldest"}


def cmd_test(args=None) -> int:
    """Both stacks (--stack all, the default): build the newest, build the oldest beside the newest's
    tests (at nice 19, in a process of its own), then test the oldest. One stack: build + up +
    pytest + down (unless it was already up)."""
    which = getattr(args, "stack", None) or "all"
    extra = list(getattr(args, "pytest_args", None) or [])
    if find_go() is None and not built("newest"):
        log("SKIP cluster tier: no Go toolchain found (install Go >= 1.26 or set GO=...); "
            "the control plane is built from Go modules")
        return 0
    if which != "all":
        return _test_stack(which, extra)
    rc = _build_stack("newest")
    if rc:
        return rc
    oldest_log = BIN / ".build-oldest.log"
    with open(oldest_log, "w") as out:  # the oldest stack builds while the newest's tests wait on the API server
        building = subprocess.Popen([sys.executable, __file__, "build", "--stack", "oldest"], stdout=out,
                                    stderr=subprocess.STDOUT, cwd=REPO, env=dict(os.environ, TJA_STACK="oldest"))
    try:
        newest = _test_stack("newest", extra)
    finally:
        built_oldest = building.wait()
    if built_oldest:
        log(f"test: the oldest stack did not build (exit {built_oldest}); last lines of {oldest_log}:\n"
            + oldest_log.read_text(errors="replace")[-3000:])
        return newest or built_oldest
    log(f"test: the oldest stack built beside the newest's tests ({_build_seconds('oldest')})")
    return newest or _test_stack("oldest", extra)


def _build_seconds(stack: str) -> str:
    path = BIN / (".build-seconds" if stack == "newest" else ".build-seconds-oldest")
    return f"{path.read_text().strip()} s" if path.exists() else "cached"


def _test_stack(stack: str, extra: list[str]) -> int:
    """build + up + pytest (the stack's tests) + down, in a process of that stack's own when it is not the active one."""
    if stack != STACK:
        return subprocess.call([sys.executable, __file__, "test", "--stack", stack, *extra], cwd=REPO,
                               env=dict(os.environ, TJA_STACK=stack))
    rc = _build_stack(stack)
    if rc:
        return rc
    was_up = is_up()
    t0 = time.monotonic()
    up()
    log(f"test: the {stack} stack's control plane up in {time.monotonic() - t0:.1f} s")
    try:
        rc = subprocess.call([sys.executable, "-m", "pytest", "tests/cluster", "-m", STACK_TESTS[stack], *extra],
                             cwd=REPO, env=dict(os.environ, TJA_STACK=stack))
        if rc == 5:
            log("test: no cluster tests collected: a lost marker or filter, not a pass")
        return rc
    finally:
        if not was_up:
            down()


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("up", "down", "status", "env"):
        sub.add_parser(name)
    sub.add_parser("gomod").add_argument("--stack", choices=STACKS, default="newest")
    sub.add_parser("build").add_argument("--stack", choices=(*STACKS, "all"))
    t = sub.add_parser("test")
    t.add_argument("--stack", choices=(*STACKS, "all"), default="all")
    t.add_argument("pytest_args", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    if args.cmd in ("status", "env"):  # read-only: fine to die quietly when piped into `head`
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    return globals()[f"cmd_{args.cmd}"](args)


if __name__ == "__main__":
    sys.exit(main())
