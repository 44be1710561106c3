# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed

.PHONY: test lint demo bench clean install browser

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check aeroqueue tests sync benchmarks examples
	$(BIN)/mypy

test: lint browser
	$(BIN)/python -m tests.run

# The dashboard's browser test drives Debian's chromium with chromium-driver.
# Installed when missing; where apt-get cannot (not root), the test skips, and
# fails in CI (CI=true), so a missing browser never passes unnoticed there.
browser:
	@if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then \
		echo "installing chromium and chromium-driver (apt-get)"; \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; } \
			|| { echo "could not install chromium: the browser tests will skip (and fail in CI)"; [ -z "$$CI" ]; }; \
	fi

demo: $(STAMP)
	$(BIN)/python -m aeroqueue.demo

bench: $(STAMP)
	$(BIN)/aeroqueue bench

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
