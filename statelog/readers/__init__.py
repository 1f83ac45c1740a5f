"""The readers of the ``statelog`` data sources: state rows, the change feed and the metadata
tables of a job root as Arrow record batches, in the schemas of the Spark data sources.

They need pyarrow only (no PySpark, no Java): :mod:`statelog.spark` wraps them in PySpark's
data source classes, and ``statelog sql`` / ``statelog inspect`` run them in-process for
DuckDB (:mod:`tools.sql.duckdb`). Modules: :mod:`statelog.readers.state` (state rows),
:mod:`statelog.readers.changes` (the change feed), :mod:`statelog.readers.metadata` (the
metadata tables), below them :mod:`statelog.readers.rows`, :mod:`statelog.readers.schema`,
:mod:`statelog.readers.restore` and :mod:`statelog.readers.options`.
"""
