"""Image policy: every image a reference the kubelet can pull; pinned by digest where the bundle
asks; one image for the processes of one MPI program (launcher and workers), unless the bundle
allows the pair. The registry allow-list stays with the job shape (checks/shape.py)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from ..job.effective_job import EffectiveJob, NODE, PodSet, container_field, containers_of
from ..k8s.apitypes import Strict
from ..k8s.imageref import ImageRef, InvalidImage, PINNED, parse
from ..k8s.redaction import shown
from .base import CheckContext, Finding


class ImagePair(Strict):
    """A launcher image that may run beside a different worker image (ImageRef.covers)."""

    launcher: str
    worker: str

    @field_validator("launcher", "worker")
    @classmethod
    def _reference(cls, value: str) -> str:
        try:
            parse(value)
        except InvalidImage as exc:
            raise ValueError(f"{value!r}: {exc}") from None
        return value

class ImageCheck(Strict):
    """Image references (policies/checks/images.py): valid always; pinned by digest and one image
    across the launcher and the workers when asked."""

    enabled: bool = True
    requireDigest: bool = False
    sameImage: Literal["deny", "warn", "ignore"] = "deny"
    allowedPairs: list[ImagePair] = Field(default=[], max_length=256)


MAX_SHOWN = 512  # longer than any real reference; a longer one is named by its length only


def check(context: CheckContext, settings: ImageCheck) -> list[Finding]:
    job = context.job
    findings: list[Finding] = []
    for ps in job.with_pods:
        for key, container in containers_of(ps.pod.get("spec") or {}):
            findings += _reference(job, ps, key, container, settings.requireDigest)
    if settings.sameImage != "ignore":
        severity = "warn" if settings.sameImage == "warn" else None
        findings += [Finding(message, fix, severity) for message, fix in _mismatches(job, settings)]
    return findings


def _reference(job: EffectiveJob, ps: PodSet, key: str, container: dict, require_digest: bool) -> list[Finding]:
    """A reference the kubelet would refuse (the pod waits in InvalidImageName for ever), or one
    not pinned by a sha256 digest where the bundle requires it."""
    image, name = container.get("image"), str(container.get("name", ""))
    where = f"{ps.name} container {name!r} runs {_shown(image)}"
    try:
        ref = parse(image)
    except InvalidImage as exc:
        return [Finding(f"{where}, which is not an image reference the kubelet can pull: {exc}; "
                        "the pods would never start (InvalidImageName)",
                        f"set {_image_field(job, ps, key, name)} to a valid reference")]
    if not require_digest or ref.pinned:
        return []
    found = f"pinned by {ref.digest.partition(':')[0]}" if ref.digest else "not pinned by digest"
    name_tag, pull = f"{ref.repository}{':' + ref.tag if ref.tag else ''}", image
    if len(image) > MAX_SHOWN:
        name_tag, pull = "NAME[:TAG]", "IMAGE"
    return [Finding(f"{where}, {found}; this namespace requires images pinned by {PINNED} digest",
                    f"set {_image_field(job, ps, key, name)} to {name_tag}@{PINNED}:<64 hex> (its digest: "
                    f"skopeo inspect --format '{{{{.Digest}}}}' docker://{pull}, or crane digest {pull})")]


def _mismatches(job: EffectiveJob, settings: ImageCheck) -> list[tuple[str, str]]:
    """Launcher and workers of an MPI job against the first worker set: mpirun starts the ranks
    over SSH inside the workers' containers, so a different build there (another MPI, CUDA or
    Python library) breaks the program or gives other results. A launcher may differ where the
    bundle allows that pair; worker sets may not differ among themselves."""
    if job.launcher is None:
        return []  # no MPI launcher: the workers share one pod template
    ranks = [(ps, container, ref) for ps in job.with_pods if ps.role in ("launcher", "worker")
             if (container := _mpi_container(job, ps)) is not None
             if (ref := _parsed(container.get("image"))) is not None]  # an invalid one is reported on its own
    ref_set, ref_container, ref_ref = next((rank for rank in ranks if rank[0].role == "worker"), (None, {}, None))
    problems = []
    for ps, container, ref in ranks:
        if ps is ref_set or ref_ref is None or ref.pulled == ref_ref.pulled:
            continue
        if ps.role == "launcher" and _pair_allowed(settings, ref, ref_ref):
            continue
        image, ref_image = _shown(container.get("image")), _shown(ref_container.get("image"))
        name, ref_name = str(container.get("name", "")), str(ref_container.get("name", ""))
        field, ref_field = _image_field(job, ps, "containers", name), _image_field(job, ref_set, "containers", ref_name)
        pairs = "; or ask your admin to allow this pair (checks.images.allowedPairs)" if ps.role == "launcher" else ""
        problems.append((
            f"{ps.name} container {name!r} runs {image} but the {ref_set.name} pods' container {ref_name!r} "
            f"runs {ref_image}: every process of one MPI job needs the same image (MPI, CUDA and library "
            f"versions must match){_only_launcher(ps, ref_set, name, ref_name)}",
            f"run one image: set {field} to {ref_image}, or {ref_field} to {image}{pairs}",
        ))
    return problems


def _only_launcher(ps: PodSet, ref_set: PodSet, name: str, ref_name: str) -> str:
    """Why a TrainJob's workers ignore spec.trainer.image: Trainer v2.3 copies it into the "node"
    container of the trainer-ancestor job only (pkg/runtime/framework/plugins/jobset/builder.go Trainer)."""
    from_trainer = [s.name for s, n in ((ps, name), (ref_set, ref_name)) if n == NODE and "image" in s.from_trainer]
    if len(from_trainer) != 1:
        return ""
    return f"; Trainer sets spec.trainer.image in the {from_trainer[0]} pods only, the others keep the runtime's image"


def _mpi_container(job: EffectiveJob, ps: PodSet) -> dict | None:
    """The container that runs the MPI program in a launcher or worker pod: in a TrainJob the one
    named "node", which Trainer's MPI plugin gives the SSH keys and, in the launcher, the hostfile
    (v2.3.0 pkg/runtime/framework/plugins/mpi/mpi.go); in an MPIJob, and in a runtime whose pods
    have no "node" container (it sets MPI up itself), the first container, as mpi-operator v0.7.0
    does (pkg/controller/mpi_job_controller.go newWorker, newLauncherPodTemplate). Never a
    container Trainer adds itself, nor an init container."""
    containers = [c for key, c in containers_of(ps.pod.get("spec") or {}) if key == "containers"
                  and isinstance(c, dict) and str(c.get("name")) not in ps.added_containers]
    if not containers:
        return None
    node = next((c for c in containers if c.get("name") == NODE), None) if job.kind == "TrainJob" else None
    return node or containers[0]


def _parsed(image: object) -> ImageRef | None:
    """The reference, or None for one _reference reports as invalid: ranks compare what will be pulled,
    so that "ubuntu" and "docker.io/library/ubuntu:latest" are one image."""
    try:
        return parse(image)
    except InvalidImage:
        return None


def _shown(image: object) -> str:
    """An image as messages quote it: verbatim unless it is too long to be a real one."""
    if isinstance(image, str) and len(image) <= MAX_SHOWN and image.isprintable():
        return repr(image)
    return shown(image)


def _pair_allowed(settings: ImageCheck, launcher: ImageRef, worker: ImageRef) -> bool:
    return any(parse(pair.launcher).covers(launcher) and parse(pair.worker).covers(worker)
               for pair in settings.allowedPairs)


def _image_field(job: EffectiveJob, ps: PodSet, key: str, name: str) -> str:
    """Where the submitter sets this container's image. Trainer's Flux installer (the one container
    it adds, effective_job._add_flux_installer) takes its image from FLUX_VIEW_IMAGE in the trainer's env."""
    if name in ps.added_containers:
        return "FLUX_VIEW_IMAGE in spec.trainer.env (Trainer adds this container with that image)"
    return container_field(job, ps, name, "image", key)
