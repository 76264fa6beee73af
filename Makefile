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

SDC    := $(VENV)/bin/sdc

# Record a golden run and an emulated unhealthy node, replay around their first
# divergence in both modes, diff everything into one DuckDB database, query it and report.
demo: $(STAMP)
	$(SDC) record --out $(DEMO)/golden --node-label golden --overwrite
	$(SDC) inspect $(DEMO)/golden
	$(SDC) record --out $(DEMO)/node-7 --node-label node-7 --fault-profile bursty-mismatch --abft --overwrite
	$(SDC) replay --golden $(DEMO)/golden --suspect $(DEMO)/node-7 --at-first-divergence \
		--mode lockstep --out $(DEMO)/node-7-lockstep --overwrite
	$(SDC) replay --golden $(DEMO)/golden --suspect $(DEMO)/node-7 --at-first-divergence \
		--mode param-sync --out $(DEMO)/node-7-param-sync --overwrite
	$(SDC) diff --golden $(DEMO)/golden --suspect $(DEMO)/node-7 --db $(DEMO)/study.duckdb \
		--replay $(DEMO)/node-7-lockstep --replay $(DEMO)/node-7-param-sync
	$(SDC) query summary --db $(DEMO)/study.duckdb
	$(SDC) report --db $(DEMO)/study.duckdb --out $(DEMO)/report

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/run.py

clean:
	rm -rf $(DEMO) .pytest_cache
