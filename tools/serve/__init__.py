"""``statelog serve``: a follower's replica served over HTTP/JSON (:mod:`tools.serve.server`)."""
