# Two entry points that work on a fresh machine: `make test` and `make report`.
# Both create .venv, install the pinned CPU torch first (an unpinned torch pulls a multi-GB CUDA
# build), then the package with the versions in constraints.txt (what CI last passed with), and
# are quick when everything is already installed.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0
STAMP := $(VENV)/.installed
KERNELS := $(wildcard src/attnscale/*/csrc/*.cpp)

.PHONY: test fuzz report report-deep lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch comes through pip (the machine's pip configuration says where the CPU wheel is), the
# ~90 other pinned packages through uv, which resolves and installs them in parallel and leaves
# bytecode to first import (pip took about 2 min for them, uv about 10 s; UV=pip uses pip).
# The kernels compile during that install (setup.py): for this machine's vector ISA and the
# portable build the tests also exercise, two at a time, about 65 s on 2 cores.
# --no-build-isolation makes them build against the venv's own torch; `attnscale kernels` then
# says which build each uses.
UV ?= uv
ifeq ($(UV),pip)
INSTALL := $(BIN)/python -m pip install -q
else
INSTALL := $(BIN)/uv pip install -q --python $(BIN)/python
endif

$(STAMP): pyproject.toml constraints.txt setup.py $(KERNELS) | $(BIN)/python
	$(BIN)/python -m pip install -q $(TORCH) -c constraints.txt setuptools wheel $(if $(filter pip,$(UV)),,uv)
	ATTNSCALE_BUILD_ISA=native,generic $(INSTALL) --no-build-isolation -c constraints.txt -e '.[dev,hf,ray,parquet]'
	$(BIN)/attnscale kernels
	touch $(STAMP)

# One worker per core: a third worker on 2 cores was slower (pytest 8:39 against 7:40 on a
# fresh clone), although two keep the cores only ~79% busy.
WORKERS ?= auto
test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/python -m pytest -q -n $(WORKERS) --dist loadfile --no-loadscope-reorder --durations=15

# Every hypothesis property test with the fuzz profile (many more examples) and a fresh random
# seed, printed first so that a failure can be replayed with SEED=<seed> make fuzz.
fuzz: $(STAMP)
	@seed=$${SEED:-$$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}; \
	echo "make fuzz: --hypothesis-seed=$$seed"; \
	HYPOTHESIS_PROFILE=fuzz $(BIN)/python -m pytest -q -p no:cacheprovider -m property \
		--hypothesis-seed=$$seed tests

report: $(STAMP)
	$(BIN)/attnscale report --standard --out report

# the standard report plus the deep studies, in the same database (its runs are reused)
report-deep: $(STAMP)
	mkdir -p report && $(BIN)/attnscale report --deep --out report-deep --db report/results.db

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

bench: $(STAMP)
	$(BIN)/python benchmarks/attention_bench.py --out results/bench.json

clean:
	rm -rf $(VENV) report results
