"""Hostile experiment files, written by hand and generated with hypothesis.

Every one must end the way principle 7 says: exit code 2, one line per problem naming the file (and the
key path where there is one), no traceback, and nothing written anywhere but the output folder. Each
case runs `parity run FILE --out DIR` in-process, in a fresh folder that is also the working directory,
and the whole tree around it is compared before and after. A few real subprocesses at the end prove the
exit code and the absence of a traceback outside pytest.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.support import ROOT
from tests.support.hostile import run_parity

VALID = {
    "name": "hostile",
    "models": [{"name": "tiny", "source": "python", "entry": "tests.fixtures.tiny:tiny_cnn"}],
    "inputs": [{"name": "noise", "synthetic": {"shape": [2, 3, 8, 8]}}],
    "targets": [{"backend": "eager", "name": "same"}],
}

# 40 examples per strategy keep the corpus at a few seconds; PARITY_HOSTILE_EXAMPLES=2000 explores deeper
# (with a random seed each time) when the config code changes.
_EXAMPLES = int(os.environ.get("PARITY_HOSTILE_EXAMPLES", "40"))
HYPOTHESIS = settings(max_examples=_EXAMPLES, deadline=None, derandomize=_EXAMPLES <= 40,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@dataclass
class Outcome:
    code: int | str
    err: str
    path: Path
    out: Path
    written_outside: list[str]


def _tree(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*")}


def run_cli(content: str | bytes | dict, files: dict[str, bytes] | None = None, argv: list[str] | None = None,
            name: str = "exp.yaml") -> Outcome:
    """`parity run FILE --out work/out` on `content`, in a fresh folder `case/work` that is also the working
    directory; reports what changed outside `work/out`, in `work` or its parent `case`, by path and content
    (support.hostile.run_parity)."""
    case = Path(tempfile.mkdtemp(prefix="hostile-"))
    try:
        work = case / "work"
        work.mkdir()
        path = work / name
        if isinstance(content, dict):
            content = yaml.safe_dump(content, sort_keys=False)
        path.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
        for rel, data in (files or {}).items():
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / rel).write_bytes(data)
        out = work / "out"
        result = run_parity(argv or ["run", str(path), "--out", str(out), "--quiet"], case, work, ["work/out"])
        return Outcome(result.code, result.err, path, out, result.outside)
    finally:
        shutil.rmtree(case, ignore_errors=True)


def assert_rejected(outcome: Outcome, *expected: str, names_file: bool = True, lines: int | None = None) -> None:
    """Exit 2; each stderr line is `error: FILE...` (or a warning); the expected words are there; no
    traceback; nothing written outside the output folder, and for a bad file no output folder at all."""
    err = outcome.err
    assert outcome.code == 2, f"exit {outcome.code}:\n{err}"
    assert "Traceback" not in err and "internal error" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert errors and all(line.startswith(("error: ", "warning: ")) for line in err.splitlines()), err
    if names_file:
        assert all(line.startswith(f"error: {outcome.path}") for line in errors), err
    if lines is not None:
        assert len(errors) == lines, err
    for words in expected:
        assert words in err, f"{words!r} not in:\n{err}"
    assert outcome.written_outside == [], outcome.written_outside


def reject(content, *expected: str, **kw) -> None:
    outcome = run_cli(content)
    assert_rejected(outcome, *expected, **kw)
    if kw.get("names_file", True):
        assert not outcome.out.exists()


def valid(**changes) -> dict:
    data = copy.deepcopy(VALID)
    data.update(changes)
    return data


def with_model(**fields) -> dict:
    data = copy.deepcopy(VALID)
    data["models"][0].update(fields)
    return data


def with_synthetic(spec) -> dict:
    return valid(inputs=[{"name": "noise", "synthetic": spec}])


def with_target(**fields) -> dict:
    return valid(targets=[{"backend": "eager", "name": "same", **fields}])


def test_the_valid_file_runs():
    """The base every generated case breaks: it must itself pass, or the corpus would prove nothing."""
    outcome = run_cli(VALID)
    assert outcome.code == 0, outcome.err
    assert outcome.written_outside == []


# ---- [1] YAML that is not an experiment, or would build objects, hang or recurse

LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{b}: &{b} [{', '.join(['*' + a] * 10)}]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=True)) + "models: *i\n"

# Each case: (id, file content, words the message must hold).
YAML_FILES = [
    ("empty", "", ("expected a mapping of keys",)),
    ("only-a-comment", "# nothing here\n", ("expected a mapping of keys",)),
    ("list-at-top", "- models\n- inputs\n", ("expected a mapping of keys", "got list")),
    ("scalar-at-top", "just words\n", ("got str",)),
    ("number-at-top", "42\n", ("got int",)),
    ("two-documents", "name: a\n---\nname: b\n", ("not valid YAML", "single document")),
    ("not-utf8", b"name: caf\xe9\nmodels: []\n", ("not UTF-8",)),
    ("utf16", "name: x\n".encode("utf-16"), ("not UTF-8",)),
    ("nul-byte", "name: a\x00b\n", ("not allowed",)),
    ("tab-indent", "models:\n\t- name: x\n", ("not valid YAML",)),
    ("unclosed-bracket", "models: [\n  - a: b\n", ("not valid YAML",)),
    ("duplicate-key", "name: a\nname: b\n", ("appears twice",)),
    ("python-apply", "name: !!python/object/apply:os.system ['touch PWNED']\n", ("could not determine a constructor",)),
    ("python-object", "name: !!python/object:subprocess.Popen {args: ['touch', 'PWNED']}\n", ("constructor",)),
    ("python-name", "name: !!python/name:os.system\n", ("constructor",)),
    ("python-module", "name: !!python/module:os\n", ("constructor",)),
    ("custom-tag", "name: !mytag x\n", ("constructor",)),
    ("billion-laughs", LAUGHS, ("expands to more than 100000 values",)),
    ("alias-loop", "models: &a [*a]\n", ("loop",)),
    ("alias-loop-in-mapping", "a: &a {b: *a}\n", ("loop",)),
    ("undefined-alias", "models: *nowhere\n", ("not valid YAML", "undefined alias")),
    ("deep-nesting", "models: " + "[" * 3000 + "]" * 3000 + "\n", ("nested more than",)),
    ("deep-nesting-mapping", "a:\n" + "".join(" " * i + "b:\n" for i in range(1, 100)), ("nested more than",)),
    ("list-as-key", "? [a, b]\n: c\n", ("a key must be a plain name",)),
    ("mapping-as-key", "? {a: 1}\n: c\n", ("a key must be a plain name",)),
]


@pytest.mark.parametrize("content, expected", [c[1:] for c in YAML_FILES], ids=[c[0] for c in YAML_FILES])
def test_yaml_that_is_not_an_experiment(content, expected):
    """Refused by the safe loader or its shape check: nothing is constructed, nothing runs."""
    reject(content, *expected)


def test_no_python_tag_ever_runs():
    """The tags above would create a file named PWNED in the working directory if anything ran them."""
    for _, content, _ in YAML_FILES:
        if isinstance(content, str) and "PWNED" in content:
            outcome = run_cli(content)
            assert outcome.code == 2 and not any(Path(p).name == "PWNED" for p in outcome.written_outside)


def test_an_oversized_file_is_refused_unread():
    reject("# " + "x" * (1 << 20) + "\n", "bytes; an experiment file is at most")


def test_a_folder_or_a_device_is_not_an_experiment():
    outcome = run_cli("", argv=["run", ".", "--out", "out", "--quiet"])
    assert outcome.code == 2 and "is a folder" in outcome.err
    outcome = run_cli("", argv=["validate", "/dev/zero"])
    assert outcome.code == 2 and "not a regular file" in outcome.err


def test_merge_keys_are_yaml_not_an_error():
    """`<<: *base` is how YAML files share settings; it was refused as an unknown tag."""
    text = yaml.safe_dump(VALID, sort_keys=False) + "reference:\n  <<: &base {backend: eager}\n  name: ref\n"
    outcome = run_cli(text)
    assert outcome.code == 0, outcome.err


# Generated cases. Each strategy builds files that are invalid by construction, so every example must be
# rejected; hypothesis explores the variety (unicode, odd numbers, odd places) a hand list misses.

@HYPOTHESIS
@given(text=st.text(max_size=300))
def test_generated_text_files(text):
    reject(text)


@HYPOTHESIS
@given(blob=st.binary(max_size=300))
def test_generated_byte_files(blob):
    reject(blob)


@HYPOTHESIS
@given(width=st.integers(2, 12), depth=st.integers(2, 9), at=st.sampled_from(["models", "name", "params"]))
def test_generated_alias_bombs(width, depth, at):
    if width ** depth <= 100_000:
        depth = 1 + next(d for d in range(2, 40) if width ** d > 100_000)
    lines = [f"l0: &l0 [{', '.join(['x'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, depth)]
    lines.append(f"{at}: *l{depth - 1}")
    reject("\n".join(lines) + "\n", "expands to more than")


# ---- [2] wrong types, unknown keys and names, each one message at its key path

WRONG_TYPES = [
    ("integer-key", {1: 2, **VALID}, ("(top level): key 1 is int, not a name; put it in quotes",)),
    ("null-key", "~: 1\n", ("key None is NoneType, not a name",)),
    ("number-key-in-options", "targets: [{backend: eager, options: {0E0: 1}}]\n",
     ("targets[0].options: key 0.0 is float, not a name; put it in quotes",)),
    ("number-key-in-params", with_model(params={1: 2}), ("models[0].params: key 1 is int, not a name",)),
    ("capitalized-unknown-key", {**VALID, "Models": []}, ("Models: unknown key; did you mean 'models'?",)),
    ("bracket-unknown-key", {**VALID, "a[0]": 1}, ("a[0]: unknown key",)),
    ("newline-in-key", {**VALID, "a\nb": 1}, ("a\\nb: unknown key",)),
    ("models-not-a-list", valid(models="resnet18"), ("models: expected a list",)),
    ("model-not-a-mapping", valid(models=[5]), ("models[0]: expected a mapping",)),
    ("no-targets", {k: v for k, v in VALID.items() if k != "targets"}, ("targets: required key is missing",)),
    ("empty-targets", valid(targets=[]), ("targets",)),
    ("name-is-a-number", valid(name=5), ("name: expected a string, got 5",)),
    ("name-is-a-date", "name: 2024-01-01\n", ("name: expected a string",)),
    ("repeats-is-text", valid(repeats="many"), ("repeats: expected an integer",)),
    ("seed-is-a-list", valid(seed=[1]), ("seed: expected an integer",)),
    ("unknown-key-in-target", with_target(optons={}), ("targets[0].optons: unknown key; did you mean 'options'?",)),
    ("unknown-backend", valid(targets=[{"backend": "onnxruntim"}]), ("did you mean 'onnxruntime'",)),
    ("unknown-option", with_target(options={"thread": 2}), ("did you mean 'threads'",)),
    ("options-not-a-mapping", with_target(options=[1, 2]), ("targets[0].options: expected a mapping",)),
    ("unknown-entry", with_model(entry="tests.fixtures.tiny:tiny_cnnn"), ("models[0].entry",)),
    ("relative-entry", with_model(entry="..tiny:tiny_cnn"), ("absolute module path",)),
    ("relative-backend", valid(targets=[{"backend": ".tiny:X"}]), ("absolute module path",)),
    ("backend-not-a-class", valid(targets=[{"backend": "os:system"}]), ("not a subclass of parity.backends.base.Backend",)),
    ("granularity-number", valid(tiers={"activations": {"granularity": 5}}),
     ("tiers.activations.granularity: expected a string or a list, got 5",)),
    ("tasks-number", valid(tiers={"tasks": 3}), ("tiers.tasks: expected a mapping",)),
    ("adapter-number", valid(adapters=[5]), ("adapters[0]: expected a mapping",)),
    ("adapter-unknown", valid(adapters=["nms"]), ("adapters[0].name",)),
    ("shape-text", with_synthetic({"shape": "2x3"}), ("shape: expected a list",)),
    ("shape-nested", with_synthetic({"shape": [[1, 2], [3]]}), ("shape[0]: expected an integer",)),
    ("shape-fraction", with_synthetic({"shape": [2.5]}), ("shape[0]",)),
    ("shape-zero", with_synthetic({"shape": [2, 0]}), ("every dimension must be positive",)),
    ("shape-negative", with_synthetic({"shape": [-1]}), ("every dimension must be positive",)),
    ("shape-empty", with_synthetic({"shape": []}), ("shape",)),
    ("synthetic-empty-mapping", with_synthetic({}), ("shape: required key is missing",)),
    ("synthetic-number", with_synthetic(5), ("synthetic: expected a mapping",)),
    ("resize-three-sides", valid(inputs=[{"name": "p", "images": ["sample:chelsea"], "preprocess": {"resize": [1, 2, 3]}}]),
     ("preprocess.resize",)),
    ("std-zero", valid(inputs=[{"name": "p", "images": ["sample:chelsea"], "preprocess": {"mean": [0.5], "std": [0]}}]),
     ("'std' must not contain 0",)),
    ("missing-weights", with_model(weights="nowhere.pt"), ("weights file not found",)),
    ("missing-image", valid(inputs=[{"name": "p", "images": ["missing.jpg"]}]), ("image not found",)),
    ("missing-repo", valid(models=[{"name": "r", "source": "repo", "path": "nowhere", "entry": "m:M"}]),
     ("repository folder not found",)),
    ("weights-is-a-folder", with_model(weights="."), ("weights file not found",)),
    ("legacy-from-unknown", "from: hub\nmodel: resnet18\ninputs: [a.jpg]\n", ("from: expected 'library' or 'repo'",)),
    ("legacy-inputs-empty", "from: library\nmodel: resnet18\ninputs: []\n", ("inputs: expected a non-empty list",)),
]


@pytest.mark.parametrize("content, expected", [c[1:] for c in WRONG_TYPES], ids=[c[0] for c in WRONG_TYPES])
def test_wrong_types_and_unknown_keys(content, expected):
    """One line per problem, in the user's words: the key path and what was expected there."""
    reject(content, *expected)


def _mappings() -> dict[tuple, set[str]]:
    """Where a mapping lives in VALID, and the keys the schema allows there."""
    from parity.backends.eager import EagerOptions
    from parity.config.schema import BackendSpec, Experiment, InputSetSpec, ModelSpec, Synthetic

    return {(): set(Experiment.model_fields), ("models", 0): set(ModelSpec.model_fields),
            ("inputs", 0): set(InputSetSpec.model_fields), ("inputs", 0, "synthetic"): set(Synthetic.model_fields),
            ("targets", 0): set(BackendSpec.model_fields), ("targets", 0, "options"): set(EagerOptions.model_fields)}


MAPPINGS = _mappings()


def _at(data, path):
    """The container at `path`, made (as an empty mapping) where VALID has none."""
    for part in path:
        if isinstance(data, dict):
            data = data.setdefault(part, {})
        else:
            data = data[part]
    return data


KEY = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=12)


@HYPOTHESIS
@given(where=st.sampled_from(sorted(MAPPINGS, key=len)), key=KEY, value=st.none() | st.integers() | st.text(max_size=5))
def test_generated_unknown_keys(where, key, value):
    assume(key not in MAPPINGS[where] and key != "from")
    data = valid(targets=[{"backend": "eager", "name": "same", "options": {}}])
    _at(data, where)[key] = value
    outcome = run_cli(data)
    assert_rejected(outcome)
    # `1e5` or `0E0` as a key is a number to YAML: then the message says so instead
    assert ("unknown key" if where != ("targets", 0, "options") else "unknown option") in outcome.err or (
        "not a name; put it in quotes" in outcome.err), outcome.err


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20)


@HYPOTHESIS
@given(document=JSONISH)
def test_generated_documents(document):
    reject(yaml.safe_dump(document))


# ---- [3] names that would leave the output folder

NOT_NAMES = [
    ("name-parent", valid(name="../../x"), ("name: '../../x' is not a plain name",)),
    ("name-absolute", valid(name="/tmp/x"), ("not a plain name",)),
    ("name-slash", valid(name="a/b"), ("not a plain name",)),
    ("name-backslash", valid(name="a\\b"), ("not a plain name",)),
    ("name-dotdot", valid(name=".."), ("not a plain name",)),
    ("name-dot", valid(name="."), ("not a plain name",)),
    ("name-hidden", valid(name=".hidden"), ("not a plain name",)),
    ("name-empty", valid(name=""), ("not a plain name",)),
    ("name-newline", valid(name="a\nb"), ("not a plain name",)),
    ("name-option", valid(name="--fresh"), ("not a plain name",)),
    ("name-too-long", valid(name="x" * 101), ("not a plain name",)),
    ("model-name-parent", with_model(name="../m"), ("models[0].name",)),
    ("model-name-absolute", with_model(name="/etc/passwd"), ("models[0].name",)),
    ("model-name-colon", with_model(name="a:b"), ("models[0].name",)),
    ("input-name-slash", valid(inputs=[{"name": "x/../../y", "synthetic": {"shape": [2]}}]), ("inputs[0].name",)),
    ("target-name-parent", with_target(name="../../../t"), ("targets[0].name",)),
    ("target-name-absolute", with_target(name="/t"), ("targets[0].name",)),
    ("reference-name-slash", valid(reference={"backend": "eager", "name": "r/e/f"}), ("reference.name",)),
    ("keyword-not-an-identifier", with_synthetic({"a/b": {"shape": [2]}}), ("not a keyword argument name",)),
    ("legacy-model-parent", "from: library\nmodel: ../../x\ninputs: [a.jpg]\n", ("model: expected a torchvision builder",)),
    ("legacy-class-without-module", "from: repo\nrepo: {path: ., class: Net}\ninputs: [a.jpg]\n", ("repo.class",)),
]


@pytest.mark.parametrize("content, expected", [c[1:] for c in NOT_NAMES], ids=[c[0] for c in NOT_NAMES])
def test_names_that_are_not_plain(content, expected):
    """Experiment, model, input set and target names appear in records and file names."""
    reject(content, *expected)


@pytest.mark.parametrize("layout", ["two-files", "default-out"])
def test_names_cannot_steer_the_output_folder(layout):
    """With several files the output folder is OUT/NAME, and without --out parity-out/NAME-TIMESTAMP: a name
    like ../../escaped would put records outside; it is refused before anything is written."""
    a = yaml.safe_dump(valid(name="../../escaped"))
    if layout == "two-files":
        outcome = run_cli(a, argv=["run", "exp.yaml", "b.yaml", "--out", "out", "--quiet"],
                          files={"b.yaml": yaml.safe_dump(valid(name="b")).encode()})
    else:
        outcome = run_cli(a, argv=["run", "exp.yaml", "--quiet"])
    assert outcome.code == 2 and "not a plain name" in outcome.err and "Traceback" not in outcome.err
    assert outcome.written_outside == []


def test_a_file_named_dots_gets_a_plain_experiment_name():
    """`...yaml` has the stem `..`; as the experiment's name it would be the parent folder."""
    outcome = run_cli({k: v for k, v in VALID.items() if k != "name"}, name="...yaml",
                      argv=["run", "...yaml", "b.yaml", "--out", "out", "--quiet"],
                      files={"b.yaml": yaml.safe_dump(valid(name="b")).encode()})
    assert outcome.code == 0, outcome.err
    assert outcome.written_outside == []


NOT_A_NAME = st.one_of(
    st.text(min_size=1, max_size=20).map(lambda s: f"../{s}"),
    st.text(min_size=1, max_size=20).map(lambda s: f"/{s}"),
    st.text(min_size=0, max_size=20).flatmap(lambda s: st.sampled_from([f"{s}/x", f"x/{s}", f".{s}", f"-{s}", f"a\\{s}"])),
    st.text(st.characters(categories=["Zs", "Cc", "P", "S"], exclude_characters="_.+-"), min_size=1, max_size=5),
    st.just(""), st.just(".."), st.just("."), st.text(min_size=101, max_size=120, alphabet="ab"),
)
NAME_PLACES = [("name",), ("models", 0, "name"), ("inputs", 0, "name"), ("targets", 0, "name")]


@HYPOTHESIS
@given(where=st.sampled_from(NAME_PLACES), name=NOT_A_NAME)
def test_generated_names_that_are_not_plain(where, name):
    data = valid()
    _at(data, where[:-1])[where[-1]] = name
    reject(data, "not a plain name")


# ---- [4] URLs and hub references: parity does not download

REMOTE = [
    ("url-weights", with_model(weights="https://example.com/w.pth"), ("parity does not download",)),
    ("url-image", valid(inputs=[{"name": "p", "images": ["http://example.com/cat.jpg"]}]), ("parity does not download",)),
    ("url-repo", valid(models=[{"name": "r", "source": "repo", "path": "https://github.com/pytorch/vision", "entry": "m:M"}]),
     ("models[0].path", "parity does not download")),
    ("github-repo", valid(models=[{"name": "r", "source": "repo", "path": "github:pytorch/vision", "hubconf": "resnet18"}]),
     ("parity does not download",)),
    ("hf-weights", with_model(weights="hf://org/model/w.safetensors"), ("parity does not download",)),
    ("legacy-url-repo", "from: repo\nrepo: {path: 'https://x/y', class: m.Net}\ninputs: [a.jpg]\n", ("parity does not download",)),
]


@pytest.mark.parametrize("content, expected", [c[1:] for c in REMOTE], ids=[c[0] for c in REMOTE])
def test_remote_references(content, expected):
    """A repository, weights file or image must be a path on this machine."""
    reject(content, *expected)


# ---- [5] absurd sizes and non-finite or negative tolerances

ABSURD = [
    ("tera-elements", with_synthetic({"shape": [10**12]}), ("more than parity builds",)),
    ("huge-batch", with_synthetic({"shape": [10**9, 3, 224, 224]}), ("more than parity builds",)),
    ("huge-total", with_synthetic([{"shape": [2**27]}, {"shape": [2**27]}, {"shape": [2]}]), ("together",)),
    ("huge-dimension-integer", with_synthetic({"shape": [10**30]}), ("more than parity builds",)),
    ("repeats-billion", valid(repeats=10**9), ("repeats: Input should be less than or equal to 1000",)),
    ("repeats-zero", valid(repeats=0), ("repeats",)),
    ("seed-huge", valid(seed=10**30), ("seed",)),
    ("seed-negative", valid(seed=-1), ("seed",)),
    ("synthetic-seed-huge", with_synthetic({"shape": [2], "seed": 2**64}), ("seed",)),
    ("resize-billion", valid(inputs=[{"name": "p", "images": ["sample:chelsea"], "preprocess": {"resize": 10**9}}]),
     ("sizes must be between 1 and 16384",)),
    ("crop-huge", valid(inputs=[{"name": "p", "images": ["sample:chelsea"], "preprocess": {"center_crop": [10**6, 2]}}]),
     ("center_crop",)),
    ("threads-huge", with_target(options={"threads": 10**9}), ("threads",)),
    ("executor-threads-huge", valid(executor={"kind": "process", "threads": 10**6}), ("executor.threads",)),
    ("executor-timeout-inf", valid(executor={"kind": "process", "timeout": float("inf")}), ("executor.timeout",)),
    ("uniform-high-huge", with_synthetic({"shape": [2], "distribution": "uniform", "high": 1e300}), ("high",)),
    ("float-overflow", "repeats: 1e400\n", ("repeats",)),
    ("shape-too-many-dims", with_synthetic({"shape": [1] * 17}), ("shape",)),
    ("synthetic-empty-list", with_synthetic([]), ("synthetic",)),
    ("atol-nan", valid(tolerances={"atol": [float("nan")]}), ("tolerances.atol[0]: Input should be a finite number",)),
    ("atol-nan-yaml", "tolerances: {atol: .nan}\n", ("finite number",)),
    ("atol-inf", valid(tolerances={"atol": [1e-5, float("inf")]}), ("finite number",)),
    ("atol-negative", valid(tolerances={"atol": [-1e-5]}), ("tolerances must be >= 0",)),
    ("rtol-negative", valid(tolerances={"rtol": -1}), ("tolerances.rtol",)),
    ("rtol-nan", valid(tolerances={"rtol": float("nan")}), ("tolerances.rtol",)),
    ("gate-negative-inf", valid(tolerances={"gate": float("-inf")}), ("tolerances.gate",)),
    ("atol-text", valid(tolerances={"atol": "small"}), ("tolerances.atol[0]: expected a number",)),
    ("atol-empty", valid(tolerances={"atol": []}), ("tolerances.atol",)),
    ("oracle-multiplier-nan", valid(oracle={"multiplier": float("nan")}), ("oracle.multiplier",)),
    ("threshold-above-one", valid(tiers={"tasks": {"top1_agreement": 2}}), ("top1_agreement",)),
    ("activation-threshold-nan", valid(tiers={"activations": {"threshold": float("nan")}}), ("threshold",)),
    ("score-grid-zero", valid(adapters=[{"name": "deterministic_nms", "score_grid": 0}]), ("score_grid",)),
    ("legacy-tol-nan", "from: library\nmodel: resnet18\ninputs: [a.jpg]\nverification: {tol: {atol: .nan}}\n",
     ("verification.tol.atol: expected a finite number",)),
    ("legacy-means-inf", "from: library\nmodel: resnet18\ninputs: [a.jpg]\nmeans: [.inf]\nstds: [1]\n", ("means",)),
]


@pytest.mark.parametrize("content, expected", [c[1:] for c in ABSURD], ids=[c[0] for c in ABSURD])
def test_absurd_numbers(content, expected):
    """Bounds in the schema: a typo cannot ask for days of work or terabytes of memory."""
    reject(content, *expected)


def _not_int(values):
    """Values no integer field accepts: words, lists, mappings, fractions, non-finite floats."""
    return st.one_of(st.text(alphabet="abcxyz ", min_size=1, max_size=8), st.lists(st.integers(), max_size=2),
                     st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
                     st.floats(allow_nan=True, allow_infinity=True).filter(lambda f: f != f or f in (float("inf"), float("-inf")) or f != int(f)),
                     values)


BAD_VALUES = {  # (key path, values that are wrong there)
    ("seed",): _not_int(st.integers(max_value=-1) | st.integers(min_value=2**63)),
    ("repeats",): _not_int(st.integers(max_value=0) | st.integers(min_value=1001)),
    ("inputs", 0, "synthetic", "shape"): st.one_of(
        st.lists(st.integers(max_value=0), min_size=1, max_size=4),
        st.lists(st.integers(min_value=2**15, max_value=2**40), min_size=2, max_size=5),
        st.lists(st.just(1), min_size=17, max_size=30), st.just([]), st.text(alphabet="x0123", max_size=5)),
    ("inputs", 0, "synthetic", "dtype"): st.text(max_size=10).filter(
        lambda s: s not in ("float32", "float64", "bfloat16", "float16", "int64", "int32", "bool")),
    ("inputs", 0, "synthetic", "seed"): st.integers(max_value=-1) | st.integers(min_value=2**63),
    ("tolerances", "atol"): st.lists(st.floats(max_value=-1e-300) | st.sampled_from([float("nan"), float("inf")]),
                                     min_size=1, max_size=3),
    ("tolerances", "rtol"): st.floats(max_value=-1e-300) | st.sampled_from([float("nan"), float("inf"), "tight"]),
    ("tolerances", "gate"): st.floats(max_value=-1e-300) | st.sampled_from([float("nan"), float("inf"), [1e-4]]),
    ("targets", 0, "dtype"): st.text(max_size=10).filter(lambda s: s not in ("float32", "float64", "bfloat16", "float16")),
    ("targets", 0, "device"): st.text(max_size=10).filter(lambda s: s not in ("cpu", "cuda") and not s.startswith("cuda:")),
    ("targets", 0, "options"): st.lists(st.integers(), max_size=2) | st.text(max_size=4) | st.integers(),
    ("targets", 0, "backend"): st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12).filter(
        lambda s: s not in ("eager", "compile", "onnxruntime", "torchscript", "openvino")),
    ("models", 0, "source"): st.text(max_size=10).filter(lambda s: s not in ("torchvision", "repo", "python")),
    ("models", 0, "weights"): st.sampled_from(["http://", "https://", "github:", "hf://", "s3://"]).flatmap(
        lambda scheme: st.text(alphabet="abc/._", max_size=10).map(lambda rest: scheme + rest)),
}


@HYPOTHESIS
@given(data=st.data())
def test_generated_wrong_values(data):
    where = data.draw(st.sampled_from(sorted(BAD_VALUES)))
    value = data.draw(BAD_VALUES[where])
    experiment = valid()
    _at(experiment, where[:-1])[where[-1]] = value
    from parity.experiment.yaml_io import format_path

    reject(experiment, format_path(where))


# Real processes: the exit code and the stderr a user sees, outside pytest's capture.

def _subprocess(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    return subprocess.run([sys.executable, "-m", "parity.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_subprocess_exit_code_and_stderr(tmp_path):
    """Several hostile files in one `parity validate` process, then one `parity run`: exit 2, one line per
    problem, no traceback, no file anywhere."""
    files = {"tag.yaml": "name: !!python/object/apply:os.system ['touch PWNED']\n",
             "laughs.yaml": LAUGHS, "names.yaml": yaml.safe_dump(valid(name="../../x")),
             "latin1.yaml": b"name: caf\xe9\n", "top-list.yaml": "- a\n"}
    work = tmp_path / "work"
    work.mkdir()
    for name, content in files.items():
        (work / name).write_bytes(content.encode() if isinstance(content, str) else content)
    before = _tree(tmp_path)
    result = _subprocess(["validate", *files], work)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == len(files) and all(line.startswith("error: ") for line in lines), result.stderr
    for name in files:
        assert sum(line.startswith(f"error: {name}") for line in lines) == 1, result.stderr
    result = _subprocess(["run", "laughs.yaml", "--out", "out"], work)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and "expands to more than" in result.stderr
    assert _tree(tmp_path) == before  # no PWNED, no output folder, nothing in the parent
