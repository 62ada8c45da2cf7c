"""The words for a job's shape, defined once. Every message, fix, summary, record and doc says:

- **node**: a pod that runs a share of the training, as Trainer's ``spec.trainer.numNodes`` counts
  them. A TrainJob with numNodes 8 has 8 nodes, whether or not its launcher is one of them
  (``runLauncherAsNode``). An MPIJob's nodes are its Worker replicas, plus its launcher with
  ``runLauncherAsWorker``.
- **the launcher**: the pod that starts ``mpirun``; named as such, and said to be one of the
  nodes when it is one.
- **cluster node**: a Kubernetes Node, a machine that runs pods; never just "node".
- any other pod by its replicated job's name (``1 dataset-initializer``).

"Worker" is not used: it meant the nodes but the launcher, the nodes, or mpi-operator's replicas,
depending on the message (tests/unit/test_vocabulary.py holds the messages to these words).
"""
from __future__ import annotations

from .effective_job import EffectiveJob, PodSet


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def launcher_is_node(job: EffectiveJob) -> bool:
    return bool(job.mpi.get("runLauncherAsNode") and job.launcher)


def is_node(job: EffectiveJob, ps: PodSet) -> bool:
    return ps.role == "worker" or (ps.role == "launcher" and launcher_is_node(job))


def count_field(job: EffectiveJob) -> str:
    """Where the submitter sets how many nodes, in the kind they submitted."""
    return "spec.trainer.numNodes" if job.kind == "TrainJob" else "spec.mpiReplicaSpecs.Worker.replicas"


def field_value(job: EffectiveJob, pods: int) -> int:
    """The count field's value that gives ``pods`` pods in the replicated job it sets (job.workers):
    a TrainJob's numNodes counts a launcher that runs as a node as well; an MPIJob's replicas do not."""
    return pods + (1 if job.kind == "TrainJob" and launcher_is_node(job) else 0)


def set_nodes(job: EffectiveJob, value: int) -> str:
    """The fix that sets the count field to ``value`` (in that field's units, see field_value)."""
    with_launcher = f" ({plural(value + 1, 'node')} with the launcher)" if job.kind != "TrainJob" and launcher_is_node(job) else ""
    return f"set {count_field(job)} to {value}{with_launcher}"


def who(job: EffectiveJob, ps: PodSet) -> str:
    """One pod of ``ps``, as the subject of a sentence: "each node", "the launcher"."""
    if ps.role == "launcher":
        return "the launcher"
    return "each node" if ps is job.workers else f"each {ps.name} pod"


def pods(job: EffectiveJob, ps: PodSet) -> str:
    """All pods of ``ps``: "7 nodes", "the launcher", "1 dataset-initializer"."""
    if ps.role == "launcher":
        return "the launcher"
    return plural(ps.count, "node") if ps is job.workers else f"{ps.count} {ps.name}"


def shape(job: EffectiveJob) -> str:
    """The job's pods in these words: "8 nodes, the launcher among them", "4 nodes + the launcher"."""
    parts = [plural(job.num_nodes, "node") + (", the launcher among them" if launcher_is_node(job) else "")]
    if job.launcher and not launcher_is_node(job):
        parts.append("the launcher")
    parts += [f"{ps.count} {ps.name}" for ps in job.pod_sets if ps.role not in ("worker", "launcher") and ps.count]
    return " + ".join(parts)


def breakdown(job: EffectiveJob, parts: list[tuple[PodSet, str]]) -> str:
    """Amounts per pod, e.g. "8 nodes x 4", "7 nodes x 4 + the launcher node x 1", "4 nodes x 4 +
    the launcher x 1"; ``parts``: (pod set, the amount one of its pods asks for, as shown). A
    launcher that is a node and asks for what the other nodes do is counted with them."""
    shown = dict((id(ps), amount) for ps, amount in parts)
    launcher, nodes = job.launcher, job.workers
    merged = (launcher is not None and nodes is not None and launcher_is_node(job)
              and id(launcher) in shown and shown.get(id(launcher)) == shown.get(id(nodes)))
    out = []
    for ps, amount in parts:
        if merged and ps is launcher:
            continue
        if merged and ps is nodes:
            out.append(f"{plural(ps.count + 1, 'node')} x {amount}")
        elif ps.role == "launcher":
            out.append(f"the launcher{' node' if launcher_is_node(job) else ''} x {amount}")
        else:
            out.append(f"{pods(job, ps)} x {amount}")
    return " + ".join(out)
