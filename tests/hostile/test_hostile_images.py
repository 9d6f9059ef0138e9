"""Hostile images: every mode Pillow reads, constant pictures, damaged files, absurd sizes, FIFOs, devices
and links, globs that would hang or flood. Each case either reads the image at the right scale, warns
that the input is constant, or exits 2 with one message naming the file; nothing is written outside the
output folder, and no check passes on garbage.
"""

from __future__ import annotations

import os
import socket
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from parity.experiment import experiment_from_dict
from parity.inputs import build_inputs
from parity.inputs import images as images_module
from tests.support.hostile_kit import assert_refused, assert_warned, run, with_images

SIDE = 8
RAMP = np.arange(SIDE * SIDE).reshape(SIDE, SIDE)


def _ramp(mode: str) -> Image.Image:
    """An image of `mode` whose values run from the mode's smallest to its largest."""
    if mode == "1":
        return Image.fromarray((RAMP % 2).astype(bool))
    if mode in ("I;16", "I;16B"):
        im = Image.fromarray((RAMP * 65535 // RAMP.max()).astype(np.uint16))
        return im if mode == "I;16" else _sixteen_big(im)
    if mode == "I":
        return Image.fromarray((RAMP * (2**31 - 1) // RAMP.max()).astype(np.int32))
    if mode == "F":
        return Image.fromarray((RAMP / RAMP.max()).astype(np.float32))
    gray = Image.fromarray((RAMP * 255 // RAMP.max()).astype(np.uint8))
    if mode in ("L", "LA", "P"):
        return gray.convert(mode)
    rgb = Image.merge("RGB", [gray, gray.transpose(Image.Transpose.FLIP_LEFT_RIGHT), gray])
    return rgb if mode == "RGB" else rgb.convert(mode)


def _sixteen_big(im: Image.Image) -> Image.Image:
    big = Image.new("I;16B", im.size)
    big.frombytes(np.asarray(im).astype(">u2").tobytes())
    return big


# (mode, file suffix, the range the values must span after reading): each is one way a file holds pixels
ACCEPTED = [
    ("1", ".png", (0.0, 1.0)), ("1", ".bmp", (0.0, 1.0)), ("1", ".tif", (0.0, 1.0)),
    ("L", ".png", (0.0, 1.0)), ("L", ".jpg", (0.0, 1.0)), ("L", ".bmp", (0.0, 1.0)), ("L", ".tif", (0.0, 1.0)),
    ("L", ".webp", (0.0, 1.0)), ("L", ".gif", (0.0, 1.0)),
    ("P", ".png", (0.0, 1.0)), ("P", ".gif", (0.0, 1.0)), ("P", ".bmp", (0.0, 1.0)),
    ("RGB", ".png", (0.0, 1.0)), ("RGB", ".tif", (0.0, 1.0)), ("RGB", ".bmp", (0.0, 1.0)),
    ("RGB", ".webp", (0.0, 1.0)), ("RGBA", ".png", (0.0, 1.0)), ("RGBA", ".tif", (0.0, 1.0)),
    ("RGBA", ".webp", (0.0, 1.0)), ("LA", ".png", (0.0, 1.0)), ("CMYK", ".tif", (0.0, 1.0)),
    ("CMYK", ".jpg", (0.0, 1.0)), ("YCbCr", ".tif", (0.0, 1.0)), ("LAB", ".tif", None),
    ("I;16", ".png", (0.0, 1.0)), ("I;16", ".tif", (0.0, 1.0)), ("I;16B", ".tif", (0.0, 1.0)),
    ("I;16B", ".png", (0.0, 1.0)), ("I", ".tif", (0.0, 1.0)), ("F", ".tif", (0.0, 1.0)),
]


def _write(folder: Path, name: str, im: Image.Image) -> None:
    kwargs = {"quality": 100} if name.endswith((".jpg", ".webp")) else {}
    if name.endswith(".webp"):
        kwargs["lossless"] = True
    im.save(folder / name, **kwargs)


@pytest.mark.parametrize("mode, suffix, span", ACCEPTED, ids=[f"{m}{s}" for m, s, _ in ACCEPTED])
def test_every_mode_is_read_at_its_own_scale(mode, suffix, span, tmp_path):
    """The run goes through without a warning, and the values fill [0, 1] as the file's range does: a
    16-bit ramp read through 8 bits would be all 1.0, an int32 one all 0.0."""
    name = f"ramp{suffix}"
    outcome = run(with_images([name]), setup=lambda work: _write(work, name, _ramp(mode)))
    assert outcome.code == 0, outcome.err
    assert "Traceback" not in outcome.err and not [r for r in outcome.records if r["kind"] == "warning"], outcome.err
    assert outcome.written_outside == []
    _write(tmp_path, name, _ramp(mode))
    data = experiment_from_dict(with_images([name]), "<dict>", tmp_path)
    [x] = build_inputs(data.inputs[0], data).args
    assert x.shape == (1, 3, SIDE, SIDE) and x.dtype == torch.float32
    if span is not None:
        assert float(x.min()) == pytest.approx(span[0], abs=0.02) and float(x.max()) == pytest.approx(span[1], abs=0.02)


CONSTANT = [
    ("L", ".png", lambda: Image.new("L", (SIDE, SIDE), 200)),
    ("RGB", ".jpg", lambda: Image.new("RGB", (SIDE, SIDE), (30, 30, 30))),
    ("1", ".png", lambda: Image.new("1", (SIDE, SIDE), 0)),
    ("I;16", ".png", lambda: Image.fromarray(np.full((SIDE, SIDE), 3000, np.uint16))),
    ("I", ".tif", lambda: Image.fromarray(np.full((SIDE, SIDE), 7, np.int32))),
    ("F", ".tif", lambda: Image.fromarray(np.full((SIDE, SIDE), 0.5, np.float32))),
    ("RGBA", ".png", lambda: Image.new("RGBA", (SIDE, SIDE), (9, 9, 9, 0))),
    ("P", ".gif", lambda: Image.new("P", (SIDE, SIDE), 3)),
]


@pytest.mark.parametrize("mode, suffix, make", CONSTANT, ids=[f"{m}{s}" for m, s, _ in CONSTANT])
def test_a_constant_image_is_warned_about(mode, suffix, make):
    """Every backend agrees on a constant input: the run says so, on stderr and in a warning record."""
    name = f"flat{suffix}"
    outcome = run(with_images([name, "sample:chelsea"], resize=[16, 16]), setup=lambda work: make().save(work / name))
    assert_warned(outcome, f"flat{suffix} (mode {mode}", "every value is")


def test_a_constant_image_among_others_is_named_alone():
    outcome = run(with_images(["flat.png", "sample:coffee"], resize=[16, 16]),
                  setup=lambda work: Image.new("L", (4, 4), 0).save(work / "flat.png"))
    assert_warned(outcome, "flat.png")
    assert sum(r["kind"] == "warning" for r in outcome.records) == 1


OUT_OF_RANGE = [
    ("float-above-one", "F", np.full((SIDE, SIDE), 2.5, np.float32), "mode F (32-bit floats) holds values from 2.5 to 2.5"),
    ("float-negative", "F", (RAMP - 10).astype(np.float32), "holds values from -10"),
    ("float-nan", "F", np.where(RAMP > 3, np.nan, 0.5).astype(np.float32), "NaN or Inf"),
    ("float-inf", "F", np.where(RAMP > 3, np.inf, 0.5).astype(np.float32), "NaN or Inf"),
    ("float-huge", "F", (RAMP * 1e30).astype(np.float32), "must lie in [0, 1]"),
    ("int32-negative", "I", (RAMP - 100).astype(np.int32), "mode I (32-bit integers) holds negative values"),
    ("int32-min", "I", np.full((SIDE, SIDE), -2**31, np.int32), "negative values"),
]


@pytest.mark.parametrize("values, words", [c[2:] for c in OUT_OF_RANGE], ids=[c[0] for c in OUT_OF_RANGE])
def test_values_outside_what_parity_can_scale_are_refused(values, words):
    outcome = run(with_images(["odd.tif"]), setup=lambda work: Image.fromarray(values).save(work / "odd.tif"))
    assert_refused(outcome, "odd.tif", words)


def test_a_mode_parity_cannot_scale_is_refused_naming_it(monkeypatch):
    """Pillow knows more modes than parity scales; one outside MODES is refused by name, at validation."""
    monkeypatch.delitem(images_module.MODES, "LA")
    outcome = run(with_images(["la.png"]), setup=lambda work: _ramp("LA").save(work / "la.png"))
    assert_refused(outcome, "la.png", "mode LA cannot be scaled into [0, 1]", "images[0]")


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _png_header(width: int, height: int, mode_byte: int = 0) -> bytes:
    """A PNG whose header says `width` x `height` and whose pixel data is a few bytes: Pillow reads the
    size without decoding anything, as a hostile file would have it do."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, mode_byte, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(b"\0" * 16)) + _chunk(b"IEND", b"")


SIZES = [  # (id, width, height, preprocess, words)
    ("strip-resized", 100000, 1, {"resize": 256}, "resize [256] would hold 3 x 256 x 25600000"),
    ("column-resized", 1, 100000, {"resize": 256}, "would hold 3 x 25600000 x 256"),
    ("wide-resized", 16384, 4, {"resize": 224}, "resize [224] would hold"),
    ("huge-decoded", 10000, 9000, {}, "the decoded image would hold 3 x 9000 x 10000"),
    ("bomb-decoded", 100000, 100000, {}, "too large to decode"),
    ("exact-resize-huge", 8, 8, {"resize": [16384, 16384]}, "resize [16384, 16384] would hold"),
    ("crop-huge", 8, 8, {"center_crop": [16384, 16000]}, "center_crop [16384, 16000] would hold"),
    ("multiple-after-resize", 20, 10, {"resize": [10000, 9000], "resize_multiple": 16384}, "would hold"),
]


@pytest.mark.parametrize("width, height, pre, words", [c[1:] for c in SIZES], ids=[c[0] for c in SIZES])
def test_sizes_are_bounded_before_anything_is_decoded(width, height, pre, words):
    """The header alone says how much memory decoding and each preprocessing step would need; beyond the
    bound it is exit 2 with the file and the size (a 1 x 100000 strip resized to 256 asked for 78 GB)."""
    outcome = run(with_images(["big.png"], **pre), setup=lambda work: (work / "big.png").write_bytes(_png_header(width, height)))
    assert_refused(outcome, "big.png", words)


def test_images_together_are_bounded(monkeypatch):
    """Each image fits, the two together do not: the second is refused before it is decoded."""
    monkeypatch.setattr(images_module, "MAX_ELEMENTS", 3 * SIDE * SIDE + 10)
    outcome = run(with_images(["a.png", "b.png"]), setup=lambda w: (_ramp("L").save(w / "a.png"), _ramp("L").save(w / "b.png")))
    assert_refused(outcome, "b.png: the input set's images would hold 384 values")


DAMAGED = [
    ("random-bytes", "noise.png", os.urandom(64)),
    ("empty", "empty.png", b""),
    ("text-as-jpeg", "notes.jpg", b"this is not a picture\n" * 10),
    ("truncated-png", "cut.png", None),
    ("header-only-png", "bare.png", _png_header(8, 8)),
    ("zip-as-png", "archive.png", b"PK\x03\x04" + b"\0" * 60),
    ("gif-signature-only", "sig.gif", b"GIF89a"),
    ("tiff-signature-only", "sig.tif", b"II*\x00\x08\x00\x00\x00"),
    ("bmp-signature-only", "sig.bmp", b"BM" + b"\0" * 10),
    ("png-bad-mode", "mode.png", _png_header(8, 8, mode_byte=7)),
]


def _truncated_png(work: Path) -> bytes:
    _ramp("RGB").resize((64, 64)).save(work / "full.png")
    data = (work / "full.png").read_bytes()
    (work / "full.png").unlink()
    return data[: len(data) // 2]


@pytest.mark.parametrize("name, data", [c[1:] for c in DAMAGED], ids=[c[0] for c in DAMAGED])
def test_damaged_files_are_refused_by_name(name, data):
    def setup(work: Path) -> None:
        (work / name).write_bytes(data if data is not None else _truncated_png(work))

    outcome = run(with_images([name]), setup=setup)
    assert_refused(outcome, name)


def _fifo(work: Path, name: str = "pipe.png") -> None:
    os.mkfifo(work / name)


def _socket(work: Path) -> None:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(work / "sock.png"))
    sock.close()


NOT_FILES = [  # (id, the images: entry, setup, words): a literal path that is not a regular file
    ("fifo", "pipe.png", _fifo, "pipe.png: is a FIFO (named pipe), not a file"),
    ("link-to-fifo", "link.png", lambda w: (_fifo(w), os.symlink(w / "pipe.png", w / "link.png")), "is a FIFO"),
    ("dev-zero", "/dev/zero", None, "/dev/zero: is a character device, not a file"),
    ("link-to-dev-zero", "zero.png", lambda w: os.symlink("/dev/zero", w / "zero.png"), "zero.png: is a character device"),
    ("link-to-dev-null", "null.jpg", lambda w: os.symlink("/dev/null", w / "null.jpg"), "is a character device"),
    ("link-to-dev-urandom", "r.png", lambda w: os.symlink("/dev/urandom", w / "r.png"), "is a character device"),
    ("socket", "sock.png", _socket, "sock.png: is a socket, not a file"),
    ("folder", "pics.png", lambda w: (w / "pics.png").mkdir(), "pics.png: is a folder, not a file"),
    ("dangling-link", "gone.png", lambda w: os.symlink(w / "nowhere.png", w / "gone.png"), "which does not exist"),
    ("missing", "missing.png", None, "image not found"),
    ("link-loop", "loop.png", lambda w: os.symlink(w / "loop.png", w / "loop.png"), "loop.png: cannot be read"),
]


@pytest.mark.parametrize("ref, setup, words", [c[1:] for c in NOT_FILES], ids=[c[0] for c in NOT_FILES])
@pytest.mark.parametrize("verb", ["run", "validate"])
def test_a_path_that_is_not_a_file_is_named_for_what_it_is(ref, setup, words, verb):
    """Opening a FIFO would wait for ever and reading a device would never end: both are refused by
    what they are, never called "not found", in `validate` as in `run`."""
    outcome = run(with_images([ref]), setup=setup, verb=verb)
    assert_refused(outcome, words)
    if "not found" not in words:
        assert "not found" not in outcome.err


def _mixed_folder(work: Path) -> None:
    (work / "pics").mkdir()
    _ramp("RGB").save(work / "pics" / "a.png")
    _fifo(work / "pics", "b.png")
    os.symlink("/dev/zero", work / "pics" / "c.png")
    _ramp("L").save(work / "pics" / "d.png")
    (work / "pics" / "e.png").mkdir()


@pytest.mark.parametrize("pattern", ["pics/*.png", "pics/*", "**/*.png", "pics/[a-e].png", "pics/?.png"])
def test_globs_skip_what_is_not_a_regular_file(pattern):
    """The FIFO, the link to /dev/zero and the folder are passed over; the two pictures are read."""
    outcome = run(with_images([pattern], resize=[8, 8]), setup=_mixed_folder)
    assert outcome.code == 0, outcome.err
    assert outcome.written_outside == []
    [model_record] = [r for r in outcome.records if r["kind"] == "model"]
    assert model_record


def test_a_glob_that_matches_only_a_fifo_matches_nothing():
    outcome = run(with_images(["pipes/*.png"]), setup=lambda w: ((w / "pipes").mkdir(), _fifo(w / "pipes")))
    assert_refused(outcome, "no image matches 'pipes/*.png'")


def _many(work: Path, count: int = 30) -> None:
    (work / "many" / "deep").mkdir(parents=True)
    for i in range(count):
        _ramp("L").save(work / "many" / "deep" / f"{i:03d}.png")


BOUNDS = [  # (id, the bound to lower, its value, pattern, words)
    ("entries", "MAX_GLOB_ENTRIES", 10, "many/**/*.png", "looked at more than 10 entries"),
    ("seconds", "MAX_GLOB_SECONDS", 0.0, "many/**/*.png", "for more than 0 s"),
    ("matches", "MAX_IMAGES", 5, "many/deep/*.png", "matches 30 images; an input set holds at most 5"),
    ("listed", "MAX_IMAGES", 5, "many/deep/0[0-2]?.png", "holds at most 5"),
]


@pytest.mark.parametrize("bound, value, pattern, words", [c[1:] for c in BOUNDS], ids=[c[0] for c in BOUNDS])
def test_globs_are_bounded_in_entries_time_and_matches(bound, value, pattern, words, monkeypatch):
    """`/proc/**/*.png` kept validate busy for minutes: a walk stops at its bound with exit 2."""
    monkeypatch.setattr(images_module, bound, value)
    outcome = run(with_images([pattern]), setup=_many)
    assert_refused(outcome, words)


def test_a_link_loop_under_a_double_star_ends():
    def setup(work: Path) -> None:
        (work / "tree" / "sub").mkdir(parents=True)
        os.symlink(work / "tree", work / "tree" / "sub" / "back")
        _ramp("RGB").save(work / "tree" / "sub" / "x.png")

    outcome = run(with_images(["tree/**/*.png"]), setup=setup)
    assert outcome.code == 0, outcome.err
    assert outcome.written_outside == []


def test_proc_is_walked_within_the_bound():
    """The case the issue names: whatever /proc holds here, the walk ends quickly with exit 2."""
    outcome = run(with_images(["/proc/**/*.png"]), verb="validate")
    assert_refused(outcome, "/proc/**/*.png")
