"""Write the speech clips study/trained.yaml gives the audio models (study/speech/*.wav).

No package bundles recorded speech, so the clips are synthesized: two English sentences spoken by
espeak-ng (two voices, Debian's `espeak-ng`), resampled from its 22050 Hz to the models' 16 kHz
(scipy's polyphase filter), cut to their first 1.6 s and written as 16-bit mono PCM at -30 dBFS RMS,
the level Resemblyzer normalizes speech to. Synthesized speech has voicing, formants and pauses that
noise lacks, so the voice-activity model sees speech and silence; it is not a human voice.

    apt-get install espeak-ng && python study/make_speech.py   # prints each clip's RMS and length
"""

from __future__ import annotations

import subprocess
import tempfile
import wave
from pathlib import Path

import numpy as np
from scipy.signal import resample_poly

OUT = Path(__file__).resolve().parent / "speech"
RATE = 16_000
SECONDS = 1.6
TARGET_RMS = 10 ** (-30 / 20)
CLIPS = {"fox": ("en-us", "The quick brown fox jumps over the lazy dog."),
         "backends": ("en-gb", "Every backend answers the same question.")}


def speak(voice: str, text: str) -> np.ndarray:
    """espeak-ng's waveform of `text`, at its own rate, as float64 in [-1, 1]."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "clip.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-s", "150", "-w", str(path), text], check=True)
        with wave.open(str(path), "rb") as clip:
            rate, frames = clip.getframerate(), clip.readframes(clip.getnframes())
    samples = np.frombuffer(frames, dtype="<i2").astype(np.float64) / 32768.0
    return resample_poly(samples, RATE, rate) if rate != RATE else samples


def main() -> None:
    OUT.mkdir(exist_ok=True)
    for name, (voice, text) in CLIPS.items():
        clip = speak(voice, text)[: int(RATE * SECONDS)]
        clip = clip * (TARGET_RMS / np.sqrt(np.mean(clip**2)))
        pcm = np.clip(np.round(clip * 32768.0), -32768, 32767).astype("<i2")
        with wave.open(str(OUT / f"{name}.wav"), "wb") as out:
            out.setnchannels(1), out.setsampwidth(2), out.setframerate(RATE)
            out.writeframes(pcm.tobytes())
        print(f"{name}: {len(pcm) / RATE:.2f} s, RMS {np.sqrt(np.mean((pcm / 32768.0) ** 2)):.4f}")


if __name__ == "__main__":
    main()
