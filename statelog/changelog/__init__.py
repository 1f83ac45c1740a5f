"""The changelog: change records, the segment format, the process-wide writer and the reader."""
