"""SQL over the state of a checkpoint: the views both engines share (:mod:`tools.sql.views`),
the in-process DuckDB engine (:mod:`tools.sql.duckdb`) and the Spark engine
(:mod:`tools.sql.spark`); ``statelog sql`` and ``statelog inspect`` run them."""
