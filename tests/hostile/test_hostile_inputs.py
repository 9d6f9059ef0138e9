"""Hostile synthetic inputs and numbers, models whose outputs carry nothing, and weights files that are not
weights. Each case exits 2 with one message at its key path, or fails its checks with a reason; none
passes, none ends in a traceback, none writes outside the output folder.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path

import pytest
import torch

from parity import taxonomy as tx
from parity.verify.tensors import compare
from tests.fixtures.hollow import Returns
from tests.fixtures.tiny import tiny_cnn
from tests.support.hostile_kit import (
    TINY,
    assert_failed_with,
    assert_refused,
    assert_warned,
    experiment,
    run,
    with_synthetic,
)

# ---- numbers that lax parsing would have coerced: `true` is 1, `2.0` is 2, `"8"` is 8

COERCED = [  # (where, value): each a number of another type in an input spec
    ("shape", [True, 8]), ("shape", [2, False]), ("shape", [2.0, 8]), ("shape", ["2", 8]), ("shape", [2, 8.0]),
    ("seed", True), ("seed", 1.0), ("seed", "1"),
    ("low", True), ("low", "0"), ("high", True), ("high", "3"),
]


@pytest.mark.parametrize("key, value", COERCED, ids=[f"{k}={v!r}" for k, v in COERCED])
def test_synthetic_numbers_are_not_coerced(key, value):
    spec = {"shape": [2, 8], key: value} if key != "shape" else {"shape": value}
    if key in ("low", "high"):
        spec.update(distribution="uniform", **({"high": 5.0} if key == "low" else {"low": 0.0}))
    assert_refused(run(with_synthetic(spec)), f"synthetic.{key}", "expected")


PREPROCESS = [("resize", True), ("resize", [224.0]), ("resize", ["224"]), ("resize", [True, 8]),
              ("center_crop", True), ("center_crop", [8.0, 8]), ("resize_multiple", True), ("resize_multiple", 32.0),
              ("resize_multiple", "32"), ("mean", [True, 0.5, 0.5]), ("mean", ["0.5", 0.5, 0.5]), ("std", [1, 1, True])]


@pytest.mark.parametrize("key, value", PREPROCESS, ids=[f"{k}={v!r}" for k, v in PREPROCESS])
def test_preprocess_numbers_are_not_coerced(key, value):
    pre = {key: value}
    if key in ("mean", "std"):
        pre = {"mean": [0.5] * 3, "std": [0.2] * 3, key: value}
    data = experiment(inputs=[{"name": "p", "images": ["sample:chelsea"], "preprocess": pre}])
    assert_refused(run(data), f"preprocess.{key}")


@pytest.mark.parametrize("key, value", [("seed", True), ("seed", 3.0), ("repeats", True), ("repeats", 2.0)])
def test_experiment_numbers_are_not_coerced(key, value):
    assert_refused(run(experiment(**{key: value})), f"{key}: expected an integer")


RANGES = [  # (dtype, distribution, low, high, words): bounds the dtype cannot hold
    ("int32", "randint", 0, 2**40, "int32 holds integers from -2147483648 to 2147483647"),
    ("int32", "randint", 0, 2**31 + 1, "draws from 0 to 2147483648"),
    ("int32", "randint", -2**31 - 1, 0, "draws from -2147483649"),
    ("float16", "randint", 0, 2**11 + 2, "float16 holds integers from -2048 to 2048 exactly"),
    ("bfloat16", "randint", 0, 300, "bfloat16 holds integers from -256 to 256"),
    ("float32", "randint", 0, 2**24 + 2, "float32 holds integers"),
    ("float16", "randint", -5000, 0, "draws from -5000"),
    ("int64", "randint", 0.5, 3, "'low' 0.5 is not a whole number"),
    ("int32", "randint", 0, 2.5, "'high' 2.5 is not a whole number"),
    ("float32", "randint", 0.25, 4, "not a whole number"),
    ("float16", "uniform", 0, 70000, "within float16's range (+-65504)"),
    ("float16", "uniform", -1e6, 0, "float16's range"),
    ("bfloat16", "uniform", 0, 1e15, None),  # within bfloat16's range: accepted
]


@pytest.mark.parametrize("dtype, dist, low, high, words", RANGES,
                         ids=[f"{r[0]}-{r[1]}-{r[2]}-{r[3]}" for r in RANGES])
def test_bounds_must_fit_the_dtype(dtype, dist, low, high, words):
    """int32 randint with high 2**40 wrapped to negative values; a float16 draw past 65504 is Inf."""
    spec = {"shape": [2, 3, 8, 8], "dtype": dtype, "distribution": dist, "low": low, "high": high}
    outcome = run(with_synthetic(spec), verb="validate")
    if words is None:
        assert outcome.code == 0, outcome.err
    else:
        assert_refused(outcome, "inputs[0].synthetic", words)


@pytest.mark.parametrize("dtype, high", [("int32", 2**31), ("float16", 2**11 + 1), ("bfloat16", 2**8 + 1),
                                         ("int64", 10**15)])
def test_the_largest_exact_bound_is_accepted(dtype, high):
    spec = {"shape": [4], "dtype": dtype, "distribution": "randint", "low": 0, "high": high}
    assert run(with_synthetic(spec), verb="validate").code == 0


CONSTANT_DRAWS = [
    ("randint-one-value", {"shape": [2, 3, 8, 8], "dtype": "float32", "distribution": "randint", "low": 3, "high": 4}, "is 3"),
    ("uniform-narrower-than-float32", {"shape": [2, 3, 8, 8], "distribution": "uniform", "low": 1.0, "high": 1.00000001}, "is 1"),
    ("uniform-narrower-than-bfloat16", {"shape": [2, 3, 8, 8], "dtype": "float32", "distribution": "uniform",
                                        "low": 0.0, "high": 1e-50}, "is 0"),
]


@pytest.mark.parametrize("spec, words", [c[1:] for c in CONSTANT_DRAWS], ids=[c[0] for c in CONSTANT_DRAWS])
def test_a_random_draw_that_came_out_constant_is_warned_about(spec, words):
    assert_warned(run(with_synthetic(spec)), "draw", words)


def test_zeros_and_ones_are_asked_for_not_warned_about():
    outcome = run(with_synthetic({"shape": [2, 3, 8, 8], "distribution": "zeros"}))
    assert outcome.code == 0 and not [r for r in outcome.records if r["kind"] == "warning"]


# ---- outputs that carry nothing comparable

HOLLOW = ["none", "empty-tuple", "empty-dict", "empty-list", "int", "text", "nested-nones", "shape"]
NOT_DENSE = [("sparse", "layout sparse_coo"), ("sparse-csr", "layout sparse_csr"), ("nested", "nested tensor"),
             ("quantized", "quantized tensor"), ("sparse-in-dict", "out['sparse']")]


def _hollow_model(kind: str, repeats: int = 1) -> dict:
    model = {"name": "m", "source": "python", "entry": "tests.fixtures.hollow:returns", "params": {"kind": kind}}
    return experiment(models=[model], inputs=[{"name": "x", "synthetic": {"shape": [2, 4]}}], repeats=repeats)


@pytest.mark.parametrize("repeats", [1, 2])
@pytest.mark.parametrize("kind", HOLLOW)
def test_a_model_that_returns_no_tensor_fails_uncomparable(kind, repeats):
    """None, (), {} or constants only: every backend agrees on them, so a pass would check nothing."""
    assert_failed_with(run(_hollow_model(kind, repeats)), tx.UNCOMPARABLE, "the model returned no tensor to compare")


@pytest.mark.parametrize("kind, words", NOT_DENSE, ids=[k for k, _ in NOT_DENSE])
def test_tensors_that_are_not_dense_arrays_are_uncomparable(kind, words):
    assert_failed_with(run(_hollow_model(kind)), tx.UNCOMPARABLE, words)


@pytest.mark.parametrize("kind", HOLLOW + [k for k, _ in NOT_DENSE] + ["meta"])
def test_compare_never_passes_and_never_raises_on_them(kind):
    """Straight through `compare`, as every command path calls it; the meta tensor too (eager cannot
    even copy it out, so through the CLI it is the reference's own failure)."""
    with torch.no_grad():
        out = Returns(kind)(torch.ones(2, 4))
    result = compare(out, out, 1e-5, 1e-4)
    assert result.failure_class == tx.UNCOMPARABLE and result.detail


def test_a_tensor_next_to_the_constants_is_compared_as_usual():
    x = torch.ones(3)
    assert compare({"n": None, "x": x}, {"n": None, "x": x}, 1e-5, 1e-4).failure_class is None


# ---- weights files that are not weights

class _RunsCode:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def _torch_bomb(path: Path) -> None:
    """A torch archive whose members are deflated: 30 kB on disk, 32 MB once inflated (the issue's was
    4.7 MB becoming 1.8 GB; the ratio is what gives it away, so a small one is as good a test)."""
    plain = path.with_suffix(".plain")
    torch.save({"conv.weight": torch.zeros(8_000_000)}, plain)
    with zipfile.ZipFile(plain) as src, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info.filename))
    plain.unlink()


WEIGHTS = [  # (id, file name, how to make it, words)
    ("empty", "w.pt", lambda p: p.write_bytes(b""), "is empty"),
    ("empty-safetensors", "w.safetensors", lambda p: p.write_bytes(b""), "is empty"),
    ("pickle-runs-code", "w.pt", lambda p: p.write_bytes(pickle.dumps(_RunsCode(), protocol=2)), "would call posix.system"),
    ("torch-save-runs-code", "w.pt", lambda p: torch.save({"x": _RunsCode()}, p), "refusing weights file"),
    ("zip-bomb", "w.pt", _torch_bomb, "more than 20x"),
    ("link-to-dev-zero", "w.pt", lambda p: os.symlink("/dev/zero", p), "is a character device, not a file"),
    ("link-to-dev-null", "w.pt", lambda p: os.symlink("/dev/null", p), "is a character device"),
    ("fifo", "w.pt", lambda p: os.mkfifo(p), "is a FIFO (named pipe), not a file"),
    ("picture", "w.pt", lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 40), "weights_only=True"),
    ("text", "w.pth", lambda p: p.write_text("these are my weights\n"), "cannot load weights"),
    ("damaged-zip", "w.pt", lambda p: p.write_bytes(b"PK\x03\x04" + b"\1" * 100), "w.pt"),
    ("not-a-safetensors", "w.safetensors", lambda p: p.write_bytes(b"garbage" * 9), "not a valid .safetensors file"),
    ("a-list", "w.pt", lambda p: torch.save([torch.ones(2)], p), "does not hold a state dict"),
    ("dangling-link", "w.pt", lambda p: os.symlink(p.parent / "nowhere.pt", p), "which does not exist"),
    ("folder", "w.pt", lambda p: p.mkdir(), "weights file not found"),
]


@pytest.mark.parametrize("verb", ["validate", "run"])
@pytest.mark.parametrize("name, make, words", [w[1:] for w in WEIGHTS], ids=[w[0] for w in WEIGHTS])
def test_weights_that_run_would_refuse_validate_refuses(name, make, words, verb):
    """`validate` opens the file as `run` does (weights_only, tensors mapped, nothing built), so the two
    never disagree; a FIFO or a link to a device is named for what it is, never "not found"."""
    outcome = run(experiment(models=[{**TINY, "weights": name}]), setup=lambda work: make(work / name), verb=verb)
    assert_refused(outcome, "models[0].weights", words)
    assert "PWNED" not in outcome.written_outside


def test_good_weights_still_load(tmp_path):
    def setup(work: Path) -> None:
        torch.save(tiny_cnn().state_dict(), work / "w.pt")

    outcome = run(experiment(models=[{**TINY, "weights": "w.pt"}]), setup=setup)
    assert outcome.code == 0, outcome.err


# ---- a tokenizer folder holding a FIFO: validate refuses it, never blocks on it


def test_a_tokenizer_file_that_is_a_fifo_is_refused_without_blocking():
    import threading

    def setup(work):
        (work / "tok").mkdir()
        (work / "tok" / "vocab.txt").write_text("[PAD]\nhi\n")
        os.mkfifo(work / "tok" / "tokenizer_config.json")

    data = experiment(inputs=[{"name": "sentences", "text": ["hi"], "tokenizer": "tok"}])
    found = {}
    worker = threading.Thread(target=lambda: found.update(outcome=run(data, setup, verb="validate")), daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "validate blocked on a FIFO in the tokenizer folder"
    assert_refused(found["outcome"], "tokenizer_config.json", "FIFO")


def test_a_tokenizer_config_nested_too_deep_to_parse_is_refused():
    """100000 nested lists in tokenizer_config.json and config.json: Python's JSON parser raises
    RecursionError, which was a traceback (exit 3)."""
    pytest.importorskip("transformers")
    deep = '{"model_type": "bert", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"

    def setup(work):
        (work / "tok").mkdir()
        for name in ("config.json", "tokenizer_config.json"):
            (work / "tok" / name).write_text(deep)

    data = experiment(inputs=[{"name": "sentences", "text": ["hi"], "tokenizer": "tok"}])
    assert_refused(run(data, setup, verb="validate"), "no tokenizer transformers can read", "recursion")
