"""The CLI's kubectl habits, through the real console script: a closed pipe, ``--version``, ``-f -``
and ``-f DIR/``, ``-o yaml``, the same patch in every process, and ``demo`` from a wheel."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import sysconfig
from importlib.metadata import version
from pathlib import Path

import jsonpatch
import pytest
import yaml

from trainjob_admission.policies.bundle.load import BUILTIN_PREFIX, builtin_names
from trainjob_admission.policies.decide.patch_diff import make_patch
from tests.unit.test_cli import ROOT, SCRIPT, STATE
from trainjob_admission.webhook.cli.main import DEFAULT_BUNDLE

JOBS = ROOT / "examples" / "jobs"
PRIVILEGED = [*STATE, "--cluster-state", "examples/runtimes/mpi-privileged.yaml"]


def run(*args: str, stdin: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, input=stdin, env=env,
                          timeout=60)


@pytest.mark.parametrize("command", [["review"], ["policy", "explain"]])
def test_a_closed_pipe_ends_quietly_with_the_sigpipe_status(command: list[str]) -> None:
    """The reader is gone before the first write, as when `| head` has what it wants."""
    process = subprocess.Popen([str(SCRIPT), *command, "-f", "examples/jobs/", *PRIVILEGED],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=60) == 141, stderr
    assert stderr == ""


def test_head_gets_the_first_line_and_no_traceback() -> None:
    result = subprocess.run(["bash", "-c", f"{SCRIPT} review -f examples/jobs/ {' '.join(PRIVILEGED)} | head -1"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.stdout.startswith("ALLOWED  TrainJob team-a/resnet-allreduce")
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr, result.stderr


def test_the_default_bundle_named_without_importing_the_engine_is_the_builtin_one() -> None:
    assert DEFAULT_BUNDLE == BUILTIN_PREFIX + "default" and "default" in builtin_names()


def test_version_is_the_installed_distributions() -> None:
    result = run("--version")
    assert (result.returncode, result.stdout) == (0, f"trainjob-admission {version('trainjob-admission')}\n")


def test_file_from_stdin_decides_as_the_file_does() -> None:
    text = (JOBS / "over-quota.yaml").read_text()
    from_stdin = run("review", "-f", "-", *STATE, "-o", "json", stdin=text)
    from_file = run("review", "-f", "examples/jobs/over-quota.yaml", *STATE, "-o", "json")
    assert from_stdin.returncode == from_file.returncode == 1
    assert (json.loads(from_stdin.stdout)["source"], json.loads(from_file.stdout)["source"]) == (
        "<stdin>", "examples/jobs/over-quota.yaml")
    assert {**json.loads(from_stdin.stdout), "source": ""} == {**json.loads(from_file.stdout), "source": ""}


def test_dash_n_gives_the_namespace_of_a_job_without_one() -> None:
    job = yaml.safe_load((JOBS / "over-quota.yaml").read_text())
    del job["metadata"]["namespace"]
    result = run("review", "-f", "-", "-n", "team-a", *STATE, "-o", "json", stdin=json.dumps(job))
    assert result.returncode == 1
    assert [m["rule"] for m in json.loads(result.stdout)["messages"]] == ["default/quota"]


def test_a_directory_decides_each_file_in_name_order() -> None:
    """Several results are a kubectl List, each naming its job and the file it came from (issue 31:
    a bare list did not say which answer was whose)."""
    result = run("review", "-f", "examples/jobs/", *PRIVILEGED, "-o", "json")
    listed = json.loads(result.stdout)
    assert result.returncode == 1  # some are denied
    assert (listed["apiVersion"], listed["kind"]) == ("v1", "List")
    decisions = listed["items"]
    names = sorted(p.name for p in JOBS.iterdir())
    assert [d["source"] for d in decisions] == [f"examples/jobs/{name}" for name in names]
    for name, decision in zip(names, decisions):
        alone = json.loads(run("review", "-f", f"examples/jobs/{name}", *PRIVILEGED, "-o", "json").stdout)
        job = yaml.safe_load((JOBS / name).read_text())
        assert decision == alone and decision["object"] == {
            "apiVersion": job["apiVersion"], "kind": job["kind"], "namespace": job["metadata"]["namespace"],
            "name": job["metadata"]["name"]}
    explained = json.loads(run("policy", "explain", "-f", "examples/jobs/", *PRIVILEGED, "-o", "json").stdout)
    assert [(i["object"]["name"], i["source"]) for i in explained["items"]] == [
        (d["object"]["name"], d["source"]) for d in decisions]


def test_without_cluster_state_review_says_what_to_give_instead_of_a_false_denial(tmp_path: Path) -> None:
    """Issue 31: no state used to print DENIED ... runtime 'mpi-openmpi' not found and exit 1."""
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    for command in (["review"], ["policy", "explain"]):
        result = run(*command, "-f", "examples/jobs/over-quota.yaml", env=env)
        assert (result.returncode, result.stdout) == (2, ""), result
        assert "give --cluster-state FILE|DIR" in result.stderr and "--kubeconfig" in result.stderr


def test_without_cluster_state_review_reads_kubeconfig_as_kubectl_does(tmp_path: Path) -> None:
    """$KUBECONFIG is read (and stderr says so): here it names a cluster nobody listens for, so the
    answer is exit 6, cluster unreachable, not a decision against an empty state."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{port}", "insecure-skip-tls-verify": True}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}], "users": [{"name": "u", "user": {"token": "t"}}]}))
    result = run("review", "-f", "examples/jobs/over-quota.yaml", env={**os.environ, "KUBECONFIG": str(kubeconfig)})
    assert result.returncode == 6, result
    assert f"reading the cluster state from $KUBECONFIG ({kubeconfig})" in result.stderr


def test_cluster_state_may_be_a_directory(tmp_path: Path) -> None:
    """Issue 31: --cluster-state refused a directory, which -f takes."""
    state = tmp_path / "state"
    state.mkdir()
    for source in ("examples/cluster-state.yaml", "examples/runtimes/mpi-openmpi.yaml"):
        (state / Path(source).name).write_text((ROOT / source).read_text())
    (state / "notes.txt").write_text("not read: only *.yaml, *.yml and *.json are")
    from_dir = run("review", "-f", "examples/jobs/over-quota.yaml", "--cluster-state", str(state), "-o", "json")
    from_files = run("review", "-f", "examples/jobs/over-quota.yaml", *STATE, "-o", "json")
    assert from_dir.returncode == from_files.returncode == 1, from_dir
    assert json.loads(from_dir.stdout) == json.loads(from_files.stdout)
    runtimes = run("review", "-f", "examples/jobs/allowed.yaml", "--cluster-state", "examples/cluster-state.yaml",
                   "--cluster-state", "examples/runtimes")
    assert runtimes.returncode == 0 and runtimes.stdout.startswith("ALLOWED"), runtimes


def test_a_bundle_given_offline_says_it_replaces_the_default() -> None:
    """Issue 31: `review --bundle mine.yaml` silently dropped the default bundle's checks."""
    alone = run("review", "-f", "examples/jobs/too-many-nodes.yaml", *STATE, "--bundle",
                "examples/bundles/audit-rollout.yaml")
    assert "note: --bundle replaces the default bundle" in alone.stderr and "--bundle builtin:default" in alone.stderr
    both = run("review", "-f", "examples/jobs/too-many-nodes.yaml", *STATE, "--bundle",
               "examples/bundles/audit-rollout.yaml", "--bundle", "builtin:default")
    assert "replaces" not in both.stderr and both.returncode == 1 and "default/job-shape" in both.stdout


def test_a_missing_file_and_an_empty_directory_are_one_line_with_the_fix(tmp_path: Path) -> None:
    for target, words in ((tmp_path / "nope.yaml", "file not found"), (tmp_path, "holds no *.yaml, *.yml or *.json")):
        result = run("policy", "explain", "-f", str(target), *STATE)
        assert result.returncode == 3
        assert result.stderr.count("\n") == 1 and words in result.stderr
        assert "a directory of them, or - to read stdin" in result.stderr


@pytest.mark.parametrize("args", [
    ["review", "-f", "examples/jobs/", *PRIVILEGED],
    ["policy", "explain", "-f", "examples/jobs/allowed.yaml", *STATE],
    ["policy", "test", "builtin:default", "--cases", "examples/cases/default"],
])
def test_yaml_output_holds_what_json_does(args: list[str]) -> None:
    as_json, as_yaml = run(*args, "-o", "json"), run(*args, "-o", "yaml")
    assert as_json.returncode == as_yaml.returncode
    assert yaml.safe_load(as_yaml.stdout) == json.loads(as_json.stdout)


def test_the_patch_is_the_same_in_every_process() -> None:
    """python-json-patch walks keys through sets: its order followed the hash seed."""
    outputs = set()
    for seed in ("0", "1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        outputs.add(run("review", "-f", "examples/jobs/allowed.yaml", *STATE, "-o", "json", env=env).stdout)
    assert len(outputs) == 1
    assert [op["path"] for op in json.loads(outputs.pop())["patch"]] == ["/metadata/labels", "/spec/runtimePatches"]


@pytest.mark.parametrize("before, after", [
    ({"a": 1, "b": {"c": [1, 2, 3]}}, {"b": {"c": [3, 1]}, "d": 1}),
    ({"x": [{"n": 1}, {"n": 2}], "y": "s"}, {"x": [{"n": 2}], "z": {"n": 1}, "y": "t"}),
])
def test_the_ordered_patch_turns_before_into_after(before: dict, after: dict) -> None:
    assert jsonpatch.apply_patch(before, make_patch(before, after)) == after


def test_demo_runs_from_a_wheel_without_the_source_tree(tmp_path: Path) -> None:
    """The sample jobs, runtimes and state are package data: a wheel in a fresh venv, run isolated
    (-I) from elsewhere, decides them over HTTPS and verifies its log."""
    pip = [str(Path(sys.executable).parent / "pip")]
    subprocess.run([*pip, "wheel", "--no-deps", "-q", "-w", str(tmp_path / "wheel"), "."], cwd=ROOT, check=True,
                   capture_output=True, timeout=300)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True, timeout=120)
    python = str(tmp_path / "venv" / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # the dependencies from this venv's site-packages, as a path only: its .pth files (the editable
    # install of the source tree) are not processed
    Path(site, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    wheel, = (tmp_path / "wheel").glob("trainjob_admission-*.whl")
    subprocess.run([*pip, "--python", python, "install", "--no-deps", "-q", str(wheel)], check=True,
                   capture_output=True, timeout=300)
    result = subprocess.run([python, "-I", "-c", "import sys, importlib.util; print(importlib.util.find_spec('webhook')); "
                             "from trainjob_admission import webhook; print(webhook.__file__); "
                             "from trainjob_admission.webhook.cli.main import main; "
                             "sys.exit(main(['demo', '--workdir', 'demo']))"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    # the wheel claims no generic top-level name: only trainjob_admission
    none, installed = result.stdout.splitlines()[:2]
    assert none == "None" and installed.startswith(site)
    assert "--- too-many-gpus.yaml: TrainJob" in result.stdout and "-> DENIED" in result.stdout
    assert "chain intact" in result.stdout
    # a patch value too long for one line is cut with a mark, not mid-JSON without one (issue 31)
    (runtime_patch,) = [line for line in result.stdout.splitlines() if "patch: add /spec/runtimePatches = " in line]
    assert re.search(r"\.\.\.\[\+\d+ chars\]$", runtime_patch), runtime_patch
    # Issue 31: the --help examples name files this install has (they named the repository's
    # examples/, which a wheel lacks), and they run as printed
    script = str(tmp_path / "venv" / "bin" / "trainjob-admission")
    helps = {" ".join(c): subprocess.run([script, *c, "--help"], capture_output=True, text=True, timeout=60,
                                         cwd=tmp_path).stdout
             for c in (["review"], ["policy", "lint"], ["policy", "explain"], ["serve"])}
    samples = {line.split("=", 1)[1].split()[0] for text in helps.values() for line in text.splitlines()
               if line.strip().startswith("S=")}
    assert len(samples) == 1 and next(iter(samples)).startswith(site), samples
    named = {token for text in helps.values() for token in re.findall(r"\$S/[\w./-]+", text)}
    assert len(named) >= 5 and all(Path(t.replace("$S", next(iter(samples)))).exists() for t in named), named
    assert not [text for text in helps.values() if re.search(r"\bexamples/[\w.-]", text)]
    review = next(line for line in helps["review"].splitlines() if "review -f $S/jobs/over-quota.yaml" in line)
    ran = subprocess.run(["bash", "-c", f"S={next(iter(samples))}; {review.strip().replace('trainjob-admission', script, 1)}"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert ran.returncode == 1 and ran.stdout.startswith("DENIED") and "default/quota" in ran.stdout, ran


def test_help_loads_neither_the_engine_nor_cel() -> None:
    """`--help` and every command's parser start without the CEL compiler and the policy engine
    (the decision log's readers once pulled them in through policies.decide.decision), so help is quick."""
    probe = ("import sys\nfrom trainjob_admission.webhook.cli.main import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in ('celpy', 'lark', 'trainjob_admission.policies.decide.engine', 'trainjob_admission.policies.cel.environment') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True)
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout


# The server's libraries and the decision log: serve, demo, decisions and certs import them when they run.
SERVER_STACK = ("aiohttp", "prometheus_client", "kubernetes", "urllib3", "cryptography", "asyncio", "ssl",
                "trainjob_admission.webhook.admission.server", "trainjob_admission.webhook.startup",
                "trainjob_admission.webhook.decisionlog", "trainjob_admission.webhook.kube.client")


def loaded(argv: list[str], modules: tuple[str, ...]) -> list[str]:
    """Which of ``modules`` a CLI process has imported once ``argv`` has run."""
    probe = ("import sys\nfrom trainjob_admission.webhook.cli.main import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
             f"import json\nprint(json.dumps(sorted(m for m in {modules!r} if m in sys.modules)), file=sys.stderr)")
    result = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, cwd=ROOT, timeout=60)
    return json.loads(result.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize("argv", [["review", "-f", "examples/jobs/allowed.yaml", *STATE],
                                  ["policy", "explain", "-f", "examples/jobs/allowed.yaml", *STATE],
                                  ["policy", "lint", "builtin:default"], ["--help"], ["serve", "--help"]],
                         ids=["review", "explain", "lint", "help", "serve-help"])
def test_offline_commands_and_help_load_no_server_stack(argv: list[str]) -> None:
    """`review` and `policy` decide without the server's libraries, and help names the server-side
    commands without importing them: their import time is not paid (docs/architecture.md "CLI start")."""
    assert loaded(argv, SERVER_STACK) == []


def _commands(parser, path=()):
    """(words, parser) of every command that runs something: the leaves of the subcommand tree."""
    import argparse

    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subcommands:
        yield path, parser
    for action in subcommands:
        for name, child in action.choices.items():
            yield from _commands(child, (*path, name))


def test_every_command_teaches_with_an_example_and_explains_every_argument():
    """`--help` is where a data scientist or an admin learns a command: each one shows at least one
    example to copy, and no option or argument is listed bare."""
    import argparse

    from trainjob_admission.webhook.cli.main import build_parser

    commands = dict(_commands(build_parser()))
    assert len(commands) >= 12, sorted(commands)
    for words, parser in commands.items():
        shown = parser.format_help()
        assert re.search(r"^examples?:.*?trainjob-admission ", shown, re.M | re.S), \
            f"`{' '.join(words)} --help` has no example to copy"
        bare = [a.option_strings or [a.dest] for a in parser._actions
                if not a.help and a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)]
        assert not bare, f"`{' '.join(words)} --help` lists {bare} without saying what they do"


def test_a_demo_patch_value_is_cut_with_a_mark() -> None:
    from trainjob_admission.webhook.cli.demo import PATCH_VALUE_SHOWN, shown_value

    value = {"labels": {"k": "v" * 400}}
    text = json.dumps(value)
    assert shown_value(value) == f"{text[:PATCH_VALUE_SHOWN]}...[+{len(text) - PATCH_VALUE_SHOWN} chars]"
    assert shown_value({"k": "v"}) == '{"k": "v"}'
