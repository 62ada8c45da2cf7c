"""manifests/: what kustomize renders for base, the overlays and the components, and base
installed on the real control plane.

Rendering is offline (`kubectl kustomize` of the built kubectl v1.36). The install is real but
cannot touch the shared cluster's other users: a test-only kustomization (in tmp_path, over a
copy of manifests/overlays/local-ca) narrows both webhooks' namespaceSelector and the default
bundle's match to a label and a namespace nobody has, and leaves the PolicyBundle CRD alone
(it is applied only when missing and never deleted: other tests' PolicyBundles live in it).
Everything else the install created is deleted afterwards, also when a test fails.
"""
from __future__ import annotations

import base64
import json
import re
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from tests.support.install import (CRD, EXCEPTION_CRD, MANIFESTS, NS, TEST_LABEL, WEBHOOK_KINDS, Installed,
                                   copy_manifests, find, install, kustomize, write_kustomization)

pytestmark = pytest.mark.cluster

cluster = sys.modules["trainjob_cluster"]  # hack/cluster/cluster.py, loaded by conftest
REPO = Path(__file__).resolve().parents[2]
SA = f"system:serviceaccount:{NS}:trainjob-admission"
LEDGER = "trainjob-admission-reservations"  # webhook/admission/ledger.py NAME
MANAGED_BY = ("app.kubernetes.io/managed-by", "trainjob-admission")
NAMESPACED = {"ServiceAccount", "Role", "RoleBinding", "Deployment", "PodDisruptionBudget", "Service",
              "NetworkPolicy", "Secret", "ConfigMap", "ServiceMonitor", "PrometheusRule", "Issuer", "Certificate"}


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def granted(rules: list[dict], group: str, resource: str, verb: str, name: str = "") -> bool:
    """Whether ``rules`` allow ``verb`` (on the object ``name``, else on any: a rule limited to
    names does not grant that)."""
    return any(group in r.get("apiGroups", []) and resource in r.get("resources", []) and verb in r["verbs"]
               and (not r.get("resourceNames") or name in r["resourceNames"]) for r in rules)


def service_rules(docs: list[dict], namespace: str | None = None) -> list[dict]:
    """The rules the service account holds cluster-wide (ClusterRoleBindings), or with
    ``namespace`` those its RoleBindings there add."""
    kind = "RoleBinding" if namespace else "ClusterRoleBinding"
    roles = set()
    for b in docs:
        if b["kind"] == kind and b["metadata"].get("namespace") == namespace and any(
                s["kind"] == "ServiceAccount" and f"system:serviceaccount:{s['namespace']}:{s['name']}" == SA
                for s in b["subjects"]):
            roles.add(b["roleRef"]["name"])
    return [r for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] in roles for r in d["rules"]]


def with_injection_namespaces(tmp_path: Path) -> list[dict]:
    """base plus components/injection-namespaces, as docs/deploy.md installs it."""
    shutil.copytree(MANIFESTS, tmp_path / "manifests", ignore=shutil.ignore_patterns("tls"))
    return kustomize(write_kustomization(tmp_path / "overlay", {
        "resources": ["../manifests/base"], "components": ["../manifests/components/injection-namespaces"]}))


def reconcile_namespaces(docs: list[dict]) -> list[str]:
    args = find(docs, "Deployment", "trainjob-admission")["spec"]["template"]["spec"]["containers"][0]["args"]
    return [args[i + 1] for i, a in enumerate(args) if a == "--reconcile-namespace"]


def metric_names() -> set[str]:
    """Every series name webhook/metrics.py exposes (counter _total, histogram _bucket/_sum/_count)."""
    from trainjob_admission.webhook.metrics import Metrics

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    return {family.name + s for family in Metrics().registry.collect() for s in suffixes[family.type]}


@pytest.fixture(scope="module")
def base() -> list[dict]:
    return kustomize(MANIFESTS / "base")


# ---------------------------------------------------------------------------------------------
# rendering (offline)
# ---------------------------------------------------------------------------------------------
def test_default_bundle_is_the_one_in_policies():
    copy = yaml.safe_load((MANIFESTS / "base" / "policybundle-default.yaml").read_text())
    source = yaml.safe_load((REPO / "policies" / "bundle" / "builtin" / "default.yaml").read_text())
    assert copy == source, ("manifests/base/policybundle-default.yaml differs from policies/bundle/builtin/default.yaml; "
                            "run: cp policies/bundle/builtin/default.yaml manifests/base/policybundle-default.yaml")


def test_base_holds_exactly_the_service(base):
    inventory = {(d["kind"], d["metadata"]["name"]) for d in base}
    assert inventory == {
        ("Namespace", NS), ("CustomResourceDefinition", CRD), ("CustomResourceDefinition", EXCEPTION_CRD),
        ("ServiceAccount", "trainjob-admission"),
        ("ClusterRole", "trainjob-admission-reader"), ("ClusterRole", "trainjob-admission-injector"),
        ("ClusterRoleBinding", "trainjob-admission-reader"),
        ("ClusterRole", "trainjob-admission-admin"), ("ClusterRole", "trainjob-admission-auditor"),
        ("ClusterRoleBinding", "trainjob-admission-admins"), ("ClusterRoleBinding", "trainjob-admission-auditors"),
        ("ClusterRole", "trainjob-admission-exception-admin"),
        ("ClusterRoleBinding", "trainjob-admission-exception-admins"),
        ("Role", "trainjob-admission-decision-log-reader"), ("RoleBinding", "trainjob-admission-auditors"),
        ("Role", "trainjob-admission-checkpoint"), ("RoleBinding", "trainjob-admission-checkpoint"),
        ("ValidatingAdmissionPolicy", "trainjob-admission-managed-objects-only"),
        ("ValidatingAdmissionPolicyBinding", "trainjob-admission-managed-objects-only"),
        ("ValidatingAdmissionPolicy", "trainjob-admission-deadline-events-only"),
        ("ValidatingAdmissionPolicyBinding", "trainjob-admission-deadline-events-only"),
        ("ValidatingAdmissionPolicy", "trainjob-admission-own-leases-only"),
        ("ValidatingAdmissionPolicyBinding", "trainjob-admission-own-leases-only"),
        ("Deployment", "trainjob-admission"), ("PodDisruptionBudget", "trainjob-admission"),
        ("Service", "trainjob-admission"), ("NetworkPolicy", "trainjob-admission"),
        ("MutatingWebhookConfiguration", "trainjob-admission"), ("ValidatingWebhookConfiguration", "trainjob-admission"),
        ("PolicyBundle", "default"),
    }
    for d in base:
        meta = d["metadata"]
        assert meta.get("namespace") == (NS if d["kind"] in NAMESPACED else None), (d["kind"], meta)
        # the managed-by label marks injected objects, which the reconciler may delete: never ours
        assert (meta.get("labels") or {}).get(MANAGED_BY[0]) != MANAGED_BY[1], (d["kind"], meta["name"])


def test_base_deployment_is_restricted_and_highly_available(base):
    dep = find(base, "Deployment", "trainjob-admission")
    pod = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 2
    term = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["serviceAccountName"] == "trainjob-admission"
    (c,) = pod["containers"]
    assert c["args"] == ["serve", "--in-cluster", "--cert-dir", "/tls",
                         "--decision-log", "/var/log/trainjob-admission/decisions.jsonl", "--probe-port", "8444",
                         "--checkpoint-key", "/checkpoint-key/checkpoint.key"]
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in c["env"]
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["runAsNonRoot"] is True
    assert c["ports"] == [{"name": "https", "containerPort": 8443, "protocol": "TCP"},
                          {"name": "probes", "containerPort": 8444, "protocol": "TCP"}]
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):  # no client cert there
        assert c[probe]["httpGet"] == {"path": path, "port": "probes", "scheme": "HTTPS"}
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert volumes[mounts["/tls"]]["secret"]["secretName"] == "trainjob-admission-tls"
    assert volumes[mounts["/checkpoint-key"]]["secret"]["secretName"] == "trainjob-admission-checkpoint-key"
    assert "emptyDir" in volumes[mounts["/var/log/trainjob-admission"]]
    pdb = find(base, "PodDisruptionBudget", "trainjob-admission")
    assert pdb["spec"] == {"minAvailable": 1, "selector": dep["spec"]["selector"]}
    svc = find(base, "Service", "trainjob-admission")
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"},
                                    {"name": "probes", "port": 8444, "targetPort": "probes", "protocol": "TCP"}]
    netpol = find(base, "NetworkPolicy", "trainjob-admission")["spec"]
    assert netpol["podSelector"] == dep["spec"]["selector"]
    # 8443 (what creates objects) only from where the API server calls: a placeholder matching no real
    # address until the overlay names it (docs/deploy.md); 8444 (probes, metrics) only from Prometheus
    # (the kubelet's probes come from the pod's own node, which NetworkPolicy always admits)
    assert netpol["ingress"] == [{"from": [{"ipBlock": {"cidr": "192.0.2.0/24"}}],
                                  "ports": [{"port": 8443, "protocol": "TCP"}]},
                                 {"from": [{"namespaceSelector": {"matchLabels": {
                                     "kubernetes.io/metadata.name": "monitoring"}},
                                     "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}],
                                  "ports": [{"port": 8444, "protocol": "TCP"}]}]


def test_base_webhooks(base):
    paths = {"MutatingWebhookConfiguration": "/mutate", "ValidatingWebhookConfiguration": "/validate"}
    for kind, path in paths.items():
        hook = find(base, kind, "trainjob-admission")["webhooks"][0]
        assert hook["clientConfig"] == {"service": {"name": "trainjob-admission", "namespace": NS,
                                                    "path": path, "port": 443}}
        assert {(r["apiGroups"][0], r["apiVersions"][0], r["resources"][0]) for r in hook["rules"]} == {
            ("trainer.kubeflow.org", "v1alpha1", "trainjobs"), ("kubeflow.org", "v2beta1", "mpijobs")}
        # /mutate patches new jobs only (issue 33: an update, Kueue resuming a job, skips that call)
        operations = ["CREATE"] if kind.startswith("Mutating") else ["CREATE", "UPDATE"]
        assert all(r["operations"] == operations for r in hook["rules"]), hook["rules"]
        assert hook["sideEffects"] == "NoneOnDryRun"
        assert hook["admissionReviewVersions"] == ["v1"]
        assert (hook["timeoutSeconds"], hook["failurePolicy"], hook["matchPolicy"]) == (10, "Fail", "Equivalent")
        exprs = {e["key"]: e for e in hook["namespaceSelector"]["matchExpressions"]}
        assert exprs["kubernetes.io/metadata.name"]["operator"] == "NotIn"
        assert set(exprs["kubernetes.io/metadata.name"]["values"]) == {"kube-system", "kube-public", "kube-node-lease", NS}
        assert exprs["trainjob-admission.io/ignore"] == {"key": "trainjob-admission.io/ignore", "operator": "NotIn",
                                                         "values": ["true"]}
    assert find(base, "Namespace", NS)["metadata"]["labels"]["trainjob-admission.io/ignore"] == "true"
    # deletions: a second validating entry that records them and never stands in their way
    (mutate,) = find(base, "MutatingWebhookConfiguration", "trainjob-admission")["webhooks"]
    submit, delete = find(base, "ValidatingWebhookConfiguration", "trainjob-admission")["webhooks"]
    assert delete["name"] == "audit-delete.trainjob-admission.io" and delete["clientConfig"] == submit["clientConfig"]
    assert [(r["resources"], r["operations"]) for r in delete["rules"]] == [(["trainjobs"], ["DELETE"]),
                                                                            (["mpijobs"], ["DELETE"])]
    assert (delete["failurePolicy"], delete["timeoutSeconds"], delete["sideEffects"]) == ("Ignore", 3, "None")
    assert delete["namespaceSelector"] == submit["namespaceSelector"] == mutate["namespaceSelector"]


def test_base_rbac_is_least_privilege(base):
    for d in base:
        for rule in d.get("rules", []):
            for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(field, []), (d["metadata"]["name"], rule)
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), (d["metadata"]["name"], rule)
        if d["kind"] in ("ClusterRoleBinding", "RoleBinding"):
            assert d["roleRef"]["name"].startswith("trainjob-admission-"), d["metadata"]["name"]
        labels = d["metadata"].get("labels") or {}
        assert not any(k.startswith("rbac.authorization.k8s.io/aggregate-to") for k in labels), d["metadata"]["name"]
    rules = service_rules(base)
    wanted = {
        ("trainer.kubeflow.org", "clustertrainingruntimes"): {"get", "list", "watch"},
        ("trainer.kubeflow.org", "trainingruntimes"): {"get", "list", "watch"},
        ("trainer.kubeflow.org", "trainjobs"): {"get", "list", "watch"},
        ("kubeflow.org", "mpijobs"): {"get", "list", "watch"},
        ("", "namespaces"): {"get", "list", "watch"},
        ("", "resourcequotas"): {"get", "list", "watch"},
        ("", "limitranges"): {"get", "list", "watch"},
        ("", "nodes"): {"list", "watch"},  # the schedulability pre-check; never get (nor proxy)
        ("", "pods"): {"list", "watch"},
        # a job's runtime snapshot, by name; list/watch only label-selected params (the code's selector)
        ("", "configmaps"): {"get", "list", "watch"},
        ("authorization.k8s.io", "subjectaccessreviews"): {"create"},  # the CEL authorizer; reads nothing
        ("", "events"): {"create"},  # the deadline warning: never read, update or delete
        ("node.k8s.io", "runtimeclasses"): {"get", "list", "watch"},
        ("scheduling.k8s.io", "priorityclasses"): {"get", "list", "watch"},
        ("storage.k8s.io", "storageclasses"): {"get", "list", "watch"},
        # the Kueue pre-check: queues, flavors, cohorts, priorities; never get nor write
        **{("kueue.x-k8s.io", r): {"list", "watch"} for r in (
            "localqueues", "clusterqueues", "cohorts", "resourceflavors", "workloadpriorityclasses")},
        ("policy.trainjob-admission.io", "policybundles"): {"get", "list", "watch"},
        ("policy.trainjob-admission.io", "policybundles/status"): {"patch"},
        ("policy.trainjob-admission.io", "policyexceptions"): {"list", "watch"},  # never write a waiver
    }
    have: dict = {}
    for r in rules:
        for g in r["apiGroups"]:
            for res in r["resources"]:
                have.setdefault((g, res), set()).update(r["verbs"])
    assert have == wanted, "no Secret or NetworkPolicy permission cluster-wide: only per namespace"
    injector = find(base, "ClusterRole", "trainjob-admission-injector")["rules"]
    assert {(r["apiGroups"][0], r["resources"][0], tuple(r.get("resourceNames", ()))): set(r["verbs"])
            for r in injector} == {
        ("", "secrets", ()): {"get", "list", "watch", "create", "patch", "delete"},
        # made owned by their job from the start (webhook/inject/isolation.py): never patched
        ("networking.k8s.io", "networkpolicies", ()): {"get", "list", "watch", "create", "delete"},
        # the quota reservation ledger: get and update by name only; create cannot be limited to one
        ("coordination.k8s.io", "leases", (LEDGER,)): {"get", "update"},
        ("coordination.k8s.io", "leases", ()): {"create"}}


def test_service_rbac_covers_every_call_the_code_makes(tmp_path):
    """A watch or call added to the code without its permission fails here, not in production:
    cluster-wide for the caches and jobs, per injection namespace for what the injector and the
    reconciler (one per --reconcile-namespace) touch."""
    from trainjob_admission.webhook.kube import resources

    docs = with_injection_namespaces(tmp_path)
    rules = service_rules(docs)

    def group(api_version: str) -> str:
        return api_version.rpartition("/")[0]

    missing = []
    for res in (*resources.STATE_RESOURCES, *resources.kueue_resources("v1beta2"), *resources.kueue_resources("v1beta1"),
                resources.POLICY_BUNDLES):
        missing += [(res.plural, v) for v in ("list", "watch") if not granted(rules, group(res.api_version), res.plural, v)]
    missing += [("configmaps", v) for v in ("get", "list", "watch") if not granted(rules, "", resources.CONFIG_MAPS.plural, v)]
    sar = resources.SUBJECT_ACCESS_REVIEWS
    missing += [(sar.plural, "create")] * (not granted(rules, group(sar.api_version), sar.plural, "create"))
    missing += [("events", "create")] * (not granted(rules, "", resources.EVENTS.plural, "create"))
    bundle_group = group(resources.POLICY_BUNDLES.api_version)
    missing += [("policybundles/status", "patch")] * (not granted(rules, bundle_group, "policybundles/status", "patch"))
    for job in resources.JOBS.values():  # injector reads the job; reconciler watches the jobs
        missing += [(job.plural, v) for v in ("get", "list", "watch") if not granted(rules, group(job.api_version), job.plural, v)]
    namespaces = reconcile_namespaces(docs)
    bound = sorted(b["metadata"]["namespace"] for b in docs if b["kind"] == "RoleBinding"
                   and b["roleRef"]["name"] == "trainjob-admission-injector")
    assert namespaces and sorted(namespaces) == bound, "a RoleBinding per --reconcile-namespace, and no other"
    from trainjob_admission.webhook.admission.ledger import LEDGER_VERBS

    verbs = {resources.SECRETS: ("get", "list", "watch", "create", "patch", "delete"),
             resources.NETWORK_POLICIES: ("get", "list", "watch", "create", "delete")}
    for ns in namespaces:
        here = service_rules(docs, ns)
        missing += [(ns, res.plural, v) for res in resources.INJECTED.values() for v in verbs[res]
                    if not granted(here, group(res.api_version), res.plural, v)]
        missing += [(ns, LEDGER, v) for v in LEDGER_VERBS
                    if not granted(here, "coordination.k8s.io", resources.LEASES.plural, v, LEDGER)]
    assert not missing, f"manifests/base/rbac.yaml or components/injection-namespaces lacks {missing}"


def test_checkpoint_role_is_exactly_the_lease_calls(base):
    """webhook/loops/checkpointer.py's Lease calls, granted in the service's namespace and nowhere else."""
    from trainjob_admission.webhook.loops.checkpointer import LEASE_VERBS
    from trainjob_admission.webhook.kube.resources import LEASES

    role = find(base, "Role", "trainjob-admission-checkpoint")
    assert role["metadata"]["namespace"] == NS
    assert role["rules"] == [{"apiGroups": [LEASES.api_version.rpartition("/")[0]], "resources": [LEASES.plural],
                              "verbs": list(LEASE_VERBS)}]
    binding = find(base, "RoleBinding", "trainjob-admission-checkpoint")
    assert binding["metadata"]["namespace"] == NS
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": "trainjob-admission-checkpoint"}
    assert [f"system:serviceaccount:{s['namespace']}:{s['name']}" for s in binding["subjects"]] == [SA]
    assert not any(r["kind"] in ("ClusterRole", "Role")
                   and r["metadata"]["name"] not in (role["metadata"]["name"], "trainjob-admission-injector")
                   and any("leases" in rule.get("resources", []) and set(rule["verbs"]) - {"get", "list"}
                           for rule in r.get("rules", [])) for r in base), \
        "only the checkpoint Role and the injector (the reservation ledger, per namespace) write Leases"


def test_local_ca_overlay_fills_secret_and_ca_bundle(tmp_path):
    copy = copy_manifests(tmp_path)
    docs = kustomize(copy / "overlays" / "local-ca")
    tls = copy / "overlays" / "local-ca" / "tls"
    secret = find(docs, "Secret", "trainjob-admission-tls")
    assert secret["type"] == "kubernetes.io/tls" and secret["metadata"]["namespace"] == NS
    signing = find(docs, "Secret", "trainjob-admission-checkpoint-key")
    assert base64.b64decode(signing["data"]["checkpoint.key"]) == (tls / "checkpoint.key").read_bytes()
    assert "checkpoint.pub" not in signing["data"]
    assert sorted(secret["data"]) == ["ca.crt", "tls.crt", "tls.key"]
    for key in secret["data"]:
        assert base64.b64decode(secret["data"][key]) == (tls / key).read_bytes()
    for kind in WEBHOOK_KINDS:
        for hook in find(docs, kind, "trainjob-admission")["webhooks"]:
            assert base64.b64decode(hook["clientConfig"]["caBundle"]) == (tls / "ca.crt").read_bytes()
            assert "".join(hook["clientConfig"]["caBundle"].split()) == (tls / "ca-bundle.b64").read_text().strip()
    dep = find(docs, "Deployment", "trainjob-admission")
    assert {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}["tls"]["secret"]["secretName"] \
        == secret["metadata"]["name"]


def test_cert_manager_overlay(base):
    docs = kustomize(MANIFESTS / "overlays" / "cert-manager")
    serving = find(docs, "Certificate", "trainjob-admission-serving")["spec"]
    assert serving["secretName"] == "trainjob-admission-tls"
    assert f"trainjob-admission.{NS}.svc" in serving["dnsNames"]
    assert serving["issuerRef"] == {"kind": "Issuer", "name": "trainjob-admission-ca"}
    assert find(docs, "Certificate", "trainjob-admission-ca")["spec"]["isCA"] is True
    assert find(docs, "Issuer", "trainjob-admission-ca")["spec"]["ca"]["secretName"] == "trainjob-admission-ca"
    for kind in WEBHOOK_KINDS:
        assert find(docs, kind, "trainjob-admission")["metadata"]["annotations"] == {
            "cert-manager.io/inject-ca-from": f"{NS}/trainjob-admission-serving"}
    assert find(docs, "Deployment", "trainjob-admission") == find(base, "Deployment", "trainjob-admission")


def test_openshift_overlay():
    docs = kustomize(MANIFESTS / "overlays" / "openshift")
    assert find(docs, "Service", "trainjob-admission")["metadata"]["annotations"] == {
        "service.beta.openshift.io/serving-cert-secret-name": "trainjob-admission-tls"}
    for kind in WEBHOOK_KINDS:
        assert find(docs, kind, "trainjob-admission")["metadata"]["annotations"] == {
            "service.beta.openshift.io/inject-cabundle": "true"}
    pod = find(docs, "Deployment", "trainjob-admission")["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    assert pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert find(docs, "Role", "trainjob-admission-scc")["rules"] == [{
        "apiGroups": ["security.openshift.io"], "resources": ["securitycontextconstraints"],
        "resourceNames": ["restricted-v2"], "verbs": ["use"]}]
    netpol = find(docs, "NetworkPolicy", "trainjob-admission")["spec"]
    dns_ports = netpol["egress"][0]["ports"]
    assert {(p["port"], p["protocol"]) for p in dns_ports} >= {(5353, "UDP"), (5353, "TCP")}
    # the kube-apiserver calls from the control-plane nodes' host network: OVN-Kubernetes' policy group
    assert netpol["ingress"][0] == {"from": [{"namespaceSelector": {"matchLabels": {
        "policy-group.network.openshift.io/host-network": ""}}}], "ports": [{"port": 8443, "protocol": "TCP"}]}
    # the probe port from OpenShift's monitoring stacks (platform and user workload) only
    assert netpol["ingress"][1] == {"from": [{"namespaceSelector": {"matchLabels": {
        "network.openshift.io/policy-group": "monitoring"}}}], "ports": [{"port": 8444, "protocol": "TCP"}]}


def test_component_client_auth_requires_the_api_servers_certificate(tmp_path):
    copy_manifests(tmp_path)
    docs = kustomize(write_kustomization(tmp_path / "overlay", {
        "resources": ["../manifests/overlays/local-ca"], "components": ["../manifests/components/client-auth"]}))
    pod = find(docs, "Deployment", "trainjob-admission")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["args"][c["args"].index("--client-ca") + 1] == "/client-ca/ca.crt"
    assert c["args"][c["args"].index("--probe-port") + 1] == "8444"  # the probes need no client certificate
    assert {m["mountPath"]: m["name"] for m in c["volumeMounts"]}["/client-ca"] == "client-ca"
    volume = next(v for v in pod["volumes"] if v["name"] == "client-ca")
    assert volume["secret"]["secretName"] == "trainjob-admission-client-ca"
    # the flags parse as serve reads them
    from trainjob_admission.webhook.cli.main import build_parser

    args = build_parser().parse_args(c["args"])
    assert (args.clientCA, args.probePort) == ("/client-ca/ca.crt", 8444)


def test_components_fail_open_and_monitoring(tmp_path):
    copy_manifests(tmp_path)
    overlay = write_kustomization(tmp_path / "overlay", {
        "resources": ["../manifests/overlays/local-ca"],
        "components": ["../manifests/components/fail-open", "../manifests/components/monitoring"]})
    docs = kustomize(overlay)
    for kind in WEBHOOK_KINDS:  # the deletions' entry is Ignore already
        assert {h["failurePolicy"] for h in find(docs, kind, "trainjob-admission")["webhooks"]} == {"Ignore"}
    svc = find(docs, "Service", "trainjob-admission")
    monitor = find(docs, "ServiceMonitor", "trainjob-admission")["spec"]
    assert monitor["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    (endpoint,) = monitor["endpoints"]
    assert endpoint["port"] == "probes" and endpoint["scheme"] == "https"  # no client certificate needed there
    assert "probes" in [p["name"] for p in svc["spec"]["ports"]]
    secret = find(docs, "Secret", endpoint["tlsConfig"]["ca"]["secret"]["name"])
    assert endpoint["tlsConfig"]["ca"]["secret"]["key"] in secret["data"]

    known = metric_names()
    rules = [r for g in find(docs, "PrometheusRule", "trainjob-admission")["spec"]["groups"] for r in g["rules"]]
    alerts = {r["alert"] for r in rules}
    assert {"TrainJobAdmissionHighDenyRate", "TrainJobAdmissionLatencyOverBudget", "TrainJobAdmissionErrors",
            "TrainJobAdmissionCertificateExpiresSoon", "TrainJobAdmissionBundleReloadFailures"} <= alerts
    used = {m for r in rules for m in re.findall(r"trainjob_admission_\w+", r["expr"])}
    assert used and used <= known, f"alerts use metrics webhook/metrics.py does not serve: {used - known}"
    expiry = next(r for r in rules if r["alert"] == "TrainJobAdmissionCertificateExpiresSoon")["expr"]
    assert "14 * 86400" in expiry

    dashboard = find(docs, "ConfigMap", "trainjob-admission-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    (text,) = dashboard["data"].values()
    panels = json.loads(text)["panels"]
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"trainjob_admission_\w+", e)}
    assert len(panels) >= 6 and used <= known, f"dashboard uses unknown metrics: {used - known}"
    assert {"trainjob_admission_requests_total", "trainjob_admission_request_duration_seconds_bucket",
            "trainjob_admission_certificate_expiry_timestamp_seconds"} <= used


# ---------------------------------------------------------------------------------------------
# installed on the control plane
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def installed(control_plane, tmp_path_factory) -> Iterator[Installed]:
    run = uuid.uuid4().hex[:8]
    with install(tmp_path_factory.mktemp("install"), run, bundle_namespaces=[f"nowhere-{run}"]) as done:
        yield done


def test_base_passes_server_side_dry_run(installed, kubectl, base):
    """The unmodified base against the real API server (schemas, CEL of the policy, PolicyBundle CRD)."""
    p = kubectl("apply", "-k", MANIFESTS / "base", "--dry-run=server")
    assert p.stdout.count("(server dry run)") == len(base), p.stdout


def test_installed_service_runs_two_restricted_replicas(installed, kubectl, get_json, wait_for):
    wait_for("Deployment trainjob-admission 2/2 available", lambda: get_json(
        "deployment", "trainjob-admission", "-n", NS).get("status", {}).get("availableReplicas") == 2, timeout=120)
    pods = get_json("pods", "-n", NS, "-l", "app.kubernetes.io/name=trainjob-admission")["items"]
    assert len(pods) == 2
    assert len({p["spec"]["nodeName"] for p in pods}) == 2, "anti-affinity should spread the replicas over the nodes"
    # the namespace enforces Pod Security "restricted": our pods were admitted, a privileged one is not
    assert get_json("namespace", NS)["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    privileged = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe", "namespace": NS},
                  "spec": {"containers": [{"name": "c", "image": "busybox", "securityContext": {"privileged": True}}]}}
    p = kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(privileged), check=False)
    assert p.returncode != 0 and "violates PodSecurity" in p.stderr, p.stderr

    pdb = wait_for("PDB status", lambda: (lambda s: s if s.get("currentHealthy") == 2 else None)(
        get_json("pdb", "trainjob-admission", "-n", NS).get("status", {})))
    assert pdb["disruptionsAllowed"] == 1
    svc = get_json("service", "trainjob-admission", "-n", NS)
    assert [(p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [(443, "https"), (8444, "probes")]

    def ready_endpoints():
        slices = get_json("endpointslices", "-n", NS, "-l", "kubernetes.io/service-name=trainjob-admission")["items"]
        ready = [e for s in slices if sorted(p["port"] for p in s.get("ports") or []) == [8443, 8444]
                 for e in s.get("endpoints") or [] if e["conditions"].get("ready")]
        return len(ready) == 2
    wait_for("the Service's 2 ready endpoints on 8443", ready_endpoints)
    secret = get_json("secret", "trainjob-admission-tls", "-n", NS)
    assert secret["type"] == "kubernetes.io/tls"


def test_installed_webhooks_and_default_bundle(installed, get_json):
    ca = (installed.tls / "ca.crt").read_bytes()
    for kind in WEBHOOK_KINDS:
        hooks = get_json(kind.lower(), "trainjob-admission")["webhooks"]
        hook = hooks[0]
        assert hook["sideEffects"] == "NoneOnDryRun" and hook["timeoutSeconds"] == 10
        assert hook["failurePolicy"] == "Fail" and hook["matchPolicy"] == "Equivalent"
        for each in hooks:  # the deletions' entry too
            assert base64.b64decode(each["clientConfig"]["caBundle"]) == ca
            assert each["namespaceSelector"] == {"matchLabels": {TEST_LABEL: installed.run}}
    bundle = get_json("policybundle", "default")
    source = yaml.safe_load((REPO / "policies" / "bundle" / "builtin" / "default.yaml").read_text())
    source["spec"]["match"]["namespaces"] = [f"nowhere-{installed.run}"]
    assert bundle["spec"] == source["spec"]


def can_i(kubectl, *args: str, kubeconfig=None) -> bool:
    p = kubectl("auth", "can-i", *args, kubeconfig=kubeconfig, check=False)
    assert p.stdout.strip() in ("yes", "no"), p.stderr
    return p.stdout.strip() == "yes"


def test_service_account_has_least_privilege(installed, kubectl):
    asa = f"--as={SA}"
    allowed = [("list", "clustertrainingruntimes.trainer.kubeflow.org"),
               ("watch", "trainingruntimes.trainer.kubeflow.org", "-A"),
               ("watch", "trainjobs.trainer.kubeflow.org", "-A"), ("get", "mpijobs.kubeflow.org", "-n", "team-a"),
               ("list", "resourcequotas", "-A"), ("watch", "limitranges", "-A"), ("watch", "namespaces"),
               ("watch", "runtimeclasses.node.k8s.io"), ("watch", "priorityclasses.scheduling.k8s.io"),
               ("watch", "storageclasses.storage.k8s.io"), ("watch", "nodes"), ("list", "pods", "-A"),
               ("watch", "localqueues.kueue.x-k8s.io", "-A"), ("list", "clusterqueues.kueue.x-k8s.io"),
               ("watch", "resourceflavors.kueue.x-k8s.io"), ("list", "workloadpriorityclasses.kueue.x-k8s.io"),
               ("watch", "policybundles.policy.trainjob-admission.io"),
               ("patch", "policybundles.policy.trainjob-admission.io", "--subresource=status"),
               ("create", "secrets", "-n", "team-a"), ("delete", "secrets", "-n", "team-a"),
               ("create", "networkpolicies.networking.k8s.io", "-n", "team-a"),
               ("create", "leases.coordination.k8s.io", "-n", NS), ("patch", "leases.coordination.k8s.io", "-n", NS),
               # the reservation ledger where it injects: create, and get and update of its name
               ("create", "leases.coordination.k8s.io", "-n", "team-a"),
               ("update", f"leases.coordination.k8s.io/{LEDGER}", "-n", "team-a"),
               ("get", f"leases.coordination.k8s.io/{LEDGER}", "-n", "team-a")]
    denied = [("patch", "networkpolicies.networking.k8s.io", "-n", "team-a"),  # created owned, never patched
              ("update", "leases.coordination.k8s.io/other", "-n", "team-a"),
              ("delete", f"leases.coordination.k8s.io/{LEDGER}", "-n", "team-a"),
              ("create", "leases.coordination.k8s.io", "-n", "team-b"), ("delete", "leases.coordination.k8s.io", "-n", NS),
              ("get", "nodes"), ("get", "nodes", "--subresource=proxy"), ("create", "pods", "-n", "team-a"),
              ("create", "pods", "-n", NS), ("create", "pods", "--subresource=exec", "-n", NS),
              ("escalate", "clusterroles.rbac.authorization.k8s.io"), ("bind", "clusterroles.rbac.authorization.k8s.io"),
              ("patch", "clusterroles.rbac.authorization.k8s.io"), ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
              ("delete", "trainjobs.trainer.kubeflow.org", "-n", "team-a"),
              ("get", "localqueues.kueue.x-k8s.io", "-n", "team-a"), ("create", "workloads.kueue.x-k8s.io", "-n", "team-a"),
              ("update", "trainjobs.trainer.kubeflow.org", "-n", "team-a"),
              ("patch", "policybundles.policy.trainjob-admission.io"),
              ("create", "policybundles.policy.trainjob-admission.io"), ("update", "secrets", "-n", "team-a"),
              # Secrets only where it injects (components/injection-namespaces in local-ca: team-a)
              ("get", "secrets", "-n", "team-b"), ("get", "secrets", "-n", "default"), ("get", "secrets", "-n", "kube-system"), ("list", "secrets", "-A"),
              ("get", "secrets", "-n", NS), ("create", "networkpolicies.networking.k8s.io", "-n", "kube-system"),
              ("create", "serviceaccounts", "--subresource=token", "-n", NS), ("impersonate", "users"),
              ("patch", "validatingwebhookconfigurations.admissionregistration.k8s.io"),
              ("delete", "validatingadmissionpolicies.admissionregistration.k8s.io"), ("*", "*")]
    wrong = [("should be allowed", a) for a in allowed if not can_i(kubectl, *a, asa)]
    wrong += [("should be denied", a) for a in denied if can_i(kubectl, *a, asa)]
    assert not wrong, wrong


def test_service_account_reads_no_secret_where_it_does_not_inject(installed, kubectl, namespace, wait_for):
    """A namespace the install did not list: no Secret can be read, listed or written there,
    and a real Secret in it is refused to the service account, until a RoleBinding adds it."""
    asa = f"--as={SA}"
    kubectl("create", "secret", "generic", "payroll-db", "-n", namespace, "--from-literal=password=hunter22")
    for verb in ("get", "list", "watch", "create", "delete"):
        assert not can_i(kubectl, verb, "secrets", "-n", namespace, asa), verb
    p = kubectl("get", "secret", "payroll-db", "-n", namespace, asa, check=False)
    assert p.returncode != 0 and "forbidden" in p.stderr.lower(), p.stdout + p.stderr
    kubectl("create", "rolebinding", "trainjob-admission-injector", "-n", namespace,
            "--clusterrole=trainjob-admission-injector", f"--serviceaccount={NS}:trainjob-admission")
    wait_for("the RoleBinding to take effect", lambda: can_i(kubectl, "get", "secrets", "-n", namespace, asa), 30)


def test_people_roles(installed, kubectl, user_a_kubeconfig):
    bundles = "policybundles.policy.trainjob-admission.io"
    log = ("get", "pods", "--subresource=log", "-n", NS)
    # alice (edit in team-a): no bundle edits, no decision log
    for verb in ("create", "patch", "delete"):
        assert not can_i(kubectl, verb, bundles, kubeconfig=user_a_kubeconfig), verb
    assert not can_i(kubectl, *log, kubeconfig=user_a_kubeconfig)
    p = kubectl("patch", "policybundle", "default", "--type=merge", "-p", '{"spec":{"mode":"audit"}}',
                kubeconfig=user_a_kubeconfig, check=False)
    assert p.returncode != 0 and "forbidden" in p.stderr.lower(), p.stderr
    p = kubectl("logs", "-n", NS, "deployment/trainjob-admission", kubeconfig=user_a_kubeconfig, check=False)
    assert p.returncode != 0 and "forbidden" in p.stderr.lower(), p.stderr
    # auditors: read bundles and the service's logs, nothing else
    auditor = ("--as=audrey", "--as-group=trainjob-admission-auditors")
    assert can_i(kubectl, *log, *auditor) and can_i(kubectl, "list", bundles, *auditor)
    assert can_i(kubectl, "get", "deployments.apps", "-n", NS, *auditor)  # for kubectl logs deployment/...
    assert can_i(kubectl, "get", "leases.coordination.k8s.io", "-n", NS, *auditor)  # the checkpoints
    assert not can_i(kubectl, "patch", "leases.coordination.k8s.io", "-n", NS, *auditor)
    for denied in (("get", "pods", "--subresource=log", "-n", "team-a"), ("patch", bundles),
                   ("get", "secrets", "-n", NS), ("create", "pods", "--subresource=exec", "-n", NS)):
        assert not can_i(kubectl, *denied, *auditor), denied
    # admins: edit bundles, but not the service's Secrets or its decision log
    admin = ("--as=adam", "--as-group=trainjob-admission-admins")
    for verb in ("create", "patch", "delete"):
        assert can_i(kubectl, verb, bundles, *admin), verb
    assert not can_i(kubectl, "get", "secrets", "-n", NS, *admin)
    assert not can_i(kubectl, *log, *admin)
    # PolicyExceptions: admins grant them, auditors read them, alice (edit in team-a) neither
    exceptions = "policyexceptions.policy.trainjob-admission.io"
    for verb in ("create", "patch", "delete"):
        assert can_i(kubectl, verb, exceptions, "-n", "team-a", *admin), verb
        assert not can_i(kubectl, verb, exceptions, "-n", "team-a", kubeconfig=user_a_kubeconfig), verb
        assert not can_i(kubectl, verb, exceptions, "-n", "team-a", *auditor), verb
    assert can_i(kubectl, "list", exceptions, "-A", *auditor)
    assert not can_i(kubectl, "create", exceptions, "-n", "team-a", f"--as={SA}")  # the service only reads them


def template_spec(job: str, restricted: bool = False) -> dict:
    """The spec the bundle's NetworkPolicy template gives job ``job`` (policies/decide/injections.py)."""
    pods = {"matchLabels": {"jobset.sigs.k8s.io/jobset-name": job}}
    rule: dict = {"from": [{"podSelector": pods}]}
    if restricted:
        rule["ports"] = [{"protocol": "TCP", "port": 2222}, {"protocol": "TCP", "port": 30000, "endPort": 30100}]
    return {"podSelector": pods, "policyTypes": ["Ingress"], "ingress": [rule]}


def test_guard_lets_the_service_account_write_only_managed_objects(installed, kubectl, namespace, wait_for):
    def obj(kind: str, name: str, managed: bool, secret_type: str = "kubernetes.io/ssh-auth") -> dict:
        meta = {"name": name, "namespace": namespace, "labels": dict([MANAGED_BY]) if managed else {"app": "other"}}
        if kind == "Secret":
            return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": secret_type,
                    "stringData": {"ssh-privatekey": "k"}}
        return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta,
                "spec": template_spec(name.removesuffix("-mpi-isolation"))}

    def as_sa(*args: str, body: dict | None = None):
        return kubectl(*args, f"--as={SA}", "-n", namespace, input=json.dumps(body) if body else None, check=False)

    # RBAC lets it write here, as in every namespace it injects into; the guard narrows that
    kubectl("create", "rolebinding", "trainjob-admission-injector", "-n", namespace,
            "--clusterrole=trainjob-admission-injector", f"--serviceaccount={NS}:trainjob-admission")
    # the policy binding (and the RoleBinding) take a moment to be enforced
    wait_for("the guard to refuse an unlabelled Secret", lambda: "trainjob-admission may only" in as_sa(
        "create", "--dry-run=server", "-f", "-", body=obj("Secret", "probe-mpi-ssh-auth", False)).stderr, timeout=60)
    kubectl("create", "-f", "-", input="\n".join(json.dumps(obj(k, n, m)) for k, n, m in (
        ("Secret", "foreign-mpi-ssh-auth", False), ("Secret", "ours-mpi-ssh-auth", True),
        ("NetworkPolicy", "foreign-mpi-isolation", False), ("Secret", "db-credentials", True))))

    # each refusal with the verb and resource it needs: where RBAC grants that verb, the guard must
    # be what refuses; where RBAC does not (networkpolicies: no patch, they are created owned),
    # RBAC's own Forbidden is the stronger refusal and is what must answer
    secrets, netpols = "secrets", "networkpolicies.networking.k8s.io"
    denied = {
        "create an unlabelled Secret": ("create", secrets, as_sa(
            "create", "-f", "-", body=obj("Secret", "new-mpi-ssh-auth", False))),
        "create a labelled Secret of another name": ("create", secrets, as_sa(
            "create", "-f", "-", body=obj("Secret", "db-password", True))),
        "create a labelled Secret of another type": ("create", secrets, as_sa("create", "-f", "-", body=obj(
            "Secret", "opaque-mpi-ssh-auth", True, "Opaque"))),
        "create a labelled NetworkPolicy of another name": ("create", netpols, as_sa("create", "-f", "-", body=obj(
            "NetworkPolicy", "allow-all", True))),
        "delete a labelled Secret of another name": ("delete", secrets, as_sa("delete", "secret", "db-credentials")),
        "patch a foreign Secret": ("patch", secrets, as_sa("label", "secret", "foreign-mpi-ssh-auth", "x=y")),
        "adopt a foreign Secret by labelling it": ("patch", secrets, as_sa(
            "label", "secret", "foreign-mpi-ssh-auth", "=".join(MANAGED_BY))),
        "delete a foreign Secret": ("delete", secrets, as_sa("delete", "secret", "foreign-mpi-ssh-auth")),
        "patch a foreign NetworkPolicy": ("patch", netpols, as_sa(
            "label", "networkpolicy", "foreign-mpi-isolation", "x=y")),
        "drop the label from its own Secret": ("patch", secrets, as_sa(
            "label", "secret", "ours-mpi-ssh-auth", f"{MANAGED_BY[0]}-")),
    }
    for what, (verb, resource, p) in denied.items():
        assert p.returncode != 0, f"the service account could {what}"
        if can_i(kubectl, verb, resource, "-n", namespace, f"--as={SA}"):
            assert "trainjob-admission may only" in p.stderr and "ValidatingAdmissionPolicy" in p.stderr, (what, p.stderr)
        else:
            assert "forbidden" in p.stderr.lower() and f"cannot {verb} resource" in p.stderr, (what, p.stderr)
    assert not can_i(kubectl, "patch", netpols, "-n", namespace, f"--as={SA}")  # the RBAC case above is exercised
    allowed = {
        "create a labelled Secret": as_sa("create", "-f", "-", body=obj("Secret", "new-mpi-ssh-auth", True)),
        "create a labelled NetworkPolicy": as_sa("create", "-f", "-", body=obj(
            "NetworkPolicy", "new-mpi-isolation", True)),
        "patch its own Secret": as_sa("annotate", "secret", "ours-mpi-ssh-auth", "trainjob-admission.io/job=TrainJob/x"),
        "delete its own Secret": as_sa("delete", "secret", "ours-mpi-ssh-auth"),
    }
    for what, p in allowed.items():
        assert p.returncode == 0, f"the service account could not {what}: {p.stderr}"
    # anybody else is not matched by the policy at all
    assert kubectl("label", "secret", "foreign-mpi-ssh-auth", "x=y", "-n", namespace).returncode == 0


def test_guard_lets_the_service_account_write_only_its_own_leases(installed, kubectl, namespace, wait_for):
    """RBAC lets the service account create a Lease of any name where it injects (create cannot be
    limited to a name); the guard narrows that to the quota reservation ledger."""
    def lease(name: str) -> dict:
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name, "namespace": namespace},
                "spec": {}}

    def as_sa(body: dict):
        return kubectl("create", "-f", "-", f"--as={SA}", "-n", namespace, input=json.dumps(body), check=False)

    kubectl("create", "rolebinding", "trainjob-admission-injector", "-n", namespace,
            "--clusterrole=trainjob-admission-injector", f"--serviceaccount={NS}:trainjob-admission")
    wait_for("the guard to refuse another application's Lease", lambda: "trainjob-admission may only write the Lease" in
             as_sa(lease("some-controller-leader")).stderr, timeout=60)
    p = as_sa(lease(LEDGER))
    assert p.returncode == 0, f"the service account could not create its reservation ledger: {p.stderr}"
    # anybody else is not matched by the policy at all
    assert kubectl("create", "-f", "-", "-n", namespace, input=json.dumps(lease("other"))).returncode == 0


def test_guard_lets_the_service_account_write_only_the_templates_network_policy(installed, kubectl, namespace,
                                                                                wait_for):
    """Issue 30: the guard fixed a NetworkPolicy's name and label, not its spec, so a stolen token
    could create `x-mpi-isolation` admitting everyone, or rewrite a job's. Now only the template's
    shape is admitted: the job's own pods, reached only from themselves."""
    def policy(name: str, spec: dict) -> dict:
        return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": name, "namespace": namespace, "labels": dict([MANAGED_BY])}, "spec": spec}

    def as_sa(*args: str, body: dict | None = None):
        return kubectl(*args, f"--as={SA}", "-n", namespace, input=json.dumps(body) if body else None, check=False)

    kubectl("create", "rolebinding", "trainjob-admission-injector", "-n", namespace,
            "--clusterrole=trainjob-admission-injector", f"--serviceaccount={NS}:trainjob-admission")
    everyone = {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{}]}
    wait_for("the guard to refuse an allow-all NetworkPolicy", lambda: "trainjob-admission may only" in as_sa(
        "create", "--dry-run=server", "-f", "-", body=policy("probe-mpi-isolation", everyone)).stderr, timeout=60)
    spec = template_spec("job-a")
    kubectl("create", "-f", "-", input=json.dumps(policy("job-a-mpi-isolation", spec)))  # as if injected
    other_job = template_spec("job-b")
    denied = {
        "create one admitting everyone": policy("x-mpi-isolation", everyone),
        "create one selecting every pod": policy("x-mpi-isolation", {**template_spec("x"), "podSelector": {}}),
        "create one admitting every pod of the namespace": policy("x-mpi-isolation", {
            **template_spec("x"), "ingress": [{"from": [{"podSelector": {}}]}]}),
        "create one admitting other namespaces": policy("x-mpi-isolation", {
            **template_spec("x"), "ingress": [{"from": [{"namespaceSelector": {}}]}]}),
        "create one admitting an address block": policy("x-mpi-isolation", {
            **template_spec("x"), "ingress": [{"from": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}]}),
        "create one with a second rule": policy("x-mpi-isolation", {
            **template_spec("x"), "ingress": template_spec("x")["ingress"] + [{}]}),
        "create one with egress": policy("x-mpi-isolation", {
            **template_spec("x"), "policyTypes": ["Ingress", "Egress"], "egress": [{}]}),
        "create one for another job's pods": policy("x-mpi-isolation", other_job),
    }
    for what, body in denied.items():
        p = as_sa("create", "-f", "-", body=body)
        assert p.returncode != 0, f"the service account could {what}"
        assert "trainjob-admission may only" in p.stderr and "ValidatingAdmissionPolicy" in p.stderr, (what, p.stderr)
    rewrite = as_sa("patch", "networkpolicy", "job-a-mpi-isolation", "--type=merge", "-p",
                    json.dumps({"spec": {"ingress": [{}]}}))
    # a job's policy is created owned and never patched: RBAC grants no patch, and its Forbidden answers
    assert rewrite.returncode != 0 and "Forbidden" in rewrite.stderr and "cannot patch" in rewrite.stderr, rewrite.stderr
    allowed = {
        "create the default template's": as_sa("create", "-f", "-", body=policy("y-mpi-isolation", template_spec("y"))),
        "create the restricted template's": as_sa("create", "-f", "-", body=policy(
            "z-mpi-isolation", template_spec("z", restricted=True))),
        "create one for a v2beta1 MPIJob": as_sa("create", "-f", "-", body=policy("m-mpi-isolation", {
            **template_spec("m"), "podSelector": {"matchLabels": {"training.kubeflow.org/job-name": "m"}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"training.kubeflow.org/job-name": "m"}}}]}]})),
        "delete its own": as_sa("delete", "networkpolicy", "job-a-mpi-isolation"),
    }
    for what, p in allowed.items():
        assert p.returncode == 0, f"the service account could not {what}: {p.stderr}"


def test_guard_lets_each_replica_write_only_its_own_checkpoint_lease(installed, kubectl, get_json, wait_for,
                                                                     tmp_path):
    """Issue 30: the checkpoint Role lets the service account patch every replica's Lease. With
    the token of a replica's pod (bound to it, as the kubelet mounts it) only that pod's Lease can
    be written; a token bound to no pod writes none."""
    wait_for("the Deployment's pods", lambda: len(get_json("pods", "-n", NS, "-l",
                                                           "app.kubernetes.io/name=trainjob-admission")["items"]) == 2,
             timeout=120)
    a, b = get_json("pods", "-n", NS, "-l", "app.kubernetes.io/name=trainjob-admission")["items"]

    def as_token(token: str, *args: str, body: dict | None = None):
        config = tmp_path / f"token-{abs(hash(token))}.kubeconfig"
        admin = yaml.safe_load(cluster.ADMIN_KUBECONFIG.read_text())
        config.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "clusters": admin["clusters"],
            "users": [{"name": "sa", "user": {"token": token}}],
            "contexts": [{"name": "sa", "context": {"cluster": admin["clusters"][0]["name"], "user": "sa"}}],
            "current-context": "sa"}))
        return kubectl(*args, "-n", NS, kubeconfig=config, input=json.dumps(body) if body else None, check=False)

    def token(pod: dict | None) -> str:
        bound = ["--bound-object-kind", "Pod", "--bound-object-name", pod["metadata"]["name"],
                 "--bound-object-uid", pod["metadata"]["uid"]] if pod else []
        return kubectl("create", "token", "trainjob-admission", "-n", NS, *bound).stdout.strip()

    def lease(pod: dict) -> dict:
        name = pod["metadata"]["name"]
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": f"trainjob-admission-checkpoint-{name}", "namespace": NS},
                "spec": {"holderIdentity": name}}

    of_a, unbound = token(a), token(None)
    own = as_token(of_a, "create", "--dry-run=server", "-f", "-", body=lease(a))
    assert own.returncode == 0, own.stderr
    refused = {
        "another replica's": as_token(of_a, "create", "--dry-run=server", "-f", "-", body=lease(b)),
        "its own name holding another": as_token(of_a, "create", "--dry-run=server", "-f", "-", body={
            **lease(a), "spec": {"holderIdentity": b["metadata"]["name"]}}),
        "any, with a token bound to no pod": as_token(unbound, "create", "--dry-run=server", "-f", "-", body=lease(a)),
    }
    for what, p in refused.items():
        assert p.returncode != 0 and "trainjob-admission may only write the checkpoint Lease" in p.stderr, (what, p.stderr)
    # and an existing Lease of another replica cannot be patched (what the Role's patch would allow)
    kubectl("apply", "-f", "-", input=json.dumps(lease(b)))
    patch = as_token(of_a, "patch", "lease", lease(b)["metadata"]["name"], "--type=merge", "-p",
                     json.dumps({"metadata": {"annotations": {"forged": "yes"}}}))
    assert patch.returncode != 0 and "trainjob-admission may only write the checkpoint Lease" in patch.stderr, patch.stderr
    kubectl("delete", "lease", lease(b)["metadata"]["name"], "-n", NS, "--ignore-not-found")


def test_guard_lets_the_service_account_create_only_deadline_events(installed, kubectl, namespace, wait_for):
    """RBAC grants the service account create on every Event; the guard narrows it to the one the
    service posts: a Warning with reason DeadlineApproaching about a TrainJob."""
    def event(name: str, **changes: Any) -> dict:
        body = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": namespace},
                "involvedObject": {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "j",
                                   "namespace": namespace, "uid": "u"},
                "type": "Warning", "reason": "DeadlineApproaching", "message": "80% used",
                "source": {"component": "trainjob-admission"}}
        body.update(changes)
        return body

    def as_sa(body: dict):
        return kubectl("create", "-f", "-", f"--as={SA}", "-n", namespace, input=json.dumps(body), check=False)

    wait_for("the guard to refuse a Normal Event", lambda: "trainjob-admission may only" in as_sa(
        event("probe", type="Normal")).stderr, timeout=60)
    denied = {
        "a Normal Event": event("normal", type="Normal"),
        "another reason": event("reason", reason="BackOff"),
        "an Event about a Pod": event("pod", involvedObject={"apiVersion": "v1", "kind": "Pod", "name": "p",
                                                             "namespace": namespace}),
        "an Event about a look-alike kind": event("fake", involvedObject={"apiVersion": "example.com/v1",
                                                                          "kind": "TrainJob", "name": "j",
                                                                          "namespace": namespace}),
        "an Event without a reason": {k: v for k, v in event("bare").items() if k != "reason"},
    }
    for what, body in denied.items():
        p = as_sa(body)
        assert p.returncode != 0, f"the service account could create {what}"
        assert "trainjob-admission may only create Warning Events" in p.stderr, (what, p.stderr)
        assert "ValidatingAdmissionPolicy" in p.stderr, (what, p.stderr)
    p = as_sa(event("deadline"))
    assert p.returncode == 0, f"the service account could not create its deadline Event: {p.stderr}"
    # anybody else is not matched by the policy at all
    other = kubectl("create", "-f", "-", "-n", namespace, input=json.dumps(event("other", type="Normal")))
    assert other.returncode == 0
