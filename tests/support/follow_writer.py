"""The writer of the follower's SIGKILL model test (``tests/statelog/following/test_follow_kill.py``).

Run as ``python -m tests.support.follow_writer ROOT SEED``: it restores the latest checkpoint
of operator ``op`` (or starts empty), replays the operations before it into the reference
model, then applies operation after operation (:func:`op_at`: the n-th operation depends
only on ``SEED`` and ``n``) and checkpoints every :data:`EVERY` operations with
``sources={"n": n}`` (the operations the checkpoint holds), until it is killed. It prints
``CHECKPOINT <id> <n>`` (flushed) after each checkpoint. :func:`model_at` is the model after
the first ``n`` operations, and the clock then; :func:`state_of` a follower's state and
:func:`model_state` a model's, to compare (also ``test_follow_model.py``).
"""

from __future__ import annotations

import random
import sys

import statelog
from statelog.following.follower import Follower
from statelog.state.backend import KeyedStateBackend
from tests.support.harness import DESCRIPTORS, Clock, Driver, Model, backend_timers, backend_view

EVERY = 7
UID = "op"
KEYS = [0, 1, 2, 7, -3, "a", "b", "user-9", (1, "x"), True, 2.5]
NAMESPACES = [None, (0, 10), "w"]


def random_op(rng: random.Random, n: int) -> tuple:
    return rng.choice([
        ("key", rng.choice(KEYS)), ("key", rng.choice(KEYS)), ("ns", rng.choice(NAMESPACES)),
        ("value_rmw", rng.randrange(-5, 100)), ("value_clear",), ("text", f"t{n}"),
        ("list_add", f"e{n}"), ("list_update", [f"u{n}"] * rng.randrange(3)), ("list_clear",),
        ("map_put", rng.choice("pqr"), n), ("map_remove", rng.choice("pqr")),
        ("sum", n % 7), ("avg", n % 5), ("ttl_put", n), ("obj", {"n": n}), ("tick", rng.choice([1, 20, 60])),
        ("timer_add", rng.choice(["event", "processing"]), rng.randrange(200)),
        ("timer_del", rng.choice(["event", "processing"]), rng.randrange(200)),
    ])  # fmt: skip


def op_at(seed: int, n: int) -> tuple:
    rng = random.Random(seed * 1_000_003 + n)
    return ("key", rng.choice(KEYS)) if n == 0 else random_op(rng, n)


def model_at(seed: int, n: int) -> tuple[Driver, Clock]:
    """A driver (on a backend without changelog) and its clock after operations ``[0, n)``."""
    clock = Clock()
    driver = Driver(KeyedStateBackend(operator_uid=UID, max_parallelism=16, clock=clock), Model(), clock)
    for i in range(n):
        driver.apply(op_at(seed, i))
    return driver, clock


def state_of(follower: Follower) -> tuple[dict, set]:
    b = follower.backend(UID)
    return backend_view(b, {n: b.get_state(d) for n, d in DESCRIPTORS.items()}), backend_timers(b)


def model_state(model: Model, now: int) -> tuple[dict, set]:
    return model.visible(now), set(model.timers)


def main() -> int:
    root, seed = sys.argv[1], int(sys.argv[2])
    job = statelog.open(root, max_parallelism=16, writer_lease_ttl_s=1.0, retain_checkpoints=3)
    last = job.latest_checkpoint()
    n = int(last.sources["n"]) if last is not None else 0
    replay, clock = model_at(seed, n)
    driver = Driver(job.backend(UID, restore="latest" if last else "none", clock=clock), replay.model, clock)
    if replay.key_set:
        driver.set_key(replay.key)
    driver.set_ns(replay.ns)
    while True:
        driver.apply(op_at(seed, n))
        n += 1
        if n % EVERY == 0:
            meta = job.checkpoint(sources={"n": n})
            sys.stdout.write(f"CHECKPOINT {meta.checkpoint_id} {n}\n")
            sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
