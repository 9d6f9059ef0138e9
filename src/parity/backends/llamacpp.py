"""llama.cpp on the CPU, through llama-cpp-python (`pip install 'parity[llamacpp]'`): a GGUF file run the way
llama.cpp's own tools run it, its logits for every position compared with the reference's.

Which GGUF runs:
- `options: {gguf: PATH}`: the user's file as it is (an absolute path or `pkg://PACKAGE/PATH`; its header is
  checked by parity first, parity/gguf.py), e.g. the very file a `source: gguf` model was read from: what is
  compared is then transformers' dequantized float32 module against llama.cpp's kernels on the same weights.
- otherwise a GGUF written from the reference model itself, an artifact like every export: parity writes the
  module's float32 tensors with the `gguf` package under llama.cpp's tensor names (LLaMA's query and key rows in
  llama.cpp's rotary order), with the key-value metadata (hyperparameters, tokenizer) of the GGUF the model was
  read from (`source: gguf`), then converts it with llama.cpp's own quantizer (`llama_model_quantize`) to the
  target's type: `dtype: float16` or `bfloat16` (F16, BF16), `quantize: {scheme: llamacpp-Q8_0}` or any type of
  the quantizer (`llamacpp-Q4_K_M`, ...: dtypes.py). A model from another source has no GGUF metadata to carry
  (its tokenizer in llama.cpp's terms): it is refused in one line naming `gguf:`.

llama.cpp runs in a worker process of its own by default (backends/llamacpp_worker.py): an abort or a segfault in
C ends that process only, and the execution is a `crash` (taxonomy.WorkerDied). Each sequence is evaluated from
an empty KV cache with every position's logits kept (llama-perplexity's view), returned as `{"logits": float32
[B, T, vocab]}`, like the transformers model's `logits`. llama.cpp takes no attention mask: a padded batch is
refused, naming what to do (sentences of one length, or one sentence per input set).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from parity.backends.base import Backend, TensorGroup, not_installed, runtime_threads
from parity.backends.llm import token_ids
from parity.backends.worker import LogitsReply, R, Reply, WorkerProcess, script_in_process
from parity.config.schema import MAX_THREADS
from parity.dtypes import LLAMACPP_TYPES, QUANTIZE_SCHEMES
from parity.errors import ParityError
from parity.files import PACKAGE_SCHEME, user_path
from parity.gguf import gguf_problem, read_header
from parity.inputs import Inputs
from parity.models.sources.gguf import gguf_file
from parity.offline import state_folder

WORKER = Path(__file__).with_name("llamacpp_worker.py")
FILE = "model.gguf"
# The type each float dtype writes (llama.cpp's quantizer's file types: every 2-D tensor in it, 1-D ones in F32).
FLOAT_TYPES = {"float32": "ALL_F32", "float16": "MOSTLY_F16", "bfloat16": "MOSTLY_BF16"}
SCHEME_PREFIX = "llamacpp-"
MIN_CTX = 64
# The LLaMA tensors of a transformers module and their GGUF names (llama.cpp's src/llama-arch.cpp): `{}` a block.
LLAMA_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "model.layers.{}.input_layernorm.weight": "blk.{}.attn_norm.weight",
    "model.layers.{}.self_attn.q_proj.weight": "blk.{}.attn_q.weight",
    "model.layers.{}.self_attn.k_proj.weight": "blk.{}.attn_k.weight",
    "model.layers.{}.self_attn.v_proj.weight": "blk.{}.attn_v.weight",
    "model.layers.{}.self_attn.o_proj.weight": "blk.{}.attn_output.weight",
    "model.layers.{}.post_attention_layernorm.weight": "blk.{}.ffn_norm.weight",
    "model.layers.{}.mlp.gate_proj.weight": "blk.{}.ffn_gate.weight",
    "model.layers.{}.mlp.up_proj.weight": "blk.{}.ffn_up.weight",
    "model.layers.{}.mlp.down_proj.weight": "blk.{}.ffn_down.weight",
}


class IdsReply(Reply):
    """The reply to `tokenize`: each text's ids."""
    ids: list[list[int]]


class PiecesReply(Reply):
    """The reply to `pieces`: each token's text."""
    pieces: list[str]


# Metadata the written file says for itself rather than copies (its type, the quantizer's version, the alignment).
OWN_KEYS = ("general.file_type", "general.quantization_version", "general.alignment")


class LlamaCppOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gguf: str | None = None  # a GGUF file run as it is (absolute, or pkg://PACKAGE/PATH)
    threads: int | None = Field(default=None, ge=1, le=MAX_THREADS)
    n_ctx: int | None = Field(default=None, ge=1, le=1 << 20)  # the context; default: the example's length, then doubled
    # each time a longer sequence comes
    # True: llama.cpp in parity's own process (no worker: an abort in C then ends the whole run)
    in_process: bool = False
    # The file is mixed from the two whole conversions (`write_mixed`), as `parity fallback` on a llama.cpp target proposes
    keep: list[str] = Field(default_factory=list, max_length=4096)  # tensor groups at keep_type: token_embd, output, blk.N, blk.N.attn, blk.N.ffn
    keep_type: str = "Q8_0"  # F32, F16, BF16 or a quantizer type (Q8_0, Q6_K, ...)


def file_type(spec) -> str:
    """The llama.cpp file type (`LLAMA_FTYPE_<this>`) a target converts the reference to."""
    if spec.quantize is not None:
        return "MOSTLY_" + spec.quantize.scheme.removeprefix(SCHEME_PREFIX)
    return FLOAT_TYPES[spec.dtype]


KEEP_TYPES = {"F32": "ALL_F32", "F16": "MOSTLY_F16", "BF16": "MOSTLY_BF16", **{t: f"MOSTLY_{t}" for t in LLAMACPP_TYPES}}


def group_of(tensor: str) -> str | None:
    """The group a GGUF tensor belongs to (`token_embd`, `output`, `blk.N.attn`, `blk.N.ffn`), None for the
    ones no quantizer type changes (norms: kept in F32)."""
    parts = tensor.split(".")
    if parts[0] == "blk" and len(parts) >= 3:
        kind = parts[2].split("_")[0]
        return f"blk.{parts[1]}.{kind}" if kind in ("attn", "ffn") and not parts[2].endswith("_norm") else None
    return parts[0] if parts[0] in ("token_embd", "output") else None


def in_groups(tensor: str, groups) -> bool:
    """Whether `tensor` is in one of `groups`, each a group (`blk.3.ffn`), a block (`blk.3`) or a whole kind."""
    group = group_of(tensor)
    return group is not None and any(group == g or group.startswith(g + ".") for g in groups)


def tensor_groups(path: Path) -> list[TensorGroup]:
    """The tensor groups of the GGUF at `path`, in file order (blocks in their order), with types and bytes."""
    found: dict[str, list] = {}
    for info in read_header(path).tensors:
        group = group_of(info.name)
        if group is not None:
            found.setdefault(group, []).append(info)
    return [TensorGroup(name, tuple(i.name for i in infos), "+".join(sorted({i.type for i in infos})),
                        sum(i.nbytes for i in infos)) for name, infos in found.items()]


def write_mixed(low, high, keep, path: Path) -> None:
    """A GGUF at `path` whose tensors in the `keep` groups are `high`'s (their raw data and type), the rest `low`'s,
    with `low`'s metadata: llama.cpp's quantizer takes per-tensor types only through a C++ vector
    (docs/llamacpp.md), so two whole conversions are mixed instead, tensor by tensor, as gguf-py copies tensors.
    `low` and `high` are paths or `gguf.GGUFReader`s of them: a search that mixes the same two files again and again
    reads each once (gguf-py's reader parses a vocabulary's every entry into arrays of its own: most of a mix's time)."""
    import gguf

    readers = tuple(r if isinstance(r, gguf.GGUFReader) else gguf.GGUFReader(r) for r in (low, high))
    chosen = {t.name: t for t in readers[0].tensors}
    for tensor in readers[1].tensors:
        if in_groups(tensor.name, keep):
            chosen[tensor.name] = tensor
    writer = gguf.GGUFWriter(path, arch=readers[0].fields["general.architecture"].contents(), endianess=readers[0].endianess)
    for field in readers[0].fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        kind = field.types[0]
        writer.add_key_value(field.name, field.contents(), kind,
                             sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    for tensor in chosen.values():
        writer.add_tensor_info(tensor.name, tensor.data.shape, tensor.data.dtype, tensor.data.nbytes, tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in chosen.values():
        writer.write_tensor_data(tensor.data)
    writer.close()


def _gguf_path(text: str) -> Path:
    return user_path(text, "GGUF file")


def _names_group(name: str) -> bool:
    parts = name.split(".")
    if parts[0] in ("token_embd", "output"):
        return len(parts) == 1
    return (parts[0] == "blk" and 2 <= len(parts) <= 3 and parts[1].isdigit()
            and (len(parts) == 2 or parts[2] in ("attn", "ffn")))


class LlamaCppBackend(Backend):
    name = "llamacpp"
    dtypes = tuple(FLOAT_TYPES)
    Options = LlamaCppOptions
    preparation_cost = 2  # a conversion
    specializes_on_example = False  # llama.cpp runs any length up to its context
    libraries = ("torch", "llama_cpp_python", "gguf", "numpy")
    quantize_schemes = tuple(s for s in QUANTIZE_SCHEMES if s.startswith(SCHEME_PREFIX))
    # keep/keep_type mix two cached conversions at load (`write_mixed`): each whole conversion is keyed without them
    session_options = ("threads", "n_ctx", "in_process", "keep", "keep_type")

    @classmethod
    def localizes(cls, spec) -> bool:
        """A conversion parity makes is localized by its tensor groups (runner/tensor_types.py); a file run as it is
        has no conversion to take a group from at another type."""
        return cls.options_of(spec).gguf is None

    @classmethod
    def available(cls, spec) -> str | None:
        return not_installed("llama_cpp", "'parity[llamacpp]'", "llama-cpp-python") or \
            not_installed("gguf", "'parity[llamacpp]'")

    @classmethod
    def spec_problem(cls, spec) -> str | None:
        options = cls.options_of(spec)
        if options.keep_type not in KEEP_TYPES:
            return f"target {spec.id}: options.keep_type {options.keep_type!r} is none of {', '.join(KEEP_TYPES)}"
        bad = [g for g in options.keep if not _names_group(g)]
        if bad:
            return (f"target {spec.id}: options.keep names no tensor group: {', '.join(bad)} (token_embd, output, "
                    "blk.N, blk.N.attn, blk.N.ffn)")
        if options.gguf is None:
            return None
        if options.keep:
            return f"target {spec.id}: options.keep mixes the conversions parity makes; a gguf file runs as it is"
        if spec.quantize is not None or spec.dtype != "float32":
            return (f"target {spec.id}: options.gguf runs that file as it is; drop dtype/quantize (they say what "
                    "parity converts the reference to when no gguf is given)")
        if not options.gguf.startswith(PACKAGE_SCHEME) and not _gguf_path(options.gguf).is_absolute():
            return f"target {spec.id}: options.gguf must be an absolute path or pkg://PACKAGE/PATH, not {options.gguf}"
        return gguf_problem(_gguf_path(options.gguf))

    def prepare(self, model: torch.nn.Module, example: Inputs) -> None:
        self.width = token_ids(example, "llama.cpp").shape[1]
        if self.options.gguf is not None:
            path = _gguf_path(self.options.gguf)
            read_header(path)  # checked again: the file may have changed since the experiment was checked
        else:
            source = gguf_file(model)
            if source is None:
                raise ParityError(f"target {self.spec.id}: llama.cpp converts models read from a GGUF file "
                                  "(source: gguf), whose metadata it carries; give options: {gguf: PATH} to run a file")
            path = self._conversion(file_type(self.spec), model, source, example)
            self._converted = (model, source, example)
        self.prepared = path
        if self.options.keep:
            path = self._mixed(self.options.keep, self.options.keep_type)
        self.path = path
        self.runtime = _LlamaRuntime(self.options.in_process)
        self.n_ctx = max(self.options.n_ctx or 0, self.width, MIN_CTX)
        self.load = {"op": "load", "model": str(path), "n_ctx": self.n_ctx, "threads": runtime_threads(self.options.threads)}
        self.runtime.request(self.load)

    def _conversion(self, target: str, model: torch.nn.Module, source: Path, example: Inputs) -> Path:
        """The reference converted to llama.cpp's file type `target`, from the artifact cache when it is there."""
        found = self._conversions = getattr(self, "_conversions", {})
        if target not in found:  # once per backend: a key hashes the model's state dict
            found[target] = self.artifact(f"gguf-{target.lower()}", model, example,
                                          lambda folder: self._convert(model, source, folder, target)) / FILE
        return found[target]

    def tensor_groups(self) -> list[TensorGroup]:
        """The prepared file's tensor groups, with their types and bytes (the TensorTypes capability)."""
        return tensor_groups(self.prepared)

    def keep(self, groups: list[str], type: str) -> int:
        """Load the prepared file with `groups` kept at `type` (TensorTypes; none: the file as prepared)."""
        before, self.path = self.path, self._mixed(groups, type) if groups else self.prepared
        self.load = {**self.load, "model": str(self.path), "n_ctx": self.n_ctx}
        self.runtime.request(self.load)
        if before != self.prepared and before != self.path:
            before.unlink()  # llama.cpp has let go of it: the next mix has a name of its own
        return self.path.stat().st_size

    def _mixed(self, groups: list[str], type: str) -> Path:
        """The prepared conversion with the tensors of `groups` taken from the conversion to `type` (a cached
        artifact too), written to this backend's scratch folder."""
        if type not in KEEP_TYPES:
            raise ParityError(f"target {self.spec.id}: keep_type {type!r} is none of {', '.join(KEEP_TYPES)}")
        if getattr(self, "_converted", None) is None:
            raise ParityError(f"target {self.spec.id}: a gguf file given as it is has no conversion to keep tensors from")
        high = self._conversion(KEEP_TYPES[type], *self._converted)
        if getattr(self, "_scratch", None) is None:
            self._scratch = tempfile.TemporaryDirectory(prefix=f"{self.name}-", dir=state_folder())
        self._mixes = getattr(self, "_mixes", 0) + 1  # a new file, never rewritten under the one llama.cpp maps
        mixed = Path(self._scratch.name) / f"mixed-{self._mixes}.gguf"
        write_mixed(self._reader(self.prepared), self._reader(high), groups, mixed)
        return mixed

    def _reader(self, path: Path):
        """gguf-py's reader of the conversion at `path` (a cached artifact, never rewritten), parsed once for every
        mix this backend writes."""
        import gguf

        self._readers = getattr(self, "_readers", {})
        if path not in self._readers:
            self._readers[path] = gguf.GGUFReader(path)
        return self._readers[path]

    def _convert(self, model: torch.nn.Module, source: Path, folder: Path, target: str) -> None:
        written = folder / (FILE if target == "ALL_F32" else "float32.gguf")
        write_gguf(model, source, written)
        if target != "ALL_F32":
            with _LlamaRuntime(self.options.in_process) as runtime:
                runtime.request({"op": "quantize", "source": str(written), "target": str(folder / FILE),
                                 "ftype": target, "threads": runtime_threads(self.options.threads)})
            written.unlink()

    def run(self, inputs: Inputs) -> Any:
        tokens = token_ids(inputs, "llama.cpp")
        if tokens.shape[1] > self.n_ctx:  # a longer sequence than the example (a greedy continuation grows one
            # token a call): a context twice as long, so that the model is loaded again a few times, not every call
            self.n_ctx = max(tokens.shape[1], 2 * self.n_ctx)
            self.runtime.request({**self.load, "n_ctx": self.n_ctx})
        header, payload = self.runtime.request({"op": "eval", "tokens": tokens.tolist()}, LogitsReply)
        import numpy as np

        logits = np.frombuffer(payload, dtype=np.float32).reshape(header.shape)
        return {"logits": torch.from_numpy(logits.copy())}

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """The ids llama.cpp's own tokenizer (the GGUF's vocabulary) gives each text, with the special tokens the
        file says to add (llama_tokenize's add_special, as llama.cpp's tools tokenize a prompt)."""
        return self.runtime.request({"op": "tokenize", "texts": texts, "add_bos": True}, IdsReply)[0].ids

    def token_texts(self, ids: list[int]) -> list[str]:
        """Each token's text, as llama.cpp's tokenizer writes it."""
        return self.runtime.request({"op": "pieces", "ids": ids}, PiecesReply)[0].pieces

    def close(self) -> None:
        runtime = getattr(self, "runtime", None)
        if runtime is not None:
            runtime.close()
            self.runtime = None
        self._readers = {}  # their files' maps let go
        super().close()


def write_gguf(model: torch.nn.Module, source: Path, path: Path) -> None:
    """`model`'s tensors in float32 as a GGUF file at `path`, under llama.cpp's LLaMA tensor names, with the
    key-value metadata of `source` (the GGUF the model was read from: its hyperparameters and tokenizer)."""
    import gguf
    import numpy as np

    header = read_header(source)
    if header.architecture != "llama":
        raise ParityError(f"parity writes GGUF files of LLaMA-architecture models; {source} is "
                          f"{header.architecture!r}: give options: {{gguf: PATH}} to run a file as it is")
    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(path, "llama")
    for field in reader.fields.values():
        if field.name in OWN_KEYS or field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    writer.add_file_type(0)  # ALL_F32
    config = model.config
    heads, kv_heads = config.num_attention_heads, getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    names = []
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and getattr(config, "tie_word_embeddings", False):
            continue  # llama.cpp reads the output projection from token_embd when output.weight is absent
        gguf_name, block = _gguf_name(name)
        data = tensor.detach().to(torch.float32).cpu().numpy()
        if gguf_name.endswith(("attn_q.weight", "attn_k.weight")):
            data = _rotary_order(data, heads if gguf_name.endswith("attn_q.weight") else kv_heads)
        names.append(gguf_name.format(block))
        writer.add_tensor(gguf_name.format(block), np.ascontiguousarray(data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _gguf_name(name: str) -> tuple[str, str]:
    parts = name.split(".")
    block = next((p for p in parts if p.isdigit()), "")
    key = ".".join("{}" if p == block and block else p for p in parts)
    if key not in LLAMA_NAMES:
        raise ParityError(f"parity has no GGUF name for the tensor {name} of a LLaMA module")
    return LLAMA_NAMES[key], block


def _rotary_order(weight, heads: int):
    """A query or key projection from transformers' rotary layout (each head's first half, then its second) to
    llama.cpp's (the halves interleaved in pairs), as llama.cpp's converter permutes them."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


class _LlamaRuntime:
    """llama.cpp behind one request/reply interface: in a worker process (default, backends/worker.py), or in this
    process."""

    def __init__(self, in_process: bool):
        self.process = None
        if in_process:
            self.module = script_in_process(WORKER, "parity_llamacpp_worker")
            self.local = self.module.LlamaWorker(None)
        else:
            self.local = None
            self.process = WorkerProcess(WORKER, "llama.cpp")

    def __enter__(self) -> _LlamaRuntime:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def request(self, message: dict, reply: type[R] = Reply) -> tuple[R, bytes]:
        """The reply to `message`, as `reply`, and its raw payload; in this process the worker script's own parse and
        handling, its refusal a RuntimeError as the worker process's is, and no abort (it would end this process)."""
        if self.local is None:
            return self.process.request(message, reply)
        try:
            request = self.module.parse(message)
            if isinstance(request, self.module.LlamaAbort):
                raise RuntimeError("llama.cpp in this process cannot abort")
            header, payload = self.local.handle(request)
        except self.module.Refused as exc:
            raise RuntimeError(f"llama.cpp: {exc}") from exc
        return reply.model_validate(header), payload

    def close(self) -> None:
        if self.process is not None:
            process, self.process = self.process, None
            process.close()
        self.local = None
