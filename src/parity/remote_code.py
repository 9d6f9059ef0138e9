"""A save_pretrained folder that names code of its own. A model folder (models/sources/transformers.py) and a
tokenizer folder (inputs/text.py) are refused alike, so the rule lives below both."""

from __future__ import annotations

import json
from pathlib import Path

from parity.errors import clip


def remote_code_problem(folder: Path, names: tuple[str, ...] = ("config.json",)) -> str | None:
    """Why `folder` needs code of its own (an `auto_map` in one of its config files `names`: classes in the
    folder's .py files, which transformers runs under trust_remote_code), or None. parity always loads with
    trust_remote_code=False; the folder is refused by name rather than left to transformers' prompt."""
    for name in names:
        path = folder / name
        if not path.is_file():
            continue
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            continue  # transformers says what it cannot read
        if isinstance(config, dict) and "auto_map" in config:
            named = clip(json.dumps(config["auto_map"]))
            return (f"{path} has an auto_map ({named}): it names code in the folder that transformers would run "
                    "(trust_remote_code); parity loads only transformers' own classes, never a folder's code")
    return None
