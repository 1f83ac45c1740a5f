"""On-demand restore: a restored backend's state, loaded key group by key group."""
