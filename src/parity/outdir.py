"""The output folder (`--out`): parity writes there and nowhere else (the artifact cache aside).

`prepare` checks a folder before any work: it is a folder (or can be made one), parity can write in it,
it has some room left, and none of the files parity writes there is a link or anything but a regular
file. A link would make parity append its records, truncate (`--fresh`) or overwrite (a report) a file
elsewhere; a folder or a FIFO in a file's place would stop the run after its work was done. The files
written in place (IN_PLACE: records are appended, and emptied by `--fresh`; the libraries' log is appended)
must also have no second hard link: a hard link is a regular file under another name (a `cp -al` copy of a run folder), and
writing it would write the other file too.

Writing: records are opened without following a link (`open_records`, O_NOFOLLOW), and refused when the
opened file has another hard link; the summary and the reports are written to a temporary file in the
folder and renamed into place (`write_text`), so a full disk leaves the previous file, or none, never a
truncated one, and a file hard-linked there is replaced by a new one, never written. Every failure is a
ParityError naming the path and the system's reason.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

from parity.errors import ParityError

OUTPUT_FILES = ("records.jsonl", "summary.json", "report.md", "report.html", "junit.xml", "run.log")
# written in place (appended, emptied), not replaced: no second hard link allowed
IN_PLACE = ("records.jsonl", "run.log")
MIN_FREE_BYTES = 4 * 2**20  # less than a run's records and reports may need; a full disk fails now, not later

_UMASK = os.umask(0o022)
os.umask(_UMASK)


def reason(exc: OSError) -> str:
    """The system's words for an OSError ('No space left on device'), without the path (the caller names it)."""
    return exc.strerror or type(exc).__name__


def prepare(folder: Path, what: str = "--out", files: tuple[str, ...] = OUTPUT_FILES) -> None:
    """Make `folder` (and its parents) if needed and check that parity can write `files` in it; else a
    ParityError naming `what` (the option) and the path. Creates nothing but the folder."""
    try:
        if folder.exists() and not folder.is_dir():
            raise ParityError(f"{what} {folder}: it is a file, not a folder")
    except OSError as exc:  # a name too long
        raise ParityError(f"{what} {folder}: cannot create the folder: {reason(exc)}") from exc
    _make(folder, what)
    for name in files:
        check_file(folder / name)
    probe_writable(folder, what)
    free = shutil.disk_usage(folder).free
    if free < MIN_FREE_BYTES:
        raise ParityError(f"{what} {folder}: only {free // 1024} KiB free on its disk (parity needs at least "
                          f"{MIN_FREE_BYTES // 2**20} MiB for records and reports); free some space or give another folder")


def _make(folder: Path, what: str) -> None:
    """mkdir -p, all or nothing: when a folder on the way cannot be made (a file on the way, a name too
    long, no permission, a read-only disk), the parents made for it are removed again."""
    made = []
    try:
        for path in [*reversed(folder.parents), folder]:
            if not path.is_dir():
                path.mkdir()
                made.append(path)
    except OSError as exc:
        for path in reversed(made):
            with contextlib.suppress(OSError):
                path.rmdir()
        raise ParityError(f"{what} {folder}: cannot create the folder: {reason(exc)}") from exc


def probe_writable(folder: Path, what: str) -> None:
    """Create and remove a file in `folder`: permission bits, read-only mounts and quotas all answer."""
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".parity-probe-")
    except OSError as exc:
        raise ParityError(f"{what} {folder}: parity cannot write in it: {reason(exc)}") from exc
    os.close(fd)
    os.unlink(probe)


def check_file(path: Path) -> None:
    """A file parity writes must be absent or a regular file, never a link (it would write through it)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ParityError(f"{path}: cannot check it: {reason(exc)}") from exc
    if stat.S_ISLNK(mode):
        raise ParityError(f"{path}: is a symbolic link; parity writes only regular files in its output folder, "
                          "never through a link to somewhere else: remove the link, or give another --out")
    if not stat.S_ISREG(mode):
        kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file (a FIFO, socket or device)"
        raise ParityError(f"{path}: is {kind}, where parity writes its {path.name}: move it away, or give another --out")
    if path.name in IN_PLACE:
        check_links(path, os.lstat(path).st_nlink)


def check_links(path: Path, links: int) -> None:
    """A file parity writes in place must be its only name: another hard link would be written too."""
    if links > 1:
        raise ParityError(f"{path}: has {links} hard links (the same file under another name, as `cp -al` makes); "
                          "parity would write into the other too: copy the folder with `cp -a`, or give another --out")


def open_records(path: Path):
    """`path` opened for reading and appending, created if missing; a link, anything but a regular file, or
    a file with another hard link is refused (O_NOFOLLOW and fstat: the checks are on what was opened)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags | getattr(os, "O_NONBLOCK", 0), 0o666)  # a FIFO must not block the open
    except OSError as exc:
        check_file(path)  # a link (ELOOP), a folder (EISDIR): said as such
        raise ParityError(f"{path}: cannot open it for writing: {reason(exc)}") from exc
    opened = os.fstat(fd)
    if not stat.S_ISREG(opened.st_mode) or opened.st_nlink > 1:
        os.close(fd)
        check_file(path)
        check_links(path, opened.st_nlink)
        raise ParityError(f"{path}: is not a regular file, where parity writes its records")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "a+b")


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` whole or not at all: into a temporary file next to it, renamed into place
    (a rename replaces a link itself, never what it points to)."""
    try:
        fd, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    except OSError as exc:
        raise ParityError(f"{path}: cannot write it: {reason(exc)}") from exc
    try:
        with os.fdopen(fd, "wb") as file:
            os.fchmod(file.fileno(), 0o666 & ~_UMASK)
            file.write(data)
        os.replace(partial, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise ParityError(f"{path}: cannot write it: {reason(exc)}") from exc
