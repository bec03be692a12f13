# Two entry points that work on a fresh machine: `make test` and `make report`.
# Both create .venv, install the pinned CPU torch first (an unpinned torch pulls a multi-GB CUDA
# build), then the package with the versions in constraints.txt (what CI last passed with), and
# are quick when everything is already installed.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: test fuzz report lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev,hf,ray,parquet]'
	# the native kernels (soft-capping attention, q/k row normalization, monitor statistics):
	# built once here, 20-40 s each, then loaded from PyTorch's extension cache; a machine that
	# cannot build them gets the Python paths (the command says which)
	$(BIN)/attnscale kernels --build
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/python -m pytest -q

# Every hypothesis property test with the fuzz profile (many more examples) and a fresh random
# seed, printed first so that a failure can be replayed with SEED=<seed> make fuzz.
fuzz: $(STAMP)
	@seed=$${SEED:-$$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}; \
	echo "make fuzz: --hypothesis-seed=$$seed"; \
	HYPOTHESIS_PROFILE=fuzz $(BIN)/python -m pytest -q -p no:cacheprovider -m property \
		--hypothesis-seed=$$seed tests

report: $(STAMP)
	$(BIN)/attnscale report --standard --out report

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

bench: $(STAMP)
	$(BIN)/python benchmarks/attention_bench.py --out results/bench.json

clean:
	rm -rf $(VENV) report results
