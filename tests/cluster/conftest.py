"""Fixtures for the cluster tier: a real control plane from hack/cluster/cluster.py.

Session:
  control_plane       -> ControlPlane (starts the cluster once, building it if needed; stops it
                         at session end unless it was already up before the session)
  admin_kubeconfig    -> Path  (kubernetes-admin, system:masters)
  user_a_kubeconfig   -> Path  (alice: ClusterRole `edit` in namespace team-a only)
  user_b_kubeconfig   -> Path  (bob:   ClusterRole `edit` in namespace team-b only)
  kubectl             -> kubectl(*args, kubeconfig=admin, check=True, input=None, timeout=120)
                         runs the built kubectl v1.36 and returns subprocess.CompletedProcess
  cluster_ca_pem      -> bytes (the CA behind the apiserver and every cert issued here)
Function:
  namespace           -> str, a fresh namespace `t-<hex>` deleted after the test
  register_webhook    -> register_webhook(name, url, ca_bundle_pem, **kw); every configuration
                         it created is removed after the test (see cluster.register_webhook)
  serving_cert        -> serving_cert(name="webhook") -> (cert_path, key_path, ca_pem) issued by
                         the cluster CA for 127.0.0.1/localhost, in the test's tmp_path
  policybundle_crd    -> str, the PolicyBundle CRD applied from manifests/base and Established
Helpers (session): get_json(*args, kubeconfig=None) -> dict, wait_for(what, pred, timeout=120)

Tests are marked @pytest.mark.cluster; those marked @pytest.mark.oldest run on the oldest stack too
(TJA_STACK=oldest: cluster.py test runs them there), where the others are skipped. Without a Go
toolchain (and no prebuilt binaries) every test using control_plane is skipped with the reason printed.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.service import REPO, cluster  # hack/cluster/cluster.py, loaded once


def pytest_collection_modifyitems(items):
    """On the oldest stack only the core cases marked `oldest` run: the others need what only the
    newest stack has (the real node, Kueue v1beta2, Kyverno) or add nothing a second time."""
    if cluster.STACK != "oldest":
        return
    skip = pytest.mark.skip(reason="not a core case of the oldest stack (mark it `oldest` to run it there)")
    for item in items:
        if "oldest" not in item.keywords:
            item.add_marker(skip)


@dataclass(frozen=True)
class ControlPlane:
    apiserver: str  # https://127.0.0.1:PORT
    admin_kubeconfig: Path
    user_a_kubeconfig: Path
    user_b_kubeconfig: Path
    kubectl_path: Path
    ca_cert: Path
    ports: dict  # name -> port, see cluster.DEFAULT_PORTS
    nodes: list  # [{"name": "kwok-node-0", "cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "8", ...}]
    runtimes: list  # ClusterTrainingRuntime names installed from the trainer module
    module: object  # the cluster module itself (register_webhook, kubectl, ...)
    stack: str = "newest"  # newest | oldest (cluster.STACK)
    versions: dict | None = None  # what it runs, by MODULES key (cluster.stack_versions())


def _kubectl(*args, kubeconfig=None, check=True, input=None, timeout=120):
    return cluster.kubectl(*args, kubeconfig=kubeconfig or cluster.ADMIN_KUBECONFIG, check=check,
                           input=input, timeout=timeout)


@pytest.fixture(scope="session")
def control_plane():
    if cluster.find_go() is None and not cluster.built():
        reason = "cluster tier skipped: no Go toolchain to build the control plane (set GO= or PATH)"
        print(f"\n{reason}", file=sys.stderr)
        pytest.skip(reason)
    was_up = cluster.is_up()
    if not was_up:
        if cluster.cmd_build() != 0:
            pytest.fail("building the control plane failed")
        cluster.up()
    st = cluster.status()
    yield ControlPlane(
        apiserver=st["apiserver"], admin_kubeconfig=cluster.ADMIN_KUBECONFIG,
        user_a_kubeconfig=cluster.USER_A_KUBECONFIG, user_b_kubeconfig=cluster.USER_B_KUBECONFIG,
        kubectl_path=cluster.KUBECTL, ca_cert=cluster.CA_CERT, ports=st["ports"], nodes=st["nodes"],
        runtimes=st.get("runtimes", []), module=cluster, stack=cluster.STACK, versions=cluster.stack_versions())
    if not was_up:
        cluster.down()


@pytest.fixture(scope="session")
def admin_kubeconfig(control_plane) -> Path:
    return control_plane.admin_kubeconfig


@pytest.fixture(scope="session")
def user_a_kubeconfig(control_plane) -> Path:
    return control_plane.user_a_kubeconfig


@pytest.fixture(scope="session")
def user_b_kubeconfig(control_plane) -> Path:
    return control_plane.user_b_kubeconfig


@pytest.fixture(scope="session")
def cluster_ca_pem(control_plane) -> bytes:
    return control_plane.ca_cert.read_bytes()


@pytest.fixture(scope="session")
def kubectl(control_plane):
    """kubectl(*args, kubeconfig=admin, check=True, input=None, timeout=120) -> CompletedProcess."""
    return _kubectl


@pytest.fixture
def namespace(control_plane):
    name = f"t-{uuid.uuid4().hex[:8]}"
    _kubectl("create", "namespace", name)
    deadline = time.monotonic() + 60
    while _kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode != 0:
        if time.monotonic() > deadline:
            raise TimeoutError(f"serviceaccount default never appeared in {name}")
        time.sleep(0.2)
    yield name
    _kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@pytest.fixture
def register_webhook(control_plane):
    """register_webhook(name, url, ca_bundle_pem, **kw) -> [(kind, name)]; removed after the test."""
    names = []

    def _register(name, url, ca_bundle_pem, **kw):
        names.append(name)
        return cluster.register_webhook(name, url, ca_bundle_pem, **kw)

    yield _register
    for name in names:
        cluster.unregister_webhook(name)


@pytest.fixture
def serving_cert(control_plane, tmp_path):
    def _issue(name: str = "webhook", hosts=("127.0.0.1", "localhost")):
        return cluster.issue_serving_cert(tmp_path / "certs", hosts=hosts, name=name)
    return _issue


def _get_json(*args, kubeconfig=None, timeout=120) -> dict:
    """`kubectl get ... -o json` parsed (helper for tests)."""
    return json.loads(_kubectl("get", *args, "-o", "json", kubeconfig=kubeconfig, timeout=timeout).stdout)


def _wait_for(what: str, pred, timeout: float = 120, interval: float = 0.5):
    """Poll pred() until it returns something truthy; raise TimeoutError with the last value."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = pred()
        except subprocess.CalledProcessError as e:  # pragma: no cover - transient
            last = e
        else:
            if last:
                return last
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout} s waiting for {what}; last: {last!r}")


@pytest.fixture(scope="session")
def get_json(control_plane):
    """get_json(*args, kubeconfig=None) -> dict: `kubectl get ARGS -o json`, parsed."""
    return _get_json


@pytest.fixture(scope="session")
def wait_for():
    """wait_for(what, pred, timeout=120, interval=0.5): poll until pred() is truthy, else TimeoutError."""
    return _wait_for


POLICYBUNDLE_CRD = REPO / "manifests" / "base" / "policybundle-crd.yaml"


@pytest.fixture(scope="session")
def policybundle_crd(control_plane) -> str:
    """The product's PolicyBundle CRD, applied (idempotently) and served; left installed, since
    a fresh control plane has none and tests in any order may need it. Returns the CRD name."""
    name = "policybundles.policy.trainjob-admission.io"
    _kubectl("apply", "--server-side", "--force-conflicts", "-f", str(POLICYBUNDLE_CRD))
    _kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{name}")
    return name
