"""Image policy through the real server: AdmissionReviews over TLS are denied (or warned) with each
container and its image named, recorded in the decision log, and hostile images never crash it."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trainjob_admission.policies.bundle.schema import API_VERSION, KIND
from tests.support.objects import example_job

from .conftest import start_server, stop_server

pytestmark = pytest.mark.server

PINNED = "quay.io/acme-ml/openmpi-runtime:4.1@sha256:" + "0123456789abcdef" * 4


def images_bundle(tmp_path: Path, name: str, **settings) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name},
                                    "spec": {"checks": {"images": settings}}}))
    return str(path)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory):
    """One server that denies (digests and one image), one that only warns about two images."""
    started = {}
    for name, settings in (("strict", {"requireDigest": True, "sameImage": "deny"}), ("advice", {"sameImage": "warn"})):
        tmp = tmp_path_factory.mktemp(name)
        started[name] = start_server(tmp, ["builtin:default", images_bundle(tmp, name, **settings)])
    yield {name: running for name, (running, _) in started.items()}
    for running, thread in started.values():
        stop_server(running, thread)


def test_each_container_and_its_image_are_named_in_the_denial_and_the_log(servers):
    running = servers["strict"]
    response = running.review(example_job("allowed.yaml"))
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert "launcher container 'node' runs 'quay.io/acme-ml/horovod-resnet:0.28', not pinned by digest" in message
    assert "node container 'node' runs 'quay.io/acme-ml/openmpi-runtime:4.1', not pinned by digest" in message
    assert ("launcher container 'node' runs 'quay.io/acme-ml/horovod-resnet:0.28' but the node pods' container 'node' "
            "runs 'quay.io/acme-ml/openmpi-runtime:4.1'") in message
    (record,) = [r for r in running.records() if r["uid"] == response["uid"]]
    (result,) = [r for r in record["rules"] if r["rule"] == "image-policy"]
    assert (result["bundle"], result["effect"], len(result["messages"])) == ("strict", "deny", 3)


def test_a_pinned_launcher_still_differs_from_workers_on_a_tag(servers):
    """The launcher pinned to the digest of the workers' tag: the tag may since point elsewhere, so
    the two are not known to be one image, and the runtime's tag is still not pinned."""
    running = servers["strict"]
    job = example_job("allowed.yaml")
    job["spec"]["trainer"]["image"] = PINNED  # the launcher's; the workers' stays the runtime's tag
    response = running.review(job)
    (record,) = [r for r in running.records() if r["uid"] == response["uid"]]
    (result,) = [r for r in record["rules"] if r["rule"] == "image-policy"]
    unpinned, mismatch = result["messages"]
    assert unpinned.startswith("node container 'node' runs 'quay.io/acme-ml/openmpi-runtime:4.1', not pinned by digest")
    assert mismatch.startswith(f"launcher container 'node' runs '{PINNED}' but the node pods' container 'node' runs "
                               "'quay.io/acme-ml/openmpi-runtime:4.1'")


def test_warn_admits_with_the_message_as_a_warning(servers):
    response = servers["advice"].review(example_job("allowed.yaml"))
    assert response["allowed"] is True
    assert any(w.startswith("[advice/image-policy] launcher container 'node' runs 'quay.io/acme-ml/horovod-resnet:0.28'")
               for w in response.get("warnings", []))


@pytest.mark.parametrize("image", [7, None, ["x"], {"a": 1}, "", "é" * 1000, "a" + "-" * 500_000 + "!/x",
                                   "quay.io/x@sha256:" + "F" * 64])
def test_hostile_images_are_denied_and_the_server_stays_up(servers, image):
    running = servers["strict"]
    job = example_job("allowed.yaml")
    job["spec"]["trainer"]["image"] = image
    response = running.review(job)
    assert response["allowed"] is False
    assert running.get("/healthz")[0] == 200
