"""LimitRange defaults in the effective job, and rule `limit-range` (the LimitRanger's
min/max/maxLimitRequestRatio), as Kubernetes applies them when the Job controller creates pods."""
from __future__ import annotations

import pytest
import yaml

from trainjob_admission.policies.checks import limitrange, quota
from trainjob_admission.policies.checks.base import CheckContext
from trainjob_admission.policies.checks.limitrange import LimitRangeCheck
from trainjob_admission.policies.checks.quota import QuotaCheck
from trainjob_admission.policies.job.effective_job import JobModelError
from trainjob_admission.policies.job.effective_job import build as effective
from trainjob_admission.policies.k8s.clusterstate import ClusterState
from trainjob_admission.webhook.cli.main import main


def limit_range(*items: dict, name: str = "limits", namespace: str = "team-a") -> dict:
    return {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": name, "namespace": namespace},
            "spec": {"limits": list(items)}}


def bare_pod(resources: dict | None = None, init: dict | None = None) -> dict:
    """A one-container pod spec that sets only ``resources`` (none: nothing at all)."""
    container: dict = {"name": "node", "image": "quay.io/acme-ml/openmpi-runtime:4.1"}
    if resources is not None:
        container["resources"] = resources
    spec: dict = {"containers": [container]}
    if init is not None:
        spec["initContainers"] = [{"name": "setup", "image": "quay.io/acme/setup:1", **init}]
    return spec


def job_in(build, *objects: dict, node: dict | None = None, launcher: dict | None = None, **trainer):
    runtime = build.runtime(node=node or bare_pod(), launcher=launcher or bare_pod())
    state = build.state(runtime, *objects)
    return effective(build.trainjob(**trainer), state), state


def findings(job, state: ClusterState) -> list[str]:
    context = CheckContext(job, limit_ranges=state.namespace_limit_ranges(job.namespace))
    return [f.message for f in limitrange.check(context, LimitRangeCheck())]


CONTAINER_DEFAULTS = {"type": "Container", "default": {"cpu": "2", "memory": "4Gi"},
                      "defaultRequest": {"cpu": "500m", "memory": "1Gi"}}


def test_defaults_fill_a_container_that_sets_nothing_init_containers_too(build):
    job, _ = job_in(build, limit_range(CONTAINER_DEFAULTS), launcher=bare_pod(init={}))
    launcher = job.launcher
    setup = launcher.pod["spec"]["initContainers"][0]
    assert setup["resources"] == {"limits": {"cpu": "2", "memory": "4Gi"}, "requests": {"cpu": "500m", "memory": "1Gi"}}
    assert launcher.requests == {"cpu": 500, "memory": 1 << 30}
    assert launcher.limits == {"cpu": 2000, "memory": 4 << 30}


def test_a_namespace_without_limit_range_is_left_as_written(build):
    job, _ = job_in(build, limit_range(CONTAINER_DEFAULTS, namespace="other"))
    assert "resources" not in job.launcher.pod["spec"]["containers"][0]
    assert job.launcher.requests == {}


def test_requests_default_from_limits_before_the_limit_range(build):
    # SetDefaults_Pod copies the container's own limit first; the LimitRange fills the rest.
    job, _ = job_in(build, limit_range(CONTAINER_DEFAULTS), node=bare_pod({"limits": {"cpu": "3"}}))
    resources = job.workers.pod["spec"]["containers"][0]["resources"]
    assert resources["requests"] == {"cpu": "3", "memory": "1Gi"}
    assert resources["limits"] == {"cpu": "3", "memory": "4Gi"}


def test_hand_written_limit_range_is_defaulted_as_the_api_server_stores_it(build):
    # default <- max; defaultRequest <- default, else min (SetDefaults_LimitRangeItem)
    job, _ = job_in(build, limit_range({"type": "Container", "max": {"cpu": "4"}, "min": {"memory": "1Gi"}}))
    assert job.launcher.requests == {"cpu": 4000, "memory": 1 << 30}
    assert job.launcher.limits == {"cpu": 4000}


def test_the_first_limit_range_setting_a_resource_wins(build):
    first = limit_range({"type": "Container", "defaultRequest": {"cpu": "1"}}, name="a")
    second = limit_range({"type": "Container", "defaultRequest": {"cpu": "3", "memory": "2Gi"}}, name="b")
    job, _ = job_in(build, second, first)
    assert job.launcher.requests == {"cpu": 1000, "memory": 2 << 30}


def test_quota_counts_the_defaults_and_does_not_warn(build):
    quota_obj = build.quota({"requests.cpu": "2", "requests.memory": "100Gi"})
    job, _ = job_in(build, limit_range(CONTAINER_DEFAULTS), numNodes=5)
    (finding,) = quota.check(CheckContext(job, quotas=[quota_obj]), QuotaCheck())
    assert "sets no" not in finding.message
    assert "job needs 2500m cpu requests" in finding.message  # 4 workers + 1 launcher x 500m
    without, _ = job_in(build, numNodes=5)
    messages = [f.message for f in quota.check(CheckContext(without, quotas=[quota_obj]), QuotaCheck())]
    assert any("sets no cpu request" in m for m in messages)


def test_container_max_is_refused_with_the_field_and_numbers(build):
    job, state = job_in(build, limit_range({"type": "Container", "max": {"cpu": "4"}}),
                        resourcesPerNode={"limits": {"cpu": "8"}})
    context = CheckContext(job, limit_ranges=state.namespace_limit_ranges("team-a"))
    # the launcher runs as a node here, so resourcesPerNode reaches its "node" container too
    finding, launcher = limitrange.check(context, LimitRangeCheck())
    assert launcher.message.startswith("launcher container 'node': ")
    assert finding.message == ('node container \'node\': LimitRange "limits" in team-a: maximum cpu per Container '
                               'is 4, but the limit is 8; Kubernetes will refuse to create these pods')
    assert finding.remediation.startswith('set spec.trainer.resourcesPerNode.limits.cpu within the LimitRange')


def test_container_min_on_an_init_container(build):
    launcher = bare_pod({"requests": {"memory": "1Gi"}}, init={"resources": {"requests": {"memory": "64Mi"}}})
    job, state = job_in(build, limit_range({"type": "Container", "min": {"memory": "256Mi"}}), launcher=launcher,
                        node=bare_pod({"requests": {"memory": "1Gi"}}))
    assert findings(job, state) == [
        'launcher init container \'setup\': LimitRange "limits" in team-a: minimum memory per Container is 256Mi, '
        'but the request is 64Mi; Kubernetes will refuse to create these pods']


def test_limit_request_ratio(build):
    node = bare_pod({"requests": {"cpu": "1"}, "limits": {"cpu": "4"}})
    launcher = bare_pod({"requests": {"cpu": "1"}, "limits": {"cpu": "2"}})
    job, state = job_in(build, limit_range({"type": "Container", "maxLimitRequestRatio": {"cpu": "2"}}),
                        node=node, launcher=launcher)
    assert findings(job, state) == [
        'node container \'node\': LimitRange "limits" in team-a: cpu limit/request ratio per Container is at most 2, '
        'but the limit 4 is 4 times the request 1; Kubernetes will refuse to create these pods']


def test_a_default_limit_below_the_request_is_refused(build):
    """The pod validation refuses a request above its limit, and a LimitRange default limit can
    put one there: a job-model error naming the field the submitter sets."""
    with pytest.raises(JobModelError) as refused:
        job_in(build, limit_range({"type": "Container", "default": {"memory": "2Gi"}}),
               node=bare_pod({"requests": {"memory": "8Gi"}}), launcher=bare_pod({"limits": {"memory": "1Gi"}}))
    assert str(refused.value).startswith(
        "node pods would be refused by Kubernetes: spec.trainer.resourcesPerNode.requests.memory: "
        "request 8Gi is more than limit 2Gi (a LimitRange default limit applies")


def test_pod_max_is_over_the_sum_of_containers(build):
    node = bare_pod({"limits": {"cpu": "3"}})
    node["containers"].append({"name": "exporter", "image": "quay.io/acme/exporter:1",
                               "resources": {"limits": {"cpu": "2"}}})
    job, state = job_in(build, limit_range({"type": "Pod", "max": {"cpu": "4"}}), node=node,
                        launcher=bare_pod({"limits": {"cpu": "1"}}))
    assert findings(job, state) == [
        'node pod: LimitRange "limits" in team-a: maximum cpu per Pod is 4, but the limit is 5 (its containers '
        'together); Kubernetes will refuse to create these pods']


def test_default_bundle_denies_through_the_engine(build, default, review):
    runtime = build.runtime(node=bare_pod(), launcher=bare_pod())
    state = build.state(runtime, build.namespace(), limit_range({"type": "Container", "max": {"memory": "2Gi"},
                                                                 "default": {"memory": "1Gi"}}))
    decision = review(build.trainjob(numNodes=1, resourcesPerNode={"limits": {"memory": "4Gi"}}), default, state)
    denied = [r for r in decision.results if r.rule == "limit-range" and r.messages]
    assert not decision.allowed and denied
    assert "maximum memory per Container is 2Gi, but the limit is 4Gi" in denied[0].messages[0]


def test_limit_ranges_are_kept_per_namespace_and_deleted():
    lr = limit_range(CONTAINER_DEFAULTS)
    state = ClusterState.from_objects([lr, limit_range(CONTAINER_DEFAULTS, name="x", namespace="b")])
    assert state.namespace_limit_ranges("team-a") == [lr]
    state.delete(lr)
    assert state.namespace_limit_ranges("team-a") == [] and len(state.namespace_limit_ranges("b")) == 1


def test_review_reads_limit_ranges_from_cluster_state(build, tmp_path, capsys):
    runtime = build.runtime(node=bare_pod(), launcher=bare_pod())
    objects = [runtime, build.namespace(), limit_range({"type": "Container", "max": {"memory": "2Gi"}})]
    state = tmp_path / "state.yaml"
    state.write_text(yaml.safe_dump_all(objects))
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(build.trainjob(numNodes=1, resourcesPerNode={"limits": {"memory": "4Gi"}})))
    assert main(["review", "-f", str(job), "--cluster-state", str(state)]) == 1
    assert "maximum memory per Container is 2Gi, but the limit is 4Gi" in capsys.readouterr().out
