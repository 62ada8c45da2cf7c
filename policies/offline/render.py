"""Renderings of decisions and explanations, shared by the CLI and the demo."""
from __future__ import annotations

from ..decide.decision import Decision, Verdict
from ..job.vocabulary import plural, shape
from ..k8s.quantity import format_amount

HEADLINES = {Verdict.ALLOW: "ALLOWED", Verdict.WARN: "ALLOWED with warnings", Verdict.DENY: "DENIED"}


def job_summary(decision: Decision) -> str:
    job = decision.job
    if job is None:
        return "job: could not be built"
    totals = job.totals
    gpus = ", ".join(f"{n} {r}" for r, n in sorted(totals["gpusByResource"].items())) or "no GPUs"
    return (f"job: {totals['pods']} pods ({shape(job)}), {gpus}, cpu {format_amount('cpu', totals['cpu'])}, "
            f"memory {format_amount('memory', totals['memory'])}"
            + (f", {plural(job.mpi['numProcPerNode'], 'slot')} per node" if job.mpi else ""))


def decision_text(obj: dict, decision: Decision) -> str:
    meta = obj.get("metadata") or {}
    head = HEADLINES[decision.decision]
    bundles = ", ".join(f"{b['name']} {b['version']}" for b in decision.bundles) or "none matched"
    lines = [f"{head}  {obj.get('kind')} {meta.get('namespace', '')}/{meta.get('name', '')}  (bundles: {bundles})"]
    messages = decision.messages
    for index, message in enumerate(messages):
        lines.append(f"  x {message['rule']}: {message['message']}")
        following = messages[index + 1]["remediation"] if index + 1 < len(messages) else None
        if message["remediation"] and message["remediation"] != following:  # a fix shared by a run of problems: once
            lines.append(f"    fix: {message['remediation']}")
    for warning in decision.warnings:
        lines.append(f"  ! {warning}")
    lines.append(f"  {job_summary(decision)}")
    for op in decision.patch:
        lines.append(f"  patch: {op['op']} {op['path']}")
    for injection in decision.injections:
        detail = [f"{k}={v}" for k, v in injection.items() if k not in ("kind", "name", "by")]
        detail += [MADE_BY[injection["by"]]] if injection.get("by") in MADE_BY else []
        lines.append(f"  inject: {injection['kind']} {injection['name']}" + (f" ({', '.join(detail)})" if detail else ""))
    lines += [f"  audit annotation: {key}={value}" for key, value in decision.audit_annotations.items()]
    return "\n".join(lines)


# Who makes a planned object (policies/decide/injections.py), as `review` says it.
MADE_BY = {"admission": "created at admission", "trainer": "made by Trainer; an existing one is refused",
           "reconciler": "created when the job is stored"}


def explain_text(decision: Decision) -> str:
    """Every rule's result, Kyverno-report style, for admins debugging a bundle."""
    rows = [("BUNDLE", "RULE", "RESULT", "EFFECT", "MESSAGE")]
    for r in decision.results:
        message = r.messages[0] if r.messages else ""
        rows.append((r.bundle, r.rule, r.result, r.effect, message))
        rows.extend(("", "", "", "", extra) for extra in r.messages[1:])
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    out = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:4])) + "  " + row[4] for row in rows]
    out.append("")
    out.append(job_summary(decision))
    return "\n".join(line.rstrip() for line in out)


def explain_json(decision: Decision) -> dict:
    """``policy explain -o json``: every rule's result and the ``job`` variable the CEL rules saw."""
    return {"results": [r.as_dict() for r in decision.results], "job": decision.job.as_cel() if decision.job else None,
            "unchecked": decision.unchecked}
