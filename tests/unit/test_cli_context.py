"""``--context`` beside every ``--kubeconfig`` (review, policy explain, audit, serve), through the
real console script: it picks the kubeconfig's context as kubectl does, and a wrong one is one line
naming the contexts there are. The servers are closed loopback ports, so which one a command tried
shows in its "cannot reach" error."""
from __future__ import annotations

import socket
import subprocess

import pytest
import yaml

from tests.unit.test_cli import ROOT, SCRIPT

JOB = "examples/jobs/allowed.yaml"
COMMANDS = [["review", "-f", JOB], ["policy", "explain", "-f", JOB], ["audit"]]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens once the socket is closed


@pytest.fixture
def kubeconfig(tmp_path):
    """Two contexts on two (closed) servers; the current one is "prod"."""
    ports = {"prod": closed_port(), "dev": closed_port()}
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "prod",
        "clusters": [{"name": name, "cluster": {"server": f"https://127.0.0.1:{port}"}}
                     for name, port in ports.items()],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": "u"}} for name in ports]}))
    return path, ports


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_context_picks_the_cluster_as_kubectl_does(kubeconfig, command) -> None:
    path, ports = kubeconfig
    current = run(*command, "--kubeconfig", str(path))
    assert current.returncode == 6 and f"127.0.0.1:{ports['prod']}" in current.stderr, current.stderr
    chosen = run(*command, "--kubeconfig", str(path), "--context", "dev")
    assert chosen.returncode == 6 and f"127.0.0.1:{ports['dev']}" in chosen.stderr, chosen.stderr
    assert f"`kubectl --kubeconfig {path} --context dev cluster-info`" in chosen.stderr


@pytest.mark.parametrize("command", [*COMMANDS, ["serve"]], ids=lambda c: " ".join(c[:2]))
def test_an_unknown_context_is_one_line_naming_those_there_are(kubeconfig, command, tmp_path) -> None:
    path, _ = kubeconfig
    if command == ["serve"]:  # it fails at start-up, before listening: it needs a certificate to get there
        assert run("certs", "issue", "--service", "s", "--namespace", "n", "--out", str(tmp_path)).returncode == 0
        command = ["serve", "--cert-dir", str(tmp_path)]
    result = run(*command, "--kubeconfig", str(path), "--context", "staging")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"error: kubeconfig {path} has no context 'staging'; its contexts: prod, dev (kubectl config get-contexts)"]


@pytest.mark.parametrize("command", [[*COMMANDS[0], "--cluster-state", "examples/cluster-state.yaml"],
                                     ["audit", "--cluster-state", "examples/cluster-state.yaml"],
                                     ["serve", "--cert-dir", ".", "--cluster-state", "examples/cluster-state.yaml"]],
                         ids=lambda c: c[0])
def test_context_without_a_kubeconfig_says_so(command) -> None:
    result = run(*command, "--context", "dev")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: --context dev selects a context of a kubeconfig: use it with --kubeconfig"]
