# make demo / make test: set everything up in .venv (when missing), then run.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# On this machine pip takes these CUDA builds from local disk; they run on the CPU too.
TORCH_PINS ?= torch==2.14.1 torchvision==0.29.1
STAMP := $(VENV)/.fastpipe-installed
EXTRAS ?= dev,plot,tnt,ray,photos,hf,data,lightning,webdataset,timm

.PHONY: demo test test-all lint install clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml setup.py $(wildcard csrc/*.cpp csrc/*.h csrc/jpeg/*.cpp csrc/jpeg/*.h)
	$(PY) -m pip install -q --upgrade pip "setuptools>=64,<81" wheel
	$(PY) -m pip install -q $(TORCH_PINS)
	$(PY) -m pip install -q --no-build-isolation -e ".[$(EXTRAS)]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/fastpipe diagnose toy:naive

# ruff (configured in pyproject.toml): the linter and the formatter's check, before the tests
lint: $(STAMP)
	$(PY) -m ruff check fastpipe tests benchmarks examples
	$(PY) -m ruff format --check fastpipe tests benchmarks examples

test: $(STAMP) lint
	$(PY) -m pytest -q -m "not slow" --durations=15

test-all: $(STAMP)
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) build *.egg-info fastpipe/*.so
