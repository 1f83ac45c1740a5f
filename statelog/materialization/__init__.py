"""Materializations: the keyed state of one checkpoint as open Parquet state tables.

A materialization is a full, consistent image of every operator's keyed state at one
completed checkpoint (format ``statelog.materialization`` v1, ``docs/format.md``). It
consists of Parquet files, one set per operator and state, each file covering a
key-group range and sorted by ``(key_group, key, namespace)``, and a manifest (versioned,
checksummed JSON, written last) that lists every file with its key-group range, rows,
bytes and CRC-32, the checkpoint id, and the changelog position per stream it covers.
Files may be shared between materializations: an incremental materialization references
the unchanged files of its base by their original path.

The modules, bottom-up:

- :mod:`~statelog.materialization.table_schema`: the state table format (Parquet schema,
  state entries as rows, the row-group layout, encoding);
- :mod:`~statelog.materialization.manifest`: the manifest model, listing and loading;
- :mod:`~statelog.materialization.ranged`: a table file read in verified ranges (footer,
  then the row groups a reader needs);
- :mod:`~statelog.materialization.table_reader`: verified reads of table files, whole or
  by key group;
- :mod:`~statelog.materialization.key_slices`: one key group read a slice of keys at a time
  (on-demand restore);
- :mod:`~statelog.materialization.table_merge` and
  :mod:`~statelog.materialization.table_writer`: a checkpoint's new tables, its
  materialized base with the changelog applied;
- :mod:`~statelog.materialization.adoption`: the newest materialization a job's backends
  build on, adopted at each checkpoint.
"""
