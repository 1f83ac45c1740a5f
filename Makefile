# statelog: every Python package is bootstrapped from pyproject.toml; Python 3.11+ and Java 17+ must be present.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean venv java browser prometheus

venv: $(STAMP)

$(STAMP): pyproject.toml statelog/_ext/fastpath.c statelog/_ext/inttable.c statelog/_ext/workingset.c statelog/_ext/keyenc.h statelog/_ext/reccodec.h statelog/_ext/bulkargs.h
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,spark]'
	touch $(STAMP)

# Spark (make demo, the Spark tests) needs Java 17+; it is the one thing pip cannot install.
java:
	@v=$$( { "$${JAVA_HOME:+$$JAVA_HOME/bin/}java" -version 2>&1 || true; } | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1); \
	if [ -z "$$v" ] || [ "$$v" -lt 17 ]; then \
	  echo "statelog: Spark needs Java 17 or newer, but $${v:+Java $$v is installed}$${v:-no java was found (PATH, JAVA_HOME)}; install a JDK or JRE 17 (Debian/Ubuntu: apt-get install openjdk-17-jre-headless) or point JAVA_HOME at one" >&2; \
	  exit 1; \
	fi

demo: java $(STAMP)
	$(PY) -m examples.clickstream

# The dashboard's browser test needs Debian's chromium; installed here when missing (as root).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "statelog: installing chromium for the browser test (apt-get)"; \
	    { apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }; } || \
	      { echo "statelog: apt-get install chromium failed" >&2; exit 1; }; \
	  else \
	    echo "statelog: the browser test needs chromium; install it (Debian/Ubuntu: apt-get install chromium)" >&2; exit 1; \
	  fi; \
	}

# The metrics tests (tests/e2e/test_prometheus.py) need Debian's prometheus (server and promtool);
# installed here when missing (as root), like chromium.
prometheus:
	@{ command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; } || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "statelog: installing prometheus for the metrics tests (apt-get)"; \
	    { apt-get install -y -q prometheus >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q prometheus >/dev/null; }; } || \
	      { echo "statelog: apt-get install prometheus failed" >&2; exit 1; }; \
	  else \
	    echo "statelog: the metrics tests need prometheus and promtool; install them (Debian/Ubuntu: apt-get install prometheus)" >&2; exit 1; \
	  fi; \
	}

test: java browser prometheus $(STAMP)
	$(PY) -m ruff check statelog materializer runtime tools tests bench examples
	STATELOG_BROWSER_REQUIRED=1 STATELOG_PROMETHEUS_REQUIRED=1 $(PY) -m pytest -q -n 2 --dist loadgroup --durations=40

lint: $(STAMP)
	$(PY) -m ruff check statelog materializer runtime tools tests bench examples

bench: $(STAMP)
	$(PY) -m bench backend --json

clean:
	rm -rf $(VENV) demo-output .pytest_cache .ruff_cache
