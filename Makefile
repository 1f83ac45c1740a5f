# statelog: everything a fresh machine needs is bootstrapped from pyproject.toml.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml statelog/_ext/fastpath.c
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m examples.clickstream

test: $(STAMP)
	$(PY) -m ruff check statelog materializer runtime tools tests bench examples
	$(PY) -m pytest -q -n 2 --dist loadgroup

lint: $(STAMP)
	$(PY) -m ruff check statelog materializer runtime tools tests bench examples

bench: $(STAMP)
	$(PY) -m bench backend --json

clean:
	rm -rf $(VENV) demo-output .pytest_cache .ruff_cache
