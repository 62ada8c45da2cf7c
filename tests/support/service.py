"""The product as a user runs it on the test control plane: `trainjob-admission serve --kubeconfig`
on the host, registered with the API server as its admission webhook.

Black box on purpose: the service is a subprocess (``serve.Serve``), it reads runtimes, namespaces,
quotas and PolicyBundles from the API itself, and the tests see it only through the API server
(kubectl, the Kubeflow SDK), its decision log and its HTTP endpoints.

    svc = start_service(workdir, kubeconfig, (crt, key, ca_pem), namespaces=["ns1"], args=("--bundle-selector", "x=y"))
    register(svc, "e2e-abc", namespaces=["ns1"])   # Mutating + Validating configurations
    ...
    unregister("e2e-abc"); svc.stop()

``cluster`` is hack/cluster/cluster.py, loaded once as the module ``trainjob_cluster`` (the cluster
tier's conftest uses the same one).
"""
from __future__ import annotations

import atexit
import base64
import contextlib
import importlib.util
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Iterator

from .serve import Serve

REPO = Path(__file__).resolve().parents[2]


def _cluster_module():
    if "trainjob_cluster" not in sys.modules:
        spec = importlib.util.spec_from_file_location("trainjob_cluster", REPO / "hack" / "cluster" / "cluster.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["trainjob_cluster"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["trainjob_cluster"]


cluster = _cluster_module()


def ensure_cluster() -> None:
    """The control plane up, for a bench: built and started if it is not (SystemExit if it cannot be),
    and then stopped when the bench exits: one left running holds the real node's ports, so the
    next cluster tier (another checkout's, CI's) could not start its own."""
    if cluster.is_up():
        return
    if cluster.find_go() is None and not cluster.built():
        raise SystemExit("no Go toolchain to build the control plane (set GO= or PATH)")
    if cluster.cmd_build() != 0:
        raise SystemExit("building the control plane failed")
    atexit.register(cluster.down)
    cluster.up()


# Rules for both kinds the service reviews (cluster.TRAINJOB_RULES: TrainJob + v2beta1 MPIJob).
RULES = cluster.TRAINJOB_RULES


def cert_dir(crt: Path, key: Path, directory: Path) -> Path:
    """Copy a serving pair into ``directory`` as tls.crt and tls.key, the layout `serve --cert-dir` reads."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(crt, directory / "tls.crt")
    shutil.copyfile(key, directory / "tls.key")
    os.chmod(directory / "tls.key", 0o600)
    return directory


def start_service(workdir: Path, kubeconfig: Path, cert: tuple[Path, Path, bytes], *, namespaces: list[str],
                  args: tuple[str, ...] = (), ready_timeout: float = 60.0) -> Serve:
    """Start `trainjob-admission serve --kubeconfig --client-ca` on a free loopback port; return once
    /readyz says 200.

    Like the API server (cluster.WEBHOOK_CLIENT_CA), the returned Serve's ``call`` presents a
    client certificate from the client CA; anyone else is refused in the TLS handshake.

    cert is (cert_path, key_path, ca_pem) as the conftest `serving_cert` fixture returns it;
    namespaces are the test's own: the service injects, adopts and deletes objects only there
    (`--reconcile-namespace`), never in another test's namespace on the shared cluster;
    args are extra serve flags (bundle, bundle selector, failure mode, ...).
    """
    assert namespaces, "a service on the shared cluster must be limited to the test's namespaces"
    client = cluster.PKI(cluster.WEBHOOK_CLIENT_CA.parent).issue(
        workdir / "test-client.crt", workdir / "test-client.key", "trainjob-admission-tests", client=True)
    return Serve(workdir, cert_dir(cert[0], cert[1], workdir / "tls"), cert[2], "--kubeconfig", str(kubeconfig),
                 "--client-ca", str(cluster.WEBHOOK_CLIENT_CA),
                 *(flag for ns in namespaces for flag in ("--reconcile-namespace", ns)), *args,
                 timeout=ready_timeout, keep_stdout=True, client_cert=client)


def register(svc: Serve, name: str, namespaces: list[str], *, timeout_seconds: int = 10,
             failure_policy: str = "Fail", condition: str | None = None) -> list:
    """Register the service for TrainJobs and MPIJobs in `namespaces` only: CREATE (mutating and
    validating) and UPDATE (validating), as the install does, and DELETE through the entry
    manifests/base/webhooks.yaml has for it (configuration `<name>-deletions`); ``condition``: a CEL
    matchCondition the CREATE and UPDATE requests must meet too (replicas splitting the requests)."""
    selector = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In",
                                      "values": sorted(namespaces)}]}
    made = cluster.register_webhook(name, svc.url, svc.ca_pem, rules=RULES, side_effects="NoneOnDryRun",
                                    failure_policy=failure_policy, timeout_seconds=timeout_seconds,
                                    namespace_selector=selector, settle_seconds=0,
                                    match_conditions=[{"name": "replica", "expression": condition}] if condition else None)
    deletions = {**deletion_webhook(), "name": f"audit-delete.{name}.admission.test", "namespaceSelector": selector,
                 "clientConfig": {"url": svc.url + "/validate", "caBundle": base64.b64encode(svc.ca_pem).decode()}}
    cluster.apply_objects([{"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
                            "metadata": {"name": f"{name}-deletions",
                                         "labels": {"app.kubernetes.io/managed-by": "trainjob-admission-tests"}},
                            "webhooks": [deletions]}])
    time.sleep(1.0)  # the API server picks up new webhook configurations asynchronously
    return [*made, ("ValidatingWebhookConfiguration", f"{name}-deletions")]


def deletion_webhook() -> dict:
    """The entry of manifests/base/webhooks.yaml that records deletions."""
    import yaml

    documents = yaml.safe_load_all((REPO / "manifests" / "base" / "webhooks.yaml").read_text())
    validating = next(d for d in documents if d["kind"] == "ValidatingWebhookConfiguration")
    return next(hook for hook in validating["webhooks"] if hook["rules"][0]["operations"] == ["DELETE"])


def unregister(name: str) -> None:
    cluster.unregister_webhook(name)
    cluster.kubectl("delete", "validatingwebhookconfiguration", f"{name}-deletions", "--ignore-not-found",
                    "--wait=true", check=False)


READER, INJECTOR = "trainjob-admission-reader", "trainjob-admission-injector"  # manifests/base/rbac.yaml


def service_kubeconfig(workdir: Path, user: str, namespaces: list[str]) -> tuple[Path, list[str]]:
    """A kubeconfig for `user` holding only the service's roles from manifests/base/rbac.yaml, bound
    as the install binds them: the reader cluster-wide, the injector by a RoleBinding in each of
    `namespaces` only (components/injection-namespaces).

    Returns (kubeconfig, names of the ClusterRoleBindings made for it; delete them afterwards; the
    RoleBindings go with their namespaces). The roles are applied from the manifests, so the test
    proves those permissions, so bound, are enough.
    """
    import yaml

    docs = yaml.safe_load_all((REPO / "manifests" / "base" / "rbac.yaml").read_text())
    roles = [d for d in docs if d and d["kind"] == "ClusterRole" and d["metadata"]["name"] in (READER, INJECTOR)]
    assert {r["metadata"]["name"] for r in roles} == {READER, INJECTOR}, "service ClusterRoles not in rbac.yaml"
    labels = {"app.kubernetes.io/managed-by": "trainjob-admission-tests"}
    subjects = [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]

    def ref(role: str) -> dict:
        return {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role}

    reader = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
              "metadata": {"name": f"{user}:{READER}", "labels": labels}, "roleRef": ref(READER), "subjects": subjects}
    injectors = [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                  "metadata": {"name": f"{user}:{INJECTOR}", "namespace": ns, "labels": labels},
                  "roleRef": ref(INJECTOR), "subjects": subjects} for ns in namespaces]
    cluster.apply_objects(roles, server_side=True)
    cluster.apply_objects([reader, *injectors])
    pki = cluster.PKI(cluster.RUN / "pki")
    crt, key = pki.issue(workdir / f"{user}.crt", workdir / f"{user}.key", user, client=True)
    kubeconfig = cluster.write_kubeconfig(workdir / f"{user}.kubeconfig", cluster.status()["apiserver"],
                                          pki.ca_crt.read_bytes(), crt, key, user)
    return kubeconfig, [reader["metadata"]["name"]]


def delete_bindings(names: list[str]) -> None:
    if names:
        cluster.kubectl("delete", "clusterrolebinding", *names, "--ignore-not-found", check=False)


@contextlib.contextmanager
def service_as_installed(workdir: Path, name: str, namespaces: list[str], selector: str) -> Iterator[Serve]:
    """The service as the install runs it, for one test module: its own user holding only the
    manifests' roles (service_kubeconfig), serving the PolicyBundles labelled ``selector``,
    registered as webhook ``name`` for ``namespaces``; unregistered, stopped and unbound after."""
    with replicas_as_installed(workdir, name, namespaces, selector, [None]) as (svc,):
        yield svc


@contextlib.contextmanager
def replicas_as_installed(workdir: Path, name: str, namespaces: list[str], selector: str,
                          conditions: list[str | None]) -> Iterator[list[Serve]]:
    """One replica of the service as installed (see service_as_installed: one user, the manifests'
    roles) per entry of ``conditions``, each in its own process and registered as its own webhook
    whose CEL matchCondition is that entry (None: every request), so the API server splits the
    requests between the replicas as a Service would. Webhook ``name`` for a single replica,
    ``name-<i>`` for several."""
    replicas: list[Serve] = []
    hooks = [name] if len(conditions) == 1 else [f"{name}-{i}" for i in range(len(conditions))]
    bindings: list[str] = []
    try:
        kubeconfig, bindings = service_kubeconfig(workdir, f"{name}-webhook", namespaces)
        cert = cluster.issue_serving_cert(workdir / "certs", name=name)
        for hook, condition in zip(hooks, conditions):
            own = workdir / hook if len(hooks) > 1 else workdir
            own.mkdir(exist_ok=True)
            replicas.append(start_service(own, kubeconfig, cert, namespaces=namespaces,
                                          args=("--bundle-selector", selector)))
            register(replicas[-1], hook, namespaces, condition=condition)
        yield replicas
    finally:
        for hook in hooks:
            unregister(hook)
        for svc in replicas:
            svc.stop()
        delete_bindings(bindings)


def default_bundle_for(namespace: str, label: str, run: str) -> dict:
    """The default bundle as a PolicyBundle named after ``namespace`` that matches only it,
    labelled ``label: run`` for the service's --bundle-selector; the caller adjusts its spec."""
    import yaml

    doc = yaml.safe_load((REPO / "policies/bundle/builtin/default.yaml").read_text())
    doc["metadata"] = {"name": namespace, "labels": {label: run}}
    doc["spec"]["match"] = {"namespaces": [namespace]}
    return doc


@contextlib.contextmanager
def scratch_namespace(prefix: str, label: str) -> Iterator[tuple[str, str]]:
    """(namespace, run) for one test module: a namespace ``<prefix>-<run>`` labelled ``label: run``,
    deleted on exit with the PolicyBundle of its name (default_bundle_for)."""
    import uuid

    run = uuid.uuid4().hex[:8]
    namespace = f"{prefix}-{run}"
    try:
        cluster.apply_objects([{"apiVersion": "v1", "kind": "Namespace",
                                "metadata": {"name": namespace, "labels": {label: run}}}])
        yield namespace, run
    finally:
        for kind in ("policybundle", "namespace"):
            cluster.kubectl("delete", kind, namespace, "--ignore-not-found", "--wait=false", check=False)
