"""What the CLI reads and prints the way kubectl users expect: ``-f FILE``, ``-f DIR/`` and ``-f -``;
``-o text|json|yaml`` (and csv where the output is a table); ``--version``; and a closed pipe
(``| head``) ending the command quietly."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

import yaml

from trainjob_admission.policies.k8s.clusterstate import StateError, load_objects, object_files, parse_objects
from trainjob_admission.policies.k8s.manifests import read_text

from .errors import EXIT_NOT_FOUND, CliError

OUTPUTS = ("text", "json", "yaml")
FILE_FIX = "give a TrainJob or MPIJob file (YAML or JSON), a directory of them, or - to read stdin"


def read_sources(spec: str) -> list[tuple[str, list[dict]]]:
    """(source, objects) for ``-f``: a file, each *.yaml, *.yml and *.json file of a directory
    (sorted by name, not recursive), or ``-`` for stdin."""
    if spec == "-":
        return [("<stdin>", _parsed(lambda: parse_objects(read_text(sys.stdin), "<stdin>")))]
    path = Path(spec)
    if path.is_dir():
        files = object_files(path)
        if not files:
            raise CliError(f"-f {spec}: the directory holds no *.yaml, *.yml or *.json file; {FILE_FIX}",
                           EXIT_NOT_FOUND)
        return [(str(p), _parsed(lambda p=p: load_objects(p))) for p in files]
    if not path.exists():
        raise CliError(f"file not found: {spec}; {FILE_FIX}", EXIT_NOT_FOUND)
    return [(spec, _parsed(lambda: load_objects(path)))]


def _parsed(read: Callable[[], list[dict]]) -> list[dict]:
    try:
        return read()
    except StateError as exc:
        raise CliError(str(exc)) from None


def add_context_flag(parser: argparse.ArgumentParser) -> None:
    """``--context`` beside every ``--kubeconfig``, as kubectl's."""
    parser.add_argument("--context", metavar="NAME",
                        help="with --kubeconfig: use its context NAME instead of its current-context, as kubectl does")


def add_output_flag(parser: argparse.ArgumentParser, *extra: str) -> None:
    """The same ``-o`` on every command that prints results: text, json, yaml (and ``extra``)."""
    parser.add_argument("-o", "--output", choices=[*OUTPUTS, *extra], default="text",
                        help="text for people; json or yaml for scripts (one result, or a List of them for several)")


def dump(value: Any, output: str) -> str:
    """``value`` as JSON or YAML text; YAML is made from the JSON so both show the same data."""
    text = json.dumps(value, indent=2)
    if output == "json":
        return text
    return yaml.safe_dump(json.loads(text), sort_keys=False, default_flow_style=False, allow_unicode=True,
                          width=float("inf")).rstrip("\n")  # long messages on one line, as kubectl prints them


def one_or_list(values: list[Any]) -> Any:
    """One result as itself, several as a ``List`` (``{"apiVersion": "v1", "kind": "List", "items"}``),
    as ``kubectl get -f`` prints one object or several."""
    return values[0] if len(values) == 1 else {"apiVersion": "v1", "kind": "List", "items": values}


class VersionAction(argparse.Action):
    """``--version``: the installed distribution's version, looked up only when asked."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print the version and exit", **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415 (only --version)

        try:
            found = version("trainjob-admission")
        except PackageNotFoundError:
            found = "unknown (not installed: pip install .)"
        print(f"{parser.prog} {found}")  # stdout, as argparse's own version action
        parser.exit()


def quiet_broken_pipe() -> None:
    """After the reader of stdout went away (``| head``): no traceback, and no second error when
    Python flushes what is left of stdout at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def port_number(text: str) -> int:
    """argparse type: a TCP port (0 picks a free one)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port (0-65535)")
    return port
