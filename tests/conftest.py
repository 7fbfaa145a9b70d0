"""Shared fixtures: small, fast specs and a cache of measured runs reused across tests."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch

from ckptlab import RunResult, RunSpec, measure

# Short sequences and one timed step keep each real run well under a second on 2 cores. The
# forward and backward alone (optimizer "none", the lessons' step): most tests reason about
# activations; tests/test_training.py covers the optimizer's step and LoRA.
FAST = RunSpec(model="tiny-llama", seq_len=128, batch_size=1, every_n_layers=1, repeats=1, warmup=0, optimizer="none")

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``-n auto`` in pyproject.toml: one worker a core) each worker takes its share of the cores
    for torch's threads, and so do the processes a test starts (a CLI, a server, ranks): two workers on 2 cores
    run 2 threads, not 4 fighting over them."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        threads = str(max(1, (os.cpu_count() or 1) // int(workers)))
        torch.set_num_threads(int(threads))
        os.environ.setdefault("OMP_NUM_THREADS", threads)


# This machine's speed as the tests take it (ckptlab.explore.machine): never measured inside a test, so an estimate
# is the same on every machine and no test spends the benchmark's second. About this CI's 2 cores, one thread.
TEST_CPU_SPEED = {"float32": 50e9, "bfloat16": 100e9, "float16": 25e9}
TEST_MEMORY_BANDWIDTH = 5e9


def pytest_collection_finish(session: pytest.Session) -> None:
    """Take what the imports made (torch's, transformers', streamlit's and the test modules' objects) out of the
    collector's walks, as the CLI and the app's workers do (``freeze_what_is_loaded``): every observed step starts
    with a full ``gc.collect()``, which in a test process walked about half a million objects, 0.2 s a step and
    thousands of steps a run. What a test makes later is collected as before."""
    from ckptlab.explore.machine import CpuSpeed, use_speed
    from ckptlab.torchstate import freeze_what_is_loaded

    use_speed(CpuSpeed(TEST_CPU_SPEED, TEST_MEMORY_BANDWIDTH, threads=1, measured_at="tests/conftest.py"))
    freeze_what_is_loaded()


def stub_counted_works(specs, simulate_missing=True, workers=None):
    """:func:`ckptlab.lab.run.counted_works` without simulating (:func:`stub_counted_work` each)."""
    return {spec: stub_counted_work(spec) for spec in specs}


def stub_counted_work(spec):
    """A step's counted work without simulating it (a simulation costs seconds): each layer's matmuls at 2 FLOPs a
    parameter a token in the forward, the backward twice that (once with a frozen LoRA base), a checkpointed layer's
    forward again, and AdamW's pass over float32 state. Where the estimate's arithmetic is tested, not the
    simulation's count (tests/lab/test_one_predictor.py proves the real one)."""
    from ckptlab.model import catalog
    from ckptlab.model.plan import planned_roles
    from ckptlab.step.work import OpCost, StepWork, WorkItem

    info = catalog.describe(spec.model)
    tokens = spec.seq_len * spec.batch_size * spec.gradient_accumulation_steps
    layer = OpCost("aten.mm.default", "float32", 2 * info.num_params // info.num_layers * tokens, 0)
    backward = 1 if spec.lora_rank is not None else 2
    roles = planned_roles(info.num_layers, spec.every_n_layers)
    items = [WorkItem("forward", i, layer, 1) for i in range(info.num_layers)]
    items += [WorkItem("backward", i, layer, backward) for i in range(info.num_layers)]
    items += [WorkItem("rerun", i, layer, 1) for i, role in enumerate(roles) if role == "CP"]
    if spec.lora_rank is None:
        items.append(WorkItem("optimizer", None, OpCost("aten.add.Tensor", "float32", 0, 7 * 4 * info.num_params), 1))
    return StepWork(tuple(items))


@pytest.fixture(autouse=True)
def _counted_work_stubbed(request, monkeypatch):
    """The Lab's time estimate reads a stubbed count (:func:`stub_counted_works`) unless the test is marked
    ``simulated_work``: it then simulates, as the app does."""
    if request.node.get_closest_marker("simulated_work") is None:
        monkeypatch.setattr("ckptlab.lab.run.counted_works", stub_counted_works)
    yield


@pytest.fixture(autouse=True)
def _models_root_as_it_was():
    """The process-wide models root (``folder_files.confine``) as before each test: a page run under AppTest
    confines this process to its server's root, which would refuse every later test's folder outside it."""
    from ckptlab.model import folder_files

    before = folder_files.confined_root()
    yield
    folder_files.confine(before)


@pytest.fixture(autouse=True)
def _hub_access_as_it_was():
    """The process-wide way to the Hub (``hub.configure``) as before each test, and never the real Hub during one: a
    page run under AppTest sets its server's (off unless CKPTLAB_HUB=1), and a Hub test its local server's."""
    from ckptlab.model import hub

    before = hub.access()
    # No test touches the real Hub: a Hub name a test did not point at tests/model/hubserver.py asks a port
    # nothing listens on, and fails at once.
    hub.configure(hub.HubAccess(endpoint="http://127.0.0.1:9", token=False, deadline_s=10))
    yield
    hub.configure(before)


@pytest.fixture(scope="session")
def measured():
    """``measured(**changes)``: a real run of ``FAST`` with ``changes``, measured once per session."""
    cache: dict[RunSpec, RunResult] = {}

    def run(**changes) -> RunResult:
        spec = replace(FAST, **changes)
        if spec not in cache:
            cache[spec] = measure(spec)
        return cache[spec]

    return run


@pytest.fixture(scope="session")
def shallower(tmp_path_factory):
    """``shallower(model, layers, **fields)``: a model folder of ``model``'s config cut to ``layers`` layers (and
    ``fields`` set, e.g. ``tie_word_embeddings=True``), made once per session. A simulation costs its number of
    operations (fake tensors hold no data): fewer layers prove the same wherever they still hold every kind of plan a
    test covers."""
    from ckptlab.model.catalog import load_config
    from ckptlab.model.configs import config_with

    folders: dict[tuple[str, int, tuple[tuple[str, object], ...]], str] = {}

    def cut(model: str, layers: int, **fields: object) -> str:
        key = (model, layers, tuple(sorted(fields.items())))
        if key not in folders:
            config, _, _ = load_config(model)
            folder = tmp_path_factory.mktemp(f"{model}-{layers}-layers")
            config_with(config, {"num_hidden_layers": layers, **fields}).save_pretrained(folder)
            folders[key] = str(folder)
        return folders[key]

    return cut


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``slow`` every test that uses one of our module-, package- or session-scoped fixtures.

    Those fixtures exist because what they build is expensive (a measured run, a sweep, a table
    of simulations), so a test that needs one cannot be among the fast ones: ``pytest -m 'not slow'``
    runs the unit tests alone in under a minute; CI runs everything.
    """
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        definitions = info.name2fixturedefs.values() if info is not None else ()
        if any(
            defs[-1].scope in ("module", "package", "session")
            and getattr(defs[-1].func, "__module__", "").startswith("tests")
            for defs in definitions
        ):
            item.add_marker(pytest.mark.slow)
