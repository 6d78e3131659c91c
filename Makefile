# The two commands of the quick start:
#   make report   executes the workbook headless into reports/ (recorded results without a GPU)
#   make test     lints (ruff), then runs the test tiers (cpu always; compile with nvcc; gpu with a CUDA
#                 device; browser with chromium); pytest's exit 5 (no tests collected) fails it too
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# pytest processes for `make test` (pytest-xdist; each test file stays in one process, its fixtures with it).
# 1 on a machine with one GPU, whose gpu tier would otherwise run two processes on it at once.
TEST_WORKERS ?= 2

.PHONY: report test gpu-suite clean

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $@

report: $(VENV)/.installed
	$(PY) -m losslab report --output reports

test: $(VENV)/.installed
	$(PY) -m ruff check losslab tests
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=15

# On a GPU machine with torch already installed: build, test and record results.
gpu-suite:
	scripts/gpu_suite.sh

clean:
	rm -rf $(VENV) reports/*.ipynb reports/*.html reports/figures
