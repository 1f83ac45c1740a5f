"""statelog.signals.stop_on_signals: the one SIGTERM/SIGINT handler of the loops that stop cleanly."""

from __future__ import annotations

import ast
import logging
import os
import signal
import threading
from pathlib import Path

import pytest

from statelog.signals import stop_on_signals

REPO = Path(__file__).resolve().parents[2]


def test_signals_set_the_event_and_a_second_sigint_interrupts(caplog: pytest.LogCaptureFixture) -> None:
    stop = threading.Event()
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    caplog.set_level(logging.INFO, logger="statelog.signals")
    with stop_on_signals(stop, "stopping the test"):
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.is_set()
        os.kill(os.getpid(), signal.SIGTERM)  # a second SIGTERM changes nothing
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    assert "received SIGTERM: stopping the test" in caplog.text


def test_a_first_sigint_only_sets_the_event() -> None:
    stop = threading.Event()
    with stop_on_signals(stop):
        os.kill(os.getpid(), signal.SIGINT)
    assert stop.is_set()


def test_outside_the_main_thread_nothing_is_installed() -> None:
    stop, seen = threading.Event(), []
    before = signal.getsignal(signal.SIGTERM)

    def run() -> None:
        with stop_on_signals(stop):
            seen.append(signal.getsignal(signal.SIGTERM))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert seen == [before] and not stop.is_set()


def test_the_stop_handlers_are_not_duplicated() -> None:
    """The application's loop and ``statelog materializer run`` use the shared handler: no other
    module installs its own SIGTERM or SIGINT handler that sets a stop event."""
    installers = []
    for pkg in ("statelog", "materializer", "runtime", "tools"):
        for path in sorted((REPO / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if (isinstance(node, ast.Call) and ast.unparse(node.func) == "signal.signal" and node.args
                        and ast.unparse(node.args[0]) in ("s", "signal.SIGTERM")):  # fmt: skip
                    installers.append(str(path.relative_to(REPO)))
    assert sorted(set(installers)) == ["statelog/signals.py"]
