"""Params from cluster objects (spec.paramKind + spec.paramRef, policies/decide/paramref.py) and the CEL
``authorizer`` (policies/cel/authz.py), each as ValidatingAdmissionPolicy defines them."""
from __future__ import annotations

import pytest

from trainjob_admission.policies.bundle.compile import BundleError
from trainjob_admission.policies.cel.authz import MAX_CHECKS, AccessCheck, AccessError
from trainjob_admission.policies.decide.decision import Result
from trainjob_admission.policies.k8s.clusterstate import PARAMS_LABEL
from trainjob_admission.webhook.admission.access import review_body
from trainjob_admission.webhook.cli.main import main

MAX_WORKERS = {"name": "max-workers", "expression": "job.workers <= int(params.maxWorkers)",
               "messageExpression": "'at most ' + params.maxWorkers + ' workers, the job has ' + string(job.workers)"}


def params_map(name: str, namespace: str = "team-a", labelled: bool = True, **data: str) -> dict:
    labels = {PARAMS_LABEL: "true", "tier": "gpu"} if labelled else {"tier": "gpu"}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "data": data}


def ref_bundle(make_bundle, **ref):
    return make_bundle({"paramKind": {"apiVersion": "v1", "kind": "ConfigMap"}, "paramRef": ref,
                        "validations": [MAX_WORKERS]})


def rule_results(decision, rule):
    return [r for r in decision.results if r.rule == rule]


# --- paramRef ---------------------------------------------------------------------------------

def test_params_come_from_the_configmap_in_the_jobs_namespace(example_job, example_state, make_bundle, review):
    bundle = ref_bundle(make_bundle, name="limits")  # no namespace: the job's (team-a), per namespace
    example_state.upsert(params_map("limits", namespace="team-b", maxWorkers="8"))  # another team's: not read
    example_state.upsert(params_map("limits", maxWorkers="2"))
    decision = review(example_job("allowed"), [bundle], example_state)  # 3 workers
    assert not decision.allowed
    assert decision.messages[0]["message"] == "at most 2 workers, the job has 3"
    example_state.upsert(params_map("limits", maxWorkers="8"))  # the watch delivers a change
    assert review(example_job("allowed"), [bundle], example_state).allowed


def test_a_fixed_namespace_serves_every_job(example_job, example_state, make_bundle, review):
    bundle = ref_bundle(make_bundle, name="limits", namespace="platform")
    example_state.upsert(params_map("limits", namespace="platform", maxWorkers="2"))
    assert not review(example_job("allowed"), [bundle], example_state).allowed


def test_every_selected_params_object_must_pass(example_job, example_state, make_bundle, review):
    bundle = ref_bundle(make_bundle, selector={"matchLabels": {"tier": "gpu"}})
    example_state.upsert(params_map("roomy", maxWorkers="8"))
    decision = review(example_job("allowed"), [bundle], example_state)
    assert decision.allowed and [r.result for r in rule_results(decision, "max-workers")] == [Result.PASS]
    example_state.upsert(params_map("strict", maxWorkers="2"))
    decision = review(example_job("allowed"), [bundle], example_state)
    assert not decision.allowed
    (failed,) = rule_results(decision, "max-workers")  # the pass for "roomy" does not count
    assert failed.messages == ["at most 2 workers, the job has 3 (params ConfigMap team-a/strict)"]


def test_no_params_object_with_deny_denies_naming_it(example_job, example_state, make_bundle, review):
    example_state.upsert(params_map("limits", labelled=False, maxWorkers="8"))  # not labelled: never kept
    decision = review(example_job("allowed"), [ref_bundle(make_bundle, name="limits")], example_state)
    assert not decision.allowed
    assert decision.messages[0]["message"] == ("bundle test takes its params from ConfigMap team-a/limits labelled "
                                               f"{PARAMS_LABEL}=true, and there is none")
    assert not rule_results(decision, "max-workers")


def test_no_params_object_with_allow_skips_the_bundles_rules(example_job, example_state, make_bundle, review):
    bundle = ref_bundle(make_bundle, selector={}, parameterNotFoundAction="Allow")
    decision = review(example_job("too-many-nodes"), [bundle], example_state)
    assert decision.allowed and not rule_results(decision, "max-workers") and not rule_results(decision, "params")


def test_inline_params_are_unchanged_and_checked_by_name(example_job, example_state, make_bundle, review):
    bundle = make_bundle({"params": {"maxWorkers": "2"}, "validations": [MAX_WORKERS]})
    assert review(example_job("allowed"), [bundle], example_state).messages[0]["message"].startswith("at most 2")
    with pytest.raises(BundleError, match="params has no key 'maxWorker'"):
        make_bundle({"params": {"maxWorkers": "2"}, "validations": [{**MAX_WORKERS, "expression": "params.maxWorker == '1'"}]})


def test_paramref_bundles_are_not_checked_against_inline_params_and_say_what_is_wrong(make_bundle):
    assert ref_bundle(make_bundle, name="limits").spec.paramRef.parameterNotFoundAction == "Deny"  # params.X compiles
    for spec, message in [
            ({"params": {"a": 1}, "paramKind": {}, "paramRef": {"name": "x"}}, "set params or paramRef, not both"),
            ({"paramKind": {}, "paramRef": {"name": "x", "selector": {}}}, "set exactly one of name and selector"),
            ({"paramRef": {"name": "x"}}, "paramKind and paramRef go together")]:
        with pytest.raises(BundleError, match=message):
            make_bundle(spec)


# --- authorizer -------------------------------------------------------------------------------

SECRETS = ("authorizer.group('').resource('secrets').namespace(object.metadata.namespace)"
           ".check('create').allowed()")


class Permissions:
    """The engine's Access: what a SubjectAccessReview would answer, and every question asked."""

    def __init__(self, allowed: set[str] | None = None, error: str = ""):
        self.allowed, self.error, self.asked = allowed or set(), error, []

    def __call__(self, check: AccessCheck) -> tuple[bool, str]:
        self.asked.append(check)
        if self.error:
            raise AccessError(self.error)
        return check.user in self.allowed, "RBAC"


def secrets_bundle(make_bundle, expression: str = SECRETS):
    return make_bundle({"validations": [{"name": "may-create-secrets", "expression": expression,
                                         "message": "only users who may create Secrets here may submit jobs"}]})


def test_authorizer_asks_for_the_submitter_and_decides(example_job, example_state, make_bundle, review):
    access = Permissions({"alice"})
    bundle = secrets_bundle(make_bundle)
    assert review(example_job("allowed"), [bundle], example_state, username="alice", groups=["team-a"],
                  access=access).allowed
    denied = review(example_job("allowed"), [bundle], example_state, username="bob", access=access)
    assert not denied.allowed and denied.messages[0]["message"] == "only users who may create Secrets here may submit jobs"
    assert access.asked[0] == AccessCheck("alice", ("team-a",), "", "create", "", "secrets", "", "team-a", "")


def test_request_resource_path_and_service_account_checks(example_job, example_state, make_bundle, review):
    access = Permissions({"alice", "system:serviceaccount:team-a:builder"})
    bundle = secrets_bundle(make_bundle, "authorizer.requestResource.check('delete').allowed() && "
                                         "authorizer.path('/healthz').check('get').reason() == 'RBAC' && "
                                         "authorizer.serviceAccount('team-a', 'builder').group('apps')"
                                         ".resource('deployments').subresource('scale').name('web').check('update')"
                                         ".allowed()")
    assert review(example_job("allowed"), [bundle], example_state, username="alice", access=access).allowed
    job, path, account = access.asked
    assert (job.group, job.resource, job.namespace, job.name, job.verb) == (
        "trainer.kubeflow.org", "trainjobs", "team-a", "resnet-allreduce", "delete")
    assert (path.path, path.verb) == ("/healthz", "get")
    assert (account.user, account.groups, account.subresource, account.name) == (
        "system:serviceaccount:team-a:builder", ("system:serviceaccounts", "system:serviceaccounts:team-a"),
        "scale", "web")


@pytest.mark.parametrize("access, reason", [
    (None, "cannot check permissions offline"),
    (Permissions(error="the SubjectAccessReview failed: HTTP 403 Forbidden"), "HTTP 403 Forbidden")])
def test_a_check_that_cannot_be_made_fails_the_rule_closed(example_job, example_state, make_bundle, review, access, reason):
    kwargs = {"access": access} if access else {}
    decision = review(example_job("allowed"), [secrets_bundle(make_bundle)], example_state, username="alice", **kwargs)
    assert not decision.allowed
    (result,) = rule_results(decision, "may-create-secrets")
    assert result.result is Result.ERROR and "permission check failed" in result.messages[0] and reason in result.messages[0]


def test_errored_lets_a_rule_look_first(example_job, example_state, make_bundle, review):
    bundle = secrets_bundle(make_bundle, "authorizer.group('').resource('pods').check('list').errored()")
    assert review(example_job("allowed"), [bundle], example_state).allowed  # offline: errored() is true


def test_checks_per_request_are_capped(example_job, example_state, make_bundle, review):
    access = Permissions({"alice"})
    many = " && ".join(f"authorizer.group('').resource('r{i}').check('get').allowed()" for i in range(MAX_CHECKS + 1))
    decision = review(example_job("allowed"), [secrets_bundle(make_bundle, many)], example_state, username="alice",
                      access=access)
    assert len(access.asked) == MAX_CHECKS
    assert not decision.allowed and f"more than {MAX_CHECKS} permission checks" in decision.messages[0]["message"]


def test_subject_access_review_body():
    resource = review_body(AccessCheck("alice", ("team-a",), "u1", "create", "", "secrets", "", "team-a", ""))
    assert resource["spec"] == {"user": "alice", "groups": ["team-a"], "uid": "u1", "resourceAttributes": {
        "verb": "create", "resource": "secrets", "namespace": "team-a"}}
    assert review_body(AccessCheck("bob", (), "", "get", path="/healthz"))["spec"] == {
        "user": "bob", "groups": [], "nonResourceAttributes": {"path": "/healthz", "verb": "get"}}


def test_review_answers_permission_checks_from_its_flag(build, tmp_path, capsys):
    bundle = tmp_path / "bundle.yaml"
    bundle.write_text(f"""apiVersion: policy.trainjob-admission.io/v1alpha1
kind: PolicyBundle
metadata: {{name: secrets}}
spec:
  validations:
    - name: may-create-secrets
      expression: "{SECRETS}"
      message: only users who may create Secrets here may submit jobs
""")
    job, state = str(build.examples / "jobs" / "allowed.yaml"), str(build.examples / "cluster-state.yaml")
    common = ["review", "-f", job, "--bundle", str(bundle), "--cluster-state", state,
              "--cluster-state", str(build.examples / "runtimes" / "mpi-openmpi.yaml")]
    assert main(common + ["--authorizer", "allow"]) == 0
    assert main(common + ["--authorizer", "deny"]) != 0
    capsys.readouterr()
    assert main(common) != 0
    assert "cannot check permissions offline" in capsys.readouterr().out
