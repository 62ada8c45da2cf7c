"""The real-world job corpus (tests/unit/corpus/corpus.yaml): its entries, each job and cluster
state read from upstream or our files, and docs/corpus.md rendered from it.

    for case in cases():            # one Case per job x scenario
        case.job(), case.state()    # the object to review and the ClusterState it is judged in
    print(table())                  # docs/corpus.md

Regenerate the docs table after editing the manifest:
    .venv/bin/python -m tests.support.corpus > docs/corpus.md
"""
from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from trainjob_admission.policies.k8s.clusterstate import ClusterState, load_objects

from . import upstream

CORPUS = Path(__file__).resolve().parents[1] / "unit" / "corpus"
NAMESPACED = {"TrainJob", "TrainingRuntime", "MPIJob"}


@dataclass(frozen=True)
class Expectation:
    """``allow: why`` or ``deny RULE[,RULE]: why``. A RULE ``a|b`` accepts either name; ``?a`` may
    be there or not (a job-model error stops the checks that would also have denied)."""

    allowed: bool
    rules: tuple[frozenset[str], ...]
    optional: frozenset[str]
    why: str

    @classmethod
    def parse(cls, text: str) -> "Expectation":
        verdict, _, why = text.partition(": ")
        word, _, rules = verdict.partition(" ")
        names = [r for r in rules.split(",") if r]
        required = tuple(frozenset(r.split("|")) for r in names if not r.startswith("?"))
        if word not in ("allow", "deny") or (word == "deny") != bool(required) or not why:
            raise ValueError(f"expectation {text!r}: want 'allow: why' or 'deny RULE[,RULE]: why'")
        return cls(word == "allow", required, frozenset(r[1:] for r in names if r.startswith("?")), why)

    def matches(self, allowed: bool, denying: set[str]) -> bool:
        if allowed != self.allowed:
            return False
        unmatched = set(denying)
        for choices in self.rules:
            hit = unmatched & choices
            if not hit:
                return False
            unmatched -= {min(hit)}
        return unmatched <= self.optional

    @property
    def verdict(self) -> str:
        rules = ["|".join(sorted(r)) for r in self.rules] + [f"({r})" for r in sorted(self.optional)]
        return "allow" if self.allowed else "deny " + ", ".join(rules)


@dataclass(frozen=True)
class Case:
    id: str
    scenario: str
    namespace: str
    source: dict
    runtimes: tuple[dict, ...]
    expect: Expectation
    notes: str = ""
    stock: tuple[dict, ...] = field(default=(), repr=False)

    def job(self) -> dict:
        (obj,) = upstream.objects(self.source, CORPUS)
        return _in_namespace(obj, self.namespace)

    def state(self) -> ClusterState:
        runtimes = [_in_namespace(obj, self.namespace)
                    for source in self.stock + self.runtimes for obj in upstream.objects(source, CORPUS)]
        return ClusterState.from_objects(copy.deepcopy(_cluster_state()) + runtimes)

    def describe(self) -> str:
        return f"{self.id} [{self.scenario}]: {upstream.describe(self.source)}"


def _in_namespace(obj: dict, namespace: str) -> dict:
    """As `kubectl apply -n NAMESPACE` would create it (namespaced kinds only)."""
    if obj.get("kind") in NAMESPACED:
        obj.setdefault("metadata", {})["namespace"] = namespace
    return obj


@functools.cache
def _cluster_state() -> list[dict]:
    return load_objects(CORPUS / "cluster-state.yaml")


@functools.cache
def manifest() -> dict:
    return yaml.safe_load((CORPUS / "corpus.yaml").read_text())


def cases() -> list[Case]:
    doc = manifest()
    stock = tuple(doc["stockRuntimes"])
    return [Case(entry["id"], scenario, namespace, entry["source"], tuple(entry.get("runtimes") or ()),
                 Expectation.parse(entry["expect"][scenario]), entry.get("notes", ""), stock)
            for entry in doc["jobs"] for scenario, namespace in doc["scenarios"].items()]


def _source_cell(source: dict) -> str:
    if "file" in source:
        return f"`tests/unit/corpus/{upstream.describe(source)}`"
    return f"{source['module']} `{upstream.describe(source).split(' ', 1)[1]}`"


def table() -> str:
    """docs/corpus.md: one row per job, one column per scenario (the verdict; reasons below)."""
    doc = manifest()
    scenarios = list(doc["scenarios"])
    by_id: dict[str, list[Case]] = {}
    for case in cases():
        by_id.setdefault(case.id, []).append(case)
    lines = [
        "# The real-world job corpus",
        "",
        "Generated from `tests/unit/corpus/corpus.yaml` by `.venv/bin/python -m tests.support.corpus > docs/corpus.md`;",
        "`tests/unit/test_corpus.py` runs each job through the engine `review` uses, under the shipped default",
        "bundle, and checks this table is current. The expected decisions follow what Kubernetes, Trainer",
        "v2.3.0, JobSet and mpi-operator v0.7.0 do with the job, not what the engine says today.",
        "",
        "Sources: `trainer` is `" + upstream.version("trainer") + "`, `mpi-operator` is `"
        + upstream.version("mpi-operator") + "`, read from the Go module cache (never copied here); a",
        "`yaml block N` is the Nth yaml block of that Markdown page, a `document N` the Nth YAML document,",
        "both from 0. Files under `tests/unit/corpus/` name what they follow in their `source:` comment.",
        "",
        "Namespaces (`tests/unit/corpus/cluster-state.yaml`): each has a ResourceQuota (requests.cpu 1000,",
        "requests.memory 4Ti, limits.cpu 2000, limits.memory 8Ti, requests.nvidia.com/gpu 64, pods 500; none",
        "in use) and a LimitRange (default cpu 2 / memory 4Gi, defaultRequest 1 / 2Gi, max 64 / 512Gi per",
        "container). " + ", ".join(f"`{s}` is `{doc['scenarios'][s]}`" for s in scenarios) + ": `team` has no",
        "Pod Security label (the bundle's `defaultLevel: baseline` applies), `restricted` enforces",
        "`restricted`, `openshift` carries the `openshift.io/sa.scc.*` annotations (restricted-v2 SCC).",
        "",
        "| job | source | " + " | ".join(scenarios) + " |",
        "|---|---|" + "---|" * len(scenarios),
    ]
    for job_id, job_cases in by_id.items():
        lines.append(f"| {job_id} | {_source_cell(job_cases[0].source)} | "
                     + " | ".join(c.expect.verdict for c in job_cases) + " |")
    lines += ["", "## Why", ""]
    for job_id, job_cases in by_id.items():
        lines.append(f"- **{job_id}**" + (f" ({job_cases[0].notes})" if job_cases[0].notes else ""))
        lines += [f"  - {c.scenario}: {c.expect.why}" for c in job_cases]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(table(), end="")
