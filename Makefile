# Two entry points for a newcomer: `make demo` and `make test`.
# Both create .venv (once) and install probseq at the tested pins in constraints.txt: the demo with the
# extras it needs (`data` and `plots`), the test suite with every extra. Each install has its own stamp,
# so a demo install does not stand in for the full one; the full install also stamps the demo's.
PYTHON ?= python3
comma := ,
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: demo test setup clean data

setup: $(STAMP)

# $(call install,EXTRAS): the venv, the pinned CPU torch, then probseq editable with EXTRAS
define install
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e ".[$(1)]"
endef

$(STAMP): setup.cfg pyproject.toml constraints.txt
	$(call install,all)
	touch $(STAMP) $(DEMO_STAMP)

$(DEMO_STAMP): setup.cfg pyproject.toml constraints.txt
	$(call install,data$(comma)plots)
	touch $(DEMO_STAMP)

# The movie-review sentences of the vaderSentiment source archive (PyPI), which the Hugging Face tutorial
# (executed by the test suite) and the sentence experiments read.
VADER_ARCHIVE := $(HOME)/.cache/probseq/vaderSentiment-3.3.2.tar.gz

$(VADER_ARCHIVE): | $(STAMP)
	$(PY) -m pip download -q --no-binary :all: --no-deps vaderSentiment==3.3.2 -d $(dir $@)

demo: $(DEMO_STAMP)
	MPLBACKEND=Agg $(PY) -m gpytorch_hippo --out out/demo

# One worker process per core, at most 4 (pytest-xdist); a test file's tests share a worker, so its module
# fixtures (the Sphinx site, trained models) are built once.
test: $(STAMP) $(VADER_ARCHIVE)
	$(PY) -m pytest -n auto --maxprocesses 4 --dist loadfile

# Lint (also run by the test suite): the ruff configuration in pyproject.toml.
.PHONY: lint
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

clean:
	rm -rf $(VENV) out *.egg-info

# Optional data for the experiments (not needed by the demo or the tests): the `data` extra, the
# vaderSentiment source archive (from PyPI, any system) and two folders that Debian/Ubuntu packages fill
# (the loaders read these fixed paths). Without apt-get, and with a folder still missing, it prints which
# files the loaders need and where they look for them, and fails.
FASHION_MNIST_DIR := /usr/share/datasets/fashion-mnist
FASHION_MNIST_FILES := train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz
SPEECH_DIR := /usr/share/pocketsphinx/test/data/librivox
HAVE_FASHION_MNIST := $(foreach file,$(FASHION_MNIST_FILES),test -f $(FASHION_MNIST_DIR)/$(file) &&) true
HAVE_SPEECH := ls $(SPEECH_DIR)/*.wav >/dev/null 2>&1
SUDO := $(shell test "$$(id -u)" = 0 || echo sudo)

data: $(STAMP) $(VADER_ARCHIVE)
	$(PY) -m pip install -q -c constraints.txt -e ".[data]"
	@if $(HAVE_FASHION_MNIST) && $(HAVE_SPEECH); then \
		echo "make data: Fashion-MNIST ($(FASHION_MNIST_DIR)) and the LibriVox clips ($(SPEECH_DIR)) are in place"; \
	elif command -v apt-get >/dev/null 2>&1; then \
		$(HAVE_FASHION_MNIST) || $(SUDO) apt-get install -y dataset-fashion-mnist || exit 1; \
		$(HAVE_SPEECH) || $(SUDO) apt-get install -y pocketsphinx-testdata || exit 1; \
	else \
		echo "make data: installed the 'data' extra and the vaderSentiment archive, but there is no apt-get here to" >&2; \
		echo "install the files below; put them in place by hand (only the experiments named need them):" >&2; \
		$(HAVE_FASHION_MNIST) || { \
		echo "- Fashion-MNIST (experiments.fashion_mnist.load_fashion_mnist: the SGPA calibration and pseudo-video" >&2; \
		echo "  experiments with --dataset fashion_mnist): the four gzipped IDX files of the Fashion-MNIST release" >&2; \
		echo "  ($(FASHION_MNIST_FILES);" >&2; \
		echo "  Debian package dataset-fashion-mnist) in $(FASHION_MNIST_DIR)/" >&2; \
		echo "  (load_fashion_mnist(root=FOLDER) reads another folder; the experiments read only this one)" >&2; }; \
		$(HAVE_SPEECH) || { \
		echo "- speech (experiments.hippo.datasets.load_speech, the runners' --dataset speech): the LibriVox .wav clips of pocketsphinx's" >&2; \
		echo "  test data (folder test/data/librivox of the pocketsphinx sources; Debian package pocketsphinx-testdata)," >&2; \
		echo "  in $(SPEECH_DIR)/; the loader reads the first *.wav by name: 16 kHz, mono, >= 19,000 samples" >&2; }; \
		exit 1; \
	fi

# API reference and tutorials (Sphinx + myst-nb); the tutorials are executed, at full size unless
# PROBSEQ_TUTORIAL_SIZE=small (MPLBACKEND is unset so that the kernel shows the plots inline). Warnings are errors.
.PHONY: docs
docs: $(STAMP)
	env -u MPLBACKEND PROBSEQ_DOCS_EXECUTE=force $(PY) -m sphinx -W --keep-going -b html docs docs/_build/html

# The GPU test and benchmark kit (benchmarks/gpu_session.sh) for a CUDA machine without network access:
# the pure-Python wheels a bare CUDA image lacks and the LibriVox clips of online_scaling.py, in the
# git-ignored gpu_kit/, to copy beside the checkout.
.PHONY: gpu-kit
gpu-kit: $(STAMP)
	mkdir -p gpu_kit/wheels
	$(PY) -m pip download -q --no-deps --only-binary=:all: --platform any --python-version 3.11 --implementation py \
		-c constraints.txt -d gpu_kit/wheels diffusers vector-quantize-pytorch einx frozendict loguru torch-einops-utils importlib_metadata \
		accelerate
	test ! -d /usr/share/pocketsphinx/test/data/librivox || cp -r /usr/share/pocketsphinx/test/data/librivox gpu_kit/
