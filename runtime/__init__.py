"""Streaming runtime with barrier checkpoints hosting the statelog backend (issue #5)."""
