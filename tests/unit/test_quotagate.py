"""The quota gate's turns (webhook/admission/quotagate.py): decisions that take room in one
namespace's quota wait for each other, and only for each other."""
from __future__ import annotations

import asyncio
import copy

from trainjob_admission.policies.capacity.reservations import Reservations
from trainjob_admission.policies.decide.engine import AdmissionInput, evaluate
from trainjob_admission.webhook.admission.quotagate import QuotaGate
from trainjob_admission.webhook.metrics import Metrics



def request(example_job, namespace: str, name: str, dry_run: bool = False) -> AdmissionInput:
    obj = example_job("allowed")
    obj["metadata"].update(namespace=namespace, name=name, uid=f"uid-{name}", generation=1)
    return AdmissionInput(obj, dry_run=dry_run)


def test_a_namespace_waiting_for_its_turn_holds_up_no_other(example_state, example_job, default):
    state = example_state
    quota = copy.deepcopy(state.namespace_quotas("team-a")[0])
    quota["metadata"]["namespace"] = "team-b"
    state.upsert({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-b"}})
    state.upsert(quota)
    state.reservations = Reservations(state)
    gate = QuotaGate(state, Metrics())
    order: list[str] = []

    def deciding(req: AdmissionInput, gate_open: asyncio.Event | None = None):
        async def run():
            if gate_open is not None:
                await gate_open.wait()
            order.append(req.object["metadata"]["name"])
            return evaluate(req, default, state)
        return run

    async def main() -> None:
        gate_open = asyncio.Event()
        first = asyncio.create_task(gate.decide(request(example_job, "team-a", "a-1"), deciding(
            request(example_job, "team-a", "a-1"), gate_open)))
        await asyncio.sleep(0.01)  # a-1 holds team-a's turn, waiting
        second = asyncio.create_task(gate.decide(request(example_job, "team-a", "a-2"),
                                                 deciding(request(example_job, "team-a", "a-2"))))
        other, _ = await asyncio.wait_for(gate.decide(request(example_job, "team-b", "b-1"),
                                                      deciding(request(example_job, "team-b", "b-1"))), 5)
        dry, _ = await asyncio.wait_for(gate.decide(request(example_job, "team-a", "a-dry", dry_run=True),
                                                    deciding(request(example_job, "team-a", "a-dry"))), 5)
        assert other.allowed and dry.allowed and not second.done()  # team-b and a dry run did not wait
        gate_open.set()
        (a1, held), _ = await first, await second
        assert a1.allowed and held is not None and held.entry.job == "a-1"
        assert a1.facts["reservation"]["path"] == "replica"
        assert dry.facts["reservation"] == {"path": "replica", "dryRun": True}  # decided, nothing taken

    asyncio.run(main())
    assert order == ["b-1", "a-dry", "a-1", "a-2"]  # a-2 only after a-1's decision and entry


def test_which_path_decides_a_claim_on_the_quota(example_state, example_job):
    """Kueue reserves the quota of the jobs it queues: those take no turn and no entry; a job
    suspended by hand holds none until it is resumed, and its resume takes one."""
    state = example_state
    state.reservations = Reservations(state)
    gate = QuotaGate(state, Metrics())

    def job(suspend: bool = False, queue: str | None = None, namespace: str = "team-a") -> dict:
        obj = example_job("allowed")
        obj["metadata"]["namespace"] = namespace
        obj["spec"]["suspend"] = suspend
        if queue:
            obj["metadata"].setdefault("labels", {})["kueue.x-k8s.io/queue-name"] = queue
        return obj

    def path(obj: dict, old: dict | None = None) -> str | None:
        return gate.path(AdmissionInput(obj, operation="UPDATE" if old else "CREATE", old_object=old))

    assert path(job()) == "replica"  # no ledger here: this replica's entries
    assert path(job(suspend=True, queue="gpu")) == "kueue"  # Kueue's webhook suspended it
    assert path(job(queue="gpu"), old=job(suspend=True, queue="gpu")) == "kueue"  # Kueue resumed it
    assert path(job(suspend=True)) == "suspended"
    assert path(job(), old=job(suspend=True)) == "replica"  # resumed by hand: it takes room now
    assert path(job(), old=job()) is None  # a running job changed: it took its room when it started
    assert path(job(namespace="no-quota")) is None
