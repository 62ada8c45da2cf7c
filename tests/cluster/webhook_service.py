"""The product as a user runs it: `trainjob-admission serve --kubeconfig` on the host, registered
with the test control plane as its admission webhook.

Black box on purpose: the service is a subprocess started from the installed console script, it
reads runtimes, namespaces, quotas and PolicyBundles from the API itself, and the tests see it
only through the API server (kubectl, the Kubeflow SDK), its decision log and its HTTP endpoints.

    svc = start_service(workdir, kubeconfig, (crt, key, ca_pem), namespaces=["ns1"], args=("--bundle-selector", "x=y"))
    register(svc, "e2e-abc", namespaces=["ns1"])   # Mutating + Validating configurations
    ...
    unregister("e2e-abc"); svc.stop()
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _cluster_module():
    """hack/cluster/cluster.py, shared with conftest (which registers it as trainjob_cluster)."""
    if "trainjob_cluster" not in sys.modules:
        spec = importlib.util.spec_from_file_location("trainjob_cluster", REPO / "hack" / "cluster" / "cluster.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["trainjob_cluster"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["trainjob_cluster"]


cluster = _cluster_module()
CLI = Path(sys.executable).parent / "trainjob-admission"
LOOPBACK = "127.0.0.1"
# Rules for both kinds the service reviews (cluster.TRAINJOB_RULES: TrainJob + v2beta1 MPIJob).
RULES = cluster.TRAINJOB_RULES


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


@dataclass
class WebhookService:
    url: str
    ca_pem: bytes
    decision_log: Path
    stdout_path: Path
    stderr_path: Path
    proc: subprocess.Popen
    _ctx: ssl.SSLContext = field(repr=False, default=None)

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        """GET an endpoint of the service over TLS, verified against its CA."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout, context=self._ctx) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")
        except OSError as e:
            return 0, str(e)

    def records(self) -> list[dict]:
        """Decision-log records written so far (the file sink, rotated files not included)."""
        if not self.decision_log.exists():
            return []
        return [json.loads(line) for line in self.decision_log.read_text().splitlines() if line.strip()]

    def output(self) -> str:
        """The tail of the service's stderr, for failure messages."""
        return self.stderr_path.read_text(errors="replace")[-4000:] if self.stderr_path.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_service(workdir: Path, kubeconfig: Path, cert: tuple[Path, Path, bytes], *, namespaces: list[str],
                  args: tuple[str, ...] = (), ready_timeout: float = 60.0) -> WebhookService:
    """Start `trainjob-admission serve` on a free loopback port; return once /readyz says 200.

    cert is (cert_path, key_path, ca_pem) as the conftest `serving_cert` fixture returns it;
    namespaces are the test's own: the service injects, adopts and deletes objects only there
    (`--reconcile-namespace`), never in another test's namespace on the shared cluster;
    args are extra serve flags (bundle, bundle selector, failure mode, ...).
    """
    assert namespaces, "a service on the shared cluster must be limited to the test's namespaces"
    cert_dir = workdir / "tls"
    cert_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(cert[0], cert_dir / "tls.crt")
    shutil.copyfile(cert[1], cert_dir / "tls.key")
    os.chmod(cert_dir / "tls.key", 0o600)
    port = free_port()
    log = workdir / "decisions.jsonl"
    out, err = workdir / "serve.stdout", workdir / "serve.stderr"
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "HTTPS_PROXY", "https_proxy")}
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    argv = [str(CLI), "serve", "--kubeconfig", str(kubeconfig), "--cert-dir", str(cert_dir),
            "--host", LOOPBACK, "--port", str(port), "--decision-log", str(log),
            *(flag for ns in namespaces for flag in ("--reconcile-namespace", ns)), *args]
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=o, stderr=e, cwd=workdir, env=env)
    svc = WebhookService(url=f"https://{LOOPBACK}:{port}", ca_pem=cert[2], decision_log=log,
                         stdout_path=out, stderr_path=err, proc=proc,
                         _ctx=ssl.create_default_context(cadata=cert[2].decode()))
    deadline = time.monotonic() + ready_timeout
    code, body = 0, ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"trainjob-admission serve exited ({proc.returncode}):\n{svc.output()}")
        code, body = svc.get("/readyz", timeout=2.0)
        if code == 200:
            return svc
        time.sleep(0.2)
    svc.stop()
    raise TimeoutError(f"serve not ready after {ready_timeout:.0f} s (last /readyz: {code} {body!r}):\n"
                       f"{svc.output()}")


def register(svc: WebhookService, name: str, namespaces: list[str], *, timeout_seconds: int = 10,
             failure_policy: str = "Fail") -> list:
    """Register the service for TrainJobs and MPIJobs (CREATE, UPDATE) in `namespaces` only."""
    selector = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In",
                                      "values": sorted(namespaces)}]}
    return cluster.register_webhook(name, svc.url, svc.ca_pem, rules=RULES, side_effects="NoneOnDryRun",
                                    failure_policy=failure_policy, timeout_seconds=timeout_seconds,
                                    namespace_selector=selector)


def unregister(name: str) -> None:
    cluster.unregister_webhook(name)


SERVICE_ROLES = ("trainjob-admission-reader", "trainjob-admission-injector")  # manifests/base/rbac.yaml


def service_kubeconfig(workdir: Path, user: str) -> tuple[Path, list[str]]:
    """A kubeconfig for `user` holding only the service's ClusterRoles from manifests/base/rbac.yaml.

    Returns (kubeconfig, names of the ClusterRoleBindings made for it; delete them afterwards).
    The roles are applied from the manifests, so the test proves those permissions are enough.
    """
    import yaml

    docs = yaml.safe_load_all((REPO / "manifests" / "base" / "rbac.yaml").read_text())
    roles = [d for d in docs if d and d["kind"] == "ClusterRole" and d["metadata"]["name"] in SERVICE_ROLES]
    assert {r["metadata"]["name"] for r in roles} == set(SERVICE_ROLES), "service ClusterRoles not in rbac.yaml"
    bindings = [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                 "metadata": {"name": f"{user}:{role}", "labels": {"app.kubernetes.io/managed-by": "trainjob-admission-tests"}},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                 "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}
                for role in SERVICE_ROLES]
    cluster.apply_objects(roles, server_side=True)
    cluster.apply_objects(bindings)
    pki = cluster.PKI(cluster.RUN / "pki")
    crt, key = pki.issue(workdir / f"{user}.crt", workdir / f"{user}.key", user, client=True)
    kubeconfig = cluster.write_kubeconfig(workdir / f"{user}.kubeconfig", cluster.status()["apiserver"],
                                          pki.ca_crt.read_bytes(), crt, key, user)
    return kubeconfig, [b["metadata"]["name"] for b in bindings]


def delete_bindings(names: list[str]) -> None:
    if names:
        cluster.kubectl("delete", "clusterrolebinding", *names, "--ignore-not-found", check=False)
