"""examples/ holds real files (a copied examples/ keeps working), and the sample files the wheel
ships (webhook/samples, package data) are a copy of the part of it named in
webhook/cli/sampledata.SHIPPED, so the two never drift."""
from __future__ import annotations

from pathlib import Path

from trainjob_admission.webhook.cli.sampledata import SHIPPED

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES, SAMPLES = ROOT / "examples", ROOT / "webhook" / "samples"


def files(root: Path, names: tuple[str, ...]) -> dict[str, bytes]:
    found = {}
    for name in names:
        top = root / name
        for path in [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file()):
            found[path.relative_to(root).as_posix()] = path.read_bytes()
    return found


def test_examples_are_files_not_links() -> None:
    """They were symlinks into webhook/samples: a copy of examples/ alone lost them."""
    links = [p.relative_to(ROOT).as_posix() for p in [EXAMPLES, *EXAMPLES.rglob("*")] if p.is_symlink()]
    assert links == []


def test_the_wheels_samples_are_a_copy_of_examples() -> None:
    source, shipped = files(EXAMPLES, SHIPPED), files(SAMPLES, tuple(p.name for p in SAMPLES.iterdir()))
    differ = sorted(name for name in set(source) | set(shipped) if source.get(name) != shipped.get(name))
    assert not differ, f"webhook/samples differs from examples/ in {differ}: run `make samples`"
    assert {"jobs/allowed.yaml", "runtimes/mpi-openmpi.yaml", "cluster-state.yaml", "bundles/production.yaml"} <= set(source)
