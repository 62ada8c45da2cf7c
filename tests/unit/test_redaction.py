"""policies/redaction.py: which submitted values are kept out of messages, and how."""
from __future__ import annotations

from policies.redaction import echoable_values, scrub

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


def test_env_values_and_annotations_anywhere_in_the_job_longest_first():
    job = {"metadata": {"annotations": {"ci/token": "tok-12345678", "owner": "ml"}},
           "spec": {"trainer": {"env": [{"name": "AWS_SECRET_ACCESS_KEY", "value": SECRET},
                                        {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                                        {"name": "DEBUG", "value": "1"}]},
                    "runtimePatches": [{"trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
                        {"template": {"metadata": {"annotations": {"note": "rotate-after-" + SECRET}},
                                      "spec": {"containers": [{"env": [{"name": "DB", "value": "postgres://u:pw@db"}]}]}}}
                    ]}}}}]}}
    assert echoable_values(job) == ["rotate-after-" + SECRET, SECRET, "postgres://u:pw@db", "tok-12345678"]
    values = echoable_values(job, None)
    assert scrub(f"note rotate-after-{SECRET}, key {SECRET}, DEBUG=1, owner ml", values) == \
        "note [redacted], key [redacted], DEBUG=1, owner ml"


def test_hostile_shapes_are_ignored():
    assert echoable_values({"env": "x" * 20, "annotations": ["y" * 20], "spec": {"env": [None, 3, {"value": 5}]}}) == []
