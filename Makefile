# aiayn: two commands do everything (see README.md, "Quick start").
#   make reproduce   set up .venv, install, regenerate reports/
#   make test        set up .venv, install, run the whole test suite
# Both need only Python >= 3.10 and make on a fresh machine.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.aiayn-installed
EXTRAS := test,torch,plots,bleu
# One thread: two threads on small shared VMs swing by 2-4x (see benchmarks/).
THREADS := OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1

.PHONY: venv test reproduce bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "aiayn needs Python >= 3.10, found " + sys.version.split()[0]'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[$(EXTRAS)]'
	@touch $(STAMP)

test: $(STAMP)
	$(THREADS) $(PY) -m pytest -p no:cacheprovider -n 2 tests $(PYTEST_ARGS)

reproduce: $(STAMP)
	$(THREADS) $(PY) -m reproductions

clean:
	rm -rf $(VENV) .hypothesis .pytest_cache reports/tmp
