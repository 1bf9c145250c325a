# Two commands do everything on a fresh machine: `make train` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install train test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

train: $(STAMP)  ## install, then train the README's first model on the shipped digits data
	$(BIN)/magmadnn train configs/digits_mlp.yaml

test: $(STAMP)  ## install, then run the whole test suite
	$(BIN)/python -m pytest -q

bench: $(STAMP)  ## speed: the paper's MLP step vs a GEMM floor, data-parallel scaling, convolutions
	$(BIN)/python benchmarks/mlp_step.py
	$(BIN)/python benchmarks/scaling.py
	$(BIN)/python benchmarks/conv.py

clean:
	rm -rf $(VENV) runs .pytest_cache
