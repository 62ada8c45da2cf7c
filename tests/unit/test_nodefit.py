"""The scheduler's filters, one pod against one node, with cases worked out from the rules of
kube-scheduler v1.36 (nodeaffinity, tainttoleration, nodeunschedulable, nodename, noderesources)
and component-helpers' node selector matching."""
from __future__ import annotations

import pytest

from trainjob_admission.policies.capacity.jobfit import assess
from trainjob_admission.policies.capacity.nodefit import (
    Effort, class_refusal, holds, label_refusal, matching_members, node_classes, pod_needs, tolerates,
    untolerated,
)


def node(name="n1", labels=None, taints=(), unschedulable=False, **allocatable):
    obj = {"apiVersion": "v1", "kind": "Node",
           "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
           "spec": {"taints": [dict(zip(("key", "value", "effect"), t)) for t in taints]},
           "status": {"allocatable": {"pods": "110", **allocatable}}}
    if unschedulable:
        obj["spec"]["unschedulable"] = True
    return obj


def one(nodes):
    (cls,) = node_classes(nodes)
    return cls


def affinity(*terms):
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}}


def expr(key, operator, *values):
    return {"key": key, "operator": operator, **({"values": list(values)} if values else {})}


# --- tolerations (core/v1 Toleration.ToleratesTaint) -------------------------------------------

@pytest.mark.parametrize("toleration, taint, expected", [
    (("gpu", "Equal", "yes", "NoSchedule"), ("gpu", "yes", "NoSchedule"), True),
    (("gpu", "Equal", "no", "NoSchedule"), ("gpu", "yes", "NoSchedule"), False),
    (("gpu", "", "yes", "NoSchedule"), ("gpu", "yes", "NoSchedule"), True),  # empty operator is Equal
    (("gpu", "Exists", "", "NoSchedule"), ("gpu", "anything", "NoSchedule"), True),
    (("gpu", "Exists", "", ""), ("gpu", "x", "NoExecute"), True),  # empty effect matches every effect
    (("gpu", "Exists", "", "NoExecute"), ("gpu", "x", "NoSchedule"), False),
    (("", "Exists", "", ""), ("anything", "x", "NoExecute"), True),  # empty key with Exists: everything
    (("", "Exists", "", "NoSchedule"), ("anything", "x", "NoExecute"), False),
    (("other", "Exists", "", ""), ("gpu", "x", "NoSchedule"), False),
    (("mem", "Lt", "100", "NoSchedule"), ("mem", "64", "NoSchedule"), True),  # taint value < toleration value
    (("mem", "Lt", "100", "NoSchedule"), ("mem", "100", "NoSchedule"), False),
    (("mem", "Gt", "100", "NoSchedule"), ("mem", "101", "NoSchedule"), True),
    (("mem", "Gt", "100", "NoSchedule"), ("mem", "abc", "NoSchedule"), False),
    (("mem", "Gt", "0100", "NoSchedule"), ("mem", "101", "NoSchedule"), False),  # not a decimal integer
    (("mem", "Lt", "5", "NoSchedule"), ("mem", "-0", "NoSchedule"), False),
    (("mem", "Lt", "5", "NoSchedule"), ("mem", "-3", "NoSchedule"), True),
    (("gpu", "Whatever", "", ""), ("gpu", "", "NoSchedule"), False),
])
def test_toleration_matching(toleration, taint, expected):
    assert tolerates(toleration, taint) is expected


def test_only_noschedule_and_noexecute_taints_keep_a_pod_off():
    needs = pod_needs({}, {})
    assert untolerated(needs, [("a", "", "PreferNoSchedule")], skip_transient=False) is None
    assert untolerated(needs, [("a", "", "PreferNoSchedule"), ("b", "1", "NoExecute")], skip_transient=False) == ("b", "1", "NoExecute")


def test_a_pod_with_node_name_skips_cordons_and_noschedule_taints_but_not_noexecute():
    """The kubelet admits it: NoExecute taints only, and a cordon does not apply."""
    needs = pod_needs({"nodeName": "n1"}, {})
    cls = one([node(taints=[("a", "", "NoSchedule")], unschedulable=True)])
    assert class_refusal(needs, cls, Effort(), ever=False) is None
    cls = one([node(taints=[("a", "", "NoExecute")])])
    assert class_refusal(needs, cls, Effort(), ever=False).startswith("have the taint a:NoExecute")
    assert matching_members(pod_needs({"nodeName": "n2"}, {}), cls, Effort()) == (0, "are not the node named in spec.nodeName")


def test_every_pod_tolerates_not_ready_and_unreachable_noexecute():
    """DefaultTolerationSeconds admission adds these tolerations to every pod."""
    needs = pod_needs({}, {})
    assert untolerated(needs, [("node.kubernetes.io/not-ready", "", "NoExecute")], skip_transient=False) is None
    assert untolerated(needs, [("node.kubernetes.io/not-ready", "", "NoSchedule")], skip_transient=False) is not None


# --- cordons and transient conditions ----------------------------------------------------------

def test_a_cordoned_node_refuses_now_but_counts_for_ever():
    cls = one([node(unschedulable=True)])
    needs = pod_needs({}, {})
    assert class_refusal(needs, cls, Effort(), ever=False) == "are cordoned (spec.unschedulable)"
    assert class_refusal(needs, cls, Effort(), ever=True) is None
    tolerant = pod_needs({"tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists",
                                           "effect": "NoSchedule"}]}, {})
    assert class_refusal(tolerant, cls, Effort(), ever=False) is None
    everything = pod_needs({"tolerations": [{"operator": "Exists"}]}, {})
    assert class_refusal(everything, cls, Effort(), ever=False) is None


def test_node_controller_taints_count_now_but_not_for_ever():
    cls = one([node(taints=[("node.kubernetes.io/memory-pressure", "", "NoSchedule")])])
    needs = pod_needs({}, {})
    assert "memory-pressure" in class_refusal(needs, cls, Effort(), ever=False)
    assert class_refusal(needs, cls, Effort(), ever=True) is None
    admin = one([node(taints=[("dedicated", "ml", "NoSchedule")])])
    assert class_refusal(needs, admin, Effort(), ever=True) == "have the taint dedicated=ml:NoSchedule that it does not tolerate"


# --- node selector and required node affinity --------------------------------------------------

LABELS = {"zone": "a", "gpu.count": "8", "tier": "gold", "kubernetes.io/hostname": "n1"}


@pytest.mark.parametrize("term, expected", [
    ({"matchExpressions": [expr("zone", "In", "a", "b")]}, True),
    ({"matchExpressions": [expr("zone", "In", "b")]}, False),
    ({"matchExpressions": [expr("zone", "NotIn", "b")]}, True),
    ({"matchExpressions": [expr("missing", "NotIn", "b")]}, True),  # an absent label is not in any set
    ({"matchExpressions": [expr("zone", "NotIn", "a")]}, False),
    ({"matchExpressions": [expr("tier", "Exists")]}, True),
    ({"matchExpressions": [expr("missing", "Exists")]}, False),
    ({"matchExpressions": [expr("missing", "DoesNotExist")]}, True),
    ({"matchExpressions": [expr("tier", "DoesNotExist")]}, False),
    ({"matchExpressions": [expr("gpu.count", "Gt", "4")]}, True),
    ({"matchExpressions": [expr("gpu.count", "Gt", "8")]}, False),
    ({"matchExpressions": [expr("gpu.count", "Lt", "9")]}, True),
    ({"matchExpressions": [expr("gpu.count", "Lt", "+9")]}, True),  # strconv.ParseInt takes a sign
    ({"matchExpressions": [expr("tier", "Gt", "1")]}, False),  # a label that is no integer never matches
    ({"matchExpressions": [expr("missing", "Lt", "1")]}, False),
    ({"matchExpressions": [expr("zone", "In", "a"), expr("tier", "In", "silver")]}, False),  # ANDed
    ({"matchExpressions": [expr("zone", "In")]}, False),  # In without values: the term cannot parse
    ({"matchExpressions": [expr("zone", "Exists", "a")]}, False),
    ({"matchExpressions": [expr("zone", "Gt", "1", "2")]}, False),
    ({"matchExpressions": [expr("zone", "Like", "a")]}, False),
    ({"matchFields": [expr("metadata.name", "In", "n1")]}, True),
    ({"matchFields": [expr("metadata.name", "In", "n2")]}, False),
    ({"matchFields": [expr("metadata.name", "NotIn", "n2")]}, True),
    ({"matchFields": [expr("metadata.name", "In", "n1", "n2")]}, False),  # exactly one value
    ({"matchFields": [expr("metadata.name", "Exists")]}, False),
    ({"matchExpressions": [expr("zone", "In", "a")], "matchFields": [expr("metadata.name", "In", "n2")]}, False),
    ({}, False),  # an empty term matches nothing
    ({"matchExpressions": []}, False),
])
def test_one_required_term(term, expected):
    needs = pod_needs(affinity(term), {})
    assert (label_refusal(needs, LABELS, "n1") is None) is expected


def test_terms_are_ored_and_an_unparsable_or_empty_term_does_not_spoil_the_others():
    good, bad = {"matchExpressions": [expr("zone", "In", "a")]}, {"matchExpressions": [expr("zone", "In")]}
    assert label_refusal(pod_needs(affinity({}, bad, good), {}), LABELS, "n1") is None
    assert label_refusal(pod_needs(affinity({"matchExpressions": [expr("zone", "In", "z")]}, good), {}), LABELS, "n1") is None
    assert label_refusal(pod_needs(affinity(), {}), LABELS, "n1") == "do not match the required node affinity"


def test_node_selector_and_affinity_must_both_match():
    spec = {"nodeSelector": {"tier": "gold"}, **affinity({"matchExpressions": [expr("zone", "In", "b")]})}
    assert label_refusal(pod_needs(spec, {}), LABELS, "n1") == "do not match the required node affinity zone In (b)"
    spec["nodeSelector"] = {"tier": "silver"}
    assert label_refusal(pod_needs(spec, {}), LABELS, "n1") == "lack label tier=silver"
    assert label_refusal(pod_needs({"nodeSelector": {"tier": "gold"}}, {}), LABELS, "n1") is None


def test_hostname_selection_is_judged_per_node_within_a_class():
    nodes = [node(f"n{i}", cpu="8") for i in range(5)]
    (cls,) = node_classes(nodes)  # identical but for the hostname: one class
    assert cls.count == 5
    needs = pod_needs(affinity({"matchExpressions": [expr("kubernetes.io/hostname", "In", "n1", "n3")]}), {})
    assert matching_members(needs, cls, Effort())[0] == 2
    by_name = pod_needs(affinity({"matchFields": [expr("metadata.name", "NotIn", "n0")]}), {})
    assert matching_members(by_name, cls, Effort())[0] == 4
    assert matching_members(pod_needs({}, {}), cls, Effort()) == (5, None)


# --- resources (noderesources fitsRequest) ------------------------------------------------------

def test_requests_against_allocatable_with_the_pod_count():
    cls = one([node(cpu="8", memory="32Gi", **{"nvidia.com/gpu": "8"})])
    assert holds(pod_needs({}, {"cpu": 2000, "memory": 4 << 30}), cls.allocatable) == 4
    assert holds(pod_needs({}, {"nvidia.com/gpu": 3}), cls.allocatable) == 2
    assert holds(pod_needs({}, {"nvidia.com/gpu": 9}), cls.allocatable) == 0
    assert holds(pod_needs({}, {"example.com/fpga": 1}), cls.allocatable) == 0  # not offered: 0
    assert holds(pod_needs({}, {"cpu": 0, "example.com/fpga": 0}), cls.allocatable) == 110  # zero requests skip
    few = one([node(pods="3")])
    assert holds(pod_needs({}, {}), few.allocatable) == 3  # every pod takes one of "pods"


def test_ignored_resources_are_not_judged():
    cls = one([node(cpu="8")])
    assert holds(pod_needs({}, {"example.com/fpga": 2}, ["example.com/*"]), cls.allocatable) == 110


def test_unreadable_allocatable_counts_as_absent_and_bad_shapes_do_not_crash():
    (cls,) = node_classes([{"kind": "Node", "metadata": {"name": "x", "labels": "oops"},
                            "spec": {"taints": ["bad", {"key": "k", "effect": "NoSchedule"}]},
                            "status": {"allocatable": {"cpu": "lots", "memory": "1Gi"}}}])
    assert cls.allocatable == {"memory": 1 << 30}
    needs = pod_needs({"tolerations": "bad", "nodeSelector": ["x"], "affinity": {"nodeAffinity": 3}}, {"cpu": 1})
    assert holds(needs, cls.allocatable) == 0


# --- the whole job ------------------------------------------------------------------------------

def test_a_set_too_large_for_every_node_is_named_with_what_ruled_nodes_out():
    classes = node_classes([node("g1", {"gpu": "a100"}, cpu="64", **{"nvidia.com/gpu": "8"}),
                            node("g2", {"gpu": "h100"}, [("nvidia.com/gpu", "present", "NoSchedule")],
                                 cpu="64", **{"nvidia.com/gpu": "8"}),
                            node("c1", cpu="32")])
    needs = pod_needs({"nodeSelector": {"gpu": "h100"}}, {"nvidia.com/gpu": 4})
    fits, problem = assess([("node", 2, needs)], classes, ever=True)
    assert problem.kind == "nowhere"
    assert fits[0].refusals == {"lack label gpu=h100": 2,
                                "have the taint nvidia.com/gpu=present:NoSchedule that it does not tolerate": 1}


def test_more_of_a_resource_than_the_usable_nodes_have_in_all():
    classes = node_classes([node(f"g{i}", cpu="64", **{"nvidia.com/gpu": "8"}) for i in range(4)])
    needs = pod_needs({}, {"nvidia.com/gpu": 8})
    _, problem = assess([("node", 5, needs)], classes, ever=True)
    assert (problem.kind, problem.resource, problem.amount, problem.available, problem.nodes) == (
        "total", "nvidia.com/gpu", 40, 32, 4)
    assert assess([("node", 4, needs)], classes, ever=True)[1] is None


def test_more_pods_than_the_nodes_hold_even_when_the_total_fits():
    """15 cpu of 16 in all, but a 5-cpu pod fits once per 8-cpu node."""
    classes = node_classes([node(f"c{i}", cpu="8") for i in range(2)])
    _, problem = assess([("node", 3, pod_needs({}, {"cpu": 5000}))], classes, ever=True)
    assert (problem.kind, problem.amount, problem.available) == ("pods", 3, 2)


def test_a_packing_that_fails_is_only_a_packing_problem():
    """A 7-cpu launcher and three 4-cpu workers on two 10-cpu nodes: every necessary condition
    holds (19 of 20 cpu; at most 10 // 4 = 2 of the 4 pods per node), no placement does."""
    classes = node_classes([node(f"c{i}", cpu="10") for i in range(2)])
    seven, four = pod_needs({}, {"cpu": 7000}), pod_needs({}, {"cpu": 4000})
    _, problem = assess([("launcher", 1, seven), ("node", 3, four)], classes, ever=True)
    assert (problem.kind, problem.amount, problem.available) == ("packing", 4, 3)
    assert assess([("launcher", 1, seven), ("node", 2, four)], classes, ever=True)[1] is None


def test_pods_of_several_sets_cannot_share_a_node_their_smallest_request_fills():
    """A 6-cpu launcher and two 6-cpu workers on two 10-cpu nodes: 18 of 20 cpu, 2 workers fit
    the nodes, but a node takes one of the three pods at most (10 // 6): certain, not a packing."""
    classes = node_classes([node(f"c{i}", cpu="10") for i in range(2)])
    six, four = pod_needs({}, {"cpu": 6000}), pod_needs({}, {"cpu": 4000})
    _, problem = assess([("launcher", 1, six), ("node", 2, six)], classes, ever=True)
    assert (problem.kind, problem.resource, problem.amount, problem.available, problem.nodes) == ("cross", "cpu", 3, 2, 2)
    assert problem.most == (0, 1)  # one worker beside the launcher; the launcher alone cannot make room
    assert assess([("launcher", 1, six), ("node", 1, six)], classes, ever=True)[1] is None
    assert assess([("launcher", 1, four), ("node", 2, six)], classes, ever=True)[1] is None  # 4 + 6 on one


def test_first_fit_keeps_identical_nodes_grouped_whatever_the_pod_count():
    classes = node_classes([node(f"c{i}", cpu="64", pods="1000") for i in range(1000)])
    sets = [("launcher", 1, pod_needs({}, {"cpu": 1000})), ("node", 60000, pod_needs({}, {"cpu": 1000}))]
    sets[1] = ("node", 63999, sets[1][2])
    assert assess(sets, classes, ever=True)[1] is None
    sets[1] = ("node", 64000, sets[1][2])
    assert assess(sets, classes, ever=True)[1].kind == "total"


# --- bounded work ----------------------------------------------------------------------------

def test_integers_of_any_length_parse_as_go_parseint_does_without_crashing():
    """strconv.ParseInt(s, 10, 64): leading zeros are fine, more than int64 is an error (the
    requirement then matches nothing), and a 5000-digit value costs no more than a short one."""
    from trainjob_admission.policies.capacity.nodefit import _go_int
    assert _go_int("0" * 5000 + "7") == 7 and _go_int("+9223372036854775807") == 2**63 - 1
    assert _go_int("9223372036854775808") is None and _go_int("1" * 5000) is None
    huge = pod_needs(affinity({"matchExpressions": [expr("rank", "Gt", "1" * 5000)]}), {})
    assert label_refusal(huge, {"rank": "5"}, "n1") == "do not match the required node affinity"
    assert not tolerates(("rank", "Lt", "1" * 5000, "NoSchedule"), ("rank", "5", "NoSchedule"))
    assert not tolerates(("rank", "Gt", "1", "NoSchedule"), ("rank", "9" * 5000, "NoSchedule"))


def test_matching_past_the_cap_raises_instead_of_burning_the_cpu():
    from trainjob_admission.policies.capacity.nodefit import MAX_WORK, TooComplex
    classes = node_classes([node(f"n{i}", cpu="8") for i in range(2000)])
    terms = [{"matchExpressions": [expr("kubernetes.io/hostname", "NotIn", f"n{t}-{j}") for j in range(10)]}
             for t in range(200)]
    needs = pod_needs(affinity(*terms), {"cpu": 1000})
    effort = Effort()
    with pytest.raises(TooComplex):
        assess([("node", 2, needs)], classes, ever=True, effort=effort)
    assert effort.left < 0 and -effort.left <= needs.cost  # stopped at the cap, not after all 2000 x 200 terms
    assert MAX_WORK < 2000 * needs.cost


def test_nodes_named_by_hostname_are_found_through_the_index_not_by_matching_every_node():
    classes = node_classes([node(f"n{i}", cpu="8") for i in range(2000)])
    terms = [{"matchExpressions": [expr("kubernetes.io/hostname", "In", f"n{t}"), expr("x", "DoesNotExist")]}
             for t in range(300)]
    needs = pod_needs(affinity(*terms), {"cpu": 8000})
    effort = Effort()
    fits, problem = assess([("node", 301, needs)], classes, ever=True, effort=effort)
    assert fits[0].usable == 300 and problem.kind == "total"
    assert fits[0].refusals == {"do not match the required node affinity": 1700}
    assert effort.left > Effort().left - 300 * 2000  # a few per named node, not every term on every node


def test_a_negative_allocatable_holds_nothing():
    cls = one([node(cpu="-4", memory="1Gi")])
    assert cls.allocatable["cpu"] == 0 and holds(pod_needs({}, {"cpu": 1000}), cls.allocatable) == 0
    _, problem = assess([("node", 1, pod_needs({}, {"cpu": 1000}))], [cls], ever=True)
    assert problem.kind == "nowhere"
