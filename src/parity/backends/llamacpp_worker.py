"""The process llama.cpp runs in for the llamacpp backend (backends/llamacpp.py starts it as a script).

llama.cpp ends the whole process on some inputs (GGML_ASSERT, abort) and a bad file can crash it: in a process of
its own, that ends this process only, and the backend's execution is a `crash`. It imports llama_cpp and numpy,
never parity or torch, so it starts in well under a second.

Protocol, on the pipes the parent gave: each request is one JSON line on stdin; each reply one JSON line on the
protocol stream (the process's stdout, duplicated away at start so that nothing llama.cpp prints to stdout can
mix with it: fd 1 is pointed at stderr), followed by `nbytes` raw bytes when the reply says so.
- {"op": "load", "model": PATH, "n_ctx": N, "threads": T} -> {"n_vocab": V}
- {"op": "eval", "tokens": [[...], ...]} -> {"shape": [B, T, V], "nbytes": ...} + float32 logits, each sequence
  evaluated from an empty KV cache
- {"op": "tokenize", "texts": [...], "add_bos": bool} -> {"ids": [[...], ...]}
- {"op": "pieces", "ids": [...]} -> {"pieces": [...]}: each token's text
- {"op": "quantize", "source": PATH, "target": PATH, "ftype": NAME, "threads": T} -> {}
- {"op": "abort"} -> the process aborts (what tests use to construct a crash in C)
An error is {"error": "..."}; the process goes on. Each request is read once, into the frozen dataclass of its op
(`parse`), read by attribute afterwards; the in-process stand-in (backends/llamacpp.py) parses and handles the same way.
"""

import json
import os
import sys
from dataclasses import dataclass

if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]  # run as a script: its folder (parity's backends, `openvino.py`...) must not shadow libraries


class Refused(Exception):
    """A request the worker turns down: its error is this message alone."""


@dataclass(frozen=True)
class LlamaLoad:
    model: str
    n_ctx: int
    threads: int


@dataclass(frozen=True)
class Eval:
    tokens: list


@dataclass(frozen=True)
class Tokenize:
    texts: list
    add_bos: bool


@dataclass(frozen=True)
class Pieces:
    ids: list


@dataclass(frozen=True)
class Quantize:
    source: str
    target: str
    ftype: str
    threads: int


@dataclass(frozen=True)
class LlamaAbort:
    pass


REQUESTS = {"load": LlamaLoad, "eval": Eval, "tokenize": Tokenize, "pieces": Pieces, "quantize": Quantize, "abort": LlamaAbort}


def parse(message):
    """The request a parsed JSON line says, as its op's dataclass (a missing or unknown field: TypeError)."""
    fields = dict(message)
    op = fields.pop("op", None)
    if op not in REQUESTS:
        raise Refused(f"unknown request {op!r}")
    return REQUESTS[op](**fields)


class LlamaWorker:
    def __init__(self, out):
        self.out = out
        self.llm = None
        self.loaded = None

    def reply(self, message, payload=b""):
        if payload:
            message["nbytes"] = len(payload)
        self.out.write(json.dumps(message).encode() + b"\n")
        if payload:
            self.out.write(payload)
        self.out.flush()

    def load(self, request):
        from llama_cpp import Llama

        if self.loaded == request:
            return {"n_vocab": self.llm.n_vocab()}
        self.llm = None
        n_ctx, threads = request.n_ctx, request.threads
        # chat_format given: the binding then guesses nothing from the file's chat template (which parity never renders)
        self.llm = Llama(model_path=request.model, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=threads,
                         n_threads_batch=threads, logits_all=True, verbose=False, chat_format="llama-2", seed=0)
        self.loaded = request
        return {"n_vocab": self.llm.n_vocab()}

    def eval(self, tokens):
        import numpy as np

        n_vocab = self.llm.n_vocab()
        width = max((len(t) for t in tokens), default=0)
        logits = np.zeros((len(tokens), width, n_vocab), dtype=np.float32)
        for i, sequence in enumerate(tokens):
            self.llm.reset()  # an empty KV cache: eval removes every cell from n_tokens (0) on
            self.llm.eval(sequence)
            logits[i, :len(sequence)] = self.llm.scores[:len(sequence)]
        return logits

    def handle(self, request):
        """The reply to one parsed request, and its raw payload (b"" when none)."""
        if isinstance(request, LlamaLoad):
            return self.load(request), b""
        if isinstance(request, Eval):
            logits = self.eval(request.tokens)
            return {"shape": list(logits.shape)}, logits.tobytes()
        if isinstance(request, Tokenize):
            return {"ids": [self.llm.tokenize(t.encode("utf-8"), add_bos=request.add_bos, special=False)
                            for t in request.texts]}, b""
        if isinstance(request, Pieces):
            return {"pieces": [self.llm.detokenize([i], special=True).decode("utf-8", "replace")
                               for i in request.ids]}, b""
        if isinstance(request, Quantize):
            return quantize(request), b""
        os.abort()  # an abort request

    def serve(self, stdin):
        for line in stdin:
            try:
                reply, payload = self.handle(parse(json.loads(line)))
            except Refused as exc:
                reply, payload = {"error": str(exc)}, b""
            except Exception as exc:  # the parent raises it as the backend's error
                reply, payload = {"error": f"{type(exc).__name__}: {exc}"}, b""
            self.reply(reply, payload)


def quantize(request):
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_{request.ftype}")
    params.nthread = request.threads
    code = llama_cpp.llama_model_quantize(request.source.encode(), request.target.encode(), params)
    if code != 0:
        raise Refused(f"llama_model_quantize to {request.ftype} returned {code}")
    return {}


def main():
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # what llama.cpp or the binding prints to stdout goes to stderr, never into the protocol
    LlamaWorker(out).serve(sys.stdin.buffer)


if __name__ == "__main__":
    main()
