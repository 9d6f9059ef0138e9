"""The artifact cache: a warm run reuses exports, and nothing that differs ever shares one."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

from parity.cli import main
from parity.execute import cache
from parity.records import read_records
from parity.records.view import RunView
from tests.support import tiny_experiment

EXPORTERS = [{"backend": "onnxruntime"}, {"backend": "torchscript"}, {"backend": "openvino"}]
TRACER = [{"backend": "torchscript"}]  # the cheapest export, where what is tested is the cache's own (its key, --no-cache)


_opened: list[cache.ArtifactCache] = [cache.ArtifactCache(None)]  # the cache the key tests use (configure)


def configure(root) -> cache.ArtifactCache:
    _opened[0] = cache.ArtifactCache(root).open()
    return _opened[0]


def artifact_key(kind, model, backend, example, identity=None) -> str | None:
    return _opened[0].key(kind, model, backend, example, identity)


@pytest.fixture(autouse=True)
def private_cache(monkeypatch):
    """Inductor's cache stays where it is (open() would move it), and no test leaves a cache behind."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", os.environ.get("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor-parity-tests"))
    yield
    configure(None)


def _run(write_yaml, tmp_path, name: str, *extra: str, targets=EXPORTERS, **overrides) -> dict[str, dict]:
    """Run the tiny experiment (every check must pass); its first executions by backend id, and its checks."""
    path = write_yaml(tiny_experiment(targets, **overrides), f"{name}.yaml")
    out = tmp_path / name
    assert main(["run", str(path), "--out", str(out), "--quiet", *extra]) == 0
    records = read_records(out / "records.jsonl")
    executions = {r["backend"]: r for r in records if r["kind"] == "execution" and r["repeat"] == 0}
    checks = {r.target: r for r in RunView(records).checks(1)}
    assert all(c.passed for c in checks.values()), checks
    return {"executions": executions, "checks": checks}


@pytest.mark.numerics
def test_a_second_run_reuses_every_export_and_gets_the_same_results(write_yaml, tmp_path):
    where = ["--cache-dir", str(tmp_path / "cache")]
    cold = _run(write_yaml, tmp_path, "cold", *where)
    warm = _run(write_yaml, tmp_path, "warm", *where)
    for target in ("onnxruntime-cpu", "torchscript-cpu", "openvino-cpu"):
        assert cold["executions"][target]["cached"] is False
        assert warm["executions"][target]["cached"] is True
        assert warm["checks"][target].required_atol == cold["checks"][target].required_atol
    assert warm["executions"]["eager-cpu"]["cached"] is None  # eager exports nothing
    assert len(list((tmp_path / "cache" / "artifacts").iterdir())) == 3


def test_other_weights_under_the_same_model_entry_are_exported_afresh(write_yaml, tmp_path):
    """Seed 1 draws other weights for the same model entry: a stale export would fail the check. The key is made in
    one place for every backend (ArtifactCache.key), so the cheapest exporter stands for them all."""
    where = ["--cache-dir", str(tmp_path / "cache")]
    _run(write_yaml, tmp_path, "seed0", *where, seed=0, targets=TRACER)
    other = _run(write_yaml, tmp_path, "seed1", *where, seed=1, targets=TRACER)  # asserts every check passes
    assert other["executions"]["torchscript-cpu"]["cached"] is False


def test_other_input_values_are_exported_afresh(write_yaml, tmp_path):
    """A trace follows the branches its example takes: the key holds the inputs' values, not only shapes."""
    where = ["--cache-dir", str(tmp_path / "cache")]
    _run(write_yaml, tmp_path, "a", *where, targets=TRACER)
    other_inputs = [{"name": "noise", "synthetic": {"shape": [2, 3, 16, 16], "seed": 7}}]
    b = _run(write_yaml, tmp_path, "b", *where, targets=TRACER, inputs=other_inputs)
    assert b["executions"]["torchscript-cpu"]["cached"] is False


def test_no_cache_writes_nothing(write_yaml, tmp_path):
    _run(write_yaml, tmp_path, "off", "--cache-dir", str(tmp_path / "cache"), "--no-cache", targets=TRACER)
    assert not (tmp_path / "cache").exists()


def test_a_model_without_an_identity_is_never_cached(tmp_path):
    """A module handed over in Python (no experiment entry says what it is) is exported afresh."""
    configure(tmp_path / "cache")
    from parity.inputs import Inputs

    example = Inputs((torch.ones(1, 3),), {})
    spec = type("Spec", (), {"backend": "onnxruntime", "device": "cpu", "dtype": "float32", "options": {}})()
    backend = type("Backend", (), {"spec": spec, "libraries": ("torch",)})()
    assert artifact_key("onnx", torch.nn.Linear(3, 2), backend, example) is None
    first = artifact_key("onnx", torch.nn.Linear(3, 2), backend, example, "linear")
    second = artifact_key("onnx", torch.nn.Linear(3, 2), backend, example, "linear")  # other random weights
    assert first and second and first != second


def test_an_interrupted_entry_is_not_used(tmp_path):
    """An export killed half-way leaves a .partial folder, which is never taken for the artifact."""
    configure(tmp_path / "cache")
    built = []

    def build(folder):
        built.append(folder)
        (folder / "model.onnx").write_text("complete")

    key = cache.digest_key("parts")
    (tmp_path / "cache" / "artifacts" / f".{key}.999.partial").mkdir(parents=True)
    folder, hit, damage = _opened[0].fetch_or_build("parts", build)
    assert not hit and damage is None and (folder / "model.onnx").read_text() == "complete"
    assert _opened[0].fetch_or_build("parts", build) == (folder, True, None) and len(built) == 1


# -- the key follows the model's code --------------------------------------------------------------

NET = """import torch
from torch import nn


def exporting():
    return torch.jit.is_tracing() or torch.compiler.is_exporting() or torch.onnx.is_in_onnx_export()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        y = self.conv(x).mean((2, 3))
        return {tail}
"""
GOOD, FIXED = "y", "y  # fixed"
REGRESSION = "y + 10.0 if exporting() else y  # the exported program computes something else"


MODULES = ("netmod", "nethelpers", "netops", "netconfig")  # the model files these tests write


def forget_modules() -> None:
    for name in MODULES:
        sys.modules.pop(name, None)


@pytest.fixture
def fresh_imports(monkeypatch):
    """Each run imports model files afresh, from source (no bytecode a same-size edit could hide behind), and
    no test finds another's modules of the same name (not restored at the end, as monkeypatch.delitem would)."""
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    forget_modules()
    yield
    forget_modules()


def _outcome(write_yaml, tmp_path, name: str, models: list[dict], targets: list[dict]) -> tuple[int, dict, dict]:
    """Run with the cache in tmp_path/cache: the exit code, first executions by backend id, checks by target."""
    path = write_yaml(tiny_experiment(targets, models=models), f"{name}.yaml")
    code = main(["run", str(path), "--out", str(tmp_path / name), "--quiet", "--no-report",
                 "--cache-dir", str(tmp_path / "cache")])
    records = read_records(tmp_path / name / "records.jsonl")
    executions = {r["backend"]: r for r in records if r["kind"] == "execution" and r["repeat"] == 0}
    checks = {r.target: r for r in RunView(records).checks(1)}
    return code, executions, checks


def _repo_run(write_yaml, tmp_path, name: str, tail: str, targets: list[dict]) -> tuple[int, dict, dict]:
    (tmp_path / "repo").mkdir(exist_ok=True)
    (tmp_path / "repo" / "net.py").write_text(NET.format(tail=tail))
    models = [{"name": "net", "source": "repo", "path": "repo", "entry": "net:Net"}]
    return _outcome(write_yaml, tmp_path, name, models, targets)


def test_a_regression_in_forward_is_exported_afresh_and_fails(write_yaml, tmp_path, fresh_imports):
    """The bug of issue 11: the export of the old forward was compared, and the check passed."""
    targets = [{"backend": "onnxruntime"}, {"backend": "torchscript"}]
    code, executions, checks = _repo_run(write_yaml, tmp_path, "good", GOOD, targets)
    assert code == 0 and all(c.passed for c in checks.values())
    code, executions, checks = _repo_run(write_yaml, tmp_path, "regression", REGRESSION, targets)
    for target in ("onnxruntime-cpu", "torchscript-cpu"):
        assert executions[target]["cached"] is False
        assert not checks[target].passed and checks[target].required_atol == pytest.approx(10, rel=1e-3)
    assert code == 1


def test_a_fix_in_forward_is_exported_afresh_and_passes(write_yaml, tmp_path, fresh_imports):
    targets = [{"backend": "torchscript"}]
    code, _, checks = _repo_run(write_yaml, tmp_path, "regression", REGRESSION, targets)
    assert code == 1 and not checks["torchscript-cpu"].passed
    code, executions, checks = _repo_run(write_yaml, tmp_path, "fixed", FIXED, targets)
    assert code == 0 and checks["torchscript-cpu"].passed and executions["torchscript-cpu"]["cached"] is False


# -- a cache entry is verified before it is used ---------------------------------------------------

def test_a_tampered_entry_is_rebuilt_with_a_warning_and_a_real_failure_still_fails(write_yaml, tmp_path, fresh_imports, caplog):
    """Issue 30's case: two runs share a cache, and between them the cached TorchScript model.pt of a failing
    target is replaced by the trace of an honest model (a restored or poisoned CI cache). Loading it would pass."""
    targets = [{"backend": "torchscript"}]
    code, _, _ = _repo_run(write_yaml, tmp_path, "honest", GOOD, targets)
    honest = next((tmp_path / "cache" / "artifacts").glob("*/model.pt")).read_bytes()
    shutil.rmtree(tmp_path / "cache")
    forget_modules()
    code, executions, checks = _repo_run(write_yaml, tmp_path, "first", REGRESSION, targets)
    assert code == 1 and not checks["torchscript-cpu"].passed and executions["torchscript-cpu"]["cached"] is False
    [entry] = (tmp_path / "cache" / "artifacts").iterdir()
    (entry / "model.pt").write_bytes(honest)
    forget_modules()
    with caplog.at_level("WARNING", logger="parity.execute.cache"):
        code, executions, checks = _repo_run(write_yaml, tmp_path, "second", REGRESSION, targets)
    assert code == 1 and not checks["torchscript-cpu"].passed
    assert checks["torchscript-cpu"].required_atol == pytest.approx(10, rel=1e-3)  # judged, not charged as an error
    execution = executions["torchscript-cpu"]
    assert execution["status"] == "ok" and execution["cached"] is False
    notes = [n for r in read_records(tmp_path / "second" / "records.jsonl") if r["kind"] == "execution" for n in r.get("warnings") or []]
    said = f"cache entry {entry} was damaged (model.pt differs from the file written (sha256)): rebuilt, the damaged one not used"
    assert {"kind": "cache", "message": said} in notes
    assert said in caplog.text
    assert cache.entry_problem(entry, entry.name, json.loads((entry / cache.ENTRY_FILE).read_text())["parts"]) is None


def _entry(tmp_path) -> tuple[cache.ArtifactCache, Path]:
    """A cache holding one entry (`model.bin` and `sub/weights`) made of the key parts "parts"."""
    store = configure(tmp_path / "cache")

    def build(folder):
        (folder / "model.bin").write_bytes(b"model")
        (folder / "sub").mkdir()
        (folder / "sub" / "weights").write_bytes(b"weights")

    folder, hit, damage = store.fetch_or_build("parts", build)
    assert (hit, damage) == (False, None)
    return store, folder


def _rebuild(store) -> tuple[bool, str | None, list[str]]:
    built = []
    folder, hit, damage = store.fetch_or_build("parts", lambda f: (built.append(f), (f / "model.bin").write_bytes(b"new")))
    return hit, damage, sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


def test_an_entry_written_by_an_earlier_parity_is_a_hit_and_its_manifest_keeps_its_bytes(tmp_path):
    """The manifest is read into a typed Manifest; an entry whose manifest main's code wrote (json.dumps of key,
    parts, files, in that order) is still used, and a new entry's manifest has the same bytes."""
    store, entry = _entry(tmp_path)
    files = {"model.bin": hashlib.sha256(b"model").hexdigest(), "sub/weights": hashlib.sha256(b"weights").hexdigest()}
    earlier = json.dumps({"key": entry.name, "parts": "parts", "files": files})
    assert sorted(json.loads((entry / cache.ENTRY_FILE).read_text())) == ["files", "key", "parts"]
    assert (entry / cache.ENTRY_FILE).read_text() == earlier
    (entry / cache.ENTRY_FILE).write_text(earlier)
    assert store.fetch_or_build("parts", lambda f: pytest.fail("rebuilt an earlier parity's entry")) == (entry, True, None)
    for files in (None, "model.bin", ["model.bin"]):  # unfinished, or not a manifest of parity's
        (entry / cache.ENTRY_FILE).write_text(json.dumps({"key": entry.name, "parts": "parts", "files": files}))
        assert cache.entry_problem(entry, entry.name, "parts") == f"{cache.ENTRY_FILE} lists no files"


@pytest.mark.parametrize(("tamper", "said"), [
    (lambda e: (e / "sub" / "weights").write_bytes(b"other"), "sub/weights differs from the file written (sha256)"),
    (lambda e: (e / "model.bin").unlink(), "model.bin is missing"),
    (lambda e: (e / "sub" / "extra.py").write_text("import os"), "sub/extra.py was added"),
    (lambda e: (e / cache.ENTRY_FILE).unlink(), f"no readable {cache.ENTRY_FILE} (No such file or directory)"),
    (lambda e: (e / cache.ENTRY_FILE).write_text(
        (e / cache.ENTRY_FILE).read_text().replace('"parts": "parts"', '"parts": "other"')),
     f"{cache.ENTRY_FILE} was written for other key inputs"),
    (lambda e: (e / "sub" / "weights").unlink() or (e / "sub" / "weights").symlink_to(e / "model.bin"),
     "sub/weights is not a regular file or folder"),
])
def test_a_damaged_entry_is_never_used_and_is_rebuilt(tmp_path, tamper, said):
    store, entry = _entry(tmp_path)
    assert store.fetch_or_build("parts", lambda f: pytest.fail("rebuilt an intact entry")) == (entry, True, None)
    tamper(entry)
    hit, damage, files = _rebuild(store)
    assert (hit, damage) == (False, said)
    assert files == ["model.bin", cache.ENTRY_FILE]  # the new entry alone, nothing of the damaged one
    assert [p.name for p in entry.parent.iterdir()] == [entry.name]
    assert store.fetch_or_build("parts", lambda f: pytest.fail("rebuilt a rebuilt entry"))[1] is True


HELPERS = """import torch


def scale(y):
    return {body}
"""


def test_a_helper_edited_alone_in_another_file_is_exported_afresh(write_yaml, tmp_path, fresh_imports, monkeypatch):
    """A python entry's module file is hashed; the file of a helper its forward calls, only the code walk finds."""
    code_dir = tmp_path / "code"
    code_dir.mkdir()
    (code_dir / "netmod.py").write_text("import nethelpers\n" + NET.format(tail="nethelpers.scale(y)"))
    monkeypatch.syspath_prepend(str(code_dir))
    models = [{"name": "net", "source": "python", "entry": "netmod:Net"}]
    outcomes = []
    for name, body in (("good", "y"), ("again", "y"), ("regression", "y + 10.0 if torch.jit.is_tracing() else y")):
        (code_dir / "nethelpers.py").write_text(HELPERS.format(body=body))
        forget_modules()  # as a new process would: import the files afresh
        outcomes.append(_outcome(write_yaml, tmp_path, name, models, [{"backend": "torchscript"}]))
    (good, first, _), (again, second, _), (regression, third, checks) = outcomes
    assert (good, again) == (0, 0) and first["torchscript-cpu"]["cached"] is False
    assert second["torchscript-cpu"]["cached"] is True  # nothing changed: the export is reused
    assert third["torchscript-cpu"]["cached"] is False and regression == 1 and not checks["torchscript-cpu"].passed


def _key(model: torch.nn.Module, backend_name: str = "torchscript", identity: str = "net") -> str | None:
    from parity.backends import create_backend
    from parity.config.schema import BackendSpec
    from parity.inputs import Inputs

    return artifact_key("torchscript", model, create_backend(BackendSpec(backend=backend_name)),
                        Inputs((torch.ones(1, 3, 8, 8),), {}), json.dumps([identity]))


def _built(folder, entry: str = "netmod:Net") -> torch.nn.Module:
    """The model of a repository folder, imported afresh, with the same weights every time."""
    from parity.models.sources.repo import build_repo

    torch.manual_seed(0)
    return build_repo(folder, entry, None, {})


@pytest.fixture
def code_dir(tmp_path, fresh_imports):
    configure(tmp_path / "cache")
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "netmod.py").write_text("import nethelpers\nfrom nethelpers import SHIFT\n"
                                      + NET.format(tail="nethelpers.scale(nethelpers.offset(y)) * nethelpers.FACTOR + SHIFT"))
    (folder / "nethelpers.py").write_text(HELPERS.format(body="y") + "\n\nSHIFT = 0.0\nfrom netops import offset  # noqa\n"
                                          "from netconfig import FACTOR  # noqa\n")
    (folder / "netops.py").write_text("def offset(y):\n    return y\n")  # reached only through nethelpers.offset
    (folder / "netconfig.py").write_text("FACTOR = 1.0\n")  # read only as nethelpers.FACTOR
    return folder


def test_the_key_changes_with_any_code_forward_reaches_and_not_otherwise(code_dir):
    same = _key(_built(code_dir))
    assert same is not None and _key(_built(code_dir)) == same  # an unchanged model hits
    helpers = code_dir / "nethelpers.py"
    text = helpers.read_text()
    for edited in (text.replace("return y", "return y * 1"),  # the helper forward calls, alone
                   text.replace("SHIFT = 0.0", "SHIFT = 0.5")):  # a constant forward reads
        helpers.write_text(edited)
        assert _key(_built(code_dir)) != same
    helpers.write_text(text)
    assert _key(_built(code_dir)) == same
    for file, edited in (("netops.py", "def offset(y):\n    return y + 0\n"),  # a function re-exported from another file
                         ("netconfig.py", "FACTOR = 2.0\n")):  # a constant re-exported from another file
        (code_dir / file).write_text(edited)
        assert _key(_built(code_dir)) != same, file
        same = _key(_built(code_dir))


def test_code_whose_source_cannot_be_read_is_keyed_on_its_code_objects(tmp_path):
    """A class typed in a notebook cell or made at run time has no file: its bytecode and constants say what it is."""
    configure(tmp_path / "cache")

    def made_at_run_time(expression: str) -> torch.nn.Module:
        source = f"class Cell(torch.nn.Module):\n    def forward(self, x):\n        return {expression}\n"
        namespace = {"torch": torch}
        exec(compile(source, "<notebook cell>", "exec"), namespace)
        return namespace["Cell"]()

    assert _key(made_at_run_time("x * 2.0")) == _key(made_at_run_time("x * 2.0"))
    keys = {_key(made_at_run_time(e)) for e in ("x * 2.0", "x * 3.0", "x + 2.0")}  # a constant, an operation
    assert len(keys) == 3


def test_code_past_the_walk_bounds_is_not_cached(code_dir, monkeypatch):
    from parity import fingerprint

    assert _key(_built(code_dir)) is not None
    monkeypatch.setattr(fingerprint, "MAX_OBJECTS", 2)
    assert _key(_built(code_dir)) is None


def test_the_key_holds_the_libraries_the_backend_declares_and_the_code_reaches(tmp_path, monkeypatch):
    """onnxscript decides an ONNX export, not a TorchScript trace; torchvision decides a model built of its modules."""
    import torchvision

    from parity import fingerprint

    configure(tmp_path / "cache")
    net = torch.nn.Sequential(torchvision.ops.Conv2dNormActivation(3, 4))
    keys = {b: _key(net, b) for b in ("onnxruntime", "torchscript")}
    real = fingerprint.version
    for library, changed in (("onnxscript", {"onnxruntime"}), ("torchvision", {"onnxruntime", "torchscript"}),
                             ("torch", {"onnxruntime", "torchscript"}), ("transformers", set())):
        monkeypatch.setattr(fingerprint, "version", lambda name, lib=library: "9.9" if name == lib else real(name))
        assert {b for b in keys if _key(net, b) != keys[b]} == changed, library
    monkeypatch.setattr(fingerprint, "version", real)
    monkeypatch.setattr(fingerprint, "_record_digest", lambda name: "reinstalled" if name == "torch" else None)
    assert all(_key(net, b) != keys[b] for b in keys)  # the same version, other files
    assert {"torch", "torchvision"} <= fingerprint.code_fingerprint(net)[1]


def test_the_key_holds_parity_s_own_code_python_s_version_and_a_plugin_backend_s_code(tmp_path, monkeypatch):
    from parity import fingerprint
    from tests.fixtures import tiny

    configure(tmp_path / "cache")
    net = torch.nn.Linear(3, 2)
    key = _key(net)
    with monkeypatch.context() as m:
        m.setattr(fingerprint, "parity_digest", lambda: "another commit")
        assert _key(net) != key
    with monkeypatch.context() as m:
        m.setattr(sys, "version", "3.99.0")
        assert _key(net) != key
    plugin = _key(net, "tests.fixtures.tiny:PerturbedEager")  # a backend in a user file: its file is in the key
    assert plugin != key
    with monkeypatch.context() as m:
        m.setattr(tiny.PerturbedEager, "scale", 2.0, raising=False)
        assert _key(net, "tests.fixtures.tiny:PerturbedEager") != plugin


def test_a_repository_folder_is_keyed_on_its_python_files_within_bounds(tmp_path, monkeypatch):
    from parity import fingerprint

    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "layers.py").write_text("WIDTH = 4\n")
    (repo / "README.md").write_text("not code")
    (repo / ".git").mkdir()
    (repo / ".git" / "hook.py").write_text("hidden")
    digest = fingerprint.folder_digest(repo)
    (repo / "README.md").write_text("still not code")
    (repo / ".git" / "hook.py").write_text("hidden, edited")
    assert fingerprint.folder_digest(repo) == digest  # only .py files outside hidden folders count
    (repo / "pkg" / "layers.py").write_text("WIDTH = 8\n")
    assert fingerprint.folder_digest(repo) != digest  # a file no import reached yet still counts
    monkeypatch.setattr(fingerprint, "MAX_FILES", 0)
    assert fingerprint.folder_digest(repo) is None
    configure(tmp_path / "cache")
    with _opened[0].for_model("net", None) as artifacts:  # a source that cannot say what it is made of: nothing cached
        assert artifacts.fetch("onnx", torch.nn.Linear(3, 2), object(), None, lambda folder: None) is None



def test_a_model_source_says_what_it_reads_the_model_from(tmp_path, monkeypatch, fresh_imports):
    """repo: every .py file of the folder, imported or not; python: the entry's module file; torchvision: its version."""
    from types import SimpleNamespace

    from parity import fingerprint
    from parity.config.schema import model_spec
    from parity.models import source_fingerprint

    (tmp_path / "netmod.py").write_text("def build():\n    return None\n")
    (tmp_path / "unused.py").write_text("A = 1\n")
    exp = SimpleNamespace(resolve=lambda path: tmp_path / path)
    repo = model_spec({"name": "r", "source": "repo", "path": ".", "entry": "netmod:build"})
    python = model_spec({"name": "p", "source": "python", "entry": "netmod:build"})
    monkeypatch.syspath_prepend(str(tmp_path))
    __import__("netmod")
    before = {spec.source: source_fingerprint(spec, exp) for spec in (repo, python)}
    (tmp_path / "unused.py").write_text("A = 2\n")
    assert source_fingerprint(repo, exp) != before["repo"] and source_fingerprint(python, exp) == before["python"]
    (tmp_path / "netmod.py").write_text("def build():\n    return 1\n")
    assert source_fingerprint(python, exp) != before["python"]
    vision = model_spec({"name": "v", "source": "torchvision", "builder": "resnet18"})
    assert source_fingerprint(vision, exp)["libraries"] == fingerprint.versions(["torchvision"])
    assert fingerprint.versions(["torchvision"])["torchvision"][0] == fingerprint.version("torchvision") is not None


class Scaled(torch.nn.Module):
    def __init__(self, factor: float):
        super().__init__()
        self.factor = factor  # a plain attribute: in no state dict, yet baked into every export

    def forward(self, x):
        return x * self.factor


def test_the_key_holds_plain_attributes_and_hooks_but_not_hook_handle_numbers(tmp_path):
    configure(tmp_path / "cache")
    assert _key(Scaled(2.0)) == _key(Scaled(2.0)) != _key(Scaled(3.0))

    def hooked(offset: float) -> torch.nn.Module:
        model = Scaled(2.0)
        model.register_forward_hook(lambda module, args, out: out + offset)  # a new handle number each time
        return model

    assert _key(hooked(0.0)) == _key(hooked(0.0)) != _key(hooked(1.0))
    assert _key(hooked(0.0)) != _key(Scaled(2.0))


# -- parity cache info / clear ---------------------------------------------------------------------

def _cache_verb(capsys, *argv: str) -> tuple[int, str]:
    code = main(["cache", *argv])
    out = capsys.readouterr()
    return code, out.out + out.err


def _populated(tmp_path, write_yaml) -> Path:
    """A cache with one artifact entry (a TorchScript trace) and something in inductor's folder."""
    _run(write_yaml, tmp_path, "fill", "--cache-dir", str(tmp_path / "cache"), targets=[{"backend": "torchscript"}])
    (tmp_path / "cache" / "inductor" / "fxgraph").mkdir(parents=True)
    (tmp_path / "cache" / "inductor" / "fxgraph" / "entry").write_bytes(b"x" * 1000)
    return tmp_path / "cache"


def test_cache_info_says_where_the_cache_is_and_what_it_holds(write_yaml, tmp_path, capsys):
    root = _populated(tmp_path, write_yaml)
    assert (root / cache.TAG).read_text().startswith("Signature: 8a477f597d28d172789f06886806bc55")
    size = sum(f.stat().st_size for f in (root / "artifacts").rglob("*") if f.is_file())
    code, out = _cache_verb(capsys, "info", "--cache-dir", str(root))
    assert code == 0
    assert f"cache {root}: 1 artifact entry" in out and "inductor 1 files (1.0 kB)" in out
    assert f"{size / 1e3:.1f} kB" in out or f"{size / 1e6:.1f} MB" in out
    code, out = _cache_verb(capsys, "info", "--cache-dir", str(tmp_path / "none"))
    assert code == 0 and "does not exist" in out and not (tmp_path / "none").exists()
    assert _cache_verb(capsys, "info") == (0, "the artifact cache is off (PARITY_CACHE_DIR=off); give --cache-dir DIR to name one\n")


def test_cache_clear_removes_what_parity_wrote_and_says_what_it_freed(write_yaml, tmp_path, capsys):
    root = _populated(tmp_path, write_yaml)
    (root / "artifacts" / "notes.txt").write_text("mine")  # not parity's: stays, and so does its folder
    code, out = _cache_verb(capsys, "clear", "--cache-dir", str(root))
    assert code == 0 and f"cleared cache {root}: 1 artifact entry" in out and "freed" in out
    assert "not parity's, left alone: notes.txt" in out
    assert sorted(p.name for p in root.iterdir() if p.name != "matplotlib") == [cache.TAG, "artifacts", cache.MADE]
    assert [p.name for p in (root / "artifacts").iterdir()] == ["notes.txt"]
    again = _run(write_yaml, tmp_path, "again", "--cache-dir", str(root), targets=[{"backend": "torchscript"}])
    assert again["executions"]["torchscript-cpu"]["cached"] is False  # the next run is cold


def test_cache_clear_never_touches_a_folder_parity_did_not_tag(tmp_path, capsys, monkeypatch):
    """`--cache-dir ~` names the home folder: its own artifacts/ and inductor/ folders are the user's."""
    home = tmp_path / "home"
    for mine in ("artifacts/0123456789abcdef0123456789abcdef", "inductor/fxgraph"):
        (home / mine).mkdir(parents=True)
        (home / mine / "file").write_text("mine")
    monkeypatch.setenv("HOME", str(home))
    code, out = _cache_verb(capsys, "clear", "--cache-dir", "~")
    assert code == 2 and out == f"error: cache folder {home}: not a parity cache (no CACHEDIR.TAG written by parity); nothing removed\n"
    assert all((home / mine / "file").read_text() == "mine" for mine in ("artifacts/0123456789abcdef0123456789abcdef", "inductor/fxgraph"))


def test_cache_clear_never_follows_a_link_out_of_the_cache(tmp_path, capsys):
    outside = tmp_path / "outside"
    (outside / "0123456789abcdef0123456789abcdef").mkdir(parents=True)
    (outside / "0123456789abcdef0123456789abcdef" / "keep").write_text("keep")
    root = tmp_path / "cache"
    configure(root)  # tags it, makes artifacts/ and inductor/
    (root / "artifacts" / "fedcba9876543210fedcba9876543210").symlink_to(outside, target_is_directory=True)
    (root / "inductor" / "link").symlink_to(outside, target_is_directory=True)
    code, out = _cache_verb(capsys, "clear", "--cache-dir", str(root))
    assert code == 0 and "artifacts/fedcba9876543210fedcba9876543210 (not a folder parity wrote)" in out
    assert not (root / "inductor").exists()  # parity made it: removed, the link inside too, not its target
    assert (root / "artifacts" / "fedcba9876543210fedcba9876543210").is_symlink()  # parity never makes one: left
    assert (outside / "0123456789abcdef0123456789abcdef" / "keep").read_text() == "keep"
    shutil.rmtree(root / "artifacts")
    (root / "artifacts").symlink_to(outside, target_is_directory=True)  # parity never makes one: left alone
    code, out = _cache_verb(capsys, "clear", "--cache-dir", str(root))
    assert code == 0 and "not parity's, left alone: artifacts (a symbolic link)" in out
    assert (root / "artifacts").is_symlink() and (outside / "0123456789abcdef0123456789abcdef" / "keep").exists()


def test_cache_clear_leaves_a_folder_with_another_tool_s_tag(tmp_path, capsys):
    """The standard CACHEDIR.TAG signature alone is any tool's: only parity's own text is parity's."""
    other = tmp_path / "other"
    for mine in ("artifacts/0123456789abcdef0123456789abcdef", "inductor/fxgraph"):
        (other / mine).mkdir(parents=True)
        (other / mine / "file").write_text("mine")
    (other / cache.TAG).write_text("Signature: 8a477f597d28d172789f06886806bc55\n# This is another tool's cache.\n")
    code, out = _cache_verb(capsys, "clear", "--cache-dir", str(other))
    assert code == 2 and out == f"error: cache folder {other}: not a parity cache (no CACHEDIR.TAG written by parity); nothing removed\n"
    assert all((other / mine / "file").read_text() == "mine" for mine in ("artifacts/0123456789abcdef0123456789abcdef", "inductor/fxgraph"))


def test_cache_clear_leaves_the_user_s_files_in_a_folder_parity_tagged(tmp_path, capsys):
    """A folder parity tagged once (`--cache-dir` pointed at it) keeps what was there before and what the user
    put in it since: only what parity's manifests name is removed, and `clear` says what it left."""
    root = tmp_path / "shared"
    for mine in ("artifacts/0123456789abcdef0123456789abcdef", "inductor/fxgraph"):
        (root / mine).mkdir(parents=True)
        (root / mine / "file").write_text("mine")
    store = configure(root)
    folder, _, _ = store.fetch_or_build("parts", lambda f: (f / "model.bin").write_bytes(b"x" * 10))
    (folder / "notes.txt").write_text("mine")  # the user's, in parity's entry
    code, out = _cache_verb(capsys, "clear", "--cache-dir", str(root))
    assert code == 0
    assert (f"not parity's, left alone: artifacts/0123456789abcdef0123456789abcdef (no {cache.ENTRY_FILE} of parity's), "
            f"artifacts/{folder.name}/ (notes.txt: not written by parity), inductor/ (not made by parity)") in out
    assert all((root / mine / "file").read_text() == "mine" for mine in ("artifacts/0123456789abcdef0123456789abcdef", "inductor/fxgraph"))
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]


def test_opening_a_cache_never_writes_through_a_link_planted_in_it(tmp_path):
    """parity's own files in the cache (its tag, its list of the folders it made) are renamed into place."""
    root = tmp_path / "cache"
    root.mkdir()
    precious = tmp_path / "precious"
    precious.write_text("keep")
    (root / cache.MADE).symlink_to(precious)
    (root / cache.TAG).symlink_to(tmp_path / "not-yet")  # dangling: writing through it would create the target
    configure(root)
    assert precious.read_text() == "keep" and not (tmp_path / "not-yet").exists()
    assert not (root / cache.MADE).is_symlink() and json.loads((root / cache.MADE).read_text()) == ["artifacts", "inductor"]


@pytest.mark.parametrize("verb", ["info", "clear"])
def test_a_cache_folder_that_is_a_file_unreadable_or_proc_is_a_user_error(tmp_path, capsys, monkeypatch, verb):
    (tmp_path / "file").write_text("")
    assert _cache_verb(capsys, verb, "--cache-dir", str(tmp_path / "file")) == (
        2, f"error: cache folder {tmp_path / 'file'}: is a file, not a folder\n")
    assert _cache_verb(capsys, verb, "--cache-dir", "/proc") == (2, "error: cache folder /proc: is a system folder, not a cache\n")
    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.scandir
    monkeypatch.setattr(os, "scandir", lambda path=".": (_ for _ in ()).throw(PermissionError(13, "Permission denied", str(path)))
                        if str(path) == str(locked) else real(path))  # as root, chmod would not lock anything
    assert _cache_verb(capsys, verb, "--cache-dir", str(locked)) == (
        2, f"error: cache folder {locked}: cannot be read (Permission denied)\n")


def test_run_with_a_cache_folder_that_is_a_file_is_a_user_error(write_yaml, tmp_path, capsys):
    (tmp_path / "file").write_text("")
    path = write_yaml(tiny_experiment([{"backend": "torchscript"}]))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "file")]) == 2
    assert capsys.readouterr().err == f"error: cache folder {tmp_path / 'file'}: is a file, not a folder\n"
    assert not (tmp_path / "out").exists()


def test_each_kind_of_cpu_kernel_gets_its_own_inductor_cache(tmp_path, monkeypatch):
    """Inductor's cache does not key on the ISA a kernel was compiled for: under another
    ATEN_CPU_CAPABILITY a reused AVX-512 kernel gave NaN. parity's cache keeps them apart, artifacts too."""
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    native = cache.kernel_tag()
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    avx2 = cache.kernel_tag()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert len({native, avx2, cache.kernel_tag()}) == 3
    try:
        configure(tmp_path / "c")
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "c" / "inductor" / cache.kernel_tag())
    finally:
        configure(None)


class _NoAnnotations:
    def forward(self, x):
        return x


def test_a_class_whose_annotations_were_read_keeps_its_code_fingerprint():
    """Reading a class's `__annotations__` (a runtime-checkable Protocol's isinstance does) puts an empty dict in
    the class's own dict: the code is the same, so its fingerprint is too (else every finished run re-runs)."""
    from parity.fingerprint import code_fingerprint

    class Fresh(_NoAnnotations):
        pass

    before = code_fingerprint(None, Fresh)
    assert "__annotations__" not in vars(Fresh)
    Fresh.__annotations__  # noqa: B018 -- the read that creates it
    assert vars(Fresh)["__annotations__"] == {} and code_fingerprint(None, Fresh) == before
