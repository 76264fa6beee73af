# Every target creates the virtual environment on first use and installs what it needs.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.sdctrace-installed
DEMO   ?= demo

.PHONY: demo test bench venv clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned exactly: pip then takes the local CPU build instead of a multi-GB CUDA one.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/sdc record --out $(DEMO)/golden --node-label golden --overwrite
	$(VENV)/bin/sdc inspect $(DEMO)/golden

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/run.py

clean:
	rm -rf $(DEMO) .pytest_cache
