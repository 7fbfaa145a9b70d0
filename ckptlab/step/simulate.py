"""Real model sizes without the hardware: a training step on fake tensors, accounted like a CPU run.

``simulate(spec)`` builds the spec's model under torch's ``FakeTensorMode`` (shapes and
dtypes, no storage), enables checkpointing through transformers' own
``activation_checkpointing_enable`` and runs the same observed step as a measured run
(``ckptlab.step.measure.observe_memory``: the same probe, the same MemTracker). Nothing is
allocated, so an 8B model at 128k tokens runs on a laptop; the numbers are what the
tensors of a GPU step would hold. The result has the shape of a measured one, with
provenance "simulated" and no timing.

Two things need care:

- **offload.** transformers' offload wraps the checkpoint in
  ``save_on_cpu(pin_memory=True)``, which cannot run without an accelerator. The simulation
  keeps transformers' code path and swaps only that context manager for
  :class:`_SimulatedSaveOnCpu`, whose hooks do for fake tensors what ``save_on_cpu`` does
  for real ones: the pack hook keeps a host-side record of the tensor (and no reference to
  the device tensor, which is freed as it would be after the copy), and the unpack hook
  allocates a new device tensor of the same shape, as the host-to-device copy does. The
  bytes moved are counted as host memory, not device memory. Real tensors still go to the
  real ``save_on_cpu``, so a measured CUDA run in another thread is unaffected.
- **speed.** A 36-layer 8B step takes about 10 s of fake-tensor dispatch. Layers are
  identical but for their role, and the plan repeats every ``every_n_layers`` layers, so
  memory at any event is an affine function of how many repeating units lie before and
  after it. :func:`simulate` therefore runs two shallow copies of the model (one and two
  units in the middle) and extrapolates every event of the timeline to the full depth,
  exactly (``tests/step/test_simulate.py`` compares it with simulating every layer).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

import torch
import transformers
import transformers.masking_utils
import transformers.modeling_utils
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.autograd.graph import saved_tensors_hooks

from ..model import catalog
from ..model.catalog import ModelInfo
from ..model.lora import adapted
from ..model.plan import describe_plan, observed_roles, planned_roles
from ..results import LayerResult, MemoryResult, Provenance, RankResult, RunResult
from ..spec import RunSpec
from .fake_pg import fake_mesh
from .fsdp import shard_model
from .measure import (
    Progress,
    layer_results,
    model_summary,
    observe_memory,
    random_batch,
    resolve_dtype,
    validate_for_model,
)
from .probe import region_for
from .training import make_optimizer, prime_state

SIMULATED_DEVICE = "cuda (simulated)"
SIMULATION_METHOD = (
    "simulated: fake tensors (torch FakeTensorMode) accounted by "
    "torch.distributed._tools.mem_tracker.MemTracker (bytes of live tensor storages)"
)


def simulate(spec: RunSpec, *, fast: bool = True, progress: Progress | None = None) -> RunResult:
    """Simulate one training step of ``spec`` on fake tensors.

    Args:
        spec: what to simulate; ``device`` is ignored (the simulation stands for a CUDA
            device), ``dtype="auto"`` means bfloat16 as on a GPU, timing fields are unused.
        fast: extrapolate from two shallow copies of the model when the plan repeats
            often enough (exact, and much faster for deep models); False simulates every layer.
        progress: called with a message and the fraction done.

    Returns:
        A :class:`RunResult` with provenance "simulated", per-layer rows, memory and timeline,
        and ``timing=None``.

    Raises:
        SpecError, ModelLoadError: for bad input.
    """
    report = progress or (lambda message, fraction: None)
    spec.validate()
    info = catalog.describe(spec.model)
    validate_for_model(spec, info)
    dtype = resolve_dtype(spec.dtype, torch.device("cuda"))
    config, _, task = catalog.load_config(spec.model)
    shape = Reduction.for_plan(info.num_layers, spec.every_n_layers) if fast else None

    notes = []
    if spec.every_n_layers is not None and spec.every_n_layers >= info.num_layers > 1:
        notes.append(describe_plan(info.num_layers, spec.every_n_layers) + ".")
    if shape is None:
        report(f"simulating all {info.num_layers} layers of {info.name}", 0.1)
        step = _simulate_depth(config, task, info.num_layers, spec, dtype)
    else:
        report(f"simulating {shape.depth(1)} of {info.num_layers} layers", 0.1)
        one = _simulate_depth(config, task, shape.depth(1), spec, dtype)
        report(f"simulating {shape.depth(2)} of {info.num_layers} layers", 0.5)
        two = _simulate_depth(config, task, shape.depth(2), spec, dtype)
        step = shape.extrapolate(one, two)
        notes.append(
            f"Simulated {shape.depth(1)} and {shape.depth(2)} layers and extrapolated to {info.num_layers}: "
            "the layers are identical and the plan repeats, so every figure is exact (not an estimate)."
        )
    if spec.offload:
        notes.append(
            f"offload simulated: {step.host_bytes:,} bytes of checkpointed inputs held in pinned host "
            "memory instead of device memory (counted in host_offload_bytes, not in the device figures)."
        )
    report("done", 1.0)
    return _result(spec, info, dtype, step, notes)


# -- one simulated step -------------------------------------------------------------------


@dataclass(frozen=True)
class _Step:
    """What one simulated step of a given depth gave."""

    depth: int  # layers simulated
    memory: MemoryResult
    layers: list[LayerResult]
    host_bytes: int  # bytes offload held in host memory at the end of the forward
    plan_observed: list[str]  # roles as transformers flagged them


def _simulate_depth(config, task: str, depth: int, spec: RunSpec, dtype: torch.dtype) -> _Step:
    """Simulate the spec's step on a copy of the model with ``depth`` layers."""
    config = catalog.config_with(config, {"num_hidden_layers": depth})
    planned = planned_roles(depth, spec.every_n_layers)
    ledger = HostLedger()
    # The fake process group and its mesh come first: made inside FakeTensorMode, the mesh fails.
    with fake_mesh(spec) as mesh, FakeTensorMode(), simulating(ledger):
        model = catalog.instantiate(config, task, dtype)
        model.train()
        if spec.checkpointing:
            model.activation_checkpointing_enable(every_n_layers=spec.every_n_layers, offload=spec.offload)
        if mesh is not None:
            shard_model(model, mesh)
        enabled = observed_roles(model)
        batch = random_batch(model, spec, torch.device("cpu"))
        with adapted(model, spec.lora_rank, spec.lora_targets) as trained:
            optimizer = make_optimizer(spec.optimizer, trained)
            prime_state(optimizer)  # no warm-up here: the state a real run holds from its second step
            memory, counts = observe_memory(trained, batch, torch.device("cpu"), optimizer)
            del optimizer
        host_bytes = ledger.after_forward
    layers = layer_results(catalog.checkpointable_layers(model), planned, enabled, counts)
    memory = replace(
        memory,
        method=SIMULATION_METHOD,
        offload_bytes=sum(layer.input_bytes for layer in layers if layer.planned == "CP") if spec.offload else 0,
        offload_applied=spec.offload,
    )
    return _Step(depth, memory, layers, host_bytes, enabled)


def _result(spec: RunSpec, info: ModelInfo, dtype: torch.dtype, step: _Step, notes: list[str]) -> RunResult:
    planned = planned_roles(info.num_layers, spec.every_n_layers)
    if [layer.observed for layer in step.layers] != planned:
        notes.append("PLAN MISMATCH: the simulated step did not rerun the layers every_n_layers plans.")
    memory = replace(step.memory, host_offload_bytes=step.host_bytes)
    ranks = []
    if spec.fsdp:
        ranks = [RankResult(rank=0, memory=memory, timing=None, layers=step.layers)]
        notes.append(
            f"FSDP2 over {spec.world_size} ranks, simulated with a fake process group: the figures are rank 0's "
            "(every rank holds the same bytes but for the rounding of uneven shards)."
        )
    return RunResult(
        spec=spec,
        model=model_summary(replace(info, weights="fake")),
        status="ok",
        device=SIMULATED_DEVICE,
        dtype=str(dtype).removeprefix("torch."),
        layers=step.layers,
        memory=memory,
        timing=None,
        provenance=Provenance(
            kind="simulated",
            device_name="no GPU used; tensor shapes as on a CUDA device",
            torch_version=torch.__version__,
            transformers_version=transformers.__version__,
            created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        ),
        notes=notes,
        ranks=ranks,
    )


# -- offload on fake tensors ----------------------------------------------------------------


class HostLedger:
    """Bytes the simulated offload holds in host memory."""

    def __init__(self) -> None:
        self.current = 0
        self.after_forward = 0  # the most it held, reached when the forward ends


_ACTIVE_LEDGER = threading.local()
_INSTALL_LOCK = threading.Lock()
_REAL_SAVE_ON_CPU = torch.autograd.graph.save_on_cpu


class _SimulatedSaveOnCpu(saved_tensors_hooks):
    """``save_on_cpu`` for fake tensors: a host record at pack, a new device tensor at unpack.

    Real tensors are handed to torch's own ``save_on_cpu``, so this class can stay installed in
    transformers while measured runs go on in other threads.
    """

    def __init__(self, pin_memory: bool = False, device_type: str = "cuda") -> None:
        real = _REAL_SAVE_ON_CPU(pin_memory=pin_memory, device_type=device_type)

        def pack(tensor: torch.Tensor) -> Any:
            ledger = getattr(_ACTIVE_LEDGER, "ledger", None)
            if not isinstance(tensor, FakeTensor) or ledger is None:
                return ("real", real.pack_hook(tensor))
            nbytes = tensor.numel() * tensor.element_size()  # save_on_cpu copies into a dense host tensor
            ledger.current += nbytes
            ledger.after_forward = max(ledger.after_forward, ledger.current)
            # No reference to ``tensor``: the device copy is released as after a real copy to host.
            return ("fake", tensor.size(), tensor.dtype, tensor.device, nbytes, ledger)

        def unpack(packed: Any) -> torch.Tensor:
            if packed[0] == "real":
                return real.unpack_hook(packed[1])
            _, size, dtype, device, nbytes, ledger = packed
            ledger.current -= nbytes
            return torch.empty(size, dtype=dtype, device=device)  # the host-to-device copy allocates here

        super().__init__(pack, unpack)


_REAL_FIND_PACKED = transformers.masking_utils.find_packed_sequence_indices


def _unpacked_when_simulating(position_ids: torch.Tensor) -> torch.Tensor | None:
    """transformers' packed-sequence check, answered as for the real tensors of a simulated batch.

    With real position ids (one sequence per row, as ``random_batch`` makes) transformers
    finds no packing and lets SDPA use ``is_causal`` with no mask. Fake position ids cannot be
    read, so it assumes packing and builds an s x s mask that every layer would save: 1 MiB a
    layer at 512 tokens, which no real run holds. The simulation gives the real answer.
    """
    if getattr(_ACTIVE_LEDGER, "ledger", None) is not None and isinstance(position_ids, FakeTensor):
        return None
    return _REAL_FIND_PACKED(position_ids)


@contextmanager
def simulating(ledger: HostLedger) -> Iterator[None]:
    """Mark this thread as simulating: offload and the packed-sequence check behave as for real tensors.

    The replacements are installed in transformers once and hand real tensors, and other
    threads, to the original functions.
    """
    with _INSTALL_LOCK:
        # transformers looks both names up in its modules at each call.
        transformers.modeling_utils.save_on_cpu = _SimulatedSaveOnCpu
        transformers.masking_utils.find_packed_sequence_indices = _unpacked_when_simulating
    _ACTIVE_LEDGER.ledger = ledger
    try:
        yield
    finally:
        _ACTIVE_LEDGER.ledger = None


# -- the fast path ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reduction:
    """How a deep model is folded into shallow copies with the same plan at both ends.

    The layers split into a head (the first repeating unit, which holds layer 0), a middle of
    ``middle_units`` whole units, and a tail (the last unit plus the remainder). Removing
    whole units from the middle keeps every other layer's role.
    """

    unit: int  # layers per repeating unit of the plan
    head: int  # layers before the middle
    tail: int  # layers after the middle
    middle_units: int  # units in the middle of the full model

    @classmethod
    def for_plan(cls, num_layers: int, every_n_layers: int | None) -> Reduction | None:
        # Off, or only L1 checkpointed: every layer after the first is the same (keep).
        unit = 1 if every_n_layers is None or every_n_layers >= num_layers else every_n_layers
        head, tail = unit, unit + num_layers % unit
        middle_units = (num_layers - head - tail) // unit
        reduction = cls(unit, head, tail, middle_units)
        # Worth it only when the two shallow copies together are shallower than the model.
        if middle_units < 2 or reduction.depth(1) + reduction.depth(2) >= num_layers:
            return None
        return reduction

    @property
    def num_layers(self) -> int:
        return self.depth(self.middle_units)

    def depth(self, middle_units: int) -> int:
        return self.head + middle_units * self.unit + self.tail

    def _place(self, layer: int | None, depth: int) -> tuple[Any, ...]:
        """Where a layer of a model of ``depth`` layers sits: head, middle unit and offset, or tail."""
        if layer is None:
            return ("outside",)
        if layer < self.head:
            return ("head", layer)
        if layer >= depth - self.tail:
            return ("tail", layer - (depth - self.tail))
        unit, offset = divmod(layer - self.head, self.unit)
        return ("middle", unit, offset)

    def _layer_index(self, place: tuple[Any, ...], unit: int = 0) -> int | None:
        if place[0] == "outside":
            return None
        if place[0] == "head":
            return place[1]
        if place[0] == "tail":
            return self.num_layers - self.tail + place[1]
        return self.head + unit * self.unit + place[2]

    def extrapolate(self, one: _Step, two: _Step) -> _Step:
        """The full-depth step from steps with one and two middle units.

        A value at an event is ``c + a * (units before it) + b * (units after it)``: for events
        outside the middle, ``two - one`` is the change per middle unit; for an event of middle
        unit ``j`` of ``M``, ``one`` gives ``c`` (unit 0 of 1), ``two``'s unit 0 adds ``b`` and
        its unit 1 adds ``a``.
        """
        full_units = self.middle_units
        timeline_one, timeline_two = one.memory.timeline, two.memory.timeline
        keys_one = [self._key(point, one.depth) for point in timeline_one]
        by_key_two = {self._key(point, two.depth): point for point in timeline_two}
        timeline: list[dict[str, Any]] = []
        block: list[tuple[dict[str, Any], tuple[Any, ...]]] = []  # consecutive events of the middle unit

        def flush_block() -> None:
            # The shallow copy has one middle unit; the full model walks all of them, each
            # unit's events in the same order.
            if not block:
                return
            for unit in self._units_in_step_order(block[0][0]["phase"]):
                for point, key in block:
                    after = by_key_two[key]  # unit 0 of two: one more unit after it
                    before = by_key_two[(key[0], ("middle", 1, key[1][2]), key[2])]  # unit 1: one more before
                    value = _combine(point, before, after, unit, full_units - 1 - unit)
                    timeline.append(self._relabel(value, key, unit=unit))
            block.clear()

        for point, key in zip(timeline_one, keys_one):
            if key[1][0] == "middle":
                block.append((point, key))
                continue
            flush_block()
            timeline.append(self._relabel(_affine(point, by_key_two[key], full_units - 1), key, unit=0))
        flush_block()
        for order, point in enumerate(timeline):
            point["order"] = order
        peak_point = max(timeline, key=lambda point: point["region_peak_bytes"])
        memory = replace(
            one.memory,
            baseline_bytes=timeline[0]["current_bytes"],
            after_forward_bytes=_grow(one.memory.after_forward_bytes, two.memory.after_forward_bytes, full_units - 1),
            peak_bytes=peak_point["region_peak_bytes"],
            peak_where={name: peak_point[name] for name in ("kind", "phase", "layer", "rerun")}
            | {"description": peak_point["event"]},
            breakdown_after_forward=_grow_dict(
                one.memory.breakdown_after_forward, two.memory.breakdown_after_forward, full_units - 1
            ),
            breakdown_baseline=_grow_dict(one.memory.breakdown_baseline, two.memory.breakdown_baseline, full_units - 1),
            breakdown_at_peak=peak_point["region_peak_breakdown"],
            offload_bytes=_grow(one.memory.offload_bytes, two.memory.offload_bytes, full_units - 1),
            optimizer_state_bytes=_grow(
                one.memory.optimizer_state_bytes, two.memory.optimizer_state_bytes, full_units - 1
            ),
            timeline=timeline,
        )
        layers = [self._layer_row(one, two, index) for index in range(self.num_layers)]
        return _Step(
            depth=self.num_layers,
            memory=memory,
            layers=layers,
            host_bytes=_grow(one.host_bytes, two.host_bytes, full_units - 1),
            plan_observed=[layer.enabled for layer in layers],
        )

    def _units_in_step_order(self, phase: str) -> range:
        # The forward meets the middle units first to last, the backward last to first.
        return range(self.middle_units) if phase != "backward" else range(self.middle_units - 1, -1, -1)

    def _key(self, point: dict[str, Any], depth: int) -> tuple[Any, ...]:
        return (point["kind"], self._place(point["layer"], depth), point["phase"])

    def _relabel(self, point: dict[str, Any], key: tuple[Any, ...], unit: int) -> dict[str, Any]:
        layer = self._layer_index(key[1], unit)
        region = region_for(point["kind"], layer)
        return {**point, "layer": layer, "event": region.description}

    def _layer_row(self, one: _Step, two: _Step, index: int) -> LayerResult:
        place = self._place(index, self.num_layers)
        if place[0] == "head":
            row = one.layers[place[1]]
        elif place[0] == "tail":
            row = one.layers[one.depth - self.tail + place[1]]
        elif place[1] == 0:
            row = one.layers[self.head + place[2]]
        else:
            # Not the first middle unit: shared tensors (the rotary tables) were already saved
            # by an earlier layer, as in unit 1 of the two-unit copy.
            row = two.layers[self.head + self.unit + place[2]]
        return replace(row, index=index, name=f"L{index + 1}")


def _grow(one: int, two: int, extra_units: int) -> int:
    return one + extra_units * (two - one)


def _grow_dict(one: dict[str, int], two: dict[str, int], extra_units: int) -> dict[str, int]:
    keys = one.keys() | two.keys()
    grown = {key: _grow(one.get(key, 0), two.get(key, 0), extra_units) for key in keys}
    return {key: value for key, value in grown.items() if value}


def _affine(one: dict[str, Any], two: dict[str, Any], extra_units: int) -> dict[str, Any]:
    return {
        **one,
        "current_bytes": _grow(one["current_bytes"], two["current_bytes"], extra_units),
        "region_peak_bytes": _grow(one["region_peak_bytes"], two["region_peak_bytes"], extra_units),
        "region_peak_breakdown": _grow_dict(one["region_peak_breakdown"], two["region_peak_breakdown"], extra_units),
    }


def _combine(base: dict[str, Any], before: dict[str, Any], after: dict[str, Any], units_before: int, units_after: int):
    def value(name: str) -> int:
        return base[name] + units_before * (before[name] - base[name]) + units_after * (after[name] - base[name])

    keys = (
        base["region_peak_breakdown"].keys()
        | before["region_peak_breakdown"].keys()
        | after["region_peak_breakdown"].keys()
    )

    def part(key: str) -> int:
        b, x, y = (p["region_peak_breakdown"].get(key, 0) for p in (base, before, after))
        return b + units_before * (x - b) + units_after * (y - b)

    breakdown = {key: part(key) for key in keys}
    return {
        **base,
        "current_bytes": value("current_bytes"),
        "region_peak_bytes": value("region_peak_bytes"),
        "region_peak_breakdown": {key: amount for key, amount in breakdown.items() if amount},
    }
