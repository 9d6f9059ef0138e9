"""User and environment errors that ended in a traceback and exit 3 (issue 30): each is now one `error:` line
naming what to fix, exit 2. Grouped by the mechanism that says them: a path no system call can take
(files.user_path: `~nosuchuser`, a NUL byte), a number too long to be a size (the YAML loader, --input), a
folder Ray's sockets cannot live under, and the other ones each named where it is made.
"""

from __future__ import annotations

import tempfile

import pytest

from tests.support.hostile import assert_user_error, run_parity
from tests.support.hostile_kit import TINY, assert_refused, experiment, run, with_images, with_synthetic

HUGE = "9" * 5000  # over Python's 4300-digit limit for reading an integer

# -- paths: ~nosuchuser and NUL bytes, wherever a path comes from ---------------------------------------------

PATHS = {
    "image ~nosuchuser": (with_images(["~nosuchuser-parity/a.png"]), ["images[0]", "no user 'nosuchuser-parity'"]),
    "weights ~nosuchuser": (experiment(models=[{**TINY, "weights": "~nosuchuser-parity/w.pt"}]),
                            ["weights", "no user 'nosuchuser-parity'"]),
    "image with a NUL byte": (with_images(["a\0b.png"]), ["images[0]", "NUL byte"]),
    "audio with a NUL byte": (experiment(inputs=[{"name": "clips", "audio": ["a\0b.wav"], "sample_rate": 16000}]),
                              ["audio[0]", "NUL byte"]),
}


@pytest.mark.parametrize("verb", ["run", "validate"])
@pytest.mark.parametrize("case", list(PATHS))
def test_a_path_no_system_call_can_take_is_one_line(case, verb):
    data, words = PATHS[case]
    assert_refused(run(data, verb=verb), *words)


CLI_PATHS = {
    "--weights": ["--weights", "~nosuchuser-parity/w.pt"],
    "--images": ["--images", "~nosuchuser-parity/a.png"],
    "--images NUL": ["--images", "a\0b.png"],
    "--input": ["--input", f"{HUGE}x3"],
}


@pytest.mark.parametrize("case", list(CLI_PATHS))
def test_a_check_option_no_system_call_can_take_is_one_line(tmp_path, case):
    argv = ["check", "tests.fixtures.tiny:tiny_cnn", "--target", "torchscript", *CLI_PATHS[case], "--no-cache",
            "--out", str(tmp_path / "out"), "--quiet"]
    result = run_parity(argv, tmp_path, tmp_path, ["out"])
    assert_user_error(result, case.split()[0])


def test_cache_info_with_an_unexpandable_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("PARITY_CACHE_DIR", "~nosuchuser-parity/cache")
    assert_user_error(run_parity(["cache", "info"], tmp_path, tmp_path, []), "$PARITY_CACHE_DIR", "nosuchuser-parity")


# -- numbers too long to be a size ------------------------------------------------------------------------------

def test_a_five_thousand_digit_dimension_in_the_file(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(f"name: big\nmodels: [{{name: tiny, source: python, entry: 'tests.fixtures.tiny:tiny_cnn'}}]\n"
                    f"inputs: [{{name: noise, synthetic: {{shape: [{HUGE}, 3]}}}}]\ntargets: [{{backend: eager, name: same}}]\n")
    for verb in ("validate", "run"):
        result = run_parity([verb, str(path), *(["--out", str(tmp_path / "out")] if verb == "run" else [])],
                            tmp_path, tmp_path, ["out"])
        assert_user_error(result, f"{path}:3", "an integer of 5000 digits")


def test_a_long_but_readable_dimension_is_still_judged_by_its_size():
    """The control case: 30 digits reads as a number, then is refused as too many elements."""
    assert_refused(run(with_synthetic({"shape": [10**29, 3]})), "shape")


# -- Ray's sockets ------------------------------------------------------------------------------------------------

def test_a_tmpdir_too_deep_for_rays_sockets_is_one_line(tmp_path, monkeypatch):
    """Ray's unix sockets lie under TMPDIR; past 107 bytes Ray failed deep in its startup (exit 3). Said
    before Ray starts (nothing is started, so this is fast)."""
    pytest.importorskip("ray")
    from parity.offline import STATE_ENV

    monkeypatch.delenv(STATE_ENV, raising=False)  # this command's state folder goes under the deep TMPDIR too
    deep = tmp_path / ("d" * 60)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    data = experiment(executor={"kind": "ray", "workers": 1})
    outcome = run(data)
    assert_refused(outcome, "TMPDIR", "Ray's socket paths", "shorter folder")
    assert [p.name for p in deep.glob("parity-*/r*")] == []  # Ray's scratch folder is removed too


# -- records that name what their own run record lacks ---------------------------------------------------------

@pytest.mark.parametrize("edit", ["model", "target"])
def test_reduce_on_records_naming_what_the_config_lacks(tmp_path, edit):
    """Before: StopIteration, exit 3. A run record whose experiment was edited to lose the check's model or
    target, with the check left as it was."""
    import json

    import yaml

    from tests.support import tiny_experiment

    # one culprit module (Cancel loses its input in bfloat16), so that reduce has a repro to cut
    exp = tiny_experiment([{"backend": "eager", "dtype": "bfloat16", "name": "perturbed",
                            "tolerances": {"rtol": 1e-5, "gate": 1e-4}}], tiers={"activations": True},
                          models=[{"name": "tiny", "source": "python", "entry": "tests.fixtures.culprit:cancelling"}],
                          inputs=[{"name": "noise", "synthetic": {"shape": [2, 8]}}])
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(exp))
    out = tmp_path / "out"
    ran = run_parity(["run", str(tmp_path / "exp.yaml"), "--out", str(out), "--quiet", "--no-report"], tmp_path, tmp_path, ["out"])
    assert ran.code == 1, ran.err
    lines = (out / "records.jsonl").read_text().splitlines()
    run_record = json.loads(lines[0])
    if edit == "model":
        run_record["config"]["models"][0]["name"] = "renamed"
    else:
        run_record["config"]["targets"][0]["name"] = "renamed"
    (out / "records.jsonl").write_text("\n".join([json.dumps(run_record), *lines[1:]]) + "\n")
    result = run_parity(["reduce", str(out), "--check", "tiny/noise/perturbed", "--trust-records"], tmp_path, tmp_path,
                        ["out"])
    assert_user_error(result, "records.jsonl", f"{edit} '", "does not have")
