"""The registry of each extension point. Built-ins and third-party plugins alike register through entry
points (pyproject.toml's `[project.entry-points."parity.<group>"]`); each registry imports a plugin's module
only when its name is looked up, so config/ can find a plugin's spec without importing the layers the plugin
lives in. What each plugin object provides is described beside the code that calls it:

- `parity.backends`: a `parity.backends.base.Backend` subclass.
- `parity.sources`: a `parity.models.base.Source` (how a model is built; its spec under `models[i]`).
- `parity.tasks`: a `parity.verify.tasks.Task` (tier-3 evaluator, thresholds, headline metrics).
- `parity.adapters`: a `parity.adapters.Adapter` (a deterministic replacement applied to the model).
- `parity.executors`: a `parity.runner.executors.ExecutorPlugin` (where executions run).
- `parity.reports`: a `parity.report.ReportWriter` (one report file rendered from the records).
"""

from __future__ import annotations

from typing import Any

from parity.registry import Registry

BACKENDS: Registry[Any] = Registry("backend", group="parity.backends")
SOURCES: Registry[Any] = Registry("model source", group="parity.sources")
TASKS: Registry[Any] = Registry("task", group="parity.tasks")
ADAPTERS: Registry[Any] = Registry("adapter", group="parity.adapters")
EXECUTORS: Registry[Any] = Registry("executor", group="parity.executors")
REPORTS: Registry[Any] = Registry("report", group="parity.reports")

ALL = (BACKENDS, SOURCES, TASKS, ADAPTERS, EXECUTORS, REPORTS)


def refresh() -> None:
    """Rescan every group's entry points (after a plugin package is put on sys.path)."""
    for registry in ALL:
        registry.refresh()
