"""A newcomer installs as the docs print it (issue 31): every console block of the quickstart and
of docs/deploy.md's install, in order, on a copy of the repository, against the test control
plane; the service's pods run for real on the real node, from the image `make images` built
(hack/images/out); the quickstart's first denied and first admitted job then go through the
installed webhooks. A step left out of a doc (once: `certs checkpoint-key`, without which the
overlay does not build) fails here.

What differs from what the reader types is mechanical (tests/support/docs.py: team-a becomes a
fresh namespace, in the copy of the repository too; ~/.kube/config is the admin kubeconfig), and:

- the image: the docs' overlay names `registry.example.com/ml-platform/trainjob-admission:0.1.0`,
  the image pushed to a registry; here the built image is tagged so in the real node's
  containerd (the stand-in for the push and the pull: there is no registry on this machine);
- the docs' example of where the API server calls from, `10.0.0.10/32`, becomes the address the
  test control plane's API server calls pods from (the real node's bridge);
- a MutatingAdmissionPolicy puts the pods of namespace trainjob-admission on the real node (the
  KWOK nodes run no containers; in a real cluster every node does);
- commands get up to ROLLOUT_SECONDS (the doc's own `rollout status` waits for real pods).

One install at a time (tests/support/install.py): the docs install cluster-wide, with the fixed
names of manifests/base, so each test waits until no other install is there, and removes what it
created (but the CRDs, which other tests use) before the next.
"""
from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from tests.support.docs import Substitution, copy_tree, harness, run_step, user_env
from tests.support.install import MANIFESTS, WEBHOOK_KINDS, _exists, _wait_until_free, kustomize
from tests.support.service import REPO, cluster

pytestmark = pytest.mark.cluster

INSTALL_DOCS = [doc for doc in harness.DOCS
                if any(isinstance(s, harness.Command) for s in harness.steps(doc, {"install"}))]
IMAGE = "registry.example.com/ml-platform/trainjob-admission:0.1.0"  # the docs' overlay's image
API_SERVER_SOURCE = "10.0.0.10/32"  # the docs' example of where the API server calls from
PLACEMENT = "newcomer-on-the-real-node"
ROLLOUT_SECONDS = 300


@pytest.fixture(scope="module")
def node(control_plane) -> dict:
    state = cluster.status()
    if not state.get("real_node"):
        pytest.skip(f"no real node in this control plane: {state.get('real_node_skipped') or 'not started'}")
    if state["ports"]["apiserver"] != 6443:  # base's NetworkPolicy lets the pods reach 443 and 6443
        pytest.skip(f"the API server is on port {state['ports']['apiserver']}, not 6443 (busy at `up`)")
    return state["real_node"]


@pytest.fixture(scope="module")
def pushed(node):
    """The built service image under the docs' name, as if pushed there and pulled."""
    ctr = cluster.own_module_binary("containerd") / "ctr"
    cluster.realnode.tag_image(ctr, cluster.RUN, node["images"]["service"], IMAGE)
    yield IMAGE
    cluster.realnode.untag_image(ctr, cluster.RUN, IMAGE)


@pytest.fixture(scope="module")
def on_the_real_node(node):
    """Pods created in namespace trainjob-admission get the real node's nodeSelector and toleration."""
    placement = node["placement"]
    # JSONPatch, not ApplyConfiguration: server-side apply may not change nodeSelector and tolerations,
    # which are atomic; JSON objects are CEL map literals
    expression = (f"[JSONPatch{{op: 'add', path: '/spec/nodeSelector', value: {json.dumps(placement['nodeSelector'])}}}, "
                  f"JSONPatch{{op: 'add', path: '/spec/tolerations', value: {json.dumps(placement['tolerations'])}}}]")
    policy = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
              "metadata": {"name": PLACEMENT},
              "spec": {"matchConstraints": {
                  "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                     "resources": ["pods"]}],
                  "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "trainjob-admission"}}},
                  "failurePolicy": "Fail", "reinvocationPolicy": "Never",
                  "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": expression}}]}}
    binding = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicyBinding",
               "metadata": {"name": PLACEMENT}, "spec": {"policyName": PLACEMENT}}
    cluster.apply_objects([policy, binding])
    yield
    cluster.kubectl("delete", "mutatingadmissionpolicybinding,mutatingadmissionpolicy", PLACEMENT,
                    "--ignore-not-found", check=False)


def present(documents: list[dict]) -> set[tuple[str, str, str]]:
    return {(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace", "")) for d in documents
            if _exists(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace"))}


def uninstall(work: Path, before: set[tuple[str, str, str]], namespace: str) -> None:
    """What the doc's install created, but the CRDs: the webhooks first, so nothing calls a service
    that is going away; then the job's namespace and the rest."""
    try:  # the overlay the doc wrote, with the certificates it made; else base's objects
        installed = kustomize(work / "manifests" / "overlays" / "my-cluster")
    except AssertionError:
        installed = kustomize(MANIFESTS / "base")
    ours = [d for d in installed if d["kind"] != "CustomResourceDefinition"
            and (d["kind"], d["metadata"]["name"], d["metadata"].get("namespace", "")) not in before]
    hooks = [d for d in ours if d["kind"] in WEBHOOK_KINDS]
    for batch in (hooks, [d for d in ours if d not in hooks]):
        cluster.kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=true", "--timeout=180s",
                        input="\n".join(json.dumps(d) for d in batch), timeout=240, check=False)
    cluster.kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=false", check=False)


@pytest.mark.parametrize("doc", INSTALL_DOCS)
def test_a_newcomer_installs_as_printed(doc: str, node, pushed, on_the_real_node, policybundle_crd, tmp_path: Path):
    namespace = f"newcomer-{uuid.uuid4().hex[:8]}"
    sub = Substitution(namespace, {API_SERVER_SOURCE: f"{node['gateway']}/32"})
    work = tmp_path / "clone"
    for tree in ("examples", "manifests"):
        copy_tree(REPO / tree, work / tree, sub)
    env = user_env(tmp_path / "home", cluster.ADMIN_KUBECONFIG)
    _wait_until_free()
    before = present(kustomize(MANIFESTS / "base"))
    captures: dict[str, str] = {}
    problems: list[str] = []
    try:
        for step in harness.steps(doc, {"install", "cluster"}):
            problems += run_step(step, sub, work, env, captures, timeout=ROLLOUT_SECONDS)
            if problems:
                break  # the steps build on each other: the first that fails says what is wrong
    finally:
        seen = diagnostics() if problems else ""
        uninstall(work, before, namespace)
    assert not problems, "\n".join(problems) + seen


def diagnostics() -> str:
    """What the install left to read when a step failed: the service's objects, events and log."""
    def kc(*args: str) -> str:
        p = cluster.kubectl(*args, check=False)
        return p.stdout + p.stderr
    return ("\n--- objects ---\n" + kc("get", "deploy,rs,pods,endpointslices", "-n", "trainjob-admission", "-o", "wide")
            + "\n--- events ---\n" + kc("get", "events", "-n", "trainjob-admission", "--sort-by=.lastTimestamp")[-3000:]
            + "\n--- the service's log ---\n" + kc("logs", "-n", "trainjob-admission", "-l",
                                                  "app.kubernetes.io/name=trainjob-admission", "--tail=20"))


def test_every_doc_that_installs_is_run() -> None:
    assert set(INSTALL_DOCS) == {"docs/quickstart.md", "docs/deploy.md"}
