"""Executors: the process executor turns a segfault or a hang into a failed check and goes on; the ray
executor gives the local executor's verdicts. Workers run in other processes: the backends that crash or
hang (tests/fixtures/tiny.py) must never run in the test process itself."""

from __future__ import annotations

import dataclasses
import logging
import pickle
import re
import sys

import pytest

from parity.api import run_experiment
from parity.cli import main
from parity.errors import ParityError
from parity.execute.cache import ArtifactCache
from parity.experiment import experiment_from_dict
from parity.records import read_records
from parity.runner import worker
from parity.runner.worker import WorkerSettings, prepare_worker
from tests.support import BF16_AT_FLOAT32, tiny_experiment

SEGFAULTING = {"backend": "tests.fixtures.tiny:SegfaultingEager", "name": "segfaulting"}
HANGING = {"backend": "tests.fixtures.tiny:HangingEager", "name": "hanging"}
WELL_BEHAVED = [{"backend": "torchscript"}, BF16_AT_FLOAT32]
JUDGED = ("passed", "failure_class", "verdicts", "required_atol", "max_abs", "status")
# The time limit the hanging backend runs into. It never returns, so any limit ends it, and each test waits it
# out once. The well-behaved executions of the same run (a tiny model built, traced and run; the worker's start
# is not counted) take about a second: ten keeps them inside it on a loaded machine.
LIMIT_S = 10


def checks(records) -> dict[tuple, dict]:
    return {(r["model"], r["inputs"], r["target"], r["tier"]): r for r in records if r["kind"] == "check"}


def assert_same_verdicts(got: dict[tuple, dict], local: dict[tuple, dict]) -> None:
    assert got.keys() == local.keys()
    for key, check in local.items():
        assert set(got[key]) == set(check), key  # the same record shape
        assert {k: got[key][k] for k in JUDGED} == {k: check[k] for k in JUDGED}, key


def local_run(data: dict, out) -> list[dict]:
    """The local executor's records, computed with one torch thread as the workers are told to: another
    thread count may sum in another order, and the records are compared bit for bit."""
    from parity.backends.base import num_threads

    with num_threads(1):
        return run_experiment(data, out=out, reports=())


def test_process_executor_fails_a_segfault_and_a_hang_and_the_run_goes_on(tmp_path, write_yaml):
    data = tiny_experiment([SEGFAULTING, HANGING, *WELL_BEHAVED], repeats=2, executor={"kind": "process", "threads": 1})
    path = write_yaml(data)
    code = main(["run", str(path), "--out", str(tmp_path / "process"), "--quiet", "--no-report",
                 "--executor", "process", "--timeout", str(LIMIT_S), "--cache-dir", str(tmp_path / "cache")])
    assert code == 1
    records = read_records(tmp_path / "process")
    traced = [r for r in records if r["kind"] == "execution" and r["backend"] == "torchscript-cpu" and r["repeat"] == 0]
    assert traced[0]["cached"] is False and len(list((tmp_path / "cache" / "artifacts").iterdir())) == 1  # the worker's
    by_target = {key[2]: check for key, check in checks(records).items()}
    assert by_target["segfaulting"]["failure_class"] == "crash"
    assert "died of SIGSEGV in run (tiny.py:" in by_target["segfaulting"]["detail"]
    assert by_target["hanging"]["failure_class"] == "timeout"
    assert f"time limit of {LIMIT_S} s in run (tiny.py:" in by_target["hanging"]["detail"]
    assert by_target["torchscript-cpu"]["passed"] is True
    [crashed] = [r for r in records if r["kind"] == "execution" and r["backend"] == "segfaulting"]
    assert crashed["status"] == "error" and crashed["failure_class"] == "crash"
    assert records[0]["config"]["executor"] == {"kind": "process", "timeout": LIMIT_S, "address": None, "threads": 1,
                                              "workers": None}

    local = local_run(tiny_experiment(WELL_BEHAVED, repeats=2), tmp_path / "local")
    well_behaved = {key: check for key, check in checks(records).items() if key[2] not in ("segfaulting", "hanging")}
    assert_same_verdicts(well_behaved, checks(local))
    executions = lambda rs: {(r["backend"], r["repeat"]): set(r) for r in rs if r["kind"] == "execution"}  # noqa: E731
    assert {k: v for k, v in executions(records).items() if k[0] not in ("segfaulting", "hanging")} == executions(local)


def test_process_executor_keeps_its_worker_and_refuses_a_model_it_cannot_rebuild():
    from parity.inputs import build_inputs
    from parity.models import build_model
    from parity.runner.plan import plan
    from parity.runner.prepared import ModelCopies
    from parity.runner.process import ProcessExecutor

    data = tiny_experiment([{"backend": "eager", "name": "same"}])
    data["models"].append({"name": "unseeded", "source": "python", "entry": "tests.fixtures.tiny:unseeded_cnn"})
    exp = experiment_from_dict(data)
    jobs = plan(exp)
    with ProcessExecutor(timeout_s=60) as executor:
        executor.start(exp, jobs)
        job = jobs[0]
        copies, inputs = ModelCopies(build_model(job.model, exp), job.model.name), build_inputs(job.inputs, exp)
        first = executor.execute(job, job.reference, copies, inputs)
        pid = executor.worker_pid
        second = executor.execute(job, job.targets[0], copies, inputs)
        assert first.ok and second.ok and executor.worker_pid == pid
        assert first.outputs[0].equal(second.outputs[0])
        unseeded = jobs[1]
        with pytest.raises(ParityError, match="not deterministic"):
            executor.execute(unseeded, unseeded.reference, ModelCopies(build_model(unseeded.model, exp), "unseeded"),
                             inputs)


def test_executor_settings_in_the_file_and_on_the_command_line(tmp_path, write_yaml, capsys):
    exp = experiment_from_dict(tiny_experiment(WELL_BEHAVED, executor="process"))
    assert exp.executor.kind == "process" and exp.executor.timeout_s == 600
    with pytest.raises(ParityError, match=r"executor: .*'timeout' and 'threads' apply to the process and ray"):
        experiment_from_dict(tiny_experiment(WELL_BEHAVED, executor={"kind": "local", "timeout": 5}))
    path = write_yaml(tiny_experiment(WELL_BEHAVED, executor={"kind": "ray", "address": "auto"}))
    assert main(["run", str(path), "--executor", "process", "--address", "x", "--quiet"]) == 2
    assert "'address' applies to the ray executor" in capsys.readouterr().err
    assert main(["run", str(path), "--timeout", "0", "--quiet"]) == 2
    assert "timeout: Input should be greater than 0" in capsys.readouterr().err


def test_ray_workers_is_a_setting_of_the_ray_parity_starts(tmp_path, write_yaml, capsys):
    exp = experiment_from_dict(tiny_experiment(WELL_BEHAVED, executor={"kind": "ray", "workers": 3, "threads": 2}))
    assert exp.executor.workers == 3 and exp.executor.execution_threads == 2
    assert experiment_from_dict(tiny_experiment(WELL_BEHAVED, executor="ray")).executor.execution_threads == 1
    for wrong in ({"kind": "process", "workers": 2}, {"kind": "ray", "workers": 2, "address": "auto"}):
        with pytest.raises(ParityError, match="'workers' applies to the ray executor without an address"):
            experiment_from_dict(tiny_experiment(WELL_BEHAVED, executor=wrong))
    from argparse import Namespace

    from parity.cli.run import with_executor_options

    flags = {"executor": None, "address": None, "workers": None, "timeout": None}
    exp = experiment_from_dict(tiny_experiment(WELL_BEHAVED, executor={"kind": "ray", "workers": 2}))
    joined = with_executor_options(exp, Namespace(**{**flags, "address": "auto"}))  # a cluster, not the file's Ray
    assert (joined.executor.address, joined.executor.workers) == ("auto", None)
    assert (exp.executor.address, exp.executor.workers) == (None, 2)  # a copy: the experiment given is unchanged
    started = with_executor_options(joined, Namespace(**{**flags, "workers": 3}))  # and back
    assert (started.executor.address, started.executor.workers) == (None, 3)
    path = write_yaml(tiny_experiment(WELL_BEHAVED))
    assert main(["run", str(path), "--workers", "2", "--quiet"]) == 2  # the local executor has no workers
    assert "--workers/--timeout: executor: 'workers' applies to the ray executor" in capsys.readouterr().err


def test_a_worker_keeps_to_the_cpus_it_was_given():
    """torch threads, and torch.compile's code-generation processes, imported before or after."""
    import os
    import subprocess
    import sys

    script = ("import sys, torch; from parity.runner.worker import use_cpus; n, when = int(sys.argv[1]), sys.argv[2]\n"
              "if when == 'early': import torch._inductor.config\n"
              "use_cpus(n); import torch._inductor.config as c; print(torch.get_num_threads(), c.compile_threads)")
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_COMPILE_THREADS"}
    n = str((os.cpu_count() or 1) + 1)  # more than this machine's cores: never a default
    for when in ("early", "late"):
        done = subprocess.run([sys.executable, "-c", script, n, when], capture_output=True, text=True, env=env)
        assert done.stdout.split() == [n, n], (n, when, done.stderr[-2000:])


def test_ray_submits_the_references_first_then_the_costliest_preparations():
    import dataclasses

    from parity.runner.plan import plan
    from parity.runner.ray_executor import submission_order

    targets = [{"backend": "eager", "dtype": "bfloat16"}, {"backend": "torchscript"}, {"backend": "onnxruntime"},
               {"backend": "compile"}]
    data = tiny_experiment(targets, oracle=True)
    data["models"].append({**data["models"][0], "name": "tiny2"})
    data["inputs"].append({"name": "noise2", "synthetic": {"shape": [1, 3, 16, 16]}})
    jobs = [dataclasses.replace(job) for job in plan(experiment_from_dict(data))]  # as the runner hands them over
    order = [(job.model.name, job.inputs.name, spec.id) for job, spec in submission_order(jobs)]
    pairs = [(model, inputs) for model in ("tiny", "tiny2") for inputs in ("noise", "noise2")]
    assert order == [(*pair, spec) for pair in pairs for spec in ("eager-cpu", "oracle")] + [
        (*pair, spec) for spec in ("compile-cpu", "onnxruntime-cpu", "torchscript-cpu", "eager-cpu-bfloat16")
        for pair in pairs]


def test_ray_executor_gives_the_local_verdicts_and_fails_a_segfault_and_a_hang(tmp_path, monkeypatch):
    from parity.runner.runner import _Progress

    ray = pytest.importorskip("ray")
    started, said = [], []
    monkeypatch.setattr(ray, "init", lambda *a, init=ray.init, **kw: started.append(kw) or init(*a, **kw))
    monkeypatch.setattr(_Progress, "describe", lambda self, text: said.append(text))
    data = tiny_experiment([SEGFAULTING, HANGING, *WELL_BEHAVED], executor={"kind": "ray", "timeout": LIMIT_S, "workers": 2})
    records = run_experiment(data, out=tmp_path / "ray", reports=())
    assert [kw["num_cpus"] for kw in started] == [2]  # two tasks at a time, of one CPU each
    assert records[0]["environment"]["threads"] == 1  # the executions' threads, not this process's
    counts = [tuple(map(int, re.match(r"ray (\d+)/(\d+) done, next tiny / ", t).groups())) for t in said if t[:4] == "ray "]
    assert {m for _, m in counts} == {5} and [n for n, _ in counts] == sorted(n for n, _ in counts)  # the progress bar
    assert run_experiment(data, out=tmp_path / "ray", reports=()) == records and len(started) == 1  # done: no Ray
    by_target = {key[2]: check for key, check in checks(records).items()}
    assert by_target["segfaulting"]["failure_class"] == "crash"
    assert "died of SIGSEGV in run (tiny.py:" in by_target["segfaulting"]["detail"]
    assert by_target["hanging"]["failure_class"] == "timeout"
    assert f"ran past the time limit of {LIMIT_S} s" in by_target["hanging"]["detail"]

    local = local_run(tiny_experiment(WELL_BEHAVED), tmp_path / "local")
    well_behaved = {key: check for key, check in checks(records).items() if key[2] not in ("segfaulting", "hanging")}
    assert_same_verdicts(well_behaved, checks(local))
    assert checks(local)[("tiny", "noise", "eager-cpu-bfloat16", 1)]["passed"] is False  # one verdict of each kind
    assert checks(local)[("tiny", "noise", "torchscript-cpu", 1)]["passed"] is True


def test_an_executor_that_runs_elsewhere_runs_a_jobs_backends_one_after_the_other_until_the_reference_fails():
    """The default `execute_together` (process, ray): each execution alone, none interleaved, and nothing after a
    failed reference (its targets have nothing to be judged against)."""
    from parity.config.schema import BackendSpec
    from parity.execute.execution import Execution
    from parity.runner.base import Executor

    class Told(Executor):  # each backend's status as its name says
        def execute(self, job, spec, copies, inputs, on_run=None, example=None):
            asked.append(spec.name)
            return Execution(spec, "error" if spec.name.startswith("bad") else "ok")

    asked: list[str] = []
    specs = [BackendSpec(backend="eager", name=n) for n in ("ref", "bad-t1", "t2")]
    done = Told().execute_together(None, specs, None, None)
    assert asked == ["ref", "bad-t1", "t2"] and [ex.status for ex in done] == ["ok", "error", "ok"]
    assert not any(ex.interleaved for ex in done)
    asked.clear()
    assert [ex.status for ex in Told().execute_together(None, [specs[1], specs[2]], None, None)] == ["error"]
    assert asked == ["bad-t1"]


def test_a_worker_is_told_the_parents_sys_path_and_cache_as_worker_settings(tmp_path, monkeypatch):
    """The process and Ray executors pickle a frozen WorkerSettings to each worker; prepare_worker puts the
    parent's sys.path entries first and opens the parent's cache folder."""
    logger = logging.getLogger("parity")
    monkeypatch.setattr(logger, "handlers", list(logger.handlers))
    monkeypatch.setattr(logger, "level", logger.level)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p])
    monkeypatch.setattr(worker, "ARTIFACTS", worker.ARTIFACTS)
    settings = WorkerSettings.of_parent(ArtifactCache(tmp_path / "cache"), None, None)
    assert settings == WorkerSettings(tuple(sys.path), str(tmp_path / "cache"), None, None)
    told = pickle.loads(pickle.dumps(dataclasses.replace(settings, sys_path=(str(tmp_path / "mods"), *settings.sys_path))))
    prepare_worker(told)
    assert sys.path[0] == str(tmp_path / "mods")
    assert worker.ARTIFACTS.root == tmp_path / "cache"
