# make demo / make test / make docs: set everything up in .venv (when missing), then run.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# On this machine pip takes these CUDA builds from local disk; they run on the CPU too.
TORCH_PINS ?= torch==2.14.1 torchvision==0.29.1
STAMP := $(VENV)/.fastpipe-installed
EXTRAS ?= dev,plot,tnt,ray,photos,hf,data,lightning,webdataset,timm,docs

.PHONY: demo test test-all lint install docs clean

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
	$(PY) -m ruff check fastpipe tests benchmarks examples docs
	$(PY) -m ruff format --check fastpipe tests benchmarks examples docs

test: $(STAMP) lint
	$(PY) -m pytest -q -m "not slow" --durations=15

test-all: $(STAMP)
	$(PY) -m pytest -q

# the documentation site, docs/ -> docs/_build/html; warnings (a broken link, a docstring that does not parse) fail it
docs: $(STAMP)
	$(PY) -m sphinx -W --keep-going -E -b html docs docs/_build/html

clean:
	rm -rf $(VENV) build *.egg-info fastpipe/*.so docs/_build
