"""The service's own record of what it injected (webhook/inject/provenance.py): an HMAC that a planted
or forged copy cannot carry, and which the injector and the reconciler both require."""
from __future__ import annotations

import copy

import pytest

from trainjob_admission.policies.job.effective_job import EffectiveJob
from trainjob_admission.webhook.inject.injector import secret
from trainjob_admission.webhook.inject.keys import generate
from trainjob_admission.webhook.inject.provenance import (
    ANNOTATION, Provenance, ProvenanceKeyError, load_provenance,
)
from trainjob_admission.webhook.inject.reconciler import Reconciler
from trainjob_admission.webhook.kube.resources import SECRETS

KEY = Provenance([b"k" * 32])


def job(name: str = "resnet", namespace: str = "team-a") -> EffectiveJob:
    return EffectiveJob(kind="TrainJob", name=name, namespace=namespace, labels={}, runtime={}, mpi={},
                        pod_sets=[], pod_selector={"jobset.sigs.k8s.io/jobset-name": name})


def ours(name: str = "resnet", namespace: str = "team-a") -> dict:
    return KEY.stamp("Secret", secret(job(name, namespace), f"{name}-mpi-ssh-auth", "uid-1", generate("ed25519")))


def test_our_secret_verifies_as_stored_and_after_the_reconciler_adds_an_owner():
    obj = ours()
    assert obj["metadata"]["annotations"][ANNOTATION].startswith("v1:")
    assert KEY.verify("Secret", obj)
    obj["metadata"]["ownerReferences"] = [{"kind": "TrainJob", "name": "resnet", "uid": "uid-1"}]
    obj["metadata"]["resourceVersion"] = "42"
    assert KEY.verify("Secret", obj)


def test_a_forged_copy_of_label_and_annotations_is_refused():
    """An attacker copies a real Secret's label and annotations (HMAC included) onto their own
    key, or onto another job's name, or into another namespace: none of them verifies."""
    real = ours()
    attacker = generate("ed25519")
    own_key = copy.deepcopy(real)
    own_key["data"] = secret(job(), "resnet-mpi-ssh-auth", "uid-1", attacker)["data"]
    other_job = copy.deepcopy(real)
    other_job["metadata"]["name"] = "victim-mpi-ssh-auth"
    other_job["metadata"]["annotations"]["trainjob-admission.io/job"] = "TrainJob/victim"
    other_ns = copy.deepcopy(real)
    other_ns["metadata"]["namespace"] = "team-b"
    other_submission = copy.deepcopy(real)
    other_submission["metadata"]["annotations"]["trainjob-admission.io/admission-id"] = "uid-2"
    for forged in (own_key, other_job, other_ns, other_submission):
        assert not KEY.verify("Secret", forged)
    assert not Provenance([b"x" * 32]).verify("Secret", real), "another key (another install) is not ours"
    assert not KEY.verify("NetworkPolicy", real), "the kind is covered"
    unsigned = copy.deepcopy(real)
    del unsigned["metadata"]["annotations"][ANNOTATION]
    assert not KEY.verify("Secret", unsigned)


def test_key_file_rotation_and_errors(tmp_path):
    old, new = "a" * 64, "b" * 64
    (tmp_path / "old").write_text(old + "\n")
    (tmp_path / "both").write_text(f"{new}\n{old}\n")
    signed_before = Provenance.from_file(tmp_path / "old").stamp("Secret", secret(
        job(), "resnet-mpi-ssh-auth", "uid-1", generate("ed25519")))
    rotated = Provenance.from_file(tmp_path / "both")
    assert rotated.verify("Secret", signed_before), "a key moved to the second line still verifies"
    assert rotated.sign("Secret", signed_before) != signed_before["metadata"]["annotations"][ANNOTATION]
    (tmp_path / "short").write_text("secret\n")
    with pytest.raises(ProvenanceKeyError, match="at least 32 characters"):
        Provenance.from_file(tmp_path / "short")
    with pytest.raises(ProvenanceKeyError, match="cannot read --provenance-key"):
        Provenance.from_file(tmp_path / "missing")
    # without a key file: derived from the serving key, the same for every replica that mounts it
    (tmp_path / "tls.key").write_bytes(b"-----BEGIN PRIVATE KEY-----\nabc\n-----END PRIVATE KEY-----\n")
    first, second = (load_provenance(None, tmp_path / "tls.key") for _ in range(2))
    assert second.verify("Secret", first.stamp("Secret", ours()))
    with pytest.raises(ProvenanceKeyError, match="pass --provenance-key"):
        load_provenance(None, tmp_path / "no-such.key")


def test_reconciler_touches_only_its_own_names_with_a_valid_record_outside_protected_namespaces():
    reconciler = Reconciler(None, KEY, own_namespace="ml-admission")  # the check makes no API call

    def judged(obj: dict) -> bool:
        kind, _, name = obj["metadata"]["annotations"]["trainjob-admission.io/job"].partition("/")
        return reconciler._ours(SECRETS, obj, kind, name)

    assert judged(ours())
    forged = copy.deepcopy(ours())
    forged["metadata"]["annotations"][ANNOTATION] = "v1:" + "0" * 64
    assert not judged(forged)
    renamed = ours()
    renamed["metadata"]["name"] = "payroll-db-credentials"  # a name not of our pattern, even if validly signed
    assert not judged(KEY.stamp("Secret", renamed))
    for namespace in ("kube-system", "kube-public", "kube-node-lease", "ml-admission"):
        assert not judged(ours(namespace=namespace)), namespace
