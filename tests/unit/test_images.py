"""Image policy (rule image-policy): references read as the kubelet reads them, digest pinning,
one image across an MPI job's launcher and workers, allowed pairs; the corpus's real images."""
from __future__ import annotations

import copy

import pytest

from trainjob_admission.policies.bundle.compile import BundleError
from trainjob_admission.policies.checks import images
from trainjob_admission.policies.checks.base import CheckContext
from trainjob_admission.policies.checks.images import ImageCheck
from trainjob_admission.policies.decide.decision import Effect
from trainjob_admission.policies.job import effective_job
from trainjob_admission.policies.k8s import imageref
from tests.support import corpus, upstream

SHA = "sha256:" + "0123456789abcdef" * 4
OTHER_SHA = "sha256:" + "fedcba9876543210" * 4


# --- references: distribution/reference v0.6.0 as the kubelet parses them --------------------------

@pytest.mark.parametrize("image, repository, tag, digest", [
    ("ubuntu", "docker.io/library/ubuntu", None, None),
    ("pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime", "docker.io/pytorch/pytorch", "2.13.0-cuda13.0-cudnn9-runtime", None),
    ("index.docker.io/mpioperator/mpi-pi:openmpi", "docker.io/mpioperator/mpi-pi", "openmpi", None),
    ("registry.example.com:5000/team/sub/train:1.2@" + SHA, "registry.example.com:5000/team/sub/train", "1.2", SHA),
    ("localhost:5000/train@" + SHA, "localhost:5000/train", None, SHA),
    ("localhost/train", "localhost/train", None, None),
    ("[fd00::1]:5000/ml/train:v1", "[fd00::1]:5000/ml/train", "v1", None),
    ("us-docker.pkg.dev/cloud-tpu-images/jax-ai-image/tpu:latest", "us-docker.pkg.dev/cloud-tpu-images/jax-ai-image/tpu",
     "latest", None),
    ("Registry.Example.com/a__b/c--d.e:T_1", "Registry.Example.com/a__b/c--d.e", "T_1", None),  # capitals in the host only
    ("my_registry.io/train", "my_registry.io/train", None, None),  # no host: a path, as Parse reads it
    ("ghcr.io/x:" + "t" * 128, "ghcr.io/x", "t" * 128, None),
    ("quay.io/x@sha512:" + "a" * 128, "quay.io/x", None, "sha512:" + "a" * 128),
])
def test_valid_references(image, repository, tag, digest):
    ref = imageref.parse(image)
    assert (ref.repository, ref.tag, ref.digest) == (repository, tag, digest)


@pytest.mark.parametrize("image, why", [
    ("", "non-empty string"),
    (None, "non-empty string"),
    (["ubuntu"], "non-empty string"),
    ("0123456789abcdef" * 4, "image ID"),
    ("quay.io/Team/train:1", "lowercase"),
    ("Ubuntu", "lowercase"),
    (" ubuntu", "not name[:tag][@digest]"),
    ("ubuntu:", "not name[:tag][@digest]"),
    ("ubuntu:" + "t" * 129, "not name[:tag][@digest]"),
    ("quay.io/team/train:1.2:3", "not name[:tag][@digest]"),
    ("quay.io//train", "not name[:tag][@digest]"),
    ("quay.io/train@sha256:" + "0123456789ABCDEF" * 4, "lowercase hex"),
    ("quay.io/train@sha256:" + "0" * 63, "has 64 hex characters, this one 63"),
    ("quay.io/train@md5:" + "0" * 32, "'md5' is not supported"),
    ("quay.io/" + "a" * 256, "more than 255"),
])
def test_invalid_references(image, why):
    with pytest.raises(imageref.InvalidImage, match=why.replace("[", r"\[").replace("]", r"\]")):
        imageref.parse(image)


def test_a_long_hostile_reference_is_refused_in_linear_time():
    # domain components with many dashes backtrack quadratically in Python's re; RE2 does not
    with pytest.raises(imageref.InvalidImage):
        imageref.parse("a" + "-" * 200_000 + "!/x")


@pytest.mark.parametrize("a, b, same", [
    ("ubuntu", "docker.io/library/ubuntu:latest", True),
    ("index.docker.io/library/ubuntu", "ubuntu:latest", True),
    ("quay.io/x:1@" + SHA, "quay.io/x@" + SHA, True),  # the runtime pulls the digest; the tag beside it is ignored
    ("quay.io/x:1@" + SHA, "quay.io/x:2@" + SHA, True),
    ("quay.io/x:1", "quay.io/x@" + SHA, False),  # a tag may move: not known to be the same image
    ("quay.io/x:1", "quay.io/x:2", False),
])
def test_what_is_pulled(a, b, same):
    assert (imageref.parse(a).pulled == imageref.parse(b).pulled) is same


@pytest.mark.parametrize("entry, image, covered", [
    ("quay.io/tools/mpi-launcher", "quay.io/tools/mpi-launcher:3", True),  # no tag or digest: every version
    ("quay.io/tools/mpi-launcher", "quay.io/tools/mpi-launcher@" + SHA, True),
    ("quay.io/tools/mpi-launcher:3", "quay.io/tools/mpi-launcher:3@" + SHA, True),
    ("quay.io/tools/mpi-launcher:3", "quay.io/tools/mpi-launcher:4", False),
    ("quay.io/tools/mpi-launcher:latest", "quay.io/tools/mpi-launcher", True),
    ("quay.io/tools/mpi-launcher@" + SHA, "quay.io/tools/mpi-launcher@" + OTHER_SHA, False),
    ("quay.io/tools/mpi-launcher", "quay.io/tools/other:3", False),
    ("mpioperator/mpi-pi", "docker.io/mpioperator/mpi-pi:openmpi", True),
])
def test_an_allow_list_entry_covers(entry, image, covered):
    assert imageref.parse(entry).covers(imageref.parse(image)) is covered


def _corpus_jobs():
    """Each corpus job once (its first scenario), as its effective job; those that cannot be built are skipped."""
    seen, jobs = set(), []
    for case in corpus.cases():
        if case.id in seen:
            continue
        seen.add(case.id)
        try:
            jobs.append((case.id, effective_job.build(case.job(), case.state())))
        except upstream.UpstreamMissing as exc:
            pytest.skip(f"upstream source not available: {exc}")
        except effective_job.JobModelError:
            continue
    return jobs


def test_every_real_world_image_of_the_corpus_is_read_and_judged_consistent():
    """The corpus's images (upstream examples, stock runtimes, SDK and OpenShift AI jobs) are all
    valid references, and its MPI jobs (Trainer's, OpenShift AI's, mpi-operator's) run one image
    across launcher and workers: sameImage: deny and the reference check refuse none of them.
    requireDigest refuses every one of them: real jobs use tags."""
    jobs = _corpus_jobs()
    mpi = [name for name, job in jobs if job.launcher is not None]
    assert len(mpi) >= 8, mpi
    for name, job in jobs:
        assert images.check(CheckContext(job), ImageCheck(sameImage="deny")) == [], name
        pinned = images.check(CheckContext(job), ImageCheck(requireDigest=True, sameImage="ignore"))
        assert len(pinned) == sum(len(effective_job.containers_of(ps.pod["spec"])) for ps in job.with_pods), name


# --- the check through the engine -------------------------------------------------------------------

def _bundle(make_bundle, **settings):
    return make_bundle({"checks": {"images": settings}})


def _runtime(build, node_image="quay.io/acme-ml/train:2.1", launcher_image=None, **kwargs):
    return build.runtime(node=build.pod_spec(image=node_image),
                         launcher=build.pod_spec(image=launcher_image or node_image), **kwargs)


def _messages(decision, effect=Effect.DENY):
    return [(m, f) for r in decision.results if r.rule == "image-policy" and r.effect is effect
            for m, f in zip(r.messages, r.remediations)]


def test_require_digest_names_each_container_its_image_and_field(build, make_bundle, review):
    runtime = _runtime(build, node_image="quay.io/acme-ml/train:2.1@" + SHA)
    job = build.trainjob(numNodes=2, image="quay.io/acme-ml/train:2.1")  # the launcher's, by spec.trainer.image
    bundle = _bundle(make_bundle, requireDigest=True, sameImage="ignore")
    ((message, fix),) = _messages(review(job, [bundle], build.state(runtime)))
    assert message == ("launcher container 'node' runs 'quay.io/acme-ml/train:2.1', not pinned by digest; this "
                       "namespace requires images pinned by sha256 digest")
    assert fix.startswith("set spec.trainer.image to quay.io/acme-ml/train:2.1@sha256:<64 hex> (its digest: skopeo")
    job["spec"]["trainer"]["image"] = "quay.io/acme-ml/train:2.1@" + SHA
    assert review(job, [bundle], build.state(runtime)).allowed


def test_require_digest_names_the_runtime_for_an_image_only_the_runtime_sets(build, make_bundle, review):
    runtime = _runtime(build)
    job = build.trainjob(numNodes=2, image="quay.io/acme-ml/train:2.1@" + SHA)
    ((message, fix),) = _messages(review(job, [_bundle(make_bundle, requireDigest=True, sameImage="ignore")],
                                         build.state(runtime)))
    assert message.startswith("node container 'node' runs 'quay.io/acme-ml/train:2.1', not pinned by digest")
    assert fix.startswith("set containers[name=node].image of ClusterTrainingRuntime rt, replicatedJobs[node] pod "
                          "template (only the runtime sets it; spec.runtimePatches cannot change it) to "
                          "quay.io/acme-ml/train:2.1@sha256:<64 hex>")


def test_a_sha512_digest_is_not_the_sha256_pin_asked_for(build, make_bundle, review):
    image = "quay.io/acme-ml/train@sha512:" + "a" * 128
    runtime = _runtime(build, node_image=image)
    decision = review(build.trainjob(numNodes=2, image=image), [_bundle(make_bundle, requireDigest=True)],
                      build.state(runtime))
    assert [m for m, _ in _messages(decision)] == [
        f"{ps} container 'node' runs {image!r}, pinned by sha512; this namespace requires images pinned by sha256 digest"
        for ps in ("node", "launcher")]


def test_tags_pass_without_require_digest_and_an_invalid_reference_never_does(build, make_bundle, review):
    runtime = _runtime(build)
    bundle = _bundle(make_bundle)
    assert review(build.trainjob(numNodes=2, image="quay.io/acme-ml/train:2.1"), [bundle], build.state(runtime)).allowed
    decision = review(build.trainjob(numNodes=2, image="quay.io/acme-ml/Train:2.1"), [_bundle(make_bundle, sameImage="ignore")],
                      build.state(runtime))
    ((message, fix),) = _messages(decision)
    assert message == ("launcher container 'node' runs 'quay.io/acme-ml/Train:2.1', which is not an image reference "
                       "the kubelet can pull: the repository name must be lowercase; the pods would never start "
                       "(InvalidImageName)")
    assert fix == "set spec.trainer.image to a valid reference"


@pytest.mark.parametrize("image", [123, ["quay.io/x:1"], {"ref": "x"}, "x" * 300_000])
def test_hostile_images_are_denied_not_crashed_on(build, make_bundle, review, image):
    runtime = _runtime(build)
    decision = review(build.trainjob(numNodes=2, image=image), [_bundle(make_bundle)], build.state(runtime))
    assert not decision.allowed


def test_the_launcher_and_workers_run_one_image(build, make_bundle, review):
    """The shipped example's shape: spec.trainer.image reaches the launcher only (Trainer v2.3)."""
    runtime = _runtime(build, node_image="quay.io/acme-ml/openmpi-runtime:4.1")
    job = build.trainjob(numNodes=2, image="quay.io/acme-ml/horovod-resnet:0.28")
    ((message, fix),) = _messages(review(job, [_bundle(make_bundle)], build.state(runtime)))
    assert message == ("launcher container 'node' runs 'quay.io/acme-ml/horovod-resnet:0.28' but the node pods' "
                       "container 'node' runs 'quay.io/acme-ml/openmpi-runtime:4.1': every process of one MPI job "
                       "needs the same image (MPI, CUDA and library versions must match); Trainer sets "
                       "spec.trainer.image in the launcher pods only, the others keep the runtime's image")
    assert fix.startswith("run one image: set spec.trainer.image to 'quay.io/acme-ml/openmpi-runtime:4.1', or "
                          "containers[name=node].image of ClusterTrainingRuntime rt, replicatedJobs[node] pod template")
    assert fix.endswith("or ask your admin to allow this pair (checks.images.allowedPairs)")
    job["spec"]["trainer"]["image"] = "quay.io/acme-ml/openmpi-runtime:4.1"
    assert review(job, [_bundle(make_bundle)], build.state(runtime)).allowed


def test_same_image_compares_what_is_pulled(build, make_bundle, review):
    runtime = _runtime(build, node_image="ubuntu")
    job = build.trainjob(numNodes=2, image="docker.io/library/ubuntu:latest")
    assert review(job, [_bundle(make_bundle)], build.state(runtime)).allowed


def test_same_image_warn_admits_with_the_message_and_ignore_says_nothing(build, make_bundle, review):
    runtime = _runtime(build, node_image="quay.io/acme-ml/openmpi-runtime:4.1")
    job = build.trainjob(numNodes=2, image="quay.io/acme-ml/horovod-resnet:0.28")
    warned = review(job, [_bundle(make_bundle, sameImage="warn")], build.state(runtime))
    assert warned.allowed and len(_messages(warned, Effect.WARN)) == 1
    assert any("every process of one MPI job needs the same image" in w for w in warned.warnings)
    ignored = review(job, [_bundle(make_bundle, sameImage="ignore")], build.state(runtime))
    assert ignored.allowed and not _messages(ignored, Effect.WARN)


@pytest.mark.parametrize("pair, allowed", [
    ({"launcher": "quay.io/acme-ml/horovod-resnet", "worker": "quay.io/acme-ml/openmpi-runtime"}, True),
    ({"launcher": "quay.io/acme-ml/horovod-resnet:0.28", "worker": "quay.io/acme-ml/openmpi-runtime:4.1"}, True),
    ({"launcher": "quay.io/acme-ml/horovod-resnet:0.27", "worker": "quay.io/acme-ml/openmpi-runtime"}, False),
    ({"launcher": "quay.io/acme-ml/openmpi-runtime", "worker": "quay.io/acme-ml/horovod-resnet"}, False),  # one way
])
def test_allowed_pairs(build, make_bundle, review, pair, allowed):
    runtime = _runtime(build, node_image="quay.io/acme-ml/openmpi-runtime:4.1")
    job = build.trainjob(numNodes=2, image="quay.io/acme-ml/horovod-resnet:0.28")
    assert review(job, [_bundle(make_bundle, allowedPairs=[pair])], build.state(runtime)).allowed is allowed


def test_worker_sets_may_not_differ_even_with_a_pair(build, make_bundle, review):
    runtime = _runtime(build, node_image="quay.io/acme-ml/train:2.1")
    extra = copy.deepcopy(runtime["spec"]["template"]["spec"]["replicatedJobs"][0])
    extra["name"] = "node-b"
    extra["template"]["spec"]["template"]["spec"]["containers"][0]["image"] = "quay.io/acme-ml/train:2.2"
    runtime["spec"]["template"]["spec"]["replicatedJobs"].append(extra)
    pair = {"launcher": "quay.io/acme-ml/train", "worker": "quay.io/acme-ml/train"}
    job = build.trainjob(numNodes=2, image="quay.io/acme-ml/train:2.1")
    ((message, fix),) = _messages(review(job, [_bundle(make_bundle, allowedPairs=[pair])], build.state(runtime)))
    assert message.startswith("node-b container 'node' runs 'quay.io/acme-ml/train:2.2' but the node pods' container "
                              "'node' runs 'quay.io/acme-ml/train:2.1'")
    assert "allowedPairs" not in fix


def test_sidecars_and_non_mpi_jobs_are_not_compared(build, make_bundle, review):
    launcher = build.pod_spec(image="quay.io/acme-ml/train:2.1")
    launcher["containers"].insert(0, {"name": "log-shipper", "image": "quay.io/acme/fluent:1"})
    runtime = build.runtime(node=build.pod_spec(image="quay.io/acme-ml/train:2.1"), launcher=launcher)
    job = build.trainjob(numNodes=2, image="quay.io/acme-ml/train:2.1")
    assert review(job, [_bundle(make_bundle)], build.state(runtime)).allowed  # "node" is the MPI container
    torch = build.runtime(node=build.pod_spec(image="quay.io/acme-ml/train:2.1"), mpi=False)
    assert review(build.trainjob(numNodes=2, image="quay.io/acme-ml/other:1"), [_bundle(make_bundle)],
                  build.state(torch)).allowed


def test_a_legacy_mpijob_compares_the_first_containers(example_job, example_state, make_bundle, review):
    obj = example_job("legacy-mpijob")
    launcher = obj["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
    launcher.append({"name": "sidecar", "image": "quay.io/acme/fluent:1"})  # not compared
    assert review(obj, [_bundle(make_bundle)], example_state).allowed
    launcher[0]["image"] = "quay.io/acme-ml/horovod-resnet:0.29"
    ((message, fix),) = _messages(review(obj, [_bundle(make_bundle)], example_state))
    assert message.startswith("launcher container 'launcher' runs 'quay.io/acme-ml/horovod-resnet:0.29' but the "
                              "worker pods' container 'worker' runs 'quay.io/acme-ml/horovod-resnet:0.28'")
    assert fix.startswith("run one image: set spec.mpiReplicaSpecs.Launcher.template.spec.containers[name=launcher]"
                          ".image to 'quay.io/acme-ml/horovod-resnet:0.28', or spec.mpiReplicaSpecs.Worker.template."
                          "spec.containers[name=worker].image to 'quay.io/acme-ml/horovod-resnet:0.29'")


def test_trainers_flux_installer_is_pinned_through_its_env_and_never_compared():
    (case,) = [c for c in corpus.cases() if c.id == "trainer-flux-lammps" and c.scenario == "team"]
    try:
        job = effective_job.build(case.job(), case.state())
    except upstream.UpstreamMissing as exc:
        pytest.skip(f"upstream source not available: {exc}")
    findings = images.check(CheckContext(job), ImageCheck(requireDigest=True))
    installer = [f for f in findings if "'flux-installer'" in f.message]
    assert len(installer) == 1
    assert installer[0].remediation.startswith("set FLUX_VIEW_IMAGE in spec.trainer.env (Trainer adds this container")


# --- the bundle section --------------------------------------------------------------------------------

@pytest.mark.parametrize("settings, error", [
    ({"allowedPairs": [{"launcher": "quay.io/Tools/x", "worker": "quay.io/t/y"}]}, "must be lowercase"),
    ({"allowedPairs": [{"launcher": "quay.io/t/x"}]}, "worker"),
    ({"sameImage": True}, "sameImage"),
    ({"requireDigests": True}, "unknown field"),
])
def test_bad_settings_are_refused_at_load_with_their_field(make_bundle, settings, error):
    with pytest.raises(BundleError, match=error) as info:
        _bundle(make_bundle, **settings)
    assert all(p.field and p.field.startswith("spec.checks.images") for p in info.value.problems)


def test_a_valid_but_huge_reference_is_named_by_its_length(build, make_bundle, review):
    image = "r" * 2000 + ".example.com/train:1"  # a host has no length limit in the grammar
    runtime = _runtime(build, node_image=image)
    decision = review(build.trainjob(numNodes=2, image=image), [_bundle(make_bundle, requireDigest=True)],
                      build.state(runtime))
    ((message, fix), _) = _messages(decision)
    assert message.startswith(f"node container 'node' runs a {len(image)}-character value, not pinned by digest")
    assert "NAME[:TAG]@sha256:<64 hex>" in fix and len(message) + len(fix) < 1000
