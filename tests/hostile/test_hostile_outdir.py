"""The output folder, the cache folder and the numbers that bound a run: every way a user or the
environment can make them unusable ends in exit 2 with one line naming the path or the option, before
any work, and nothing outside `--out` changes: not a byte of a file that a link in `--out` points to."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import stat
import tempfile
from pathlib import Path

import pytest

from parity import outdir
from tests.support.hostile import assert_user_error, experiment, run_parity, write_experiment

FILES = list(outdir.OUTPUT_FILES)
SAME = {"backend": "eager", "name": "same"}
DATA = experiment([SAME])


def case(tmp_path: Path) -> tuple[Path, Path]:
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "elsewhere").mkdir()
    return work, write_experiment(work, DATA)


def make_in_place(path: Path, kind: str, elsewhere: Path) -> None:
    """Put something that is not parity's regular file where parity writes `path`."""
    if kind == "link to a file":
        target = elsewhere / f"precious-{path.name}"
        target.write_text("someone else's file\n")
        path.symlink_to(target)
    elif kind == "dangling link":
        path.symlink_to(elsewhere / f"not-yet-{path.name}")
    elif kind == "folder":
        path.mkdir()
        (path / "inside").write_text("kept\n")
    elif kind == "fifo":
        os.mkfifo(path)


KINDS = ["link to a file", "dangling link", "folder", "fifo"]
SAID = {"link to a file": "is a symbolic link", "dangling link": "is a symbolic link", "folder": "is a folder",
        "fifo": "not a regular file"}


@pytest.mark.parametrize("fresh", [False, True], ids=["resume", "fresh"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", FILES)
def test_run_refuses_what_is_not_a_regular_file_where_it_writes(tmp_path, name, kind, fresh):
    work, path = case(tmp_path)
    out = work / "out"
    out.mkdir()
    make_in_place(out / name, kind, tmp_path / "elsewhere")
    argv = ["run", str(path), "--out", str(out), "--quiet", *(["--fresh"] if fresh else [])]
    result = run_parity(argv, tmp_path, work, [])  # nothing may change, in --out either: refused before work
    assert_user_error(result, str(out / name), SAID[kind])


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """The --out folder of a finished run (records only), copied by each case that needs one."""
    root = tmp_path_factory.mktemp("finished")
    path = write_experiment(root, DATA)
    result = run_parity(["run", str(path), "--out", str(root / "out"), "--quiet", "--no-report"], root, root, ["out"])
    assert result.code == 0, result.err
    return root / "out"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", [n for n in FILES if n != "records.jsonl"])
def test_report_refuses_what_is_not_a_regular_file_where_it_writes(tmp_path, finished_run, name, kind):
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (out / "records.jsonl").write_bytes((finished_run / "records.jsonl").read_bytes())
    make_in_place(out / name, kind, tmp_path / "elsewhere")
    result = run_parity(["report", str(out)], tmp_path, tmp_path, [])
    assert_user_error(result, str(out / name), SAID[kind])


def test_report_through_an_existing_link_never_writes_the_target(tmp_path, finished_run):
    """Even past the check (a link made between the check and the write), a report replaces the link
    itself: the rename never writes through it."""
    target = tmp_path / "precious.html"
    target.write_text("someone else's page\n")
    (tmp_path / "out").mkdir()
    link = tmp_path / "out" / "report.html"
    link.symlink_to(target)
    outdir.write_text(link, "<html></html>")
    assert target.read_text() == "someone else's page\n" and not link.is_symlink()
    assert link.read_text() == "<html></html>"


def test_records_are_never_opened_through_a_link(tmp_path):
    target = tmp_path / "precious.jsonl"
    target.write_text("keep\n")
    (tmp_path / "records.jsonl").symlink_to(target)
    with pytest.raises(outdir.ParityError, match="symbolic link"):
        outdir.open_records(tmp_path / "records.jsonl")
    assert target.read_text() == "keep\n"


LONG = "y" * 256


def out_paths(tmp_path: Path) -> dict[str, str]:
    """--out values that cannot be an output folder, and what the message says."""
    return {
        "an existing file": str(tmp_path / "work" / "exp.yaml"),
        "/dev/null": "/dev/null",
        "under a file": str(tmp_path / "work" / "exp.yaml" / "out"),
        "a component over 255 characters": str(tmp_path / "work" / LONG),
        "a parent over 255 characters": str(tmp_path / "work" / LONG / "out"),
        "new folders, then one over 255 characters": str(tmp_path / "work" / "new" / "newer" / LONG),
        "a path over 4096 characters": str(tmp_path / "work" / "/".join(["z" * 200] * 21)),
        "deep under a file": str(tmp_path / "work" / "exp.yaml" / "a" / "b" / "c"),
        "~nosuchuser": "~nosuchuser-parity/out",
        "in /proc": "/proc/parity-out",
        "in /sys": "/sys/parity-out",
    }


OUT_CASES = list(out_paths(Path("/")))


@pytest.mark.parametrize("verb", ["run", "localize", "fallback", "report"])
@pytest.mark.parametrize("which", OUT_CASES)
def test_an_out_that_cannot_be_an_output_folder(tmp_path, which, verb):
    work, path = case(tmp_path)
    out = out_paths(tmp_path)[which]
    argv = {"run": ["run", str(path), "--out", out, "--quiet"],
            "localize": ["localize", str(path), "--out", out],
            "fallback": ["fallback", str(path), "--out", out],
            "report": ["report", out]}[verb]
    result = run_parity(argv, tmp_path, work, [])
    if verb == "report" and which not in ("~nosuchuser",):
        assert result.code == 2 and "Traceback" not in result.err and result.outside == [], result.err
        return  # no records there: said as such
    assert_user_error(result, out[:40])


NOBODY = 65534


def unreachable_for_nobody() -> str | None:
    """The first folder that `nobody` cannot enter on the way to the code this process may still import
    (parity's source, these tests, Python's standard library, the installed packages), or None. A checkout
    or a Python under a private folder (root's 0700 home, where pyenv installs) is one: there `nobody` can
    import nothing more (a command's lazy imports fail: `No module named 'fractions'`), and a case run as
    nobody would fail for that, not for what it tests."""
    import pydantic
    import torch

    import parity
    import tests

    for module in (parity, tests, os, pydantic, torch):
        for folder in Path(module.__file__).resolve().parents:
            mode = folder.stat().st_mode
            if not mode & 0o001:  # no search permission for others
                return str(folder)
    return None


@contextlib.contextmanager
def as_nobody(cwd: Path):
    """Root writes anywhere: drop to `nobody` (effective ids) so permission bits mean something, in `cwd` (a
    folder nobody can enter: the folder the process was in may not be one). Ids are given back first, then
    the folder: as nobody, the way back into a private folder is closed. Skips where nobody could not import
    parity's own modules (unreachable_for_nobody)."""
    if os.geteuid() != 0:
        yield
        return
    blocked = unreachable_for_nobody()
    if blocked:
        pytest.skip(f"run as root with code under {blocked}, which user nobody cannot enter: the read-only cases "
                    "run as nobody, who could not import the modules a command needs from there")
    saved = os.getcwd()
    os.chdir(cwd)
    os.setegid(NOBODY)
    os.seteuid(NOBODY)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)
        os.chdir(saved)


@pytest.mark.parametrize("where", ["out itself", "its parent"])
def test_a_read_only_out_is_refused(where, monkeypatch):
    # torch writes its default cache folder into the environment when this process first compiles: that folder
    # (root's) is checked too, and is no more writable by nobody than the output folder
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    case_dir = Path(tempfile.mkdtemp(prefix="parity-readonly-"))
    try:
        os.chmod(case_dir, 0o755)
        path = write_experiment(case_dir, DATA)
        os.chmod(path, 0o644)
        folder = case_dir / "ro"
        folder.mkdir(mode=0o555)
        os.chmod(folder, 0o555)
        out = folder if where == "out itself" else folder / "out"
        with as_nobody(case_dir):
            result = run_parity(["run", str(path), "--out", str(out), "--quiet"], case_dir, case_dir, [])
        assert_user_error(result, str(out), "ermission denied")
    finally:
        os.chmod(case_dir / "ro", 0o755)
        import shutil

        shutil.rmtree(case_dir)


def cache_values(tmp_path: Path) -> dict[str, str]:
    return {"a file": str(tmp_path / "work" / "exp.yaml"), "/dev/null": "/dev/null",
            "under a file": str(tmp_path / "work" / "exp.yaml" / "cache"), "in /proc": "/proc/parity-cache",
            "a component over 255 characters": str(tmp_path / LONG), "~nosuchuser": "~nosuchuser-parity/cache"}


@pytest.mark.parametrize("how", ["--cache-dir", "PARITY_CACHE_DIR"])
@pytest.mark.parametrize("which", list(cache_values(Path("/"))))
def test_a_cache_that_cannot_be_written_is_a_user_error_not_a_target_failure(tmp_path, monkeypatch, which, how):
    work, path = case(tmp_path)
    value = cache_values(tmp_path)[which]
    argv = ["run", str(path), "--out", str(work / "out"), "--quiet"]
    if how == "--cache-dir":
        argv += ["--cache-dir", value]
    else:
        monkeypatch.setenv("PARITY_CACHE_DIR", value)
    result = run_parity(argv, tmp_path, work, [])
    assert_user_error(result, value[:30])


TIMEOUTS = ["1e18", "1e300", "inf", "-inf", "nan", "0", "-1", "604801", "1e-400"]


@pytest.mark.parametrize("executor", ["process", "ray"])
@pytest.mark.parametrize("value", TIMEOUTS)
def test_timeouts_are_bounded_on_the_command_line(tmp_path, value, executor):
    work, path = case(tmp_path)
    argv = ["run", str(path), "--out", str(work / "out"), "--quiet", "--executor", executor, f"--timeout={value}"]
    assert_user_error(run_parity(argv, tmp_path, work, []), "--timeout", "timeout")


@pytest.mark.parametrize("value", ["1e18", "1e300", ".inf", "-.inf", ".nan", "0", "-5", "604801", "1e309"])
def test_timeouts_are_bounded_in_the_file(tmp_path, value):
    work = tmp_path / "work"
    work.mkdir()
    path = work / "exp.yaml"
    text = write_experiment(work, DATA).read_text() + f"executor: {{kind: process, timeout: {value}}}\n"
    path.write_text(text)
    result = run_parity(["run", str(path), "--out", str(work / "out"), "--quiet"], tmp_path, work, [])
    assert_user_error(result, "executor.timeout")


def test_a_full_disk_leaves_no_partial_file(tmp_path, finished_run):
    """Writes past a file-size limit fail as on a full disk: `parity report` exits 2 naming the file, and
    the summary.json already there is left whole, not truncated to what fitted (nor a 0-byte file left)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "records.jsonl").write_bytes((finished_run / "records.jsonl").read_bytes())
    (out / "summary.json").write_text('{"previous": true}\n')
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, hard))  # a summary takes more
    try:
        result = run_parity(["report", str(out)], tmp_path, tmp_path, ["out"])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert_user_error(result, str(out / "summary.json"), "File too large")
    assert sorted(p.name for p in out.iterdir()) == ["records.jsonl", "summary.json"]
    assert (out / "summary.json").read_text() == '{"previous": true}\n'


def test_too_little_free_space_is_refused_before_any_work(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)  # its disk would be found too small first
    work, path = case(tmp_path)
    usage = outdir.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(outdir.shutil, "disk_usage", lambda p: usage._replace(free=1024 * 1024))
    result = run_parity(["run", str(path), "--out", str(work / "out"), "--quiet"], tmp_path, work, ["work/out"])
    assert_user_error(result, str(work / "out"), "1024 KiB free")
    assert not (work / "out" / "records.jsonl").exists()


def test_a_run_writes_only_regular_files_in_out(tmp_path):
    """The control case: the same experiment into a fresh --out passes, writing only parity's files."""
    work, path = case(tmp_path)
    result = run_parity(["run", str(path), "--out", str(work / "out"), "--quiet", "--no-report"], tmp_path, work,
                        ["work/out"])
    assert result.code == 0 and result.outside == [], result.err
    assert sorted(p.name for p in (work / "out").iterdir()) == ["records.jsonl", "summary.json"]
    assert all(stat.S_ISREG(os.lstat(p).st_mode) for p in (work / "out").iterdir())


@pytest.mark.parametrize("where", ["targets[0].backend", "models[0].entry", "an unknown key"])
def test_a_megabyte_value_is_quoted_in_two_hundred_characters(tmp_path, where):
    work, _ = case(tmp_path)
    big = "x" * 900_000
    data = experiment([{"backend": big if where == "targets[0].backend" else "eager", "name": "same"}],
                      models=[{"name": "m", "source": "python",
                               "entry": f"tests.fixtures.exiting:{big}" if where == "models[0].entry" else
                               "tests.fixtures.exiting:plain"}], **({big: 1} if where == "an unknown key" else {}))
    path = write_experiment(work, data)
    result = run_parity(["run", str(path), "--out", str(work / "out"), "--quiet"], tmp_path, work, [])
    assert_user_error(result, "characters]")
    assert len(result.err) < 1000


# -- hard links: a regular file under two names ----------------------------------------------------

@pytest.mark.parametrize("fresh", [False, True], ids=["resume", "fresh"])
def test_records_hard_linked_to_a_file_elsewhere_are_never_written(tmp_path, finished_run, fresh):
    """A `cp -al` copy of a run folder: its records.jsonl is the other folder's file too. Appending (a
    resumed run) or emptying it (--fresh) would change the original; the run is refused before any work."""
    work, path = case(tmp_path)
    original = tmp_path / "elsewhere" / "records.jsonl"
    original.write_bytes((finished_run / "records.jsonl").read_bytes()[:-1])  # a torn last line: resume would cut it
    out = work / "out"
    out.mkdir()
    os.link(original, out / "records.jsonl")
    argv = ["run", str(path), "--out", str(out), "--quiet", *(["--fresh"] if fresh else [])]
    result = run_parity(argv, tmp_path, work, [])
    assert_user_error(result, str(out / "records.jsonl"), "has 2 hard links", "cp -a")


def test_the_run_log_hard_linked_to_a_file_elsewhere_is_never_appended_to(tmp_path, finished_run):
    """run.log is appended to (the libraries' logging): like the records, a second hard link is refused."""
    work, path = case(tmp_path)
    original = tmp_path / "elsewhere" / "run.log"
    original.write_text("keep\n")
    out = work / "out"
    out.mkdir()
    os.link(original, out / "run.log")
    result = run_parity(["run", str(path), "--out", str(out), "--quiet"], tmp_path, work, [])
    assert_user_error(result, str(out / "run.log"), "has 2 hard links", "cp -a")
    assert original.read_text() == "keep\n"


def test_records_hard_linked_after_the_check_are_refused_when_opened(tmp_path):
    """The link may appear between the check before the work and the open: the opened file is checked."""
    original = tmp_path / "precious.jsonl"
    original.write_text("keep\n")
    os.link(original, tmp_path / "records.jsonl")
    with pytest.raises(outdir.ParityError, match="has 2 hard links"):
        outdir.open_records(tmp_path / "records.jsonl")
    assert original.read_text() == "keep\n"


def test_a_summary_and_reports_hard_linked_elsewhere_are_replaced_never_written(tmp_path, finished_run):
    """Files parity replaces by a rename may be hard links: the new file takes the name, the other stays."""
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (out / "records.jsonl").write_bytes((finished_run / "records.jsonl").read_bytes())
    replaced = [name for name in FILES if name not in outdir.IN_PLACE]
    for name in replaced:
        (tmp_path / "elsewhere" / name).write_text("someone else's file\n")
        os.link(tmp_path / "elsewhere" / name, out / name)
    result = run_parity(["report", str(out)], tmp_path, tmp_path, ["out"])
    assert result.code == 0 and result.outside == [], result.err
    for name in replaced:
        assert (tmp_path / "elsewhere" / name).read_text() == "someone else's file\n"
        assert os.stat(out / name).st_nlink == 1 and (out / name).read_text() != "someone else's file\n"


@pytest.mark.parametrize("dangling", [True, False], ids=["dangling", "to a file"])
def test_save_experiment_through_a_link_is_refused(tmp_path, dangling):
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "elsewhere").mkdir()
    target = tmp_path / "elsewhere" / "planted.yaml"
    if not dangling:
        target.write_text("someone else's file\n")
    (work / "grown.yaml").symlink_to(target)
    argv = ["check", "tests.fixtures.tiny:tiny_cnn", "--target", "torchscript", "--input", "1x3x8x8", "--out",
            str(work / "o"), "--quiet", "--save-experiment", str(work / "grown.yaml")]
    result = run_parity(argv, tmp_path, Path.cwd(), [])
    assert_user_error(result, f"--save-experiment {work / 'grown.yaml'}: is a symbolic link")
    assert target.exists() is not dangling
