"""Jobs of the runtime tests, their deterministic inputs and plain-Python golden outputs.

Everything here is defined at module level so the job graphs pickle by reference into the
worker processes.

* **clicks**: ``CLICK_SPLITS`` generator splits of ``(user, ts, split, i)`` events with
  bounded out-of-orderness (never late); per-user tumbling event-time windows counted with
  the clickstream example's aggregate function and window row (``examples/clickstream.py``)
  -> ``[user, window start, count]``.
* **orders / payments**: two generator sources; every order ``"k-i"`` has exactly one
  payment; a keyed two-input function joins them -> ``[order id, user, amount]``.

The builders take ``rate`` (records/s per source subtask) and ``gate``: with a gate (a file
path) the sources are paced only while the file does not exist and hold back each split's
last record until it does, so a crash loop's job cannot end before its kills landed, and
its input drains at full speed once the test creates the file (:func:`open_gate`).
"""

from __future__ import annotations

import os
import time
import zlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

import statelog
from examples.clickstream import CountClicks, window_row
from runtime import (
    FileSink,
    FixedDelay,
    GeneratorSource,
    KeyedCoProcessFunction,
    KeyedProcessFunction,
    Sink,
    SlidingEventTimeWindows,
    StreamExecutionEnvironment,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)
from runtime.connectors.sources import Source, SplitReader
from runtime.network import inflight
from statelog import PICKLE, ValueStateDescriptor
from tests.support.s3server import RootSpec

EPOCH = 1_735_689_600_000
USERS = 17
STEP_MS = 2
OOO_MS = 50
WINDOW_MS = 200
CLICK_SPLITS = 4
ORDER_SPLITS = 2


def _h(*parts: Any) -> int:
    return zlib.crc32(":".join(map(str, parts)).encode())


# -- a generator paced until a gate opens -------------------------------------------------------


class GatedGeneratorSource(GeneratorSource):
    """:class:`GeneratorSource` whose splits are paced at ``rate`` records/s per source subtask
    while the file ``gate`` does not exist, and hold back their last record until it does;
    once it exists they read at full speed. Positions are the generator's."""

    def __init__(self, fn: Callable[[int, int], Any], count: int, splits: int, rate: float,
                 gate: Path, parallelism: int) -> None:
        super().__init__(fn, count, splits=splits)
        self.gate = str(gate)
        self.split_rate = rate / max(1, -(-splits // parallelism))  # the subtask's rate over its splits

    def reader(self, split: str, position: dict[str, Any] | None) -> SplitReader:
        return _GatedReader(self.fn, int(split), self.count or 0, int((position or {}).get("next", 0)),
                            self.split_rate, self.gate)


class _GatedReader(SplitReader):
    def __init__(self, fn: Callable[[int, int], Any], split: int, count: int, start: int, rate: float,
                 gate: str) -> None:
        self.fn, self.split, self.count, self.next, self.start = fn, split, count, start, start
        self.rate, self.gate, self.open = rate, gate, False
        self.t0: float | None = None  # the pace counts from the first read (after the restore)
        self.finished = start >= count

    def read(self, max_records: int) -> list[Any]:
        if not self.open:
            self.open = os.path.exists(self.gate)
        stop = min(self.next + max_records, self.count)
        if not self.open:
            if self.t0 is None:
                self.t0 = time.monotonic()
            paced = self.start + int(self.rate * (time.monotonic() - self.t0))
            stop = min(stop, paced, self.count - 1)
        out = [self.fn(self.split, i) for i in range(self.next, stop)] if stop > self.next else []
        self.next = max(self.next, stop)
        self.finished = self.next >= self.count
        return out

    def position(self) -> dict[str, Any]:
        return {"next": self.next}


def open_gate(gate: Path) -> None:
    """Let the gated sources of a job read the rest of their input at full speed."""
    gate.touch()


def _source(fn: Callable[[int, int], Any], count: int, splits: int, rate: float | None,
            gate: Path | None, parallelism: int) -> Source:
    if gate is None:
        return GeneratorSource(fn, count, splits=splits, records_per_s=rate)
    assert rate, "a gated source is paced: give its rate"
    return GatedGeneratorSource(fn, count, splits, rate, gate, parallelism)


# -- clicks and windows --------------------------------------------------------------------------


def make_click(split: int, i: int) -> tuple[str, int, int, int]:
    h = _h("click", split, i)
    return (f"u{h % USERS:02d}", EPOCH + i * STEP_MS - (h >> 8) % OOO_MS, split, i)


def click_ts(e: tuple[str, int, int, int]) -> int:
    return e[1]


def click_user(e: tuple[str, int, int, int]) -> str:
    return e[0]


def golden_windows(per_split: int, splits: int = CLICK_SPLITS, size: int = WINDOW_MS, slide: int | None = None) -> list[list[Any]]:
    c: Counter[tuple[str, int]] = Counter()
    for k in range(splits):
        for i in range(per_split):
            user, ts, _, _ = make_click(k, i)
            if slide is None:
                c[(user, ts - ts % size)] += 1
            else:
                last = ts - ts % slide
                for s in range(last, ts - size, -slide):
                    c[(user, s)] += 1
    return sorted([u, s, n] for (u, s), n in c.items())


# -- orders, payments and the join ---------------------------------------------------------------


def make_order(split: int, i: int) -> tuple[str, str, int, int]:
    h = _h("order", split, i)
    return (f"{split}-{i}", f"u{h % USERS:02d}", h % 1000, EPOCH + i * 3)


def make_payment(split: int, i: int) -> tuple[str, int]:
    # payments come in a locally shuffled order: blocks of 8 reversed
    j = (i // 8) * 8 + 7 - i % 8
    return (f"{split}-{j}", EPOCH + j * 3 + 5)


def order_key(o: tuple[Any, ...]) -> str:
    return o[0]


def order_ts(o: tuple[Any, ...]) -> int:
    return o[-1]


ORDER = ValueStateDescriptor("order", PICKLE)
PAID = ValueStateDescriptor("paid", pa.bool_(), default=False)


class Join(KeyedCoProcessFunction):
    def open(self, ctx: Any) -> None:
        self.order = ctx.get_state(ORDER)
        self.paid = ctx.get_state(PAID)

    def process_element1(self, order: Any, ctx: Any) -> Any:
        if self.paid.value():
            self.paid.clear()
            yield [order[0], order[1], order[2]]
        else:
            self.order.update(list(order))

    def process_element2(self, payment: Any, ctx: Any) -> Any:
        order = self.order.value()
        if order is None:
            self.paid.update(True)
        else:
            self.order.clear()
            yield [order[0], order[1], order[2]]


def golden_join(per_split: int, splits: int = ORDER_SPLITS) -> list[list[Any]]:
    return sorted([o[0], o[1], o[2]] for k in range(splits) for i in range(per_split) for o in [make_order(k, i)])


def payments_count(per_split: int) -> int:
    # make_payment only maps complete blocks of 8 onto themselves
    assert per_split % 8 == 0, "use a multiple of 8 payments per split"
    return per_split


# -- a keyed pass-through counting deliveries (at-least-once) ------------------------------------


SEEN = ValueStateDescriptor("seen", pa.int64(), default=0)


class Deliver(KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.seen = ctx.get_state(SEEN)

    def process_element(self, e: Any, ctx: Any) -> Any:
        self.seen.update(self.seen.value() + 1)
        yield [e[2], e[3]]


# -- the environment and the job builders ----------------------------------------------------------


def make_env(root: RootSpec, **kw: Any) -> StreamExecutionEnvironment:
    """The tests' environment on ``root``: parallelism 2, checkpoints every 0.2 s, up to 30
    immediate restarts; ``kw`` overrides any of them or adds other options."""
    opts: dict[str, Any] = {
        "parallelism": 2,
        "checkpoint_interval_s": 0.2,
        "checkpoint_timeout_s": 30.0,
        "state_root": root.url,
        "restart_strategy": FixedDelay(attempts=30, delay_s=0.0),
    }
    opts.update(kw)
    return StreamExecutionEnvironment(**opts)


def build_clicks(
    env: StreamExecutionEnvironment,
    out: Path | Sink,
    per_split: int,
    rate: float | None = None,
    sliding: bool = False,
    uid: str = "window-count",
    gate: Path | None = None,
) -> None:
    clicks = env.from_source(
        _source(make_click, per_split, CLICK_SPLITS, rate, gate, env.config.parallelism),
        uid="clicks",
        watermarks=WatermarkStrategy(click_ts, OOO_MS),
    )
    assigner = SlidingEventTimeWindows(WINDOW_MS, WINDOW_MS // 2) if sliding else TumblingEventTimeWindows(WINDOW_MS)
    (
        clicks.key_by(click_user)
        .window(assigner)
        .aggregate(CountClicks(), uid=uid, window_function=window_row)
        .sink_to(out if isinstance(out, Sink) else FileSink(out), uid="windows-out")
    )


def build_join(
    env: StreamExecutionEnvironment,
    out: Path,
    per_split: int,
    order_rate: float | None = None,
    payment_rate: float | None = None,
    slow_payments: bool = False,
    gate: Path | None = None,
) -> None:
    """The orders/payments join; ``slow_payments`` puts a slow map task on the payments path."""
    p = env.config.parallelism
    orders = env.from_source(
        _source(make_order, per_split, ORDER_SPLITS, order_rate, gate, p),
        uid="orders",
        watermarks=WatermarkStrategy(order_ts, 0),
    )
    payments = env.from_source(
        _source(make_payment, payments_count(per_split), ORDER_SPLITS, payment_rate, gate, p),
        uid="payments",
        watermarks=WatermarkStrategy(order_ts, 30),
    )
    if slow_payments:
        payments = payments.key_by(order_key).map(slow_payment, name="slow-payments")
    (
        orders.key_by(order_key)
        .connect(payments.key_by(order_key))
        .process(Join(), uid="join")
        .sink_to(FileSink(out), uid="join-out")
    )


def build_deliveries(env: StreamExecutionEnvironment, out: Path, per_split: int, rate: float | None = None) -> None:
    clicks = env.from_source(
        GeneratorSource(make_click, per_split, splits=CLICK_SPLITS, records_per_s=rate),
        uid="clicks",
        watermarks=WatermarkStrategy(click_ts, OOO_MS),
    )
    clicks.key_by(click_user).process(Deliver(), uid="deliver").sink_to(FileSink(out), uid="deliveries-out")


def twice(e: Any) -> list[Any]:
    return [e, e]


def slow_payment(p: tuple[str, int]) -> tuple[str, int]:
    """Slows the payments path down (a separate task: its input queues fill up)."""
    import time

    time.sleep(0.0004)
    return p


def expected_join_state(sources: dict[str, Any]) -> tuple[dict[str, list[Any]], set[str]]:
    """The join's state after the orders and payments before the given split positions:
    (stored orders by id, ids marked paid)."""
    orders = {
        o[0]: list(o)
        for split, pos in sources["orders"].items()
        for i in range(pos["next"])
        for o in [make_order(int(split), i)]
    }
    paid = {make_payment(int(split), i)[0] for split, pos in sources["payments"].items() for i in range(pos["next"])}
    return {k: v for k, v in orders.items() if k not in paid}, {k for k in paid if k not in orders}


def explode_on_order_7(o: tuple[Any, ...]) -> tuple[Any, ...]:
    if o[0] == "0-7":
        raise ValueError("boom: order 0-7")
    return o


def window_checkpoint_errors(meta: Any, state: dict[tuple[str, int], int], timers: set[tuple[str, int]],
                             committed: dict[tuple[str, int], list[int]]) -> list[str]:
    """What is wrong with the window operator's state restored from checkpoint ``meta``.

    The clicks before the checkpoint's split positions make up each window's count; a window
    whose result was committed with a checkpoint ``<=`` this one must be gone from the state,
    every other window must hold exactly its count and its timer.
    """
    cid = meta.checkpoint_id
    consumed: Counter[tuple[str, int]] = Counter()
    for split, pos in meta.sources["clicks"].items():
        for i in range(pos["next"]):
            user, ts, _, _ = make_click(int(split), i)
            consumed[(user, ts - ts % WINDOW_MS)] += 1
    errors = []
    for w, n in consumed.items():
        if any(c <= cid for c in committed.get(w, [])):
            if w in state:
                errors.append(f"checkpoint {cid}: window {w} was emitted but is still in the state")
        elif state.get(w) != n or w not in timers:
            errors.append(f"checkpoint {cid}: window {w} holds {state.get(w)}, timer {w in timers}, expected {n}")
    errors += [f"checkpoint {cid}: window {w} has no input yet" for w in state if w not in consumed]
    return errors


def apply_inflight(root: RootSpec, meta: Any, state: tuple[dict[str, list[Any]], set[str]]) -> tuple[
        dict[str, list[Any]], set[str], int]:
    """The join state a restore of an unaligned checkpoint reaches after replaying its in-flight
    data: the snapshot plus the overtaken orders and payments (those of the join's inputs and
    the ones an upstream task still had buffered). Returns the number of records applied."""
    orders, paid = dict(state[0]), set(state[1])
    with statelog.open(root.url, store_options=root.options) as job:
        payloads = inflight.read_all(job.store, meta.sources)
    n = 0
    for payload in payloads.values():
        values = [r[2] for r in payload["input"]] + [r[1] for r in payload["output"]]
        for v in values:
            n += 1
            if len(v) == 4 and not isinstance(v[1], str):
                continue  # a click (other operators of the job): not the join's
            if len(v) == 4:  # an order
                if v[0] in paid:
                    paid.discard(v[0])
                else:
                    orders[v[0]] = list(v)
            elif v[0] in orders:  # a payment of a stored order
                del orders[v[0]]
            else:
                paid.add(v[0])
    return orders, paid, n
