"""Audio clips from PCM WAV files: float32 in [-1, 1], mono, one clip per file, stacked into (clips, samples).

Each file's header is read before any sample. Its rate must be the input set's `sample_rate`: parity does
not resample, and a clip read at another rate is another sound, on which every backend may still agree.
Integer PCM only (8-bit unsigned, 16, 24 and 32-bit signed), each scaled by its range; anything else (a
float or compressed WAV, which Python's `wave` does not read) is refused with the file, since read as
integers it would be noise. Channels are averaged to mono. Each clip is cut to `samples` from its start or
padded with silence at its end; without `samples`, to the shortest clip's length, so that none is padded.
A clip and every input set hold at most `MAX_ELEMENTS` samples, checked from the headers; a header that
promises more samples than the file's size can hold is refused at validate. A clip whose
samples are all the same is warned about, as a constant image is: every backend agrees on it.
"""

from __future__ import annotations

import os
import wave
from pathlib import Path

import numpy as np
import torch

from parity.config.schema import MAX_ELEMENTS
from parity.errors import ParityError
from parity.files import file_problem

SCALES = {1: 128.0, 2: 32768.0, 3: 8388608.0, 4: 2147483648.0}  # bytes per sample -> full scale


def _header(path: Path, sample_rate: int) -> wave.Wave_read:
    problem = file_problem(path, "audio file")
    if problem:
        raise ParityError(problem)
    try:
        clip = wave.open(str(path), "rb")
    except (wave.Error, EOFError) as exc:
        raise ParityError(f"audio file {path}: not a PCM WAV file parity reads ({exc}); convert it to "
                          "integer PCM WAV") from None
    except OSError as exc:
        raise ParityError(f"audio file {path}: cannot be read ({exc.strerror or exc})") from None
    if clip.getframerate() != sample_rate:
        clip.close()
        raise ParityError(f"audio file {path}: {clip.getframerate()} Hz, and the input set's sample_rate is "
                          f"{sample_rate} (parity does not resample: resample the file, or set sample_rate)")
    if clip.getsampwidth() not in SCALES or clip.getnchannels() < 1:
        clip.close()
        raise ParityError(f"audio file {path}: {clip.getsampwidth()} bytes per sample is not a PCM width parity reads")
    if clip.getnframes() * clip.getnchannels() > MAX_ELEMENTS:
        clip.close()
        raise ParityError(f"audio file {path}: {clip.getnframes()} frames of {clip.getnchannels()} channels, more "
                          f"than parity reads ({MAX_ELEMENTS} samples)")
    promised = clip.getnframes() * clip.getsampwidth() * clip.getnchannels()
    size = os.stat(path).st_size
    if size < promised:  # checked at validate from the file's size; a file cut by less than its header, at the read
        clip.close()
        raise ParityError(f"audio file {path}: its header promises {clip.getnframes()} frames ({promised} bytes of "
                          f"samples), and the whole file holds {size} bytes")
    return clip


def _samples(clip: wave.Wave_read, frames: int, path: Path) -> torch.Tensor:
    """The first `frames` frames, mono, in [-1, 1]."""
    width, channels = clip.getsampwidth(), clip.getnchannels()
    data = clip.readframes(frames)
    if len(data) < frames * width * channels:
        raise ParityError(f"audio file {path}: its header promises {clip.getnframes()} frames, and the file ends "
                          f"after {len(data) // (width * channels)}")
    raw = np.frombuffer(data, dtype=np.uint8)
    if width == 1:
        values = raw.astype(np.float64) - 128.0  # 8-bit WAV is unsigned
    elif width == 3:
        triples = raw.reshape(-1, 3).astype(np.int32)
        values = (triples[:, 0] | (triples[:, 1] << 8) | (triples[:, 2] << 16)).astype(np.float64)
        values[values >= 2**23] -= 2**24
    else:
        values = np.frombuffer(data, dtype=f"<i{width}").astype(np.float64)
    mono = values.reshape(-1, channels).mean(axis=1) / SCALES[width]
    return torch.from_numpy(mono.astype(np.float32))


def load_audio(files: list[Path], sample_rate: int, samples: int | None) -> tuple[torch.Tensor, list[str]]:
    """The clips as one (clips, samples) float32 tensor, and notes on clips that came out constant."""
    clips: list[wave.Wave_read] = []
    try:
        for path in files:
            clips.append(_header(path, sample_rate))
        length = samples if samples is not None else min(c.getnframes() for c in clips)
        if length == 0:
            raise ParityError(f"audio file {files[[c.getnframes() for c in clips].index(0)]}: holds no samples")
        if length * len(clips) > MAX_ELEMENTS:
            raise ParityError(f"the clips hold {length * len(clips)} samples together, more than parity builds "
                              f"({MAX_ELEMENTS} per input set)")
        rows, notes = [], []
        for path, clip in zip(files, clips, strict=True):
            row = _samples(clip, min(length, clip.getnframes()), path)
            if len(row) and bool((row == row[0]).all()):
                notes.append(f"audio file {path}: every sample is {float(row[0]):g} (a constant clip: every backend "
                             "agrees on it)")
            rows.append(torch.nn.functional.pad(row, (0, length - len(row))))
    finally:
        for clip in clips:
            clip.close()
    return torch.stack(rows), notes


def audio_problem(path: Path, sample_rate: int) -> str | None:
    """What `parity validate` says of one `audio:` file, from its header alone."""
    try:
        _header(path, sample_rate).close()
    except ParityError as exc:
        return exc.problems[0]
    return None
