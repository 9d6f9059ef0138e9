# Two commands do all set-up: `make demo` and `make test` (see README.md).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch and torchvision are pinned to the builds this project is tested with.
TORCH  := torch==2.14.1 torchvision==0.29.1

.PHONY: demo test lint clean

$(BIN)/parity: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(BIN)/parity

# Exit code 1 means "some check failed": the demo shows drift on purpose (bfloat16), so it is not an error here.
demo: $(BIN)/parity
	$(BIN)/parity run examples/quickstart.yaml --out parity-out/quickstart || [ $$? -eq 1 ]

test: $(BIN)/parity
	$(BIN)/python -m pytest -q

lint: $(BIN)/parity
	$(BIN)/ruff check src tests benchmarks

clean:
	rm -rf parity-out .pytest_cache
