"""The process ONNX Runtime GenAI runs in for the onnxruntime-genai backend (backends/ortgenai.py starts it as a
script).

ONNX Runtime GenAI is C++ behind a thin binding: a bad model folder or a failed assertion can end the whole process.
In a process of its own, that ends this process only, and the backend's execution is a `crash`. It imports
onnxruntime_genai and numpy, never parity or torch, so it starts in well under a second.

Protocol, on the pipes the parent gave: each request is one JSON line on stdin; each reply one JSON line on the
protocol stream (the process's stdout, duplicated away at start so that nothing the runtime prints to stdout can mix
with it: fd 1 is pointed at stderr), followed by `nbytes` raw bytes when the reply says so.
- {"op": "load", "folder": PATH, "threads": T} -> {}
- {"op": "logits", "tokens": [[...], ...]} -> {"shape": [B, T, V], "nbytes": ...} + float32 logits: each sequence
  appended to a fresh generator as one prompt (the prefill), every position's logits read from the model's output
- {"op": "decode", "prompt": [[...], ...], "steps": N, "forced": [[...], ...] | null} -> {"tokens": [[...], ...],
  "shape": [B, N, V], "nbytes": ...} + float32 logits: a prefill, then one token at a time through the generator's
  KV cache (its own greedy choice, or the forced one)
- {"op": "abort"} -> the process aborts (what tests use to construct a crash in C)
An error is {"error": "..."}; the process goes on. Each request is read once, into the frozen dataclass of its op
(`parse`), read by attribute afterwards.
"""

import json
import os
import sys
from dataclasses import dataclass

if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]  # run as a script: its folder (parity's backends, `onnxruntime.py`...) must not shadow libraries


@dataclass(frozen=True)
class GenAILoad:
    folder: str
    threads: int


@dataclass(frozen=True)
class Logits:
    tokens: list


@dataclass(frozen=True)
class Decode:
    prompt: list
    steps: int
    forced: list | None


@dataclass(frozen=True)
class GenAIAbort:
    pass


REQUESTS = {"load": GenAILoad, "logits": Logits, "decode": Decode, "abort": GenAIAbort}


def parse(message):
    """The request a parsed JSON line says, as its op's dataclass (a missing or unknown field: TypeError)."""
    fields = dict(message)
    op = fields.pop("op", None)
    if op not in REQUESTS:
        raise ValueError(f"unknown request {op!r}")
    return REQUESTS[op](**fields)


class GenAIWorker:
    def __init__(self, out):
        self.out = out
        self.model = None

    def reply(self, message, payload=b""):
        if payload:
            message["nbytes"] = len(payload)
        self.out.write(json.dumps(message).encode() + b"\n")
        if payload:
            self.out.write(payload)
        self.out.flush()

    def load(self, request):
        import onnxruntime_genai as og

        config = og.Config(request.folder)
        # the runtime's thread pool as parity sizes every runtime's (backends/base.py runtime_threads)
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {
            "intra_op_num_threads": request.threads, "inter_op_num_threads": 1}}}}))
        self.model = og.Model(config)
        return {}

    def _generator(self, length):
        import onnxruntime_genai as og

        params = og.GeneratorParams(self.model)
        # max_length bounds the KV cache; no end-of-sequence stop: parity asks for a number of steps
        params.set_search_options(max_length=length, min_length=length, do_sample=False)
        return og.Generator(self.model, params)

    def logits(self, tokens):
        import numpy as np

        rows = []
        for sequence in tokens:
            generator = self._generator(len(sequence) + 1)
            generator.append_tokens(np.asarray([sequence], dtype=np.int32))
            rows.append(np.asarray(generator.get_output("logits"), dtype=np.float32).reshape(len(sequence), -1))
            del generator
        width = max((len(t) for t in tokens), default=0)
        out = np.zeros((len(tokens), width, rows[0].shape[-1] if rows else 0), dtype=np.float32)
        for i, row in enumerate(rows):
            out[i, :len(row)] = row
        return out

    def decode(self, request):
        import numpy as np

        prompt, steps, forced = request.prompt, request.steps, request.forced
        chosen, logits = [], []
        for i, sequence in enumerate(prompt):
            generator = self._generator(len(sequence) + steps)
            generator.append_tokens(np.asarray([sequence], dtype=np.int32))
            row_tokens, row_logits = [], []
            for step in range(steps):
                scores = np.asarray(generator.get_logits(), dtype=np.float32).reshape(-1)
                token = int(forced[i][step]) if forced is not None else int(scores.argmax())
                row_tokens.append(token)
                row_logits.append(scores)
                if step + 1 < steps:
                    generator.append_tokens(np.asarray([[token]], dtype=np.int32))
            del generator
            chosen.append(row_tokens)
            logits.append(np.stack(row_logits) if row_logits else np.zeros((0, 0), dtype=np.float32))
        return chosen, np.ascontiguousarray(np.stack(logits), dtype=np.float32)

    def handle(self, request):
        """The reply to one request (its parsed JSON), and its raw payload (b"" when none)."""
        request = parse(request)
        if isinstance(request, GenAILoad):
            return self.load(request), b""
        if isinstance(request, Logits):
            out = self.logits(request.tokens)
            return {"shape": list(out.shape)}, out.tobytes()
        if isinstance(request, Decode):
            tokens, out = self.decode(request)
            return {"tokens": tokens, "shape": list(out.shape)}, out.tobytes()
        os.abort()  # an abort request

    def serve(self, stdin):
        for line in stdin:
            try:
                reply, payload = self.handle(json.loads(line))
            except Exception as exc:  # the parent raises it as the backend's error
                reply, payload = {"error": f"{type(exc).__name__}: {exc}"}, b""
            self.reply(reply, payload)


def main():
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # what the runtime or the binding prints to stdout goes to stderr, never into the protocol
    GenAIWorker(out).serve(sys.stdin.buffer)


if __name__ == "__main__":
    main()
