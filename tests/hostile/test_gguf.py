"""Hostile GGUF files: a header that lies is exit 2 in one line naming the file, before any library reads it,
nothing allocated from what it claims and nothing written outside the output folder (issue 42's GGUF surface).

Each case is a `source: gguf` model on a constructed file; the header check (parity.gguf) needs neither
transformers' GGUF support nor llama.cpp, so the corpus runs everywhere.
"""

from __future__ import annotations

import os
import resource
import struct

import pytest

from tests.fixtures.gguf_files import (
    ARRAY,
    STRING,
    U32,
    header,
    kv,
    small_file,
    string,
    tensor_info,
)
from tests.hostile.test_hostile import VALID, assert_rejected, run_cli

NEAR_2_63 = (1 << 63) - 1
ARCH = kv("general.architecture", STRING, "llama")


def _experiment(path: str = "m.gguf", tokenizer: str | None = None) -> dict:
    exp = {**VALID, "models": [{"name": "lm", "source": "gguf", "path": path}]}
    if tokenizer is not None:
        exp = {**VALID, "inputs": [{"name": "t", "text": ["hello"], "tokenizer": tokenizer}]}
    return exp


def _lying_string_value() -> bytes:
    return string("general.name") + struct.pack("<I", STRING) + struct.pack("<Q", NEAR_2_63) + b"x"


def _lying_array() -> bytes:
    return string("tokenizer.ggml.scores") + struct.pack("<IIQ", ARRAY, 6, NEAR_2_63 // 4)


CASES = {  # id: (file bytes, words the message holds)
    "bad-magic": (b"GGML" + small_file()[4:], "not a GGUF file"),
    "empty": (b"", "not a GGUF file"),
    "version-1": (small_file(version=1), "version 1"),
    "version-huge": (small_file(version=0xFFFFFFFF), "version 4294967295"),
    "tensor-count-2^63": (small_file(tensor_count=NEAR_2_63), "tensor count is 9223372036854775807"),
    "kv-count-2^63": (small_file(kv_count=NEAR_2_63), "key-value count is 9223372036854775807"),
    "key-length-2^63": (small_file([string("k", NEAR_2_63)]), "length of key 0"),
    "string-length-2^63": (small_file([ARCH, _lying_string_value()]), "length of general.name"),
    "array-count-2^61": (small_file([ARCH, _lying_array()]), "element count of tokenizer.ggml.scores"),
    "unknown-value-type": (small_file([ARCH, string("x") + struct.pack("<I", 13) + b"\0" * 8]), "unknown value type 13"),
    "unknown-element-type": (small_file([ARCH, string("x") + struct.pack("<IIQ", ARRAY, 77, 1)]), "unknown element type 77"),
    "nested-arrays": (small_file([ARCH, kv("x", ARRAY, (ARRAY, [(ARRAY, [(U32, [1])])]))]), "nested deeper"),
    "key-not-utf8": (small_file([ARCH, kv(b"\xff\xfe", U32, 1)]), "not UTF-8"),
    "duplicate-key": (small_file([ARCH, ARCH]), "appears twice"),
    "unknown-ggml-type": (small_file(infos=[tensor_info("w", (16,), ggml_type=99)]), "unknown ggml type 99"),
    "five-dims": (small_file(infos=[tensor_info("w", (1, 1, 1, 1, 16))]), "5 dimensions"),
    "zero-dims": (small_file(infos=[tensor_info("w", ())]), "0 dimensions"),
    "empty-dimension": (small_file(infos=[tensor_info("w", (16, 0))]), "empty dimension"),
    "dims-product-huge": (small_file(infos=[tensor_info("w", (1 << 40, 1 << 40))]), "larger than the whole file"),
    "offset-past-end": (small_file(infos=[tensor_info("w", (16,), offset=1 << 20)]), "past the end of the file"),
    "offset-2^63": (small_file(infos=[tensor_info("w", (16,), offset=NEAR_2_63 + 1)]), "past the end of the file"),
    "data-truncated": (small_file(data=16), "past the end of the file"),
    "misaligned-offset": (small_file(infos=[tensor_info("w", (4,), offset=4)]), "not a multiple of the alignment"),
    "overlapping": (small_file(infos=[tensor_info("a", (16,)), tensor_info("b", (16,), offset=32)], data=128),
                    "overlap"),
    "duplicate-tensor": (small_file(infos=[tensor_info("w", (8,)), tensor_info("w", (8,), offset=32)]), "appears twice"),
    "block-misfit": (small_file(infos=[tensor_info("w", (30,), ggml_type=2)]), "not a multiple of Q4_0's block"),
    "alignment-not-power": (small_file([ARCH, kv("general.alignment", U32, 24)]), "not a power of two"),
    "alignment-zero": (small_file([ARCH, kv("general.alignment", U32, 0)]), "not a power of two"),
    "vocabulary-duplicate": (small_file([ARCH, kv("tokenizer.ggml.tokens", ARRAY, (STRING, ["a", "b", "a"]))]),
                             "listed twice"),
    "vocabulary-not-strings": (small_file([ARCH, kv("tokenizer.ggml.tokens", ARRAY, (U32, [1, 2]))]),
                               "not an array of strings"),
    "header-truncated": (small_file()[:30], "bytes left"),
    "tensor-info-truncated": (header([ARCH], [tensor_info("w", (16,))])[:-6], "truncated"),
}


@pytest.mark.parametrize("data, words", CASES.values(), ids=list(CASES))
def test_a_lying_header_is_one_line_exit_2(data, words):
    outcome = run_cli(_experiment(), files={"m.gguf": data})
    assert_rejected(outcome, words, lines=1)
    assert "m.gguf" in outcome.err


def test_the_well_formed_file_passes_the_check(tmp_path):
    """The base every case breaks is itself accepted: the corpus proves the checks, not a reader that refuses all."""
    from parity.gguf import read_header

    path = tmp_path / "m.gguf"
    path.write_bytes(small_file([ARCH, kv("tokenizer.ggml.tokens", ARRAY, (STRING, ["a", "b"]))]))
    found = read_header(path)
    assert (found.architecture, found.vocabulary, [t.name for t in found.tensors]) == ("llama", 2, ["w"])


def test_nothing_is_allocated_from_a_claimed_length(tmp_path):
    """A claimed length of 2^62 is refused before it is read: the process's memory limit would fail a read of it."""
    from parity.errors import ParityError
    from parity.gguf import read_header

    path = tmp_path / "m.gguf"
    path.write_bytes(small_file([ARCH, string("general.name") + struct.pack("<IQ", STRING, 1 << 62)]))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with pytest.raises(ParityError, match="more than the"):
        resource.setrlimit(resource.RLIMIT_AS, (min(hard, 1 << 36) if hard != resource.RLIM_INFINITY else 1 << 36, hard))
        try:
            read_header(path)
        finally:
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def test_a_fifo_is_refused_by_name_unopened():
    outcome = run_cli(_experiment("pipe.gguf"), files={})
    assert_rejected(outcome, "not found", lines=1)  # the base: no file at all
    import tempfile
    from pathlib import Path

    folder = Path(tempfile.mkdtemp())
    fifo = folder / "pipe.gguf"
    os.mkfifo(fifo)
    try:
        outcome = run_cli(_experiment(str(fifo)))
        assert_rejected(outcome, "FIFO", lines=1)
    finally:
        fifo.unlink()
        folder.rmdir()


def test_a_device_or_a_folder_is_refused_by_name():
    assert_rejected(run_cli(_experiment("/dev/zero")), "character device", lines=1)
    outcome = run_cli(_experiment("sub.gguf"), files={"sub.gguf/x": b""})
    assert_rejected(outcome, "a folder", lines=1)


def test_another_suffix_is_refused():
    assert_rejected(run_cli(_experiment("m.bin"), files={"m.bin": small_file()}), "expected a .gguf file", lines=1)


def test_a_gguf_tokenizer_is_checked_the_same_way():
    outcome = run_cli(_experiment(tokenizer="t.gguf"), files={"t.gguf": small_file(tensor_count=NEAR_2_63)})
    assert_rejected(outcome, "tensor count", lines=1)


def test_a_package_path_cannot_leave_its_package():
    outcome = run_cli(_experiment("pkg://parity/../../../etc/passwd.gguf"))
    assert_rejected(outcome, "leaves package", lines=1)
    assert_rejected(run_cli(_experiment("pkg://no_such_package_here/m.gguf")), "no installed package", lines=1)


def test_a_duplicated_token_is_refused_by_the_header_check_itself(tmp_path):
    """llama.cpp aborts the whole process on a vocabulary that lists a token twice: parity's own check says so
    first, naming the token (without this check transformers goes on to read the file)."""
    from parity.errors import ParityError
    from parity.gguf import read_header

    path = tmp_path / "m.gguf"
    path.write_bytes(small_file([ARCH, kv("tokenizer.ggml.tokens", ARRAY, (STRING, ["a", "b", "a"]))]))
    with pytest.raises(ParityError, match=r"token 2 b'a' is listed twice"):
        read_header(path)
