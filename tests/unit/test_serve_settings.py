"""serve's settings come from one table (webhook/cli/settings.py): every setting is a flag and a
config key of the same name, the file and the flags reach the same server fields, the defaults are
the server's own, and the old key names still read."""
from __future__ import annotations

import dataclasses

import pytest

from trainjob_admission.webhook.admission.config import ReviewerConfig, ServerConfig
from trainjob_admission.webhook.cli.errors import CliError
from trainjob_admission.webhook.cli.main import build_parser
from trainjob_admission.webhook.cli.settings import RENAMED_KEYS, SETTINGS, from_args


def options(tmp_path, *flags: str, config: str | None = None):
    argv = ["serve", "--cert-dir", str(tmp_path)]
    if config is not None:
        (tmp_path / "serve.yaml").write_text(config)
        argv += ["--config", str(tmp_path / "serve.yaml")]
    return from_args(build_parser().parse_args([*argv, *flags]))


def test_each_flag_is_its_key_in_kebab_case() -> None:
    flags = {s.key: s.flag for s in SETTINGS}
    assert flags["clientCA"] == "--client-ca" and flags["bundles"] == "--bundle"
    assert flags["reconcileNamespaces"] == "--reconcile-namespace" and flags["webhookTimeout"] == "--webhook-timeout"
    assert len(set(flags.values())) == len(flags)


def test_every_setting_has_a_flag_and_a_key_and_both_reach_the_server(tmp_path) -> None:
    """The settings once only in the file (creationRate, creationBurst, the evaluation's timeout)
    have flags now, and the file and the flag give the server the same value."""
    by_flag = options(tmp_path, "--creation-rate", "2.5", "--creation-burst", "7", "--evaluation-timeout", "3")
    by_file = options(tmp_path, config="creationRate: 2.5\ncreationBurst: 7\nevaluationTimeout: 3.0\n")
    for found in (by_flag, by_file):
        reviewer = found.server.reviewer
        assert (reviewer.creation_rate, reviewer.creation_burst, reviewer.timeout_seconds) == (2.5, 7, 3.0)


def test_the_flag_wins_over_the_file(tmp_path) -> None:
    found = options(tmp_path, "--port", "9443", "--failure-mode", "allow",
                    config="port: 8000\nfailureMode: deny\nhost: 127.0.0.1\n")
    assert (found.server.port, found.server.reviewer.failure_mode, found.server.host) == (9443, "allow", "127.0.0.1")


def test_the_defaults_are_the_servers_own(tmp_path) -> None:
    found = options(tmp_path)
    assert dataclasses.replace(found.server, cert_file=None, key_file=None, replica="") == \
        dataclasses.replace(ServerConfig(), replica="")
    assert found.server.reviewer == ReviewerConfig()


def test_old_key_names_still_read_with_a_note(tmp_path, capsys) -> None:
    found = options(tmp_path, config="timeoutSeconds: 4.0\nwebhookTimeoutSeconds: 12.0\n")
    assert (found.server.reviewer.timeout_seconds, found.server.reviewer.webhook_timeout_seconds) == (4.0, 12.0)
    note = capsys.readouterr().err
    assert all(f"key {old!r} is now {new!r}" in note for old, new in RENAMED_KEYS.items() if old != "provenanceKeyFile")
    with pytest.raises(CliError, match="'timeoutSeconds' is the old name of 'evaluationTimeout'"):
        options(tmp_path, config="timeoutSeconds: 4.0\nevaluationTimeout: 3.0\n")


def test_a_misspelt_key_is_refused_by_name(tmp_path) -> None:
    with pytest.raises(CliError, match="unknown key 'evaluationTimeOut'"):
        options(tmp_path, config="evaluationTimeOut: 3\n")
