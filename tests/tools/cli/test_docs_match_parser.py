"""docs/cli.md and README.md name every command and option of the ``statelog`` parser.

The parser is walked (every command and subcommand, every option); docs/cli.md's synopsis
block (the first code block starting ``statelog [-v]``, continuation lines indented) must have
a line per command naming each of its options and nothing the parser lacks, and a section
heading per command; README.md's command list must name every command.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from tools.cli import build_parser

REPO = Path(__file__).resolve().parents[3]
# options every command takes after its name (documented once, under "Global options")
GLOBAL = {"--verbose", "--store-option", "--help"}
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z-]*")


def parser_commands() -> dict[str, set[str]]:
    """``"materializer run"`` -> its long options (without the global ones)."""
    out: dict[str, set[str]] = {}

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            out[" ".join(path)] = {o for a in parser._actions for o in a.option_strings
                                   if o.startswith("--")} - GLOBAL
            return
        for name, sub in subs[0].choices.items():
            walk(sub, [*path, name])

    walk(build_parser(), [])
    return out


def synopsis(text: str) -> dict[str, set[str]]:
    """The synopsis block of docs/cli.md: command -> the options its line names."""
    block = re.search(r"```\n(statelog \[-v\].*?)```", text, re.S)
    assert block, "docs/cli.md has no synopsis block starting with 'statelog [-v]'"
    lines: list[str] = []
    for line in block.group(1).splitlines():
        if line.startswith((" ", "\t")) and lines:
            lines[-1] += " " + line.strip()
        elif line.startswith("statelog "):
            lines.append(line)
    out: dict[str, set[str]] = {}
    commands = parser_commands()
    for line in lines:
        words = line.split()[1:]
        name = " ".join(words[:2]) if " ".join(words[:2]) in commands else words[0]
        if name.startswith(("[", "-")):
            continue  # the global lines
        assert name not in out, f"two synopsis lines for {name!r}"
        out[name] = set(FLAG.findall(line))
    return out


def test_every_command_and_option_is_in_the_synopsis() -> None:
    documented = synopsis((REPO / "docs" / "cli.md").read_text())
    commands = parser_commands()
    assert sorted(documented) == sorted(commands), "commands of the parser vs docs/cli.md's synopsis"
    for name, options in commands.items():
        assert documented[name] == options, (
            f"statelog {name}: missing in docs/cli.md {sorted(options - documented[name])}, "
            f"not in the parser {sorted(documented[name] - options)}")


def test_every_command_has_a_section() -> None:
    headings = re.findall(r"^## `statelog ([a-z ]+?)(?: [A-Z\"]|`)", (REPO / "docs" / "cli.md").read_text(), re.M)
    assert set(parser_commands()) <= set(headings), set(parser_commands()) - set(headings)


def test_readme_lists_every_command() -> None:
    readme = (REPO / "README.md").read_text()
    block = readme.split("## Command line", 1)[1].split("```")[1]
    listed = {" ".join(line.split()[1:3]) if " ".join(line.split()[1:3]) in parser_commands() else line.split()[1]
              for line in block.splitlines() if line.startswith("statelog ")}
    assert listed == set(parser_commands()), set(parser_commands()) ^ listed


@pytest.mark.parametrize("flag", ["--engine", "--checkpoint", "--json"])
def test_the_walk_finds_options(flag: str) -> None:
    assert any(flag in options for options in parser_commands().values())
