"""study/trained_models.py: the trained models whose weights ship in their wheels. Each entry builds from the
installed package's own files, runs, and is deterministic; a missing package is a clear error with the pip
line. The tests that need a package skip (the pip line as the reason) where it is not installed: `make
study-deps` installs them all."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from parity.cli import main
from parity.errors import ParityError
from parity.experiment import experiment_from_dict
from parity.runner.prepared import build_model_or_explain

STUDY = Path(__file__).resolve().parents[2] / "study"


def _load_study_module():
    spec = importlib.util.spec_from_file_location("study_trained_models", STUDY / "trained_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tm = _load_study_module()
ENTRIES = {"mtcnn_pnet": "facenet_pytorch", "mtcnn_rnet": "facenet_pytorch", "mtcnn_onet": "facenet_pytorch",
           "silero_vad": "silero_vad", "resemblyzer": "resemblyzer", "nudenet_yolov8n": "nudenet",
           "nudenet_detector": "nudenet"}


def needs(package: str):
    """Skip unless `package` is installed (found, not imported), with the line that installs it."""
    return pytest.mark.skipif(importlib.util.find_spec(package) is None, reason=tm.PIP_LINES[package])


def face(name: str, side: int) -> torch.Tensor:
    """A face crop of study/faces as MTCNN normalizes it: (1, 3, side, side), (p - 127.5) / 128."""
    image = Image.open(STUDY / "faces" / f"{name}_face.png").convert("RGB").resize((side, side), Image.BILINEAR)
    pixels = torch.tensor(np.asarray(image), dtype=torch.float32).permute(2, 0, 1)[None]
    return (pixels - 127.5) / 128


def audio(samples: int) -> torch.Tensor:
    """Seeded white noise at -30 dBFS, as study/trained.yaml's `audio` input set."""
    return (torch.rand(2, samples, generator=torch.Generator().manual_seed(0)) - 0.5) * 0.11


def test_the_study_file_is_valid_without_the_packages(capsys):
    """`parity validate` imports each entry's module (not the packages) and finds the face crops and the speech clips."""
    assert main(["validate", str(STUDY / "trained.yaml")]) == 0
    assert "valid (9 model(s), 7 input set(s), 6 target(s))" in capsys.readouterr().out


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_a_missing_package_names_the_pip_line(entry, monkeypatch):
    """No package needed: a None in sys.modules is a package Python cannot find."""
    package = ENTRIES[entry]
    monkeypatch.setitem(sys.modules, package, None)
    with pytest.raises(ImportError, match=rf"needs the package '{package}', which is not installed: pip install "
                                          rf"--no-deps {package.replace('_', '-')}=="):
        getattr(tm, entry)()


def test_parity_reports_the_missing_package_as_a_build_error(monkeypatch):
    """Through parity's python source, from the experiment file's folder: one message naming the model and
    the pip line (exit 2 at the command line), not a traceback."""
    monkeypatch.setitem(sys.modules, "silero_vad", None)
    monkeypatch.delitem(sys.modules, "trained_models", raising=False)
    exp = experiment_from_dict({"name": "t", "models": [{"name": "vad", "source": "python",
                                                          "entry": "trained_models:silero_vad"}],
                                "inputs": [{"name": "a", "synthetic": {"shape": [1, 512]}}],
                                "targets": [{"backend": "torchscript"}]}, "<dict>", STUDY)
    with pytest.raises(ParityError, match="model 'vad': building it failed: ImportError: .*pip install --no-deps "
                                          "silero-vad=="):
        build_model_or_explain(exp.models[0], exp)


def test_installed_but_without_its_weights_file_says_so(tmp_path, monkeypatch):
    (tmp_path / "silero_vad").mkdir()
    (tmp_path / "silero_vad" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "silero_vad", raising=False)
    with pytest.raises(ImportError, match=r"'silero_vad' is installed but has no data/silero_vad.jit .* reinstall"):
        tm.silero_vad()


# Librosa's mel filters for Resemblyzer's settings (sr 16000, n_fft 400, 40 mels, Slaney scale and norm): the
# sum of each filter over the 201 FFT bins, from transformers 5.24's audio_utils.mel_filter_bank (which
# follows librosa), rounded to 12 digits. They fix every filter edge and the area normalization.
LIBROSA_MEL_ROW_SUMS = [
    0.024809041571, 0.024809041571, 0.024809041571, 0.024809041571, 0.024809041571, 0.025734475041,
    0.025071557078, 0.024809041571, 0.024809041571, 0.024809041571, 0.024809041571, 0.025471959533,
    0.025255345941, 0.024641206646, 0.024681732171, 0.025868205447, 0.024183972548, 0.025566428464,
    0.024776214029, 0.024855843281, 0.025219751537, 0.024745281875, 0.025168017884, 0.025108877594,
    0.024789421879, 0.025108658572, 0.025034622787, 0.024953063481, 0.024966712361, 0.025048886378,
    0.024935600315, 0.025035194234, 0.025049033418, 0.024942260918, 0.02501707655, 0.025011998367,
    0.024986582468, 0.024996232877, 0.025012804695, 0.024978756603]
LIBROSA_MEL_PEAK_BINS = [2, 4, 6, 7, 9, 11, 13, 15, 17, 18, 20, 22, 24, 26, 28, 30, 32, 35, 38, 41, 44, 47, 51, 55,
                         59, 64, 69, 75, 80, 87, 94, 101, 109, 118, 127, 137, 148, 159, 172, 185]


def test_mel_filters_are_librosas():
    filters = tm.slaney_mel_filters(16000, 400, 40)
    assert filters.shape == (40, 201)
    np.testing.assert_allclose(filters.sum(axis=1), LIBROSA_MEL_ROW_SUMS, rtol=0, atol=1e-11)
    assert filters.argmax(axis=1).tolist() == LIBROSA_MEL_PEAK_BINS


def test_mel_frames_are_the_power_spectrogram_through_the_filters():
    """The conv STFT against numpy's rfft of the same zero-padded, Hann-windowed frames (float64)."""
    signal = audio(3200)[0]
    frames = tm.MelFrames()(signal[None])[0].double().numpy()
    padded = np.pad(signal.double().numpy(), 200)
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(400) / 400)
    starts = range(0, len(padded) - 400 + 1, 160)
    power = np.abs(np.fft.rfft(np.stack([padded[s:s + 400] * window for s in starts]), axis=1)) ** 2
    expected = power @ tm.slaney_mel_filters(16000, 400, 40).T
    assert frames.shape == expected.shape == (1 + 3200 // 160, 40)
    np.testing.assert_allclose(frames, expected, rtol=1e-4, atol=1e-6 * expected.max())


def assert_deterministic(build, example):
    """Two builds hold the same weights, and two forwards of one give bit-identical outputs."""
    a, b = build(), build()
    assert not a.training
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name
    with torch.no_grad():
        first, second = a(example), a(example)
    first = first if isinstance(first, tuple) else (first,)
    second = second if isinstance(second, tuple) else (second,)
    for x, y in zip(first, second, strict=True):
        assert torch.isfinite(x).all() and torch.equal(x, y)
    return first


@needs("facenet_pytorch")
@pytest.mark.numerics
def test_mtcnn_stages_find_the_faces_in_their_crops():
    """The trained weights, not an init: every stage calls both crops faces (probability > 0.9)."""
    pnet_boxes, pnet_prob = assert_deterministic(tm.mtcnn_pnet, torch.cat([face("astronaut", 12),
                                                                            face("camera", 12)]))
    assert pnet_boxes.shape == (2, 4, 1, 1) and (pnet_prob[:, 1] > 0.9).all()
    rnet_boxes, rnet_prob = assert_deterministic(tm.mtcnn_rnet, torch.cat([face("astronaut", 24),
                                                                            face("camera", 24)]))
    assert rnet_boxes.shape == (2, 4) and (rnet_prob[:, 1] > 0.9).all()
    onet_boxes, landmarks, onet_prob = assert_deterministic(tm.mtcnn_onet, face("astronaut", 48))
    assert landmarks.shape == (1, 10) and onet_prob[0, 1] > 0.9


@needs("facenet_pytorch")
def test_facenet_installed_without_what_it_imports_says_so(monkeypatch):
    """Installed with --no-deps, facenet-pytorch's __init__ still imports requests: a clear message, not the
    bare ModuleNotFoundError."""
    for name in [m for m in sys.modules if m == "facenet_pytorch" or m.startswith("facenet_pytorch.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "requests", None)
    with pytest.raises(ImportError, match="facenet_pytorch is installed but importing it failed: .*pip install "
                                          "requests"):
        tm.mtcnn_rnet()


@needs("silero_vad")
@pytest.mark.numerics
def test_silero_port_gives_the_packages_torchscript_outputs():
    """The port, run over a clip, against the package's own stateful TorchScript module fed chunk by chunk."""
    clip = audio(4 * 512)
    probabilities = assert_deterministic(tm.silero_vad, clip)[0]
    assert probabilities.shape == (2, 4)
    scripted = torch.jit.load(str(tm.package_file("silero_vad", "data/silero_vad.jit")))
    scripted.reset_states()
    with torch.no_grad():
        expected = torch.cat([scripted(clip[:, i:i + 512], 16000) for i in range(0, clip.shape[1], 512)], dim=1)
    torch.testing.assert_close(probabilities, expected, rtol=0, atol=1e-6)


def test_silero_refuses_a_clip_of_partial_chunks():
    with pytest.raises(ValueError, match="not a multiple of 512"):
        tm.SileroVAD()(torch.zeros(1, 700))


def package_voice_encoder(monkeypatch):
    """Resemblyzer's own VoiceEncoder class. Its package imports librosa, webrtcvad and a scipy module newer
    scipy dropped, for audio loading only: those are stubbed for the import, and the package's modules are
    dropped from sys.modules afterwards."""
    morphology = types.ModuleType("scipy.ndimage.morphology")
    morphology.binary_dilation = None
    for name, module in (("librosa", types.ModuleType("librosa")), ("webrtcvad", types.ModuleType("webrtcvad")),
                         ("scipy.ndimage.morphology", morphology)):
        monkeypatch.setitem(sys.modules, name, module)
    try:
        from resemblyzer.voice_encoder import VoiceEncoder
    finally:
        for name in [m for m in sys.modules if m == "resemblyzer" or m.startswith("resemblyzer.")]:
            del sys.modules[name]
    return VoiceEncoder


@needs("resemblyzer")
@pytest.mark.numerics
def test_resemblyzer_embeds_one_partial_utterance_as_the_package_does(monkeypatch):
    """Audio in, a unit-norm non-negative embedding out; the encoder behind the mel front end gives what the
    package's own VoiceEncoder gives on the same frames."""
    clip = audio(25600)
    embedding = assert_deterministic(tm.resemblyzer, clip)[0]
    assert embedding.shape == (2, 256) and (embedding >= 0).all()
    torch.testing.assert_close(embedding.norm(dim=1), torch.ones(2))
    encoder = package_voice_encoder(monkeypatch)(device="cpu", verbose=False).eval()
    with torch.no_grad():
        torch.testing.assert_close(encoder(tm.MelFrames()(clip)[:, :tm.PARTIAL_FRAMES]), embedding, rtol=0, atol=1e-6)


@needs("nudenet")
def test_nudenet_detector_converts_and_runs():
    pytest.importorskip("onnx2torch")
    scores = assert_deterministic(tm.nudenet_yolov8n, torch.rand(1, 3, 320, 320,
                                                                  generator=torch.Generator().manual_seed(0)))
    assert scores[0].shape == (1, 22, 2100)


class Anchors(torch.nn.Module):
    """A stand-in for YOLOv8n: returns the constructed anchors (1, 4 + classes, anchors) whatever the image."""

    def __init__(self, rows: list[list[float]]):
        super().__init__()
        self.rows = torch.tensor(rows, dtype=torch.float32).T[None]

    def forward(self, images):
        return self.rows.expand(images.shape[0], -1, -1)


def anchor(cx, cy, w, h, label, score, classes=3):
    scores = [0.0] * classes
    scores[label] = score
    return [cx, cy, w, h, *scores]


def test_the_nudenet_detectors_post_processing_is_nudenets():
    """Per anchor its best class; centre and size to corners, clipped to the image; the score threshold;
    NMS across classes (nudenet's OpenCV NMSBoxes is class-agnostic) at IoU 0.45; best score first."""
    rows = [anchor(50, 50, 20, 20, 0, 0.9),   # kept
            anchor(52, 50, 20, 20, 0, 0.8),   # IoU 0.82 with the first: suppressed
            anchor(51, 50, 20, 20, 2, 0.85),  # another class over the first: suppressed too (class-agnostic)
            anchor(10, 10, 30, 30, 1, 0.3),   # reaches past the corner: clipped to 0
            anchor(200, 200, 10, 10, 1, 0.2)]  # under the threshold 0.25
    detector = tm.NudenetDetector(Anchors(rows)).eval()
    [out] = detector([torch.zeros(3, 64, 96)])
    torch.testing.assert_close(out["boxes"], torch.tensor([[40.0, 40.0, 60.0, 60.0], [0.0, 0.0, 25.0, 25.0]]))
    torch.testing.assert_close(out["scores"], torch.tensor([0.9, 0.3]))
    assert out["labels"].tolist() == [0, 1]


def test_the_nms_adapter_reaches_the_nudenet_detector():
    """Two overlapping boxes whose scores differ in the last bits: plain NMS keeps the higher-scoring one,
    the deterministic_nms adapter (through the batched_nms the detector looks up when it runs) the one first
    in box order; a box apart is kept by both."""
    rows = [anchor(60, 50, 20, 20, 0, 0.5 + 1e-7), anchor(58, 50, 20, 20, 0, 0.5), anchor(200, 200, 20, 20, 1, 0.4)]
    from parity.adapters.nms import apply_deterministic_nms

    plain, adapted = tm.NudenetDetector(Anchors(rows)).eval(), tm.NudenetDetector(Anchors(rows)).eval()
    apply_deterministic_nms(adapted, score_grid=1e-3, box_grid=1.0)
    images = [torch.zeros(3, 320, 320)]
    assert plain(images)[0]["boxes"][:, 0].tolist() == [50.0, 190.0]
    assert adapted(images)[0]["boxes"][:, 0].tolist() == [48.0, 190.0]


def test_the_nudenet_detectors_flips_are_attributed_through_its_anchors():
    """NudenetDetector hands its anchors to parity.record_candidates: a target whose anchor changed its best
    class and fell below the threshold, and whose other box NMS now suppresses across classes, is classed
    through both sides' candidates (score_threshold, nms_iou), not from the outputs alone."""
    from parity.execute import capture
    from parity.verify.tasks.detection import DetectionThresholds, flips

    reference = [anchor(50, 50, 20, 20, 0, 0.9), anchor(63, 50, 20, 20, 0, 0.8), anchor(200, 200, 10, 10, 1, 0.5)]
    target = [anchor(50, 50, 20, 20, 0, 0.9), anchor(56, 50, 20, 20, 2, 0.8), anchor(200, 200, 10, 10, 2, 0.2)]
    images = [torch.zeros(3, 320, 320)]
    sides = []
    for rows in (reference, target):
        with capture.watching() as captured:
            out = tm.NudenetDetector(Anchors(rows)).eval()(images)
        sides.append((out, captured))
    (ref_out, ref_captured), (tgt_out, tgt_captured) = sides
    assert len(ref_out[0]["labels"]) == 3 and len(tgt_out[0]["labels"]) == 1
    result = flips(ref_out, tgt_out, DetectionThresholds(), ref_captured, tgt_captured)
    assert result.candidates == "both"
    assert result.counts == {"score_threshold": 1, "nms_iou": 1}
