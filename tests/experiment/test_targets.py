"""The one-word target grammar shared by `parity check`, assert_backends_agree and the pytest plugin."""

from __future__ import annotations

import pytest

from parity import ParityError
from parity.config.schema import BackendSpec
from parity.experiment.targets import parse_target


@pytest.mark.parametrize("text, entry, printed", [
    ("compile", {"backend": "compile"}, "compile-cpu"),
    ("compile-cpu", {"backend": "compile", "device": "cpu"}, "compile-cpu"),
    ("eager-cpu-bfloat16", {"backend": "eager", "device": "cpu", "dtype": "bfloat16"}, "eager-cpu-bfloat16"),
    ("eager:bfloat16", {"backend": "eager", "dtype": "bfloat16"}, "eager-cpu-bfloat16"),
    ("eager-bf16", {"backend": "eager", "dtype": "bfloat16"}, "eager-cpu-bfloat16"),
    ("onnxruntime:fp16", {"backend": "onnxruntime", "dtype": "float16"}, "onnxruntime-cpu-float16"),
    ("eager-cuda", {"backend": "eager", "device": "cuda"}, "eager-cuda"),
    ("eager-cuda1-half", {"backend": "eager", "device": "cuda:1", "dtype": "float16"}, "eager-cuda1-float16"),
])
def test_targets_parse_and_the_ids_they_print_parse_back(text, entry, printed):
    assert parse_target(text) == entry
    assert BackendSpec.model_validate(entry).id == printed
    assert BackendSpec.model_validate(parse_target(printed)).id == printed


def test_a_backend_class_is_a_target_as_in_experiment_files():
    assert parse_target("tests.fixtures.tiny:PerturbedEager") == {"backend": "tests.fixtures.tiny:PerturbedEager"}


@pytest.mark.parametrize("text, message", [
    ("onnxruntme", "no backend 'onnxruntme'; did you mean 'onnxruntime'?"),
    ("onnxrt-cpu", "no backend 'onnxrt'; did you mean 'onnxruntime'?"),
    ("eager-cpu-bfloat61", "no device or dtype 'bfloat61'; did you mean 'bfloat16'?"),
    ("eager-gpu", "no device or dtype 'gpu'; did you mean 'cpu'?"),
    ("eager-bfloat16-cpu", "the device 'cpu' comes before the dtype"),
    ("eager-cpu-cuda", "a second device 'cuda'"),
    ("eager-fp16-bf16", "a second dtype 'bf16'"),
    ("trt", "no backend 'trt' (a target is BACKEND[-DEVICE][-DTYPE]"),
])
def test_unknown_targets_are_refused_with_did_you_mean(text, message):
    with pytest.raises(ParityError) as info:
        parse_target(text)
    assert info.value.problems[0].startswith(f"unknown target '{text}': ")
    assert message in info.value.problems[0]
