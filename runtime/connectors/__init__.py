"""Sources and sinks: where a job's records come from and go to.

* :mod:`~runtime.connectors.sources`: the source API (:class:`Source`, splits, positions,
  watermark strategies) and :class:`GeneratorSource`;
  :mod:`~runtime.connectors.file_source` (JSON lines) and
  :mod:`~runtime.connectors.parquet_source` (Parquet, local or ``s3://`` through
  :mod:`~runtime.connectors.store_files`);
* :mod:`~runtime.connectors.sinks`: the sink API, the transactional file sink (a local
  directory, or a store URL: :mod:`~runtime.connectors.object_sink`), collect and print;
* :mod:`runtime.connectors.kafka`: the Kafka source and sink.
"""
