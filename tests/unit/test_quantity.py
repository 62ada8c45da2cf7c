"""policies/k8s/quantity.py parses quantities as ParseQuantity does (k8s.io/apimachinery@v0.36.3,
pkg/api/resource/quantity.go and suffix.go): the grammar exactly, values rounded up to 1n, and
what Kubernetes cannot hold refused as invalid input, in microseconds (bench/quantity.py times it)."""
from __future__ import annotations

from decimal import ROUND_UP, Context, Decimal

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes.utils.quantity import parse_quantity

from trainjob_admission.policies.bundle.compile import BundleError
from trainjob_admission.policies.job.effective_job import JobModelError, from_trainjob
from trainjob_admission.policies.k8s.quantity import MAX_QUANTITY, QuantityError, to_decimal, to_number
from trainjob_admission.webhook.cli import main

DECIMAL_SI = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
BINARY_SI = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
ORACLE = Context(prec=200)
NANO = Decimal("1e-9")


@st.composite
def quantities(draw, max_digits: int = 12) -> tuple[str, Decimal]:
    """A text of the grammar in quantity.go's Quantity comment, and its exact value computed by
    Decimal from the number's text (not by the parser under test)."""
    digits = st.text("0123456789", min_size=1, max_size=max_digits)
    whole, fraction = draw(st.one_of(
        st.tuples(digits, st.none()),                                 # 1
        st.tuples(digits, st.text("0123456789", max_size=max_digits)),  # 1.5, 1.
        st.tuples(st.just(""), digits),                               # .5
    ))
    sign = draw(st.sampled_from(["", "+", "-"]))
    number = ORACLE.create_decimal(f"{sign}{whole or '0'}.{fraction or '0'}")
    kind = draw(st.sampled_from(["decimal", "binary", "exponent"]))
    if kind == "decimal":
        suffix = draw(st.sampled_from(sorted(DECIMAL_SI)))
        exact = number.scaleb(DECIMAL_SI[suffix], ORACLE)
    elif kind == "binary":
        suffix = draw(st.sampled_from(sorted(BINARY_SI)))
        exact = ORACLE.multiply(number, 2 ** BINARY_SI[suffix])
    else:
        power = draw(st.integers(-40, 40))
        exponent_sign = "-" if power < 0 else draw(st.sampled_from(["", "+"]))
        suffix = f"{draw(st.sampled_from('eE'))}{exponent_sign}{'0' * draw(st.integers(0, 3))}{abs(power)}"
        exact = number.scaleb(power, ORACLE)
    fraction_text = "" if fraction is None else f".{fraction}"
    return f"{sign}{whole}{fraction_text}{suffix}", exact


def as_kubernetes_holds(exact: Decimal) -> Decimal | None:
    """quantity.go:369-375 rounds non-zero values up to 1n (away from zero); beyond 2**63-1
    (binary values are capped there, decimal ones overflow Value()) is None: refused."""
    rounded = exact.quantize(NANO, rounding=ROUND_UP, context=ORACLE) if exact.as_tuple().exponent < -9 else exact
    return None if abs(rounded) > MAX_QUANTITY else rounded


@settings(max_examples=600, deadline=None)
@given(quantity=quantities())
def test_the_grammar_parses_to_the_exact_value(quantity):
    text, exact = quantity
    expected = as_kubernetes_holds(exact)
    if expected is None:
        with pytest.raises(QuantityError, match="larger than any resource Kubernetes can hold"):
            to_decimal(text)
    else:
        assert to_decimal(text) == expected


@settings(max_examples=400, deadline=None)
@given(quantity=quantities(max_digits=4))
def test_agrees_with_the_kubernetes_client_where_the_client_is_right(quantity):
    # At most 8 digits, so the client's own arithmetic (Decimal, 28 digits) is exact. It is right
    # on every value of the grammar but two kinds, where the Go source is the authority.
    text, _ = quantity
    old = parse_quantity(text)
    if abs(old) > MAX_QUANTITY:
        # The client keeps 9Ei and 1e40; quantity.go:377-381 caps binary values at maxAllowed and
        # Value() overflows on decimal ones: refused.
        with pytest.raises(QuantityError):
            to_decimal(text)
    else:
        # The client keeps 0.1n; quantity.go:369-375 rounds it up to 1n (on the grid: no change).
        assert to_decimal(text) == old.quantize(NANO, rounding=ROUND_UP, context=ORACLE)


UNICODE_DIGITS = ["٣", "３", "𝟙", "१", "²", "߁"]  # Python's Decimal and int() accept most of these
NOT_NUMBERS = ["NaN", "nan", "NAN", "sNaN", "Inf", "inf", "INF", "Infinity", "infinity"]
SUFFIXES = [suffix for suffix in sorted(DECIMAL_SI) + sorted(BINARY_SI) if suffix]


@st.composite
def near_misses(draw) -> str:
    """Texts one slip away from the grammar, each refused by ParseQuantity or the CRD pattern."""
    text, _ = draw(quantities())
    at = draw(st.integers(0, len(text)))
    digit_at = draw(st.sampled_from([i for i, c in enumerate(text) if c.isdigit()]))
    number = draw(st.from_regex(r"[0-9]{1,4}(\.[0-9]{0,3})?", fullmatch=True))
    sign = draw(st.sampled_from("+-"))
    return draw(st.sampled_from([
        text[:at] + draw(st.sampled_from([" ", "\t", "\n", "\u00a0", "\u200b", "_", ","])) + text[at:],
        text[:digit_at] + draw(st.sampled_from(UNICODE_DIGITS)) + text[digit_at + 1:],
        draw(st.sampled_from("+-")) + sign + number,                               # --1
        number + draw(st.sampled_from(["K", "ki", "KI", "kI", "mi", "ni", "ui", "B", "Kb"])),
        number + draw(st.sampled_from([s for s in SUFFIXES if s != "E"])) + str(draw(st.integers(0, 99))),  # 1Ki5
        number + draw(st.sampled_from(["e", "e+", "E-", "e1.5", "e.5", "e+-1", "ee1", "e1e1"])),  # "1E" is exa
        draw(st.sampled_from(["e5", "E5", "Ki", "Ki5", "m", "E", "", "+", "-", ".", "+.", "-.e5"])),  # no number
        number + ".5.3" if "." not in number else number + ".3",                   # 1.2.3
        draw(st.sampled_from(["", "+", "-"])) + draw(st.sampled_from(NOT_NUMBERS)),
        number + draw(st.sampled_from(SUFFIXES)) + draw(st.sampled_from(SUFFIXES)),  # two suffixes
    ]))


@settings(max_examples=600, deadline=None)
@given(text=near_misses())
def test_near_misses_are_refused(text):
    # ParseQuantity alone reads a missing number as 0 ("e5", "+", "Ki", parseQuantityString), and
    # Quantity.UnmarshalJSON trims spaces (quantity.go:744) for built-in objects, but the CRD
    # pattern of the TrainJob, runtime and MPIJob fields we read refuses both, so we do.
    with pytest.raises(QuantityError, match="is not a Kubernetes quantity"):
        to_decimal(text)


@pytest.mark.parametrize("text", ["1K", "1_000", " 1", "1 ", "NaN", "Infinity", "٣", "1\u0663"])
def test_the_old_parser_accepted_what_kubernetes_refuses(text):
    parse_quantity(text)  # why we replaced it
    with pytest.raises(QuantityError):
        to_decimal(text)


@pytest.mark.parametrize("value", ["1e300000", "1e600000", "-1e600000", "9" * 1000, "1e19", "9223372036854775808",
                                   "9223372036854775807.000000001", "8Ei", "9Ei", 2**63, -(2**63), 10**5000, 1e300],
                         ids=lambda value: f"{value.bit_length()}-bit int" if isinstance(value, int) else repr(value)[:16])
def test_values_kubernetes_cannot_hold_are_refused_with_the_limit(value):
    # quantity.go:377-381 caps binary values at maxAllowed (2**63-1); decimal ones are kept but
    # Value()/MilliValue() overflow: either way not the number the submitter wrote.
    with pytest.raises(QuantityError, match=r"larger than any resource Kubernetes can hold \(at most 9223372036854775807"):
        to_number("cpu", value)


def test_values_at_the_edges():
    assert to_decimal("9223372036854775807") == MAX_QUANTITY
    assert to_decimal("-9223372036854775807") == -MAX_QUANTITY
    assert to_decimal("7.99999999999999999Ei") == Decimal("9223372036854775796.470784954")  # rounded up
    assert to_decimal("0.1n") == NANO and to_decimal("-0.1n") == -NANO  # away from zero, as inf.RoundUp
    assert to_decimal("1e-300000") == NANO and to_decimal("1e-2147483648") == NANO
    assert to_decimal("1.0000000001Ki") == Decimal("1024.000000103")
    assert to_decimal("0e999999999999") == 0 == to_decimal("-0.000")  # zero whatever the exponent
    assert to_decimal("1E") == 10**18 and to_decimal("1E+3") == to_decimal("1e0003") == 1000


def test_exponents_past_int32_and_int64():
    # suffix.go: strconv.ParseInt(..., 64) fails beyond int64 (ErrSuffix), else int32(parsed)
    # wraps, so Kubernetes would read 1e4294967296 as 1: we refuse rather than wrap.
    with pytest.raises(QuantityError, match="wraps around past 32 bits"):
        to_decimal("1e4294967296")
    with pytest.raises(QuantityError, match="wraps around past 32 bits"):
        to_decimal("1e-2147483649")
    with pytest.raises(QuantityError, match="is not a Kubernetes quantity"):
        to_decimal("1e9223372036854775808")
    with pytest.raises(QuantityError, match="longer than any quantity we read"):
        to_decimal("0" * 1024 + "1")


def test_yaml_ints_floats_and_other_types():
    assert to_number("cpu", 2) == 2000 and to_number("memory", 0) == 0
    # A YAML float is read as its shortest text, the JSON number text the API server parses: 0.1
    # is 100m (the old parser took the binary float, 0.1000000000000000055511151231257827, as 101m).
    assert to_number("cpu", 0.1) == 100 and to_number("cpu", 0.5) == 500 and to_number("cpu", 1.5e-7) == 1
    for value in (True, False, None, [1], {"cpu": 1}, float("nan"), float("inf"), Decimal(1)):
        with pytest.raises(QuantityError, match="is not a Kubernetes quantity"):
            to_decimal(value)


# --- how a bad quantity is answered -----------------------------------------------------------

@pytest.mark.parametrize("cpu", ["1e300000", "1e600000"])
def test_absurd_cpu_is_a_denial_naming_the_field(cpu, example_job, example_state, default, review):
    job = example_job("allowed")
    job["spec"]["trainer"]["resourcesPerNode"]["requests"]["cpu"] = cpu
    decision = review(job, default, example_state)
    assert not decision.allowed
    (message,) = decision.messages
    assert message["rule"] == "default/job-model"
    assert message["message"].startswith(f"spec.trainer.resourcesPerNode.requests.cpu: '{cpu}' is larger than any")


def test_a_bad_runtime_quantity_names_its_template_and_field(build):
    runtime = build.runtime(node=build.pod_spec(cpu="1K"))
    with pytest.raises(JobModelError, match=r"replicatedJobs\[node\] pod template: "
                                            r"spec\.containers\[node\]\.resources\.requests\.cpu: '1K' is not"):
        from_trainjob(build.trainjob(), build.state(runtime))


def test_review_denies_with_exit_1_and_no_traceback(build, tmp_path, capsys):
    job = build.load_one(build.examples / "jobs" / "allowed.yaml")
    job["spec"]["trainer"]["resourcesPerNode"]["requests"]["cpu"] = "1e600000"
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    state = [arg for f in build.state_files[:2] for arg in ("--cluster-state", str(f))]
    assert main.main(["review", "-f", str(path), *state]) == 1
    printed = capsys.readouterr()
    assert "x default/job-model: spec.trainer.resourcesPerNode.requests.cpu: '1e600000' is larger" in printed.out
    assert "Traceback" not in printed.out + printed.err


def test_a_bundle_with_an_absurd_quantity_is_refused(make_bundle):
    with pytest.raises(BundleError, match="larger than any resource Kubernetes can hold"):
        make_bundle({"checks": {"shape": {"minWorkerCpu": "1e600000"}}})


@pytest.mark.parametrize("text", ["wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "9" * 30 + "x", "1e" + "9" * 40,
                                  "1" * 2000])
def test_errors_name_a_long_value_by_its_length_not_a_prefix(text):
    """Redaction replaces whole values only: an echoed prefix of a secret would get past it."""
    with pytest.raises(QuantityError, match=f"a {len(text)}-character value") as info:
        to_decimal(text)
    assert text[:8] not in str(info.value)


def test_errors_quote_a_short_value_whole():
    with pytest.raises(QuantityError, match="^'lots' is not a Kubernetes quantity"):
        to_decimal("lots")
    with pytest.raises(QuantityError, match=r"^a 5-character value is not"):
        to_decimal("1\x1b[2J")  # not printable: not repeated
