"""The registry of each extension point. Built-ins and third-party plugins alike register through entry
points (pyproject.toml's `[project.entry-points."parity.<group>"]`); each registry imports a plugin's module
only when its name is looked up, so config/ can find a plugin's spec without importing the layers the plugin
lives in. Each registry names the base class of what it holds, which the object an entry point loads is checked
against (a reference, not an import: the bases live in the layers above this one; `backends.backend_class`
gives the backends' registry its type where the base can be imported). What each plugin object provides is
described beside its base class:

- `parity.backends`: a `parity.backends.base.Backend` subclass.
- `parity.sources`: a `parity.models.sources.Source` (how a model is built; its spec under `models[i]`).
- `parity.tasks`: a `parity.verify.tasks.Task` (tier-3 evaluator, thresholds, headline metrics).
- `parity.adapters`: a `parity.adapters.Adapter` (a deterministic replacement applied to the model).
- `parity.executors`: a `parity.runner.executors.ExecutorPlugin` (where executions run).
- `parity.reports`: a `parity.report.ReportWriter` (one report file rendered from the records).
"""

from __future__ import annotations

from typing import Any

from parity.registry import Registry

BACKENDS: Registry[type] = Registry("backend", "parity.backends", "parity.backends.base:Backend", classes=True)
SOURCES: Registry[Any] = Registry("model source", "parity.sources", "parity.models.sources:Source")
TASKS: Registry[Any] = Registry("task", "parity.tasks", "parity.verify.tasks:Task")
ADAPTERS: Registry[Any] = Registry("adapter", "parity.adapters", "parity.adapters:Adapter")
EXECUTORS: Registry[Any] = Registry("executor", "parity.executors", "parity.runner.executors:ExecutorPlugin")
REPORTS: Registry[Any] = Registry("report", "parity.reports", "parity.report:ReportWriter")

ALL = (BACKENDS, SOURCES, TASKS, ADAPTERS, EXECUTORS, REPORTS)


def refresh() -> None:
    """Rescan every group's entry points (after a plugin package is put on sys.path)."""
    for registry in ALL:
        registry.refresh()
