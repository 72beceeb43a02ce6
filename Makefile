PYTHON ?= python3

.PHONY: install test test-gpu gpu-check vectors verify lint

install:
	$(PYTHON) -m pip install -q -e '.[test]'

# The test command of README.md (and of .ci/run): installs the package with its
# test extras into the current Python, checks that the committed vectors regenerate
# byte for byte (a reference change that moves a vector fails here unless the vectors
# were regenerated with it, CONTRACTS C8), then runs every test that needs no GPU
# (GPU tests skip with a reason; the nvcc compile test runs where nvcc exists), spread
# over the cores by pytest-xdist (at most 8 workers: each imports NumPy, torch and the suite), a test file
# to a worker (so that one worker builds the nvcc compile test's kernels, once).
test: install
	$(PYTHON) -m conformance.cli verify --strict --vectors vectors
	$(PYTHON) -m pytest -q -n auto --maxprocesses 8 --dist loadfile

test-gpu:
	$(PYTHON) -m pytest -q -m gpu

# On a GPU host: the GPU tests, the exact / fast / FastRound suites over the committed vectors, the fast mode's full
# geometries and the bench, each log and report under OUT (never docs/), a table at the end (tools/gpu_check.sh).
# PARTS picks some of them (e.g. PARTS="tests-a suites"; see the script's header).
OUT ?= out/gpu
PARTS ?=
gpu-check:
	PYTHON=$(PYTHON) bash tools/gpu_check.sh $(OUT) $(PARTS)

vectors:
	dflash-conformance generate --out vectors

verify:
	dflash-conformance verify --vectors vectors

lint:
	$(PYTHON) -m ruff check .
