# Two entry points for a newcomer: `make demo` and `make test`.
# Both create .venv (once) and install probseq with the tested pins in constraints.txt.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test setup clean data

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

# Optional data for the experiments (not needed by the demo or the tests).
data: $(STAMP)
	$(PY) -m pip install -q -c constraints.txt -e ".[data]"
	test -d /usr/share/datasets/fashion-mnist || apt-get install -y dataset-fashion-mnist || sudo apt-get install -y dataset-fashion-mnist
	test -f $(HOME)/.cache/probseq/vaderSentiment-3.3.2.tar.gz || $(PY) -m pip download -q --no-binary :all: --no-deps vaderSentiment==3.3.2 -d $(HOME)/.cache/probseq
	test -d /usr/share/pocketsphinx/test/data/librivox || apt-get install -y pocketsphinx-testdata || sudo apt-get install -y pocketsphinx-testdata

# API reference and tutorials (Sphinx + myst-nb); the tutorials are executed, at full size unless
# PROBSEQ_TUTORIAL_SIZE=small (MPLBACKEND is unset so that the kernel shows the plots inline). Warnings are errors.
.PHONY: docs
docs: $(STAMP)
	env -u MPLBACKEND PROBSEQ_DOCS_EXECUTE=force $(PY) -m sphinx -W --keep-going -b html docs docs/_build/html

# What a GPU lease needs beside the checkout (benchmarks/gpu_session.sh): the pure-Python wheels the
# device image lacks and the LibriVox clips of online_scaling.py, in the git-ignored gpu_kit/.
.PHONY: gpu-kit
gpu-kit: $(STAMP)
	mkdir -p gpu_kit/wheels
	$(PY) -m pip download -q --no-deps --only-binary=:all: --platform any --python-version 3.11 --implementation py \
		-c constraints.txt -d gpu_kit/wheels diffusers vector-quantize-pytorch einx frozendict loguru torch-einops-utils importlib_metadata
	test ! -d /usr/share/pocketsphinx/test/data/librivox || cp -r /usr/share/pocketsphinx/test/data/librivox gpu_kit/
