"""main(): one command in this process: its parser, its artifact cache, its logging, and the boundary where
every error becomes an exit code (a user's or the environment's: one line, exit 2; parity's own: exit 3)."""

from __future__ import annotations

import argparse
import errno
import os
import sys
import traceback
from pathlib import Path

from parity.cli.logs import show_logs
from parity.cli.parser import build_parser
from parity.cli.terminal import EXIT_BUG, EXIT_USER, Stdout
from parity.errors import ParityError, clip_problem
from parity.files import user_path
from parity.offline import STATE_ENV, keep_state_in
from parity.outdir import prepare


def _artifact_cache(args: argparse.Namespace):
    """The artifact cache this command's Runner keeps exports in, checked before anything runs: a cache that
    cannot be written is the user's to fix (exit 2), never an export failure charged to a target."""
    from parity.execute.cache import ArtifactCache, check_location, default_root

    if not hasattr(args, "cache_dir"):
        return ArtifactCache(None)
    inductor, state = os.environ.get("TORCHINDUCTOR_CACHE_DIR"), os.environ.get(STATE_ENV)
    if inductor and not (state and Path(inductor).is_relative_to(state)):  # the user's (not parity's own, set by
        # an earlier command in this process): torch.compile fails in it later, charged to the target, unless said now
        prepare(user_path(inductor, "$TORCHINDUCTOR_CACHE_DIR"), "$TORCHINDUCTOR_CACHE_DIR (torch.compile's cache)",
                files=())
    if getattr(args, "no_cache", False):
        return ArtifactCache(None)
    if args.cache_dir:
        root, what = user_path(args.cache_dir, "--cache-dir"), "--cache-dir"
    else:
        root, what = default_root(), "the artifact cache ($PARITY_CACHE_DIR, else ~/.cache/parity)"
    if root is not None:
        check_location(root)
        prepare(root, what, files=())
    return ArtifactCache(root).open()


def _contain_library_state(args: argparse.Namespace) -> None:
    """Libraries' home-folder state (matplotlib's) goes into this command's cache, else a temporary folder."""
    from parity.execute.cache import default_root

    if hasattr(args, "cache_dir"):
        keep_state_in(args.artifact_cache.root)
        return
    try:
        keep_state_in(default_root())
    except ParityError:  # PARITY_CACHE_DIR=~nosuchuser/x, and this command has no cache to complain about
        keep_state_in(None)


# What the system says when the user's disk, folders or limits are the problem, not parity: such an
# OSError that reaches main is said in one line with its path, as a ParityError is (exit 2).
ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENAMETOOLONG,
                      errno.ENOTDIR, errno.EISDIR, errno.ELOOP, errno.EFBIG, errno.EMFILE, errno.ENFILE, errno.EEXIST}



def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    show_logs(getattr(args, "verbose", False))
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # `entry: mymodels:build` next to you imports, as with python -m
    stdout, sys.stdout = sys.stdout, Stdout(sys.stdout)
    try:
        return _command(args)
    finally:
        sys.stdout = stdout


def _command(args: argparse.Namespace) -> int:
    try:
        args.artifact_cache = _artifact_cache(args)
        _contain_library_state(args)
        return args.func(args)
    except ParityError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        return EXIT_USER
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:  # model code outside an execution (the runner catches it inside one)
        from parity.execute.execution import ends_the_program

        print(f"error: {ends_the_program(exc)} while parity was running it outside a backend's execution; "
              "nothing is judged from this command", file=sys.stderr)
        return EXIT_USER
    except OSError as exc:
        if exc.errno not in ENVIRONMENT_ERRNOS:
            return _internal_error()
        where = f"{exc.filename}: " if exc.filename else ""
        print(clip_problem(f"error: {where}{exc.strerror or exc}"), file=sys.stderr)
        return EXIT_USER
    except Exception:
        return _internal_error()


def _internal_error() -> int:
    traceback.print_exc()
    print("internal error: this is a bug in parity; please report it with the traceback above", file=sys.stderr)
    return EXIT_BUG
