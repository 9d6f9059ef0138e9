"""JSONL records: one self-describing JSON object per line, written and flushed as results come.

Kinds: `run` (the resolved experiment, its digest and the environment), `resume` (a later process
continued the run), `model`, `execution` (one backend run), `check` (one verdict), `layers` (one
localized check), `fallback`, `warning` (an input that came out constant); their fields are the models
of records/models.py. Every record is validated against its model when written (an undeclared field or a
wrong type is a bug, raised where it is made) and every line when read (a ParityError naming the file
and the line). Reports and summaries are rendered from these lines alone. Non-finite floats (an infinite
required atol) are written as null: the file stays strict JSON.

A run can be continued: each model's `record_key` says what identifies a record, and a writer opened with
`resume=True` keeps the records already in the file and never writes a second record with the same key.
A process killed while writing leaves at most one torn last line (no newline); it is detected, and cut
off before anything is appended.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from parity.errors import FieldError, ParityError, field_errors
from parity.files import file_problem
from parity.outdir import open_records, reason, write_bytes
from parity.records.models import KINDS, RECORDS, SCHEMA_VERSION, TIERS, Record

log = logging.getLogger(__name__)

try:
    import fcntl
except ImportError:  # Windows: no advisory lock; two runs into one folder are then the user's to avoid
    fcntl = None

def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


# Settings of how a run is carried out, not of what it measures: a run may continue under others.
NOT_DIGESTED = ("executor",)


def experiment_digest(config: dict[str, Any], base_dir: str) -> str:
    """What a run is a run of: the resolved experiment and the folder its relative paths start from.
    Comments, key order and spelling (`1e-5` vs `0.00001`) do not change it; a setting does, except
    where executions run (`executor`: a run started locally may continue in worker processes)."""
    measured = {k: v for k, v in config.items() if k not in NOT_DIGESTED}
    canonical = json.dumps({"config": _finite(measured), "base_dir": base_dir}, sort_keys=True,
                           separators=(",", ":"), allow_nan=False)
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def record_problem(record: Any) -> str | None:
    """Why `record` is not a record parity can read (a missing field, a list where a string belongs), or None.
    Raises NewerRecords for a record of a newer schema than this parity's."""
    try:
        typed(record)
    except RecordProblem as exc:
        return str(exc)
    return None


class RecordProblem(ValueError):
    """Why a mapping is not a record parity can read, in words."""


def typed(record: Any) -> Record:
    """`record` as its model of records/models.py; a RecordProblem saying why it is not a record parity can
    read, NewerRecords for a record of a newer schema than this parity's."""
    if not isinstance(record, dict) or "kind" not in record:
        raise RecordProblem("not a parity record (no 'kind')")
    kind = record["kind"]
    if not isinstance(kind, str) or kind not in KINDS:
        raise RecordProblem(f"unknown kind of record {str(kind)[:40]!r} (parity writes {', '.join(KINDS)})")
    version = record.get("schema_version", SCHEMA_VERSION)
    if type(version) is int and version > SCHEMA_VERSION:
        raise NewerRecords(f"a '{kind}' record of schema version {version}: written by a newer parity (this one reads "
                           f"version {SCHEMA_VERSION} and older); upgrade parity to read it")
    tier = record.get("tier")
    if kind == "check" and (type(tier) is not int or tier not in TIERS):
        raise RecordProblem(f"a 'check' record: tier: {'missing' if 'tier' not in record else f'expected 1 or 3, got {tier!r}'}")
    model = RECORDS[kind, tier if kind == "check" else None]
    try:
        return model.model_validate(record)
    except ValidationError as exc:
        raise RecordProblem(f"a '{kind}' record: {_said(field_errors(exc)[0], model)}") from None


class NewerRecords(ParityError):
    """Records of a schema version this parity does not know: a newer parity wrote them."""


_EXPECTED = {"string_type": "a string", "int_type": "an integer", "float_type": "a number", "bool_type": "true or false",
             "dict_type": "a mapping", "model_type": "a mapping", "model_attributes_type": "a mapping",
             "list_type": "a list", "literal_error": "another value"}


def _said(error: FieldError, model: type[BaseModel]) -> str:
    """One pydantic error as a record problem: 'config.tolerances.atol[0]: expected a number, got null'."""
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.loc).lstrip(".")
    if error.kind == "missing":
        return f"{where}: missing"
    if error.kind == "value_error":  # a model's own rule: the message names the field
        return ".".join(filter(None, (where, error.message)))
    expected = _EXPECTED.get(error.kind, error.msg.lower().removeprefix("input should be "))
    got = "null" if error.input is None else {bool: "true or false", dict: "a mapping", list: "a list", str: "a string",
                                              int: "an integer", float: "a number"}.get(type(error.input), "?")
    if _allows_null(model, error.loc):
        expected = expected.replace(" or ", ", ") + " or null"  # true, false or null
    return f"{where or 'the record'}: expected {expected}, got {got}"


def _allows_null(model: type[BaseModel], loc: tuple) -> bool:
    """Whether the field at `loc` in `model` (through its parts and lists) may be null."""
    annotation: Any = model
    for part in loc:
        annotation = _one_of(annotation)
        if isinstance(part, int):
            args = typing.get_args(annotation)
            if typing.get_origin(annotation) is not list or not args:
                return False
            annotation = args[0]
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel) and part in annotation.model_fields:
            annotation = annotation.model_fields[part].annotation
        else:  # a key of a mapping
            return False
    return type(None) in typing.get_args(annotation)


def _one_of(annotation: Any) -> Any:
    """`X` for `X | None`; anything else unchanged."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(annotation) if a is not type(None)]
        return rest[0] if len(rest) == 1 else annotation
    return annotation


def undeclared_fields(model: BaseModel, where: str = "") -> list[str]:
    """The fields of a validated record (and of its parts) that its model does not declare: a writer bug."""
    if getattr(model, "open", False):
        return []
    found = [f"{where}{name}" for name in model.model_extra or {}]
    for name in model.model_fields_set:
        value = getattr(model, name)
        for i, part in enumerate(value if isinstance(value, list) else [value]):
            if isinstance(part, BaseModel):
                found += undeclared_fields(part, f"{where}{name}{f'[{i}]' if isinstance(value, list) else ''}.")
    return found


def validated(record: dict[str, Any]) -> Record:
    """`record` as its model when that declares every field and each has its type; a RuntimeError (a bug in
    what parity writes, found where it is written) otherwise."""
    try:
        model = typed(record)
    except RecordProblem as exc:
        raise RuntimeError(f"parity would write an invalid record: {exc}") from None
    extra = undeclared_fields(model)
    if extra:
        raise RuntimeError(f"parity would write an invalid record: a '{model.kind}' record: undeclared field(s) "
                           f"{', '.join(extra)} (declare them in records/models.py)")
    return model


def _parse(data: bytes, path: Path) -> list[tuple[dict[str, Any], Record]]:
    """The records in `data` up to its last newline, each as read and as its model (records/models.py): what
    follows is a torn line, not a record yet. Every line is checked (typed); a record whose key an earlier line
    has is dropped when the two are identical (said on stderr) and an error when they differ: no check is ever
    counted twice."""
    records = []
    seen: dict[tuple, tuple[int, dict]] = {}
    dropped = []
    for number, line in enumerate(data[:data.rfind(b"\n") + 1].split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise ParityError(f"{path}:{number}: not a JSON record ({getattr(exc, 'msg', exc)})") from exc
        try:
            model = typed(record)
        except NewerRecords as exc:
            raise NewerRecords(f"{path}:{number}: {exc.problems[0]}") from None
        except RecordProblem as exc:
            raise ParityError(f"{path}:{number}: {exc}") from None
        key = model.record_key
        if key in seen:
            first, earlier = seen[key]
            if earlier != record:
                raise ParityError(f"{path}:{number}: a second {' / '.join(map(str, key))} record, different from the "
                                  f"one on line {first}; a run holds one of each: remove the one that is wrong")
            dropped.append(number)
            continue
        if key is not None:
            seen[key] = number, record
        records.append((record, model))
    if dropped:
        log.warning("%s: line(s) %s%s repeat a record of an earlier line exactly; each is counted once", path,
                    ", ".join(map(str, dropped[:10])), " ..." if len(dropped) > 10 else "")
    return records


class RecordWriter:
    """Appends records to OUT/records.jsonl, flushing each line so a crash loses nothing written.

    The file is locked while the writer is open, so two runs cannot interleave lines in one folder.
    `resume=False` empties it; `resume=True` reads the records already there (`records`) and the bytes
    of a torn last line (`torn`), which `drop_torn_line` cuts off; `write` then skips any record whose
    key is already in the file."""

    def __init__(self, path: Path, resume: bool = False):
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ParityError(f"{path.parent}: cannot create the folder: {reason(exc)}") from exc
        self._file = open_records(path)  # never through a link, never anything but a regular file
        try:
            self._lock()
            self.records: list[dict[str, Any]] = []
            self._keys: set[tuple] = set()
            self.torn = 0
            if resume:
                self._file.seek(0)
                data = self._file.read()
                self.torn = len(data) - (data.rfind(b"\n") + 1)
                try:
                    parsed = _parse(data, path)
                except NewerRecords:
                    raise
                except ParityError as exc:
                    raise ParityError(f"{exc.problems[0]}; something other than parity wrote this file: move it "
                                      "away, or pass --fresh to start over") from exc
                self.records = [record for record, _ in parsed]
                self._keys = {model.record_key for _, model in parsed} - {None}
            else:
                self._file.truncate(0)
        except OSError as exc:
            self._file.close()
            raise ParityError(f"{path}: cannot read or empty it: {exc.strerror or exc}") from exc
        except BaseException:
            self._file.close()
            raise

    def _lock(self) -> None:
        if fcntl is None:
            return
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise ParityError(f"{self.path}: another parity process is writing this run; wait for it to end "
                              "or give another --out") from exc

    def drop_torn_line(self) -> int:
        """Cut off a torn last line (what a killed process was writing); returns its length in bytes."""
        torn, self.torn = self.torn, 0
        if torn:
            try:
                self._file.truncate(self._file.seek(0, os.SEEK_END) - torn)
            except OSError as exc:
                raise ParityError(f"{self.path}: cannot cut off its torn last line: {exc.strerror or exc}") from exc
        return torn

    def keep_only(self, records: list[dict[str, Any]]) -> None:
        """Rewrite the file with `records` alone (some of `self.records`: a resume removing the judgements it
        makes again), whole or not at all: written beside it and renamed over it, then locked again."""
        write_bytes(self.path, b"".join((json.dumps(r, allow_nan=False) + "\n").encode("utf-8") for r in records))
        old, self._file = self._file, open_records(self.path)
        old.close()
        try:
            self._lock()
        except BaseException:
            self._file.close()
            raise
        self.records = list(records)
        self._keys = {typed(r).record_key for r in self.records} - {None}

    def has(self, *key: Any) -> bool:
        return tuple(key) in self._keys

    def write(self, kind: str, **fields: Any) -> dict[str, Any] | None:
        """Append one record; None (and nothing written) when the file already has a record with its key."""
        record = _finite({"kind": kind, "schema_version": SCHEMA_VERSION, **fields})
        key = validated(record).record_key
        if key is not None and key in self._keys:
            return None
        if self.torn:
            raise RuntimeError("records.jsonl ends with a torn line; drop_torn_line() before appending")
        try:
            self._file.write((json.dumps(record, allow_nan=False) + "\n").encode("utf-8"))
            self._file.flush()
        except OSError as exc:  # a full disk, a quota: the run stops here, its records so far kept
            raise ParityError(f"{self.path}: cannot write a record: {exc.strerror or exc}; the records written "
                              "so far are kept and the run continues from them once the problem is solved") from exc
        self.records.append(record)
        if key is not None:
            self._keys.add(key)
        return record

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The records of a run. A torn last line (the run is being written, or was killed mid-line) is not a
    record yet and is left out."""
    path = Path(path)
    if path.is_dir():
        path = path / "records.jsonl"
    return [record for record, _ in _parse(_read(path), path)]


def _read(path: Path) -> bytes:
    problem = file_problem(path, "records file")  # a FIFO would block the read: said for what it is
    if problem and os.path.exists(path):
        raise ParityError(problem)
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ParityError(f"{path}: cannot read it: {exc.strerror or exc}") from exc


def being_written(path: Path) -> bool:
    """Whether a live parity process is writing the records file `path` (it holds the file's lock while it
    runs: RecordWriter); False where there are no locks or the file cannot be opened."""
    if fcntl is None:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


def read_run(folder: str | Path) -> list[dict[str, Any]]:
    """The records of the run in `folder` (an `--out` folder), as the mappings read. A missing file, a line that
    is not JSON or a file without its `run` record is a ParityError that says which."""
    return [record for record, _ in _read_run(folder)]


def read_typed_run(folder: str | Path) -> list[Record]:
    """The same records as read_run, each as its model (records/models.py): what RunView.read reads."""
    return [model for _, model in _read_run(folder)]


def _read_run(folder: str | Path) -> list[tuple[dict[str, Any], Record]]:
    folder = Path(folder)
    path = folder / "records.jsonl" if folder.suffix != ".jsonl" else folder
    try:
        if not path.is_file():
            where = "does not exist" if not folder.exists() else "has no records.jsonl"
            raise ParityError(f"{folder}: {where} (expected the --out folder of a parity run)")
    except OSError as exc:  # a name too long, a folder parity may not enter
        raise ParityError(f"{folder}: cannot read it: {exc.strerror or exc}") from exc
    records = _parse(_read(path), path)  # a torn last line (a run in progress, or killed) is left out
    if not any(model.kind == "run" for _, model in records):
        raise ParityError(f"{path}: no 'run' record (the first line of every parity run); is this a parity records file?")
    return records
