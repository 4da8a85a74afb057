# Two entry points for a newcomer: `make demo` and `make test`.
# Both create .venv (once) and install probseq with the tested pins in constraints.txt.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test setup clean

setup: $(STAMP)

$(STAMP): setup.cfg pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	MPLBACKEND=Agg $(PY) -m gpytorch_hippo --out out/demo

test: $(STAMP)
	$(PY) -m pytest

clean:
	rm -rf $(VENV) out *.egg-info
