"""Bounded work per request: CEL's step budget, its deadline and cancel flag, RE2 regexes, helper
results capped, and input sizes denied (naming the field) before any rule sees them."""
from __future__ import annotations

import threading
import time

import pytest

from trainjob_admission.policies.cel.environment import (
    MAX_RESULT_CHARS, Abandoned, Budget, BudgetExceeded, CelEvalError, compile_expression, to_cel, to_python,
)
from trainjob_admission.policies.decide import limits
from trainjob_admission.policies.decide.decision import Effect, Result

# every entry against every other; comparing sizes, not names, keeps its estimated cost under lint's limit
ENV_PAIRS = "object.spec.trainer.env.all(e, object.spec.trainer.env.exists(f, size(f.name) == size(e.name)))"


def env(count: int) -> list[dict]:
    return [{"name": f"E{i}", "value": "v"} for i in range(count)]


def run(expression: str, budget: Budget | None = None, **variables):
    return to_python(compile_expression(expression).evaluate({k: to_cel(v) for k, v in variables.items()}, budget))


def test_a_quadratic_rule_over_a_long_list_runs_out_of_steps():
    obj = {"spec": {"trainer": {"env": env(1000)}}}
    budget = Budget()
    with pytest.raises(BudgetExceeded, match=f"{budget.limit} steps"):
        run(ENV_PAIRS, budget, object=obj)
    assert budget.left < 0
    # Steps are per expression (the request as a whole has its deadline): the next rule runs.
    assert run("true", budget) is True
    # The same rule over a short list is well within it.
    assert run(ENV_PAIRS, object={"spec": {"trainer": {"env": env(20)}}}) is True


def test_macro_iterations_and_built_values_are_charged():
    obj = {"items": list(range(100)), "s": "y" * 64 * 100}
    cheap, iterating, building = Budget(), Budget(), Budget()
    run("size(object.items) > 0", cheap, object=obj)
    run("object.items.all(i, i >= 0)", iterating, object=obj)
    run("object.items.map(i, 'x'.replace('x', object.s)).size() > 0", building, object=obj)
    spent = {name: b.limit - b.left for name, b in (("cheap", cheap), ("iterating", iterating), ("building", building))}
    assert spent["cheap"] < 50
    assert spent["iterating"] > 100 * 10  # ten steps or more per iteration
    assert spent["building"] > spent["iterating"] + 100 * 100  # each 6400-character string costs 100 steps


def test_a_budget_past_its_deadline_or_cancelled_abandons_the_whole_evaluation():
    obj = {"spec": {"trainer": {"env": env(200)}}}
    with pytest.raises(Abandoned):
        run(ENV_PAIRS, Budget(deadline=0.0), object=obj)  # long past
    stopping = threading.Event()
    stopping.set()
    with pytest.raises(Abandoned):
        run(ENV_PAIRS, Budget(cancelled=stopping), object=obj)
    assert not issubclass(Abandoned, CelEvalError)  # not one rule's error: the request's evaluation ends


def test_a_budget_on_the_threads_cpu_clock_is_not_used_up_by_waiting():
    """The server's slice on the event loop (webhook/admission/reviewer.py) counts the loop's own CPU:
    a wait (for the GIL, here a sleep) does not use it up, as it would use up a wall-clock deadline."""
    obj = {"spec": {"trainer": {"env": env(3)}}}
    on_cpu = Budget(deadline=time.thread_time() + 0.05, clock=time.thread_time)
    on_wall = Budget(deadline=time.monotonic() + 0.05)
    time.sleep(0.2)
    assert run("size(object.spec.trainer.env) == 3", on_cpu, object=obj) is True
    with pytest.raises(Abandoned):
        run("size(object.spec.trainer.env) == 3", on_wall, object=obj)
    with pytest.raises(Abandoned):  # and spent CPU does
        run(ENV_PAIRS, Budget(deadline=time.thread_time() + 0.001, clock=time.thread_time),
            object={"spec": {"trainer": {"env": env(200)}}})


def test_find_and_find_all_use_re2_so_a_backtracking_pattern_is_linear():
    # With Python's re this stalls for hours ('a' * 28 took 13 s); RE2 answers at once.
    assert run("object.s.find('^([a-z0-9]+)*$')", object={"s": "a" * 5000 + "!"}) == ""
    assert run("object.s.findAll('(a|aa)+b')", object={"s": "a" * 5000}) == []
    with pytest.raises(CelEvalError, match="Illegal regex"):
        run("'aa'.find(object.p)", object={"p": "(a)\\1"})  # backreferences are not RE2


def test_replace_refuses_to_build_a_huge_string():
    with pytest.raises(CelEvalError, match=f"more than {MAX_RESULT_CHARS}"):
        run("object.s.replace('', object.s) != ''", object={"s": "x" * 4096})
    assert run("object.s.replace('a', 'bb')", object={"s": "aa"}) == "bbbb"


def test_input_limits_name_the_field_and_the_limit():
    assert limits.oversized({"spec": {"trainer": {"env": env(10)}}}) == []
    (problem,) = limits.oversized({"spec": {"trainer": {"env": env(3000)}}})
    assert problem == f"spec.trainer.env has 3000 entries, more than {limits.MAX_LIST_ITEMS}"
    (problem,) = limits.oversized({"metadata": {"annotations": {"blob": "x" * (limits.MAX_STRING_CHARS + 1)}}})
    assert problem.startswith("metadata.annotations.blob is ") and str(limits.MAX_STRING_CHARS) in problem
    (problem,) = limits.oversized({"spec": {"x": [[0] * 900] * 60}})
    assert f"more than {limits.MAX_NODES} values" in problem
    (problem,) = limits.oversized({"metadata": {"labels": {"k" * (limits.MAX_STRING_CHARS + 1): "v"}}})
    assert problem.startswith("a key of metadata.labels is")


def test_an_oversized_job_is_denied_before_cel_or_the_effective_job(review, example_state, example_job, default,
                                                                    make_bundle):
    job = example_job("allowed")
    job["spec"]["trainer"]["env"] = env(3000)
    quadratic = make_bundle({"validations": [{"name": "pairs", "expression": ENV_PAIRS}]}, name="pairs")
    decision = review(job, default + [quadratic], example_state)
    assert not decision.allowed and decision.job is None and decision.patch == []
    failed = [r for r in decision.results if r.result is Result.FAIL]
    assert {(r.bundle, r.rule, r.effect) for r in failed} == {("default", "input-limits", Effect.DENY),
                                                              ("pairs", "input-limits", Effect.DENY)}
    assert "spec.trainer.env has 3000 entries, more than 1000" in failed[0].messages[0]
    assert "envFrom" in failed[0].remediations[0]


def test_a_rule_that_exhausts_the_budget_denies_with_its_name(review, example_state, example_job, make_bundle):
    job = example_job("allowed")
    job["spec"]["trainer"]["env"] = env(900)
    quadratic = make_bundle({"validations": [{"name": "pairs", "expression": ENV_PAIRS}]}, name="pairs")
    decision = review(job, [quadratic], example_state)
    (result,) = [r for r in decision.results if r.rule == "pairs"]
    assert not decision.allowed and result.result is Result.ERROR and result.effect is Effect.DENY
    assert "evaluation budget" in result.messages[0]
