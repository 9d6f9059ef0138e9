"""Audio input sets (inputs/audio.py): PCM WAV files read by their header's rate, width and channels, scaled
into [-1, 1], cut or padded to one length; everything else refused with the file named, before any sample."""

from __future__ import annotations

import os
import struct
import wave

import numpy as np
import pytest
import torch

from parity.cli import main
from parity.errors import ParityError
from parity.experiment import experiment_from_dict
from parity.inputs import build_inputs
from tests.support import tiny_experiment


def write_wav(path, samples, rate=16000, width=2, channels=1):
    """A PCM WAV of `samples` (integers at `width` bytes, interleaved when `channels` > 1)."""
    values = np.asarray(samples, dtype=np.int64)
    if width == 1:
        data = (values + 128).astype(np.uint8).tobytes()
    elif width == 3:
        data = b"".join(int(v & 0xFFFFFF).to_bytes(3, "little") for v in values)
    else:
        data = values.astype(f"<i{width}").tobytes()
    with wave.open(str(path), "wb") as out:
        out.setnchannels(channels), out.setsampwidth(width), out.setframerate(rate)
        out.writeframes(data)
    return path


def experiment(tmp_path, files, **keys):
    data = tiny_experiment([{"backend": "torchscript"}])
    data["inputs"] = [{"name": "speech", "audio": [str(f) for f in files], "sample_rate": 16000, **keys}]
    return experiment_from_dict(data, "<dict>", tmp_path)


def clips(tmp_path, files, **keys):
    exp = experiment(tmp_path, files, **keys)
    return build_inputs(exp.inputs[0], exp)


@pytest.mark.parametrize("width, full", [(1, 128), (2, 32768), (3, 8388608), (4, 2147483648)])
def test_each_pcm_width_is_scaled_by_its_range(tmp_path, width, full):
    values = [0, full // 2, -full // 2, full - 1, -full]
    [x] = clips(tmp_path, [write_wav(tmp_path / "a.wav", values, width=width)]).args
    assert x.dtype == torch.float32 and x.shape == (1, 5)
    torch.testing.assert_close(x[0], torch.tensor([0.0, 0.5, -0.5, (full - 1) / full, -1.0]))


def test_channels_are_averaged_to_mono_and_clips_cut_or_padded_to_one_length(tmp_path):
    stereo = write_wav(tmp_path / "stereo.wav", [16384, 0, -16384, -16384, 8192, 8192], channels=2)  # 3 frames
    mono = write_wav(tmp_path / "mono.wav", [1000, 2000, 3000, 4000, 5000])
    [x] = clips(tmp_path, [stereo, mono]).args  # without `samples`: the shortest clip's length
    torch.testing.assert_close(x, torch.tensor([[0.25, -0.5, 0.25], [1000 / 32768, 2000 / 32768, 3000 / 32768]]))
    [x] = clips(tmp_path, [stereo, mono], samples=4).args
    assert x.shape == (2, 4) and float(x[0, 3]) == 0.0 and float(x[1, 3]) == 4000 / 32768  # silence padded at the end


def test_a_rate_other_than_the_sample_rate_is_refused_at_validate(tmp_path, capsys):
    write_wav(tmp_path / "fast.wav", [1, 2, 3], rate=22050)
    (tmp_path / "exp.yaml").write_text(
        "name: a\nmodels: [{name: m, source: python, entry: 'tests.fixtures.tiny:tiny_cnn'}]\n"
        "inputs: [{name: speech, audio: [fast.wav], sample_rate: 16000}]\ntargets: [{backend: torchscript}]\n")
    assert main(["validate", str(tmp_path / "exp.yaml")]) == 2
    err = capsys.readouterr().err
    assert "fast.wav: 22050 Hz" in err and "does not resample" in err and "Traceback" not in err


def test_what_is_not_integer_pcm_is_refused_with_the_file(tmp_path):
    header = b"RIFF" + struct.pack("<I", 36 + 8) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 3, 1, 16000, 64000, 4, 32)
    (tmp_path / "float.wav").write_bytes(header + b"data" + struct.pack("<I", 8) + struct.pack("<2f", 0.5, -0.5))
    (tmp_path / "text.wav").write_text("not audio")
    for name in ("float.wav", "text.wav"):
        with pytest.raises(ParityError, match=f"{name}: not a PCM WAV file"):
            clips(tmp_path, [tmp_path / name])


def test_a_file_shorter_than_its_header_says_is_refused(tmp_path):
    path = write_wav(tmp_path / "cut.wav", list(range(100)))
    path.write_bytes(path.read_bytes()[:-10])  # less than the header: only the read finds it short
    with pytest.raises(ParityError, match="promises 100 frames, and the file ends after 95"):
        clips(tmp_path, [path])


def test_a_fifo_or_a_missing_file_is_named_for_what_it_is(tmp_path):
    os.mkfifo(tmp_path / "pipe.wav")
    with pytest.raises(ParityError, match="pipe.wav: is a FIFO"):
        clips(tmp_path, [tmp_path / "pipe.wav"])
    with pytest.raises(ParityError, match="audio file not found"):
        clips(tmp_path, [tmp_path / "missing.wav"])


def test_a_constant_clip_is_read_and_warned_about(tmp_path):
    inputs = clips(tmp_path, [write_wav(tmp_path / "silence.wav", [0] * 64)])
    assert any("silence.wav: every sample is 0" in note for note in inputs.notes)


def test_the_keys_go_together(tmp_path):
    data = tiny_experiment([{"backend": "torchscript"}])
    for spec, message in (({"audio": ["a.wav"]}, "'audio' needs 'sample_rate'"),
                          ({"synthetic": {"shape": [2]}, "sample_rate": 16000}, "'audio' needs 'sample_rate'"),
                          ({"synthetic": {"shape": [2]}, "samples": 4}, "'samples' is for 'audio' only"),
                          ({"audio": ["a.wav"], "images": ["b.png"], "sample_rate": 8000}, "exactly one of")):
        data["inputs"] = [{"name": "x", **spec}]
        with pytest.raises(ParityError, match=message):
            experiment_from_dict(data, "<dict>", tmp_path)


def test_a_header_that_promises_far_more_than_the_file_holds_is_refused_at_validate(tmp_path, capsys):
    """134 million frames promised, 50 held: before, `parity validate` passed it."""
    path = write_wav(tmp_path / "liar.wav", list(range(50)))
    data = bytearray(path.read_bytes())
    data[40:44] = struct.pack("<I", 134_000_000 * 2)  # the data chunk's size, in bytes
    path.write_bytes(bytes(data))
    exp_file = tmp_path / "exp.yaml"
    import yaml

    spec = tiny_experiment([{"backend": "torchscript"}])
    spec["inputs"] = [{"name": "speech", "audio": [str(path)], "sample_rate": 16000}]
    exp_file.write_text(yaml.safe_dump(spec))
    assert main(["validate", str(exp_file)]) == 2
    err = capsys.readouterr().err
    assert "liar.wav: its header promises 134000000 frames" in err and "holds 144 bytes" in err, err
