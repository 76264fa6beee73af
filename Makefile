# Every target creates the virtual environment on first use and installs what it needs.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.sdctrace-installed
DEMO   ?= demo

.PHONY: demo test test-fast test-xla bench bench-xla venv lint clean mutate-rules sweep-seeds

# The C++ kernels, the fused digest (tracer/kernel), the ABFT checksums (faults/abft_sums.cpp) and faults' native
# kernel (faults/native.cpp: the emulator's gate, the scope's node labels): compiled once per machine, checkout and
# source (the build key: tracer/kernel/__init__.py), 15-23 s each (each includes only the torch headers it uses:
# torch/extension.h alone took 29 s); side by side, as each compiles one file (31 s of wall and 54 s of CPU for
# the three here, 2026-12-04). They need torch alone, so a new environment compiles them while pip installs the
# rest; a changed source compiles them again ($(KERNEL)).
BUILD_KERNELS = $(PY) -m tracer.kernel & digest=$$!; $(PY) -m faults.abft_kernel & abft=$$!; \
	$(PY) -m faults.native_kernel; native=$$?; wait $$digest && wait $$abft && test $$native -eq 0
KERNEL := $(VENV)/.sdctrace-kernel
KERNEL_SOURCES := tracer/kernel/digest.cpp faults/abft_sums.cpp faults/native.cpp tracer/kernel/__init__.py \
	faults/abft_kernel.py faults/native_kernel.py

# The [torchtitan] extra (pyproject.toml), without its own dependencies: they would downgrade the hf extra's.
TORCHTITAN := torchtitan==0.3.0 triton==3.9.0 tyro docstring_parser spmd_types==0.2.3

# Python writes the bytecode of what it imports, as it does by default, in every process make starts, although
# this machine's image sets PYTHONDONTWRITEBYTECODE: with it set, every process compiled torch again on import (+3.4 s
# a process: a fresh-clone `make test` took 18.5 minutes instead of 12). Compiling only what is imported replaced
# compileall over site-packages (16k modules, 50 s of CPU on every core, most never imported: transformers' 2,700
# model files); the venv's last step imports what every test process and `sdc` command loads (3.7k modules, 12 s
# of CPU on one core, beside the kernels' compiling).
unexport PYTHONDONTWRITEBYTECODE
WARM_IMPORTS := torch torch.distributed.fsdp torch.distributed.tensor apache_beam pyarrow duckdb matplotlib.figure \
	transformers pytorch_lightning pytest xdist hypothesis sdc.cli tracer faults jobs.launch pipelines.run \
	analysis.study_report

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned exactly: pip then takes the local CPU build instead of a multi-GB CUDA one. --no-compile: pip
	# byte-compiles one module after another (15k of them, 38 s of CPU); imports compile what is used (above).
	$(PY) -m pip install --quiet --no-compile torch==2.13.0
	( $(BUILD_KERNELS) ) & kernels=$$!; \
		$(PY) -m pip install --quiet --no-compile -e '.[test,hf,lightning]' && \
		$(PY) -m pip install --quiet --no-compile --no-deps $(TORCHTITAN) && \
		$(PY) -c 'import importlib, logging; logging.disable(logging.WARNING); \
			[importlib.import_module(m) for m in "$(WARM_IMPORTS)".split()]'; \
		installed=$$?; wait $$kernels && test $$installed -eq 0
	touch $(STAMP) $(KERNEL)

$(KERNEL): $(STAMP) $(KERNEL_SOURCES)
	$(BUILD_KERNELS)
	touch $(KERNEL)

venv: $(KERNEL)

SDC    := $(VENV)/bin/sdc

# The whole study on the embedded default (sdc/study/studies/demo.toml): record a golden
# node and four emulated ones, replay, diff into DuckDB, fine-tune, print the tables, report.
demo: $(KERNEL)
	$(SDC) demo --out $(DEMO) --overwrite

# The suite runs on TEST_WORKERS processes (pytest-xdist; one per core, at most 4: each holds torch and its runs),
# a test file's tests on one worker so that its module fixtures are made once. `make test TEST_WORKERS=0` runs it in
# this process alone; TEST_ARGS go to pytest (`TEST_ARGS="-x"` stops at the first failure). Every test process's
# idle OpenMP threads sleep (tests/conftest.py sets OMP_WAIT_POLICY).
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n > 4 ? 4 : n )))
TEST_ARGS ?=
# No test may take longer than this (tests/budget.py prints the 15 slowest and fails the run on one over it): the
# slowest, the fleet-mini study fixture, took 122 s on a quiet 2-core machine when it started late beside light
# tests, and 166-199 s (three runs, 2026-12-04) now that the longest files start first (tests/conftest.py): beside
# the 4-rank torchtitan and FSDP2 tests; 221 s with three other torch jobs beside the suite. Raised from 240 to
# 360, loudly: a loaded CI machine must not fail the suite on a neighbour's load (the next slowest takes 57 s).
TEST_BUDGET_S ?= 360
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

test: $(KERNEL)
	$(PY) -m pytest -q $(XDIST) --budget-s $(TEST_BUDGET_S) $(TEST_ARGS)

# The tests not marked slow (pyproject.toml): no recorded study, Beam job on recorded runs or multi-rank
# launch; about a minute on 2 cores (README: measured). `make test` runs these and the slow ones.
test-fast: $(KERNEL)
	$(PY) -m pytest -q -m "not slow" $(XDIST) $(TEST_ARGS)

# The linters, at the versions the lint extra pins (another ruff formats differently): ruff's checks (pyflakes,
# pycodestyle, isort, pyupgrade, bugbear: pyproject.toml) and its formatter over the whole tree, then mypy over the
# packages it checks ([tool.mypy] in pyproject.toml; the stubs it needs are in the lint extra).
LINT_STAMP := $(VENV)/.sdctrace-lint
$(LINT_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[lint]'
	touch $(LINT_STAMP)

lint: $(LINT_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy tracer jobs replay faults

# XLA: torch-xla's wheel works with one torch release only, which its metadata does not
# say; it gets its own environment with that torch (PyPI's build, about 7 GB), and the
# project goes in with --no-deps so pip cannot swap in the torch that pyproject.toml pins.
XLA_VENV    ?= .venv-xla
XLA_PY      := $(XLA_VENV)/bin/python
XLA_STAMP   := $(XLA_VENV)/.sdctrace-installed
XLA_VERSION ?= 2.9.0

$(XLA_STAMP): pyproject.toml
	$(PYTHON) -m venv $(XLA_VENV)
	$(XLA_PY) -m pip install --quiet torch==$(XLA_VERSION) torch-xla==$(XLA_VERSION)
	printf 'torch==$(XLA_VERSION)\ntorch-xla==$(XLA_VERSION)\n' > $(XLA_VENV)/constraints.txt
	$(XLA_PY) tools/requirements.py --extra test --without torch --without torch-xla > $(XLA_VENV)/requirements.txt
	$(XLA_PY) -m pip install --quiet -c $(XLA_VENV)/constraints.txt -r $(XLA_VENV)/requirements.txt
	$(XLA_PY) -m pip install --quiet --no-deps -e .
	touch $(XLA_STAMP)

# The digest kernel for the XLA environment's torch (the build key has torch, Python and the checkout's path, so it
# never replaces .venv's): fingerprints of host tensors (checkpoints, what is read back) use it there too. The
# fault emulator's and ABFT's kernels are not built: both are refused on XLA.
XLA_KERNEL  := $(XLA_VENV)/.sdctrace-kernel
$(XLA_KERNEL): $(XLA_STAMP) tracer/kernel/digest.cpp tracer/kernel/__init__.py
	$(XLA_PY) -m tracer.kernel
	touch $(XLA_KERNEL)

# The XLA tests on the XLA CPU device; `make test` skips them (no torch_xla there).
test-xla: $(XLA_KERNEL)
	PJRT_DEVICE=CPU $(XLA_PY) -m pytest -q tests/xla

bench-xla: $(XLA_KERNEL)
	PJRT_DEVICE=CPU $(XLA_PY) benchmarks/bench_xla.py

bench: $(KERNEL)
	$(PY) benchmarks/run.py

# The mutation check of the reproduction rules (tools/mutate_rules.py): each operator or constant mutant of
# analysis/reproduction_rules.py in turn, against the rule tests; prints "mutants killed K / total N (P %)" and each
# survivor with why it is equivalent; fails under 95 % or on an unexplained survivor. A few minutes; not in `make test`.
mutate-rules: $(KERNEL)
	$(PY) tools/mutate_rules.py

# Verdicts across fleet seeds (tools/sweep_seeds.py): fleet-mini's RQ1 experiment for fleet seeds 1-20 and both fault
# models, judged by the study's rules; prints each RQ1 row's verdict at the shipped seed beside "consistent in k of n
# seeds" (the table in docs/fleet.md). About 10 CPU minutes; SWEEP_ARGS go to the script (e.g. --seeds 1:5).
SWEEP_ARGS ?=
sweep-seeds: $(KERNEL)
	$(PY) tools/sweep_seeds.py $(SWEEP_ARGS)

clean:
	rm -rf $(DEMO) .pytest_cache
