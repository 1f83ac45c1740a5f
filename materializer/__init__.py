"""Background materializer: compacts the changelog into Parquet state tables (issue #3)."""
