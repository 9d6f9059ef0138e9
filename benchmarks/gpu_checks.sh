#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one go (a few minutes on one GPU): the gpu-marked tests, the CUDA
# examples (classifiers and a segmentation model in float32, bfloat16 and torch.compile on the GPU; a
# detector with and without the deterministic NMS adapter), TensorRT (examples/tensorrt.yaml, when
# torch-tensorrt and ONNX Runtime's TensorRT provider are installed), and tier 2 and fallback on a CUDA target.
# Everything is judged against eager float32 on the CPU. Writes its log and records under $OUT (default
# gpu-out). Run from the repository root with parity importable (pip install -e . or PYTHONPATH=src).
# QUICK=1 (about a minute): the tests, ResNet-18 alone from cuda.yaml, and the detector in worker processes.
set -uo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
step() { echo; echo "=== $1"; }
{
  step "machine"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, torchvision, onnxruntime as o; print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'onnxruntime', o.__version__, 'cuda', torch.cuda.is_available())"
  python3 -m parity.cli backends
  step "tests marked gpu"
  timeout 180 python3 -m pytest -q -m gpu -p no:cacheprovider tests
  if [ -n "${QUICK:-}" ]; then
    step "examples/cuda.yaml, resnet18 only, tier 3 only"
    python3 -c "import yaml; e = yaml.safe_load(open('examples/cuda.yaml')); e['models'] = e['models'][:1]; e['tiers'] = {'tasks': True}; yaml.safe_dump(e, open('$OUT/cuda-resnet18.yaml', 'w'))"
    time timeout 200 python3 -m parity.cli run "$OUT/cuda-resnet18.yaml" --out "$OUT/cuda" --quiet --no-report --no-cache
    step "examples/detection_cuda.yaml in worker processes"
    time timeout 150 python3 -m parity.cli run examples/detection_cuda.yaml --out "$OUT/detection" --quiet --no-report --no-cache --executor process
    exit 0
  fi
  step "examples/cuda.yaml"
  time timeout 300 python3 -m parity.cli run examples/cuda.yaml --out "$OUT/cuda" --quiet --no-report --no-cache
  step "examples/detection_cuda.yaml"
  time timeout 150 python3 -m parity.cli run examples/detection_cuda.yaml --out "$OUT/detection" --quiet --no-report --no-cache
  step "examples/tensorrt.yaml (torch-tensorrt and ONNX Runtime's TensorRT provider)"
  if ! python3 -c "import torch_tensorrt" 2>/dev/null; then
    echo "skipped: torch_tensorrt is not importable (pip install torch-tensorrt)"
  elif ! python3 -c "import onnxruntime as o, sys; sys.exit('TensorrtExecutionProvider' not in o.get_available_providers())"; then
    echo "skipped: onnxruntime has no TensorrtExecutionProvider (pip install onnxruntime-gpu, with TensorRT's libraries)"
  else
    time timeout 600 python3 -m parity.cli run examples/tensorrt.yaml --out "$OUT/tensorrt" --quiet --no-report --no-cache
  fi
  step "localize resnet18 on eager-cuda-bfloat16"
  timeout 90 python3 -m parity.cli localize examples/cuda.yaml --model resnet18 --target eager-cuda-bfloat16 --out "$OUT/localize" --no-cache
  step "fallback resnet18 on eager-cuda-bfloat16"
  timeout 120 python3 -m parity.cli fallback examples/cuda.yaml --model resnet18 --target eager-cuda-bfloat16 --out "$OUT/fallback" --no-cache
} 2>&1 | tee "$OUT/log.txt"
