"""Logging for the command line: parity's messages on stderr, and the libraries' logging sent to the run's
log file while backends run (docs/architecture.md, Logging)."""

from __future__ import annotations

import contextlib
import logging
import sys
from pathlib import Path

from parity.cli.terminal import make_console
from parity.errors import PlainLines


class _Stderr(logging.StreamHandler):
    """Writes to whatever sys.stderr is when a message comes (a test's capture, redirect_stderr swap it), as
    `warning: ...`: the words scripts and tests have read from parity's stderr."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def show_logs(verbose: bool = False) -> None:
    """parity's messages (its modules log through `logging`) on stderr, at INFO (`--verbose`: DEBUG): through
    rich on a terminal, as plain `warning: ...` lines elsewhere (CI logs, pipes, tests). Once per process:
    each call replaces the handler it installed before."""
    logger = logging.getLogger("parity")
    for handler in [h for h in logger.handlers if getattr(h, "parity_cli", False)]:
        logger.removeHandler(handler)
    if sys.stderr.isatty():
        from rich.logging import RichHandler

        handler: logging.Handler = RichHandler(console=make_console(stderr=True), show_time=False, show_path=False)
    else:
        handler = _Stderr()
        handler.setFormatter(PlainLines("%(message)s"))
    handler.parity_cli = True
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)


# Libraries whose logging goes to the run's log file (and onto stderr with --verbose), never above the table:
# torch (dynamo, inductor, export, the ONNX exporter's torch.onnx), onnxscript and onnx_ir (the ONNX exporter's
# passes), OpenVINO and NNCF, torchao, ExecuTorch, Torch-TensorRT.
LIBRARY_LOGGERS = ("torch", "onnxscript", "onnx_ir", "onnx", "onnxruntime", "openvino", "nncf", "torchao", "executorch",
                   "torch_tensorrt")
LOG_FILE = "run.log"


def _to_console(handler: logging.Handler) -> bool:
    """A handler that writes to the terminal (torch's own `_StderrHandler` follows sys.stderr), not to a file."""
    consoles = (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__)
    return (isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
            or type(handler).__name__ == "_StderrHandler") and getattr(handler, "stream", None) in consoles


@contextlib.contextmanager
def library_logs(log_file: Path | None, verbose: bool):
    """While a command runs backends: what the libraries log (torch's `W1201 ...` lines, graph dumps logged at
    WARNING) appended to `log_file` with parity's own messages, instead of their console handlers (None: a
    command given no --out keeps no log); with `verbose` on stderr too. Every logger is put back afterwards."""
    import torch  # noqa: F401  torch installs its loggers' console handlers at import: these come after

    to_file = logging.FileHandler(log_file, encoding="utf-8", delay=True) if log_file else logging.NullHandler()
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    saved = []
    loggers = [logging.getLogger(name) for name in LIBRARY_LOGGERS]
    loggers += [lg for name, lg in list(logging.Logger.manager.loggerDict.items())
                if isinstance(lg, logging.Logger) and name.split(".")[0] in LIBRARY_LOGGERS and lg not in loggers]
    for logger in loggers:
        saved.append((logger, list(logger.handlers), logger.propagate))
        on_console = [h for h in logger.handlers if _to_console(h)]
        for handler in on_console:
            logger.removeHandler(handler)
        if logger.name in LIBRARY_LOGGERS:  # a library's root: the file (and --verbose's stderr), no further
            logger.addHandler(to_file)
            if verbose:
                logger.addHandler(_stderr_handler())
            logger.propagate = False
        elif on_console:  # torch's registered loggers (torch._dynamo, ...) stop at their own console handler
            logger.propagate = True
    parity_logger = logging.getLogger("parity")
    parity_logger.addHandler(to_file)
    try:
        yield
    finally:
        parity_logger.removeHandler(to_file)
        for logger, handlers, propagate in saved:
            logger.handlers, logger.propagate = handlers, propagate
        to_file.close()


def _stderr_handler() -> logging.Handler:
    handler = _Stderr()
    handler.setFormatter(PlainLines("%(name)s: %(message)s"))
    return handler
