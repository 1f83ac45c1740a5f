"""The command table (tools.cli.commands) names code that exists, and the parser main uses
(each command's arguments added when it is parsed) parses as the whole parser does."""

from __future__ import annotations

import pytest

from tools.cli import build_parser
from tools.cli.commands import COMMANDS, Command, load


def _leaves(cmds: tuple[Command, ...], path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Command]]:
    out = []
    for c in cmds:
        out += _leaves(c.subcommands, (*path, c.name)) if c.subcommands else [((*path, c.name), c)]
    return out


@pytest.mark.parametrize("path,cmd", _leaves(COMMANDS), ids=lambda v: " ".join(v) if isinstance(v, tuple) else "")
def test_every_command_names_its_handler_and_arguments(path: tuple[str, ...], cmd: Command) -> None:
    assert callable(load(cmd.handler)), f"statelog {' '.join(path)}: handler {cmd.handler}"
    if cmd.arguments is not None:
        assert callable(load(cmd.arguments)), f"statelog {' '.join(path)}: arguments {cmd.arguments}"


@pytest.mark.parametrize("argv", [
    ["checkpoints", "list", "file:///r", "--json"],
    ["-v", "checkpoints", "show", "file:///r", "latest", "--store-option", "region=x"],
    ["materializer", "run", "file:///r", "--once", "--interval", "5s", "--no-gc"],
    ["savepoint", "delete", "file:///r", "sp", "--force"],
    ["sql", "file:///r", "SELECT 1", "--max-rows", "3", "--engine", "duckdb"],
    ["ui", "file:///r", "--port", "0"],
    ["verify", "file:///r", "--checkpoint", "2"],
])
def test_the_lazy_parser_parses_as_the_whole_one(argv: list[str]) -> None:
    def parsed(lazy: bool) -> str:  # repr: a --store-option value compares by its text
        return repr(sorted(vars(build_parser(lazy=lazy).parse_args(argv)).items()))

    assert parsed(True) == parsed(False)
