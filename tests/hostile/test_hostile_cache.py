"""The artifact cache used by several processes at once: `parity cache clear` while a run writes or uses an
entry, an entry removed by hand under a build, a killed export's leftovers. A running job is never broken:
clear leaves the entries a live process holds, an entry lost under a build is built again once, and a second
loss is exit 2 naming the cache, never a failure charged to the target.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from parity.errors import CacheLost
from parity.execute.cache import ARTIFACTS, ArtifactCache, clear, in_use
from tests.fixtures import cache_users
from tests.support.hostile import assert_user_error, run_parity


def _write(folder: Path) -> None:
    (folder / "model.bin").write_bytes(b"x" * 10)


def _entries(root: Path) -> list[str]:
    return sorted(p.name for p in (root / ARTIFACTS).iterdir()) if (root / ARTIFACTS).is_dir() else []


@pytest.mark.parametrize("when", ["while it is written", "after it was written", "on a hit"])
def test_clear_leaves_an_entry_this_run_holds(tmp_path, when):
    cache = ArtifactCache(tmp_path / "cache").open()
    held: list[int] = []
    seen = {}

    def build(folder):
        _write(folder)
        if when == "while it is written":
            seen["cleared"] = clear(cache.root)

    if when == "on a hit":
        cache.fetch_or_build("parts", _write)  # written by an earlier run, which ended
    folder, hit, _ = cache.fetch_or_build("parts", build, held)
    assert hit is (when == "on a hit")
    cleared = seen.get("cleared") or clear(cache.root)
    assert len(cleared.in_use) == 1 and cleared.left == (), cleared
    assert (folder / "model.bin").read_bytes() == b"x" * 10
    for fd in held:  # the run's model is done: its entries are free to clear
        os.close(fd)
    assert clear(cache.root).in_use == () and _entries(cache.root) == []


def _holder(path: Path) -> subprocess.Popen:
    """Another process that holds a shared lock on the entry `path` (as a run does) until its stdin closes."""
    code = ("import fcntl, os, sys\nfd = os.open(sys.argv[1], os.O_RDONLY)\nfcntl.flock(fd, fcntl.LOCK_SH)\n"
            "print('held', flush=True)\nsys.stdin.read()\n")
    process = subprocess.Popen([sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)
    assert process.stdout.readline().strip() == "held"
    return process


@pytest.mark.parametrize("kind", ["finished", "partial"])
def test_parity_cache_clear_leaves_an_entry_another_process_holds_and_says_so(tmp_path, kind):
    cache = ArtifactCache(tmp_path / "cache").open()
    folder, _, _ = cache.fetch_or_build("parts", _write)
    if kind == "partial":
        partial = folder.parent / f".{folder.name}.99999999.partial"
        folder.rename(partial)
        folder = partial
    process = _holder(folder)
    try:
        result = run_parity(["cache", "clear", "--cache-dir", str(cache.root)], tmp_path, tmp_path, ["cache"])
        assert result.code == 0, result.err
        assert f"in use by a running parity process, left for it: {ARTIFACTS}/{folder.name}" in result.out
        assert (folder / "model.bin").is_file()
    finally:
        process.stdin.close()
        process.wait(timeout=30)
    result = run_parity(["cache", "clear", "--cache-dir", str(cache.root)], tmp_path, tmp_path, ["cache"])
    assert result.code == 0 and "in use" not in result.out and _entries(cache.root) == []


def test_a_killed_exports_partial_entry_holds_no_lock_and_is_cleared(tmp_path):
    cache = ArtifactCache(tmp_path / "cache").open()
    code = ("import os, sys\nfrom pathlib import Path\nfrom parity.execute.cache import ArtifactCache\n"
            "cache = ArtifactCache(Path(sys.argv[1]))\n"
            "cache.fetch_or_build('parts', lambda folder: os._exit(9), [])\n")
    ended = subprocess.run([sys.executable, "-c", code, str(cache.root)], capture_output=True, text=True, timeout=120)
    assert ended.returncode == 9, ended.stderr
    [partial] = _entries(cache.root)
    release = in_use(cache.root / ARTIFACTS / partial)  # the dead writer's lock is gone with it
    assert partial.endswith(".partial") and release is not None
    release()
    assert clear(cache.root).in_use == () and _entries(cache.root) == []


@pytest.mark.parametrize("times, lost", [(1, False), (2, True)])
def test_an_entry_removed_under_its_build_is_built_once_more_then_lost(tmp_path, times, lost):
    cache = ArtifactCache(tmp_path / "cache").open()
    calls = []

    def build(folder):
        calls.append(folder)
        if len(calls) <= times:
            import shutil

            shutil.rmtree(folder)
        _write(folder)

    if lost:
        with pytest.raises(CacheLost, match=f"cache folder {cache.root}: the entry .* was removed twice"):
            cache.fetch_or_build("parts", build, [])
    else:
        folder, hit, _ = cache.fetch_or_build("parts", build, [])
        assert not hit and (folder / "model.bin").is_file()
    assert len(calls) == 2


def _experiment(tmp_path: Path, backend: str) -> Path:
    data = {"name": "cache", "models": [{"name": "plain", "source": "python", "entry": "tests.fixtures.exiting:plain"}],
            "inputs": [{"name": "noise", "synthetic": {"shape": [2, 8]}}],
            "targets": [{"backend": f"tests.fixtures.cache_users:{backend}", "name": "t"}]}
    path = tmp_path / "work" / "exp.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("backend", ["ClearingTorchScript", "ClearingOnnxRuntime"])
def test_a_cache_clear_during_a_runs_export_is_no_target_failure(tmp_path, backend):
    """Issue 42: a `parity cache clear` while a run exported removed the export's .partial folder, and the
    target's checks failed as backend_error (FileNotFoundError in the cache). The clear now leaves it."""
    path = _experiment(tmp_path, backend)
    out, root = tmp_path / "work" / "out", tmp_path / "cache"
    result = run_parity(["run", str(path), "--out", str(out), "--cache-dir", str(root), "--quiet", "--no-report"],
                        tmp_path, tmp_path / "work", ["work/out", "cache"])
    assert result.code == 0, result.err + result.out
    assert len([e for e in _entries(root) if not e.startswith(".")]) >= 1  # what it exported is in the cache


@pytest.mark.parametrize("backend, code, executor", [("Vanishing", 0, "local"), ("VanishingTwice", 2, "local"),
                                                     ("VanishingTwice", 2, "process")])
def test_an_entry_removed_by_hand_under_a_run_is_rebuilt_or_exit_2_naming_the_cache(tmp_path, backend, code, executor):
    """Under the process executor the loss happens in the worker: the parent still stops with exit 2 naming the
    cache, not with a worker crash charged to the target."""
    cache_users.Vanishing.removed = 0
    path = _experiment(tmp_path, backend)
    out, root = tmp_path / "work" / "out", tmp_path / "cache"
    result = run_parity(["run", str(path), "--out", str(out), "--cache-dir", str(root), "--quiet", "--no-report",
                         "--executor", executor], tmp_path, tmp_path / "work", ["work/out", "cache"])
    if code == 0:
        assert result.code == 0, result.err + result.out
        assert "was removed while it was being built: building it again" in result.err
    else:
        assert_user_error(result, f"cache folder {root}", "removed twice")
        assert "backend_error" not in (out / "records.jsonl").read_text()


def test_a_build_records_warning_category_is_never_imported(tmp_path):
    """A cache entry's build-record.json names the category of each warning its build gave, as module:Class. A
    shared cache could name a module planted on sys.path: it is looked up among imported modules only."""
    import json
    import warnings

    from parity.backends.base import BUILD_RECORD
    from parity.backends.eager import EagerBackend
    from parity.config.schema import BackendSpec

    (tmp_path / "planted_category.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n"
                                                  "class Warn(Warning):\n    pass\n")
    sys.path.insert(0, str(tmp_path))
    try:
        (tmp_path / BUILD_RECORD).write_text(json.dumps({"notes": [], "warnings": [
            {"message": "planted", "category": "planted_category:Warn", "filename": "x.py", "lineno": 1},
            {"message": "not a warning", "category": "os:system", "filename": "x.py", "lineno": 2},
            {"message": "torch's own", "category": "torch.jit:TracerWarning", "filename": "x.py", "lineno": 3}]}))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            EagerBackend(BackendSpec(backend="eager"))._say_again(tmp_path)
    finally:
        sys.path.remove(str(tmp_path))
    assert not (tmp_path / "ran").exists() and "planted_category" not in sys.modules
    assert [(w.category.__name__, str(w.message)) for w in caught] == [
        ("UserWarning", "planted"), ("UserWarning", "not a warning"), ("TracerWarning", "torch's own")]


def test_what_a_build_warned_of_and_noted_is_said_again_from_its_build_record(tmp_path):
    """`_recording` writes a build's warnings and notes beside the artifact (BUILD_RECORD, the JSON every parity
    wrote); a backend that finds the artifact says them again: the record is read into a BuildRecord once."""
    import warnings

    from parity.backends.eager import EagerBackend
    from parity.config.schema import BackendSpec

    first = EagerBackend(BackendSpec(backend="eager"))

    def build(folder):
        first.note("exporter", "fell back to the other capture")
        warnings.warn("might cause the trace to be incorrect", torch.jit.TracerWarning, stacklevel=1)

    first._recording(build)(tmp_path)
    assert first.notes == ()  # kept in the record, said when the artifact is used
    again = EagerBackend(BackendSpec(backend="eager"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again._say_again(tmp_path)
    assert again.notes == ({"kind": "exporter", "message": "fell back to the other capture"},)
    assert [(w.category, str(w.message)) for w in caught] == [
        (torch.jit.TracerWarning, "might cause the trace to be incorrect")]


@pytest.mark.parametrize("backend, left, full", [
    ("DiskFull", 40 * 2 ** 30, True), ("DiskFullNoErrno", 2 ** 20, True), ("DiskFullInWorker", 2 ** 20, True),
    ("DiskFullNoErrno", 40 * 2 ** 30, False)])
def test_a_full_disk_under_an_export_is_exit_2_naming_the_cache_not_the_targets_failure(tmp_path, monkeypatch, backend,
                                                                                        left, full):
    """A write into the cache that runs out of space (ENOSPC, or an error without one, an OSError or a worker's,
    while the disk has next to nothing left) is the machine's problem: exit 2, one line with the folder and the space left, and no
    verdict for the target. An OSError without an errno while the disk has room stays the target's failure."""
    from parity.execute import cache

    monkeypatch.setattr(cache, "_free", lambda path: left)
    path = _experiment(tmp_path, backend)
    out, root = tmp_path / "work" / "out", tmp_path / "cache"
    result = run_parity(["run", str(path), "--out", str(out), "--cache-dir", str(root), "--quiet", "--no-report"],
                        tmp_path, tmp_path / "work", ["work/out", "cache"])
    records = (out / "records.jsonl").read_text()
    if full:
        assert_user_error(result, f"cache folder {root}: no space left on the disk", f"{left // 2 ** 20} MiB left",
                          "more than the 3 MiB it had written")
        assert '"kind": "check"' not in records
    else:
        assert result.code == 1 and "backend_error" in records and "problem writing element" in records
    assert [e for e in _entries(root)] == []  # the partial entry is gone


def test_a_full_disk_as_an_entrys_manifest_is_written_is_no_build_failure(tmp_path, monkeypatch):
    """The build wrote its files; the disk fills as the manifest that completes the entry is written."""
    import errno

    from parity.execute.cache import ENTRY_FILE

    write_text = Path.write_text

    def full_for_manifests(path, text, *args, **kwargs):
        if path.name == ENTRY_FILE and '"files": {' in text:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return write_text(path, text, *args, **kwargs)

    cache = ArtifactCache(tmp_path / "cache").open()
    monkeypatch.setattr(Path, "write_text", full_for_manifests)
    with pytest.raises(CacheLost, match=f"cache folder {cache.root}: no space left on the disk"):
        cache.fetch_or_build("parts", _write, [])
    assert _entries(cache.root) == []
