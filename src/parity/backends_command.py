"""`parity backends`: every backend with its devices, whether it runs here, its dtypes and options, and the
quantize schemes with the target id each spells, so that a user finds `eager-int8-weight` without the docs."""

from __future__ import annotations

from parity.backends import BACKENDS, backend_class
from parity.config.schema import BackendSpec
from parity.dtypes import QUANTIZE_SCHEMES
from parity.errors import ParityError


def backends_tables() -> list:
    """The two rich tables `parity backends` prints: the backends, then the quantize schemes and their ids."""
    from rich.markup import escape
    from rich.table import Table

    backends = Table(title="parity backends")
    for col in ("backend", "device", "available", "dtypes", "quantize", "options"):
        backends.add_column(col)
    runs: dict[str, list[str]] = {}
    for name in BACKENDS.names():
        try:
            cls = backend_class(name)
        except ParityError as exc:
            backends.add_row(name, "", f"[red]no[/red]: {escape(exc.problems[0])}", "", "", "")
            continue
        schemes = cls.schemes_run()
        for scheme in schemes:
            runs.setdefault(scheme, []).append(name)
        for device in cls.devices:
            reason = cls.available(BackendSpec(backend=name, device=device))
            status = "[green]yes[/green]" if reason is None else f"[red]no[/red]: {escape(reason)}"
            backends.add_row(name, device, status, ", ".join(cls.dtypes),
                             ", ".join(QUANTIZE_SCHEMES[s].word for s in schemes) or "-",
                             ", ".join(cls.Options.model_fields) or "-")
    schemes = Table(title="quantize schemes (a target id ends with the scheme's word; `quantize: {scheme: ...}` in a "
                          "file)")
    for col in ("scheme", "target ids", "calibrated", "needs"):
        schemes.add_column(col)
    for scheme in QUANTIZE_SCHEMES.values():
        ids = ", ".join(f"{name}-{scheme.word}" for name in runs.get(scheme.name, ())) or "no backend here runs it"
        calibrated = "yes: quantize: {calibration: INPUTS}" if scheme.calibrated else "no"
        schemes.add_row(scheme.name, ids, calibrated, ", ".join(scheme.libraries))
    return [backends, schemes]
