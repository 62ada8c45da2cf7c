"""The Secret the injector writes: Trainer's shape (plugins/mpi/mpi.go), our metadata, no key
material outside `data`; and how existing Secrets are described without reading their keys."""
from __future__ import annotations

import base64
import json

from trainjob_admission.policies.job.effective_job import EffectiveJob
from trainjob_admission.webhook.inject.injector import (
    FINGERPRINT_ANNOTATION, KEY_TYPE_ANNOTATION, _key_fields, secret,
)
from trainjob_admission.webhook.inject.keys import generate


def job() -> EffectiveJob:
    return EffectiveJob(kind="TrainJob", name="resnet", namespace="team-a", labels={}, runtime={}, mpi={},
                        pod_sets=[], pod_selector={"jobset.sigs.k8s.io/jobset-name": "resnet"})


def test_secret_has_trainers_shape_and_our_metadata():
    pair = generate("ecdsa-p384")
    body = secret(job(), "resnet-mpi-ssh-auth", "uid-1", pair)
    assert body["type"] == "kubernetes.io/ssh-auth" and body["immutable"] is True
    assert base64.b64decode(body["data"]["ssh-privatekey"]) == pair.private_pem
    assert base64.b64decode(body["data"]["ssh-publickey"]) == pair.public_openssh
    meta = body["metadata"]
    assert meta["labels"] == {"app.kubernetes.io/managed-by": "trainjob-admission",
                              "jobset.sigs.k8s.io/jobset-name": "resnet"}
    assert meta["annotations"] == {"trainjob-admission.io/job": "TrainJob/resnet",
                                   "trainjob-admission.io/admission-id": "uid-1",
                                   KEY_TYPE_ANNOTATION: "ecdsa-p384", FINGERPRINT_ANNOTATION: pair.fingerprint}
    assert "PRIVATE KEY" not in json.dumps(meta)
    assert _key_fields(body) == {"keyType": "ecdsa-p384", "fingerprint": pair.fingerprint}


def test_foreign_secret_is_described_by_its_public_key_only():
    pair = generate("ed25519")
    foreign = {"metadata": {"name": "x"}, "data": {"ssh-publickey": base64.b64encode(pair.public_openssh).decode(),
                                                   "ssh-privatekey": base64.b64encode(pair.private_pem).decode()}}
    assert _key_fields(foreign) == {"fingerprint": pair.fingerprint}
    assert _key_fields({"metadata": {}, "data": {"ssh-publickey": base64.b64encode(b"garbage").decode()}}) == {}
