# Two entry points for a newcomer: `make demo` and `make test`.
# Both create .venv (once) and install probseq with all its extras (the demo needs `data` and `plots`,
# the test suite every extra) at the tested pins in constraints.txt.
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
	$(PY) -m pip install -q -c constraints.txt -e ".[all]"
	touch $(STAMP)

demo: $(STAMP)
	MPLBACKEND=Agg $(PY) -m gpytorch_hippo --out out/demo

test: $(STAMP)
	$(PY) -m pytest

# Lint (also run by the test suite): the ruff configuration in pyproject.toml.
.PHONY: lint
lint: $(STAMP)
	$(PY) -m ruff check .

clean:
	rm -rf $(VENV) out *.egg-info

# Optional data for the experiments (not needed by the demo or the tests): the `data` extra, the
# vaderSentiment source archive (from PyPI, any system) and two folders that Debian/Ubuntu packages fill.
# Without apt-get it prints where those files come from and where the loaders look for them.
FASHION_MNIST_DIR := /usr/share/datasets/fashion-mnist
SPEECH_DIR := /usr/share/pocketsphinx/test/data/librivox
SUDO := $(shell test "$$(id -u)" = 0 || echo sudo)

data: $(STAMP)
	$(PY) -m pip install -q -c constraints.txt -e ".[data]"
	test -f $(HOME)/.cache/probseq/vaderSentiment-3.3.2.tar.gz || $(PY) -m pip download -q --no-binary :all: --no-deps vaderSentiment==3.3.2 -d $(HOME)/.cache/probseq
	@if test -d $(FASHION_MNIST_DIR) && test -d $(SPEECH_DIR); then \
		echo "make data: Fashion-MNIST ($(FASHION_MNIST_DIR)) and the LibriVox clips ($(SPEECH_DIR)) are in place"; \
	elif command -v apt-get >/dev/null 2>&1; then \
		test -d $(FASHION_MNIST_DIR) || $(SUDO) apt-get install -y dataset-fashion-mnist || exit 1; \
		test -d $(SPEECH_DIR) || $(SUDO) apt-get install -y pocketsphinx-testdata || exit 1; \
	else \
		echo "make data: installed the 'data' extra and the vaderSentiment archive; no apt-get on this system, so"; \
		echo "  get these files by hand (only the experiments that use them need them):"; \
		test -d $(FASHION_MNIST_DIR) || echo "  - Fashion-MNIST (Fashion-MNIST experiments): the four files train-images-idx3-ubyte.gz,"; \
		test -d $(FASHION_MNIST_DIR) || echo "    train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz of the"; \
		test -d $(FASHION_MNIST_DIR) || echo "    Fashion-MNIST data set (Debian package dataset-fashion-mnist) in $(FASHION_MNIST_DIR)/"; \
		test -d $(SPEECH_DIR) || echo "  - speech (the 'speech' series): the LibriVox .wav clips of pocketsphinx's test data"; \
		test -d $(SPEECH_DIR) || echo "    (folder test/data/librivox of the pocketsphinx sources; Debian package pocketsphinx-testdata)"; \
		test -d $(SPEECH_DIR) || echo "    in $(SPEECH_DIR)/"; \
	fi

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
