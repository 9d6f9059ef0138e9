"""`parity backends` and `parity cache info|clear`: what this machine has, no experiment needed."""

from __future__ import annotations

import argparse

from parity.cli.terminal import EXIT_OK, make_console
from parity.files import user_path


def cmd_backends(args: argparse.Namespace) -> int:
    from parity.backends_command import backends_tables

    console = make_console()
    for table in backends_tables():
        console.print(table)
    return EXIT_OK



def cmd_cache(args: argparse.Namespace) -> int:
    """Say where the artifact cache is and what it holds (info), or empty it (clear)."""
    from parity.execute import cache

    root = user_path(args.location, "--cache-dir") if args.location else cache.default_root()
    if root is None:
        print("the artifact cache is off (PARITY_CACHE_DIR=off); give --cache-dir DIR to name one")
        return EXIT_OK
    found = cache.usage(root) if args.action == "info" else cache.clear(root)
    entries = found.entries
    held = (f"{entries} artifact {'entry' if entries == 1 else 'entries'} ({_amount(found.artifact_bytes)}), "
            f"inductor {found.inductor_files} files ({_amount(found.inductor_bytes)})")
    if not root.exists():
        print(f"cache {root}: does not exist (nothing cached yet)")
    elif args.action == "info":
        tagged = "" if found.tagged else f"; not tagged as parity's ({cache.TAG}), so `parity cache clear` leaves it"
        print(f"cache {root}: {held}{tagged}")
    else:
        print(f"cleared cache {root}: {held}; {_amount(found.freed)} freed")
    left = [*found.foreign, *found.left]
    if left:
        print(f"not parity's, left alone: {', '.join(left)}")
    if found.in_use:
        print(f"in use by a running parity process, left for it: {', '.join(found.in_use)}")
    return EXIT_OK


def _amount(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"
