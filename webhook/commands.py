"""Server-side commands: serve, demo, decisions, certs."""
from __future__ import annotations

import argparse


def register_server_commands(commands: argparse._SubParsersAction) -> None:
    """Add the server-side subcommands to the CLI parser."""
