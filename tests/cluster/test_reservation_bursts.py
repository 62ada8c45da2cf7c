"""Issue 32 on the real control plane, without Kueue: a burst of TrainJobs against a namespace
ResourceQuota, decided by one replica of the service and by two (the API server splits the
requests between them by a matchCondition on the job's name, as a Service would spread them).

The namespace's quota holds 8 GPUs; each job is 2 pods x 1 GPU (launcher + 1 node), so 4 fit.
16 creations are released at once, as a pipeline or a sweep submits them; KWOK keeps the pods
running, so they hold the quota (tests/support/bursts.py). Every round: no more jobs admitted than
the quota holds, and no gang half-created (an admitted job whose second pod ResourceQuota refuses
waits for ever). Then the jobs are deleted, the capacity frees, and the next round is admitted again.
"""
from __future__ import annotations

import pytest

from tests.support.bursts import (
    FITS, PODS_PER_JOB, QUOTA, burst, free, gangs, namespace_objects, quota_refusals, split, user_api,
)
from tests.support.objects import runtime
from tests.support.service import cluster, default_bundle_for, replicas_as_installed, scratch_namespace

pytestmark = pytest.mark.cluster

LABEL = "trainjob-admission.io/reservation-bursts-test"
BURST, ROUNDS = 16, 2


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_burst_admits_what_the_quota_holds_and_no_half_created_gang(replicas, control_plane, policybundle_crd,
                                                                       tmp_path):
    api = user_api(BURST)
    with scratch_namespace("burst", LABEL) as (ns, run):
        cluster.apply_objects([runtime(), *namespace_objects(ns), default_bundle_for(ns, LABEL, run)])
        with replicas_as_installed(tmp_path, ns, [ns], f"{LABEL}={run}", split(replicas)) as services:
            for rnd in range(ROUNDS):
                names = [f"r{rnd}-{i:02d}" for i in range(BURST)]
                results = burst(api, [(ns, name) for name in names])
                admitted = sorted(job for job, created in results.items() if created.admitted)
                refusals = {job[1]: created.refusal for job, created in results.items() if not created.admitted}
                pods = gangs([ns], admitted)
                half = {name: pods[(ns, name)] for _, name in admitted if pods[(ns, name)] != PODS_PER_JOB}
                seen = (f"round {rnd + 1}, {replicas} replica(s): admitted {[name for _, name in admitted]}; "
                        f"pods {dict(pods)}; ResourceQuota refused {quota_refusals(ns)[:3]}")
                assert len(results) == BURST, seen
                assert len(admitted) <= FITS, seen
                assert not half, f"half-created gangs {half}; {seen}"
                assert admitted, f"nothing admitted after the capacity freed; {seen}; refusals {refusals}"
                assert all(f'quota "{QUOTA}"' in why for why in refusals.values()), refusals
                if replicas > 1:  # both replicas decided
                    decided = [{r.get("name") for r in s.records() if r.get("endpoint") == "validate"} for s in services]
                    assert all(d & set(names) for d in decided), decided
                free([ns])
