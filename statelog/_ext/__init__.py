"""Optional C accelerators (built from pyproject.toml; pure-Python fallbacks exist)."""
