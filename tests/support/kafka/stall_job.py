"""One copy of the Kafka clickstream job (``tests/support/kafka/jobs.py``) in its own process,
for the tests that stall a copy past the writer-lease ttl while another copy takes the root.

Run as ``python -m tests.support.kafka.stall_job BOOTSTRAP TOPIC_IN TOPIC_OUT ROOT PREFIX RATE TTL``.
It restores the latest checkpoint (empty state if none), runs to the end of its bounded
input and prints one line on stdout (flushed)::

    RUNNING <pid>               the job master started (this process)
    DONE <attempts> <final checkpoint id>
    FENCED <attempts> <message>     the job lost its root (exit 3)
    REFUSED <message>               another live copy holds the root (exit 4)
"""

from __future__ import annotations

import logging
import os
import sys

from runtime import FixedDelay
from statelog.errors import FencedError, LeaseHeldError
from tests.support.kafka.jobs import build_kafka_clicks, clicks_env


def say(*parts: object) -> None:
    sys.stdout.write(" ".join(str(p).replace("\n", " ") for p in parts) + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    bootstrap, tin, tout, root, prefix, rate, ttl = argv[:7]
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    env = clicks_env(root, checkpoint_interval_s=0.2, writer_lease_ttl_s=float(ttl),
                     restart_strategy=FixedDelay(attempts=40, delay_s=0.2))  # fmt: skip
    build_kafka_clicks(env, bootstrap, tin, tout, prefix=prefix, rate=float(rate))
    client = env.execute_async(f"stall-{prefix}", restore="latest")
    say("RUNNING", os.getpid())
    try:
        result = client.wait(600)
    except FencedError as e:
        say("FENCED", client.attempt, e)
        return 3
    except LeaseHeldError as e:
        say("REFUSED", e)
        return 4
    say("DONE", result.attempts, result.final_checkpoint)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
