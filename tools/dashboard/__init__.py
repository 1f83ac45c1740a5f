"""The checkpoint dashboard of ``statelog ui``: its data gathered from a job root
(:mod:`tools.dashboard.data`) and the page and HTTP server that draw it
(:mod:`tools.dashboard.page`)."""
