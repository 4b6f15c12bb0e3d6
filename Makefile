SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := test
.PHONY: venv system-deps lint docs test demo bench clean

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TYPECHECK := build/typecheck
DOCS_SRC := build/docs-src
export DEBIAN_FRONTEND := noninteractive
export PIP_DISABLE_PIP_VERSION_CHECK := 1

venv: $(STAMP)

# Editable install: setuptools maps kernelext.widgets -> widgets/ through its
# import finder, so new modules are picked up without reinstalling; only a
# pyproject.toml change (dependencies, packages) needs a new install.
# pip compiles every installed module to bytecode on one core (half the install's time):
# compileall does the same on every core.
# An editable install skips the wheel's data files: the Jupyter Server extension's
# switch (jupyter-config/, shipped in the wheel under etc/jupyter) is copied by hand.
SERVER_SWITCH := jupyter-config/jupyter_server_config.d/kernelext.json

$(STAMP): pyproject.toml $(SERVER_SWITCH)
	@test -x $(PY) || { echo "+ $(PYTHON) -m venv $(VENV)"; $(PYTHON) -m venv $(VENV); }
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-compile -e '.[test]'
	$(PY) -m compileall -q -j 0 $(VENV)/lib > /dev/null \
	  || echo "compileall: a module that does not compile is left as pip leaves it"
	install -D -m 644 $(SERVER_SWITCH) $(VENV)/etc/jupyter/jupyter_server_config.d/kernelext.json
	@touch $@

# Debian packages the tests use: chromium (Playwright drives it, never
# `playwright install`) and a PostgreSQL server (initdb/pg_ctl).
system-deps:
	@apt_updated=; \
	apt_install() { \
	  if [ "$$(id -u)" != 0 ]; then \
	    echo "system-deps: not root, cannot install $$*; install it yourself" >&2; return 0; \
	  fi; \
	  if [ -z "$$apt_updated" ]; then \
	    echo "+ apt-get update"; apt-get update -qq; apt_updated=1; \
	  fi; \
	  echo "+ apt-get install -y $$*"; \
	  apt-get install -y -qq --no-install-recommends "$$@" >/dev/null; \
	}; \
	if [ -x /usr/bin/chromium ]; then \
	  echo "system-deps: chromium present (/usr/bin/chromium)"; \
	else \
	  apt_install chromium; \
	fi; \
	if initdb_path=$$(command -v initdb || ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -n 1); \
	   [ -n "$$initdb_path" ]; then \
	  echo "system-deps: PostgreSQL present ($$initdb_path)"; \
	else \
	  apt_install postgresql; \
	fi; \
	if command -v cc >/dev/null; then \
	  echo "system-deps: a C compiler present (torn-write tests build their shim)"; \
	else \
	  apt_install gcc libc6-dev; \
	fi

# mypy cannot see through setuptools' editable finder, so it checks a link tree
# laid out like the installed package (kernelext/widgets -> ../widgets); paths
# in its messages are rewritten back to the real files.
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@rm -rf $(TYPECHECK) && mkdir -p $(TYPECHECK)/kernelext
	@for f in kernelext/*; do \
	  case "$$f" in */__pycache__) ;; *) ln -s "$(CURDIR)/$$f" $(TYPECHECK)/kernelext/ ;; esac; \
	done
	@ln -s "$(CURDIR)/widgets" $(TYPECHECK)/kernelext/widgets
	cd $(TYPECHECK) && $(CURDIR)/$(VENV)/bin/mypy --config-file $(CURDIR)/pyproject.toml \
	  --cache-dir $(CURDIR)/$(TYPECHECK)-cache kernelext \
	  | sed -e 's#^kernelext/widgets/#widgets/#'

# The API reference, into build/docs (mkdocs.yml). griffe reads the code statically and,
# like mypy, cannot see through the editable finder: it reads a link tree of the same
# layout. --strict: a warning (a page missing from nav, a broken link, a name griffe cannot
# find) fails the build; never --quiet, which drops the warnings before strict counts them.
docs: venv
	@rm -rf $(DOCS_SRC) && mkdir -p $(DOCS_SRC)/kernelext
	@for f in kernelext/*; do \
	  case "$$f" in */__pycache__) ;; *) ln -s "$(CURDIR)/$$f" $(DOCS_SRC)/kernelext/ ;; esac; \
	done
	@ln -s "$(CURDIR)/widgets" $(DOCS_SRC)/kernelext/widgets
	$(VENV)/bin/mkdocs build --strict

# The suite on four pytest-xdist workers (--dist loadgroup keeps each xdist group,
# tests/browser, tests/crash and the tests sharing a module's fixture, on one worker, one test
# at a time; many tests wait on processes and servers, so four share two cores well): about
# 15 to 17 min from a clean clone on a 2-core machine.
# `make test TEST_WORKERS=0` runs it in one process.
# lint and docs run beside the suite at a lower priority (their output follows the suite's);
# either failing fails the target.
# Bytecode is written during the run even where PYTHONDONTWRITEBYTECODE is set: the suite
# starts thousands of Pythons (kernels, workers, the CLI), and without .pyc files each one
# compiled kernelext and the test modules again (a third of the suite's CPU).
TEST_WORKERS ?= 4

# The venv and the Debian packages are set up side by side (-j2: one downloads wheels, the
# other Chromium).
test:
	@$(MAKE) --no-print-directory -j2 venv system-deps
	@mkdir -p build
	@nice -n 10 $(MAKE) --no-print-directory lint docs > build/lint-and-docs.log 2>&1 & checks=$$!; \
	suite=0; env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -p no:cacheprovider \
	  -n $(TEST_WORKERS) --dist loadgroup || suite=$$?; \
	checked=0; wait $$checks || checked=$$?; \
	echo "--- make lint docs (run beside the suite):"; cat build/lint-and-docs.log; \
	if [ $$checked -ne 0 ]; then echo "make lint docs failed (exit $$checked)"; fi; \
	if [ $$suite -ne 0 ]; then exit $$suite; fi; exit $$checked

demo: venv
	$(PY) notebooks/run_demo.py

bench: venv
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache tests/artifacts
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
