"""The state processor: write state offline into a savepoint, from pyarrow (and Spark).

A savepoint written here is the same kind a job takes (docs/format.md sections 5, 8, 9;
``statelog verify`` checks it like any other): state tables cut at key-group units, one
manifest (kind ``savepoint``), the savepoint metadata last. A job starts from it with
``restore="savepoint:NAME"`` at any parallelism.

* :class:`SavepointWriter`: bootstrap state from Arrow tables in the shape of each state's
  SQL view (:mod:`~statelog.state_processor.convert` checks and converts them);
* :func:`read_state`, :func:`rewrite`, :func:`cast_state`: modify the state of a checkpoint
  or savepoint (:mod:`~statelog.state_processor.modify`), also into a new root with another
  ``max_parallelism``;
* :mod:`~statelog.state_processor.write`: the tables of key-group units and the publishing,
  shared with the Spark writer (:mod:`statelog.spark.writer`).
"""

from statelog.state_processor.modify import cast_state, read_state, rewrite, states_of
from statelog.state_processor.writer import SavepointWriter, state_info

__all__ = ["SavepointWriter", "cast_state", "read_state", "rewrite", "state_info", "states_of"]
