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
    assert parse_target(text).entry() == entry
    assert BackendSpec.model_validate(entry).id == printed
    assert BackendSpec.model_validate(parse_target(printed).entry()).id == printed


def test_a_backend_class_is_a_target_as_in_experiment_files():
    assert parse_target("tests.fixtures.tiny:PerturbedEager").entry() == {"backend": "tests.fixtures.tiny:PerturbedEager"}


@pytest.mark.parametrize("text, message", [
    ("onnxruntme", "no backend 'onnxruntme'; did you mean 'onnxruntime'?"),
    ("onnxrt-cpu", "no backend 'onnxrt'; did you mean 'onnxruntime'?"),
    ("eager-cpu-bfloat61", "no device, dtype or quantize scheme 'bfloat61'; did you mean 'bfloat16'?"),
    ("eager-gpu", "no device, dtype or quantize scheme 'gpu'; did you mean 'cpu'?"),
    ("eager-bfloat16-cpu", "the device 'cpu' comes before the dtype"),
    ("eager-cpu-cuda", "a second device 'cuda'"),
    ("eager-fp16-bf16", "a second dtype 'bf16'"),
    ("trt", "no backend 'trt' (a target is BACKEND[-DEVICE][-DTYPE][-QUANT]"),
])
def test_unknown_targets_are_refused_with_did_you_mean(text, message):
    with pytest.raises(ParityError) as info:
        parse_target(text)
    assert info.value.problems[0].startswith(f"unknown target '{text}': ")
    assert message in info.value.problems[0]


@pytest.mark.parametrize("text, scheme, printed", [
    ("eager-int8-weight", "torchao-int8-weight", "eager-cpu-int8-weight"),
    ("eager:int4", "torchao-int4-weight", "eager-cpu-int4-weight"),  # the only int4 scheme
    ("compile-cpu-int8-pt2e-x86", "pt2e-x86", "compile-cpu-int8-pt2e-x86"),
    ("eager-int8-pt2e-xnn", "pt2e-xnnpack", "eager-cpu-int8-pt2e-xnnpack"),  # the only scheme it starts
])
def test_quantized_ids_and_their_unambiguous_short_forms_parse(text, scheme, printed):
    words = parse_target(text)
    assert words.scheme == scheme and words.entry()["quantize"] == {"scheme": scheme}
    from parity.dtypes import QUANTIZE_SCHEMES

    calibration = "x" if QUANTIZE_SCHEMES[scheme].calibrated else None
    assert BackendSpec.model_validate(words.entry(calibration)).id == printed


@pytest.mark.parametrize("text, message", [
    ("eager:int8", "'int8' is several quantize schemes; eager runs eager-int8-pt2e-x86, eager-int8-pt2e-xnnpack, "
                   "eager-int8-dynamic, eager-int8-weight, eager-int4-weight"),
    ("onnxruntime-int8", "'int8' is several quantize schemes; onnxruntime quantizes nothing (`parity backends` says "
                         "who does)"),
    ("eager-int2", "'int2' is no quantize scheme; eager runs "),
])
def test_an_ambiguous_or_unknown_scheme_is_refused_with_the_ids_the_backend_runs(text, message):
    with pytest.raises(ParityError) as info:
        parse_target(text)
    assert info.value.problems[0] == f"unknown target '{text}': {message}" or message in info.value.problems[0]


def test_every_command_finds_an_experiments_target_by_any_spelling_check_takes():
    """`parity run --target`, localize and fallback read a target as `parity check --target` does."""
    from parity.experiment.targets import choose

    targets = [BackendSpec(backend="onnxruntime"), BackendSpec(backend="eager", dtype="bfloat16"),
               BackendSpec(backend="eager", quantize={"scheme": "torchao-int8-weight"})]
    assert choose("onnxruntime", targets) is targets[0]
    assert choose("onnxruntime-cpu", targets) is targets[0]
    assert choose("eager:bf16", targets) is targets[1]
    assert choose("eager-int8-weight", targets) is targets[2]
    with pytest.raises(ParityError, match=r"--target compile: the experiment has no such target \(it has: "
                                          r"onnxruntime-cpu, eager-cpu-bfloat16, eager-cpu-int8-weight\)"):
        choose("compile", targets)
    plain, reduced = BackendSpec(backend="eager"), BackendSpec(backend="eager", dtype="bfloat16")
    assert choose("eager:bf16", [plain, reduced]) is reduced  # the dtype tells them apart, and the device
    assert choose("eager", [plain, reduced]) is plain and choose("eager-cpu", [reduced, plain]) is plain
    assert choose("eager", [BackendSpec(backend="eager", device="cuda"), plain]) is plain


def test_a_scheme_alone_is_refused_with_the_ids_that_run_it():
    with pytest.raises(ParityError) as info:
        parse_target("int8")
    said = info.value.problems[0]
    assert said.startswith("unknown target 'int8': a quantized target names its backend first: eager-int8-pt2e-x86, ")
    assert "eager-int8-weight" in said and "compile-int4-weight" in said
