"""Real model sizes without the hardware: a training step on fake tensors, accounted like a CPU run.

``simulate(spec)`` builds the spec's model under torch's ``FakeTensorMode`` (shapes and
dtypes, no storage), enables checkpointing through transformers' own
``activation_checkpointing_enable`` and runs the same observed step as a measured run
(``ckptlab.step.measure.observe_memory``: the same probe, the same MemTracker). Nothing is
allocated, so an 8B model at 128k tokens runs on a laptop; the numbers are what the
tensors of a GPU step would hold (or a CPU step's, with ``device="cpu"``: its float32 default, its
optimizer and attention kernels, no offload; the result says "cpu (simulated)"). The result has the shape
of a measured one, with provenance "simulated" and no timing.

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
- **speed.** A 36-layer 8B step takes about 10 s of fake-tensor dispatch, so deep models
  whose layers are alike are simulated as two shallow copies and extrapolated exactly
  (:mod:`.fold`).
- **dropout.** On fake CPU tensors ``dropout`` draws a mask in the input's dtype; CUDA's fused kernel keeps a
  boolean one. :func:`_dropout_as_on_cuda` gives fake tensors CUDA's (eager attention's probabilities, BERT's
  and GPT-2's hidden states in train mode).
- **attention with dropout.** On fake CPU tensors SDPA with attention dropout (BERT, GPT-2 in
  train mode) falls back to the math kernel, which stores the batch x heads x seq^2
  probabilities and their dropout mask; CUDA's flash and memory-efficient kernels draw the mask
  again from the RNG in the backward and keep only the output and a float32 log-sum-exp, as
  without dropout. :func:`_sdpa_as_on_cuda` gives fake tensors that path (dropout 0: the same
  bytes, and the numbers of a fake tensor are never read).
- **values transformers reads.** Where transformers reads a tensor's values to pick a path, a fake tensor cannot
  answer, and the simulation answers as the real tensors of the lab's batch would: no packed sequences
  (:func:`_unpacked_when_simulating`), no padding in a mask the model makes of ones (:func:`_unpadded_mask`: BERT's,
  BART's, BioGPT's), and ``trunc_normal_``'s draws left undrawn (:func:`_trunc_normal_on_fake`: a vision tower's
  init); none changes a byte of what the real step holds.
- **DTensor's shape propagation.** Under FSDP2 the gradients are DTensors; to learn an op's output shape DTensor
  runs it once on placeholders of the *global* shapes in the ambient fake mode, or in a fresh one when there is
  none (a real rank). MemTracker skips what runs in another fake mode than the one it was entered in, so a real
  rank's placeholders are never counted; a simulation's ambient mode is the tracker's own, and they were:
  the norm over the sharded gradients held all of them at once, the unsharded size of every gradient (tiny-llama
  on 2 ranks: 55,071,460 B of "activation" at a 165,212,360 B peak, where gloo rank 0 peaks at 146,135,276 B),
  and only on a process's first such op, DTensor caching the answer. :func:`_propagation_fake_mode` gives the
  propagation a fake mode of its own, as on a real rank.
- **mixture of experts.** transformers' ``grouped_mm`` experts run as in a measured step;
  :mod:`.fake_experts` gives torch's grouped matmul its output on fake float32 tensors, and
  the routing, which fake tensors cannot decide, changes no byte (``ROUTING_NOTE``).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, cast

import torch
import torch.distributed.tensor._sharding_prop as dtensor_sharding_prop  # DTensor's shape propagation: see below
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.autograd.graph import saved_tensors_hooks

# Before any import that reaches transformers.models (those below): its model folders scanned once, not twice.
from ..model import transformers_models  # noqa: F401

# isort: split
import transformers
import transformers.masking_utils
import transformers.modeling_utils
from transformers import initialization as transformers_initialization  # a name of its own: see _REAL_TRUNC_NORMAL
from transformers.modeling_utils import AttentionInterface

from ..errors import expect_type
from ..fact import Fact
from ..model import catalog
from ..model.attention import FLASH_ATTENTION_2, SDPA, attention_notes, check_flash_device
from ..model.catalog import ModelInfo
from ..model.experts import ROUTING_NOTE, experts_note
from ..model.lora import adapted
from ..model.plan import CP, Role, nested_in, observed_roles, only_first_layer_notes, planned_roles, rerun_roles
from ..model.quantize import prepare as prepare_kbit
from ..model.quantize import quantization_notes, quantize
from ..model.selective import enable_checkpointing
from ..results import SIMULATED_MEMORY_METHOD, LayerResult, RankResult, RunResult
from ..results.allocations import AllocationTrace
from ..spec import RunSpec
from ..torchstate import exclusive
from .allocations import AllocationRecorder, ShallowTrace, repeated
from .fake_experts import DATA_DEPENDENT_ERRORS, GroupedMmShapes, unsupported_moe_error
from .fake_pg import fake_mesh
from .fold import NotDerivable, Reduction, SimulatedStep
from .fsdp import mixed_precision_policy, shard_model
from .measure import layer_results, observe_memory, offload_notes, reruns_inside_notes
from .memory_meters import HOST
from .opcount import WorkCounter, step_work
from .preflight import (
    resolve_dtype,
    simulated_device_type_of,
    simulated_dtype,
    validate_for_model,
    with_folder_quantization,
)
from .provenance import model_summary, simulated_provenance
from .selective import check_simulated_selective, selective_notes
from .stopping import DONE, Progress
from .torch_workarounds import TraceSink, fsdp_stream_now
from .training import Recipe, check_optimizer_runs, prime_state
from .trainstep import random_batch

SIMULATED_DEVICE = "cuda (simulated)"
SIMULATED_CPU = "cpu (simulated)"


@exclusive  # process-wide torch state: ckptlab.torchstate
def simulate(
    spec: RunSpec, *, fast: bool = True, progress: Progress | None = None, allocations: bool = False
) -> RunResult:
    """Simulate one training step of ``spec`` on fake tensors.

    Args:
        spec: what to simulate; the simulation stands for a CUDA device unless ``device`` is "cpu"
            (:func:`simulated_device_type`); ``dtype="auto"`` means bfloat16 as on a GPU (float32 on
            the CPU), timing fields are unused.
        fast: extrapolate from two shallow copies of the model when the plan repeats
            often enough (exact, and much faster for deep models); False simulates every layer.
        progress: called with a message and the fraction done.
        allocations: also record the order of the step's allocations (``RunResult.allocations``, what the caching
            allocator's replay reads); folded, it costs a third shallow copy (:func:`fold_allocations`).

    Returns:
        A :class:`RunResult` with provenance "simulated", per-layer rows, memory and timeline,
        and ``timing=None``.

    Raises:
        SpecError, ModelLoadError: for bad input.
    """
    expect_type("ckptlab.simulate", "spec", spec, RunSpec, "ckptlab.simulate(ckptlab.RunSpec(model='qwen3-8b'))")
    report = progress or (lambda message, fraction: None)
    spec = with_folder_quantization(spec)
    info, dtype, config, task = prepare(spec)
    shape = Reduction.for_plan(info.num_layers, spec.every_n_layers, info.layer_period) if fast else None

    notes = simulation_notes(spec, info, fast, config, task)
    if shape is None:
        if fast and not info.layers_alike:
            notes.insert(0, Fact("note.layers_differ"))
        report(Fact("progress.simulating_all", {"layers": info.num_layers, "name": info.name}), 0.1)
        recorder = AllocationRecorder() if allocations else None
        step = simulate_depth(config, task, info.depth or info.num_layers, spec, dtype, trace=recorder)
        if recorder is not None:
            step = replace(step, allocations=recorder.step_trace(step.memory.timeline))
    else:
        steps = 3 if allocations else 2
        recorders = [AllocationRecorder() if allocations else None for _ in range(steps)]
        report(simulating_some(shape.depth(1), info.num_layers, 1, steps), 0.1)
        one = simulate_depth(config, task, shape.depth(1), spec, dtype, trace=recorders[0])
        report(simulating_some(shape.depth(2), info.num_layers, 2, steps), 0.5 if steps == 2 else 0.3)
        two = simulate_depth(config, task, shape.depth(2), spec, dtype, trace=recorders[1])
        step = shape.extrapolate(one, two)
        if allocations:
            report(simulating_some(shape.depth(3), info.num_layers, 3, steps), 0.6)
            three = simulate_depth(config, task, shape.depth(3), spec, dtype, trace=recorders[2])
            trace = fold_allocations(shape, (one, two, three), recorders)
            if trace is None:  # the copies do not repeat as the fold says: the whole step, recorded
                recorder = AllocationRecorder()
                whole = simulate_depth(config, task, shape.num_layers, spec, dtype, trace=recorder)
                trace = recorder.step_trace(whole.memory.timeline)
                order_note = Fact("note.allocation_order_whole", {"layers": info.num_layers})
            else:
                order_note = Fact("note.allocation_order_repeated", {"three": shape.depth(3)})
            step = replace(step, allocations=trace)
        notes.append(
            Fact("note.extrapolated", {"one": shape.depth(1), "two": shape.depth(2), "layers": info.num_layers})
        )
        if allocations:
            notes.append(order_note)
    report(DONE, 1.0)
    return simulated_result(spec, info, dtype, step, notes)


def fold_allocations(
    shape: Reduction, steps: Sequence[SimulatedStep], recorders: Sequence[AllocationRecorder | None]
) -> AllocationTrace | None:
    """The full step's allocation order from shallow copies with one, two and three middle units, their middle
    units' events repeated as the fold repeats their bytes (:func:`.allocations.repeated`); ``None`` where the copies
    do not repeat as the fold says (the caller then has no order to replay, and says so)."""
    traces = []
    for units, (step, recorder) in enumerate(zip(steps, recorders, strict=True), start=1):
        if recorder is None:
            return None
        try:
            traces.append(ShallowTrace.of(units, recorder, shape.stretch_keys(step)))
        except NotDerivable:
            return None
    try:
        return repeated(traces[0], traces[1], traces[2], shape.middle_units)
    except NotDerivable:
        return None


def prepare(spec: RunSpec) -> tuple[ModelInfo, torch.dtype, Any, str]:
    """Check ``spec`` as a simulation does; its model's description, dtype, config and task.

    Raises:
        SpecError, ModelLoadError: for bad input.
    """
    spec.validate()
    info = catalog.describe(spec.model)
    validate_for_model(spec, info)
    device_type = simulated_device_type(spec)
    check_flash_device(spec.attn_implementation, device_type)
    check_optimizer_runs(spec, device_type=device_type, simulated=True)
    check_simulated_selective(spec)
    dtype = simulated_dtype(spec)
    config, _, task = catalog.load_config(spec.model)
    return info, dtype, config, task


def simulated_device_type(spec: RunSpec) -> str:
    """The device a simulation of ``spec`` stands for (:func:`~.preflight.simulated_device_type_of`)."""
    return simulated_device_type_of(spec.device)


def simulated_attention(spec: RunSpec) -> str:
    """The attention a simulation builds with: the spec's, but SDPA for flash_attention_2, whose CUDA kernels fake
    tensors cannot run; SDPA's flash kernel keeps the same bytes (the output and a float32 logsumexp)."""
    return SDPA if spec.attn_implementation == FLASH_ATTENTION_2 else spec.attn_implementation


def simulation_notes(spec: RunSpec, info: ModelInfo, fast: bool, config: Any = None, task: str = "") -> list[Fact]:
    """The notes of a simulation of ``spec`` that do not depend on how its layers were simulated (with the model's
    ``config`` and ``task``, also whether its class runs the attention asked for)."""
    notes: list[Fact] = []
    if spec.attn_implementation == FLASH_ATTENTION_2:
        notes.append(Fact("note.flash_simulated_as_sdpa"))
    model_class = None if config is None else catalog.model_class_for(config, task)
    if model_class is not None:
        notes += attention_notes(model_class, config, simulated_attention(spec))
    if info.experts_implementation is not None:
        notes += [experts_note(info), ROUTING_NOTE]
    notes += quantization_notes(spec.quantization, spec.checkpointing)
    notes += only_first_layer_notes(info.num_layers, spec.every_n_layers)
    if spec.optimizer.startswith("paged_") and simulated_device_type(spec) == "cuda":
        # bitsandbytes allocates a paged state buffer of 1e5 elements or more with cudaMallocManaged
        # (Optimizer8bit.get_state_buffer): the GPU holds it while there is room and the driver moves it to the host
        # when there is not, so the step slows down where a plain optimizer would run out of memory.
        notes.append(Fact("note.paged_optimizer", {"optimizer": spec.optimizer}))
    if model_class is not None:
        notes += cuda_sdpa_notes(spec, model_class, config)
    return notes


def cuda_sdpa_notes(spec: RunSpec, model_class: Any, config: Any) -> list[Fact]:
    """Which CUDA kernel a simulated SDPA call stands for, in a note (none for the CPU, eager, or no attention).

    Fake tensors run SDPA's CPU flash op (:func:`_sdpa_as_on_cuda`): the output and a float32 logsumexp of
    ``batch x heads x seq``. On CUDA, SDPA picks by dtype: a 16-bit step takes the flash kernel, which keeps the
    same bytes; a float32 one the memory-efficient kernel, whose logsumexp is padded to a multiple of 32 tokens
    (at most ``heads x 31 x 4`` bytes a layer more than counted).
    """
    if simulated_device_type(spec) != "cuda" or simulated_attention(spec) != SDPA:
        return []
    if attention_notes(model_class, config, SDPA):  # the class runs eager: no SDPA call to stand for
        return []
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if not getattr(text, "num_attention_heads", None):
        return []
    sixteen_bits = spec.mixed_precision != "none" or resolve_dtype(spec.dtype, torch.device("cuda")) != torch.float32
    return [Fact("note.sdpa_kernel_flash" if sixteen_bits else "note.sdpa_kernel_efficient")]


def simulating_some(depth: int, layers: int, step: int, steps: int) -> Fact:
    """The progress line of one shallow copy's simulation (``depth`` of the model's ``layers``), the ``step``-th of
    ``steps``: a count that only goes up (the copies' depths do not: a table records 3 layers, then 2)."""
    return Fact("progress.simulating_some", {"depth": depth, "layers": layers, "step": step, "steps": steps})


# -- one simulated step -------------------------------------------------------------------


def simulate_depth(
    config,
    task: str,
    depth: int,
    spec: RunSpec,
    dtype: torch.dtype,
    roles: Sequence[Role] | None = None,
    trace: TraceSink | None = None,
) -> SimulatedStep:
    """Simulate the spec's step on a copy of the model with ``depth`` layers.

    ``roles`` gives each layer's role instead of the spec's plan (:mod:`.table` simulates the
    contexts a plan's layers meet); the spec's ``every_n_layers`` must then be set. A ``trace`` is
    told every change of the step's memory, offload's host copies included (:mod:`.replay`).
    """
    # The copy keeps the real layers' per-layer settings in step with the layers it keeps (configs.layers_kept).
    config = catalog.config_with(config, {"num_hidden_layers": depth})
    work = WorkCounter()  # every op of the step, counted as the tracker sees it (:mod:`.opcount`)
    ledger = HostLedger(trace, as_cuda=simulated_device_type(spec) == "cuda", work=work)
    # The fake process group and its mesh come first: made inside FakeTensorMode, the mesh fails.
    try:
        with fake_mesh(spec) as mesh, FakeTensorMode(), GroupedMmShapes(), simulating(ledger):
            model, enabled, memory, counts, host_bytes = _fake_step(
                config, task, spec, dtype, ledger, mesh, roles, trace, work
            )
    except DATA_DEPENDENT_ERRORS as exc:
        raise unsupported_moe_error(spec.model, config.model_type, exc) from exc
    # The plan of the layers transformers counts, which a nested model has more of than its depth.
    modules = catalog.checkpointable_layers(model)
    planned = planned_roles(len(modules), spec.every_n_layers) if roles is None else list(roles)
    layers = layer_results(modules, planned, enabled, counts, nested_in(model))
    memory = replace(memory, method=SIMULATED_MEMORY_METHOD, **offload_fields(spec, layers, ledger.as_cuda))
    return SimulatedStep(depth, memory, layers, host_bytes, work=work.counted())


def offload_fields(spec: RunSpec, layers: Sequence[LayerResult], as_cuda: bool = True) -> dict[str, Any]:
    """A simulated step's ``offload_bytes`` (what the CP layers' inputs take, moved or not) and ``offload_applied``
    (not where the simulation stands for the CPU, as in a measured CPU run)."""
    moved = sum(layer.input_bytes for layer in layers if layer.planned == CP) if spec.offload else 0
    return {"offload_bytes": moved, "offload_applied": spec.offload and as_cuda}


def _fake_step(
    config,
    task: str,
    spec: RunSpec,
    dtype: torch.dtype,
    ledger: HostLedger,
    mesh,
    roles: Sequence[Role] | None,
    trace: TraceSink | None,
    work: WorkCounter | None = None,
) -> tuple:
    """Build the model on fake tensors and observe one step (inside the simulation's modes)."""
    model = catalog.instantiate(catalog.without_quantization(config), task, dtype, simulated_attention(spec))
    if spec.quantization is not None:  # as a measured run's build: quantized, then peft's preparation
        quantize(model, spec.quantization)
        prepare_kbit(model)
        if spec.every_n_layers is None:  # as a measured run's apply_setting
            model.disable_input_require_grads()
            model.activation_checkpointing_disable()
    model.train()
    offload = spec.offload and ledger.as_cuda  # as in a measured run: the CPU has no pinned host memory to move to
    if spec.every_n_layers is not None:  # spec.checkpointing
        enable_checkpointing(model, spec.every_n_layers if roles is None else 1, offload, spec.selective)
    if roles is not None:
        # transformers' call set every layer up to rerun; the flag it reads at each call picks the role.
        for layer, role in zip(catalog.checkpointable_layers(model), roles, strict=True):
            layer.gradient_checkpointing = role == CP
    if mesh is not None:
        shard_model(model, mesh, mixed_precision_policy(spec))
        if trace is not None:  # the collectives' buffers come from their streams' own pools (torch_workarounds)
            trace.follow_streams(fsdp_stream_now(model))
    enabled = observed_roles(model)
    batch = random_batch(model, spec, torch.device("cpu"))
    with adapted(model, spec.lora_rank, spec.lora_targets) as trained:
        recipe = Recipe.for_spec(spec, trained, simulated_cuda=ledger.as_cuda)
        prime_state(recipe)  # no warm-up here: the state a real run holds from its second step
        memory, counts = observe_memory(trained, batch, torch.device("cpu"), recipe, trace, work)
        del recipe
    return model, enabled, memory, counts, ledger.after_forward


def simulated_result(
    spec: RunSpec, info: ModelInfo, dtype: torch.dtype, step: SimulatedStep, notes: list[Fact]
) -> RunResult:
    """The :class:`RunResult` of a simulated step of the whole model, with ``notes`` on how it was simulated."""
    device_type = simulated_device_type(spec)
    if spec.offload and device_type == "cuda":
        notes.append(Fact("note.offload_simulated", {"bytes": step.host_bytes}))
    notes[:0] = offload_notes(spec, step.memory, step.layers)  # offload asked for a CPU: what it would move
    planned = rerun_roles(planned_roles(info.num_layers, spec.every_n_layers), info.nested_in)
    notes += reruns_inside_notes(step.layers)
    if [layer.observed for layer in step.layers] != planned:
        notes.append(Fact("note.plan_mismatch_simulated"))
    notes += selective_notes(spec, step.layers, spec.offload)
    memory = replace(step.memory, host_offload_bytes=step.host_bytes)
    ranks = []
    if spec.fsdp:
        ranks = [RankResult(rank=0, memory=memory, timing=None, layers=step.layers)]
        notes.append(Fact("note.fsdp_simulated", {"ranks": spec.world_size}))
    return RunResult(
        spec=spec,
        model=model_summary(replace(info, weights="fake")),
        status="ok",
        device=SIMULATED_DEVICE if device_type == "cuda" else SIMULATED_CPU,
        dtype=str(dtype).removeprefix("torch."),
        layers=step.layers,
        memory=memory,
        timing=None,
        provenance=simulated_provenance(device_type),
        notes=notes,
        ranks=ranks,
        allocations=step.allocations,
        work=None if step.work is None else step_work(step.work, step.memory.timeline),
    )


# -- offload on fake tensors ----------------------------------------------------------------


class HostLedger:
    """Bytes the simulated offload holds in host memory (told, copy by copy, to a ``trace`` where there is one)."""

    def __init__(
        self, trace: TraceSink | None = None, *, as_cuda: bool = True, work: WorkCounter | None = None
    ) -> None:
        self.as_cuda = as_cuda  # the step stands for a CUDA device (else the CPU: its attention kernels, no offload)
        self.work = work  # told each copy's bytes, to the host and back (the step's offload work)
        self.current = 0
        self.after_forward = 0  # the most it held, reached when the forward ends
        self._trace = trace
        self._copies = itertools.count(1)

    def hold(self, nbytes: int) -> int:
        """A copy of ``nbytes`` reaches the host; returns its name for :meth:`release`."""
        self.current += nbytes
        self.after_forward = max(self.after_forward, self.current)
        copy = -next(self._copies)  # negative: never a tracker's storage name (an id)
        if self._trace is not None:
            self._trace.change(copy, HOST, nbytes)
        return copy

    def release(self, copy: int, nbytes: int) -> None:
        """The copy ``copy`` goes back to the device."""
        self.current -= nbytes
        if self._trace is not None:
            self._trace.change(copy, HOST, -nbytes, gone=True)


_ACTIVE_LEDGER = threading.local()
_INSTALL_LOCK = threading.Lock()
_REAL_SAVE_ON_CPU = torch.autograd.graph.save_on_cpu


class _SimulatedSaveOnCpu(saved_tensors_hooks):
    """``save_on_cpu`` for fake tensors: a host record at pack, a new device tensor at unpack.

    Real tensors are handed to torch's own ``save_on_cpu``, so measured runs in other threads go on as they would
    while a simulation has this class installed in transformers (:func:`simulating`).
    """

    def __init__(self, pin_memory: bool = False, device_type: str = "cuda") -> None:
        real = _REAL_SAVE_ON_CPU(pin_memory=pin_memory, device_type=device_type)

        def pack(tensor: torch.Tensor) -> Any:
            ledger = getattr(_ACTIVE_LEDGER, "ledger", None)
            if not isinstance(tensor, FakeTensor) or ledger is None:
                return ("real", real.pack_hook(tensor))
            nbytes = tensor.numel() * tensor.element_size()  # save_on_cpu copies into a dense host tensor
            if ledger.work is not None:
                ledger.work.copy(nbytes, tensor.dtype, to_host=True)
            # No reference to ``tensor``: the device copy is released as after a real copy to host.
            return ("fake", tensor.size(), tensor.dtype, tensor.device, nbytes, ledger, ledger.hold(nbytes))

        def unpack(packed: Any) -> torch.Tensor:
            if packed[0] == "real":
                return real.unpack_hook(packed[1])
            _, size, dtype, device, nbytes, ledger, copy = packed
            ledger.release(copy, nbytes)
            if ledger.work is not None:
                ledger.work.copy(nbytes, dtype, to_host=False)
            return torch.empty(size, dtype=dtype, device=device)  # the host-to-device copy allocates here

        super().__init__(pack, unpack)


_REAL_FIND_PACKED = transformers.masking_utils.find_packed_sequence_indices
_REAL_SDPA: Callable[..., Any] = AttentionInterface._global_mapping["sdpa"]  # type: ignore[assignment]  # a plain function


def _sdpa_as_on_cuda(module, query, key, value, attention_mask, dropout: float = 0.0, **kwargs):
    """transformers' SDPA attention, on the kernel a CUDA step takes (see the module docstring): fake tensors of a
    simulation run it without the dropout that sends the CPU to the math kernel; real tensors as they are."""
    ledger = getattr(_ACTIVE_LEDGER, "ledger", None)
    if dropout and ledger is not None and ledger.as_cuda and isinstance(query, FakeTensor):
        dropout = 0.0
    return _REAL_SDPA(module, query, key, value, attention_mask, dropout=dropout, **kwargs)


_REAL_DROPOUT = torch.nn.functional.dropout


def _dropout_as_on_cuda(input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False):
    """``torch.nn.functional.dropout`` as a CUDA step runs it: fake tensors of a simulation standing for CUDA take
    the fused kernel (``native_dropout``), which keeps a one-byte boolean mask; on fake CPU tensors ``dropout``
    would draw a mask in the input's dtype (4 bytes in float32). Eager attention's dropout and the hidden
    states' keep their masks for the backward. Real tensors, and other threads, get torch's own."""
    ledger = getattr(_ACTIVE_LEDGER, "ledger", None)
    if ledger is None or not ledger.as_cuda or not isinstance(input, FakeTensor) or not training or not 0 < p < 1:
        return _REAL_DROPOUT(input, p, training, inplace)
    return torch.native_dropout(input, p, True)[0]


# transformers' lazy package may lack the submodule as an attribute when another import loaded the submodule first
# (seen in a pytest worker): `from transformers import initialization` finds it in sys.modules either way.
_REAL_TRUNC_NORMAL = cast(
    Callable[..., torch.Tensor], transformers_initialization.TORCH_INIT_FUNCTIONS["trunc_normal_"]
)


def _trunc_normal_on_fake(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """``trunc_normal_`` as transformers initializes with it (SigLIP's vision tower, Gemma 3's): torch draws until
    no value falls outside the bounds, a decision fake tensors cannot make. Their values are never read, and the
    draw is in place: a fake tensor is left as it is (no byte changes). Real tensors get torch's own."""
    if isinstance(tensor, FakeTensor):
        return tensor
    return _REAL_TRUNC_NORMAL(tensor, *args, **kwargs)


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


_REAL_IGNORE_CAUSAL = transformers.masking_utils._ignore_causal_mask_sdpa
_REAL_IGNORE_BIDIRECTIONAL = transformers.masking_utils._ignore_bidirectional_mask_sdpa


def _ignore_causal_when_simulating(padding_mask: torch.Tensor | None, *args: Any, **kwargs: Any) -> bool:
    """transformers' check whether SDPA may take ``is_causal`` and no mask, answered as for the real tensors of a
    simulated batch (:func:`_unpadded_mask`)."""
    return _REAL_IGNORE_CAUSAL(_unpadded_mask(padding_mask), *args, **kwargs)


def _ignore_bidirectional_when_simulating(padding_mask: torch.Tensor | None, *args: Any, **kwargs: Any) -> bool:
    """transformers' check whether a bidirectional (encoder's) mask can be left out, answered as for real tensors."""
    return _REAL_IGNORE_BIDIRECTIONAL(_unpadded_mask(padding_mask), *args, **kwargs)


def _unpadded_mask(padding_mask: torch.Tensor | None) -> torch.Tensor | None:
    """None (no padding) for a fake padding mask of a simulation. ``random_batch`` pads no row, so the only padding
    mask a lab step meets is all ones (BERT's, BART's, BioGPT's, made by the model with ``torch.ones`` when it is given
    none): transformers reads it, finds no padding and builds no mask. A fake mask cannot be read, so transformers
    would build a ``b x 1 x s x s`` mask that no real run holds (1,024 bytes at 32 tokens, 4,096 for eager's floats)."""
    if getattr(_ACTIVE_LEDGER, "ledger", None) is not None and isinstance(padding_mask, FakeTensor):
        return None
    return padding_mask


_REAL_DETECT_FAKE_MODE = detect_fake_mode


def _propagation_fake_mode(inputs: Any = None) -> FakeTensorMode | None:
    """The fake mode DTensor's sharding propagation runs its global-shape placeholders in: none in a simulating
    thread, so that it makes a fresh one, as on a real rank, and the tracker skips them (see the module docstring);
    torch's own answer elsewhere (real ranks, other threads, a compiler's tracing)."""
    if getattr(_ACTIVE_LEDGER, "ledger", None) is not None:
        return None
    return _REAL_DETECT_FAKE_MODE(inputs)


def _replacements() -> list[tuple[Any, str, Any]]:
    """Where each stand-in goes: (a module or a table, the name in it, the stand-in). Read at each install, so that
    a stand-in a test swaps on this module is the one installed."""
    return [
        # transformers looks these names up in its modules at each call.
        (transformers.modeling_utils, "save_on_cpu", _SimulatedSaveOnCpu),
        (transformers.masking_utils, "find_packed_sequence_indices", _unpacked_when_simulating),
        (transformers.masking_utils, "_ignore_causal_mask_sdpa", _ignore_causal_when_simulating),
        (transformers.masking_utils, "_ignore_bidirectional_mask_sdpa", _ignore_bidirectional_when_simulating),
        (AttentionInterface._global_mapping, "sdpa", _sdpa_as_on_cuda),  # models look it up at each call
        (torch.nn.functional, "dropout", _dropout_as_on_cuda),  # nn.Dropout and eager attention look it up at each call
        # transformers' init functions look their torch function up in this table at each call.
        (transformers_initialization.TORCH_INIT_FUNCTIONS, "trunc_normal_", _trunc_normal_on_fake),
        (dtensor_sharding_prop, "detect_fake_mode", _propagation_fake_mode),  # looked up at each propagation
    ]


def _put(place: Any, name: str, value: Any) -> Any:
    """Set ``name`` in a module or a table to ``value``; what it held before."""
    if isinstance(place, MutableMapping):
        held, place[name] = place[name], value
    else:
        held = getattr(place, name)
        setattr(place, name, value)
    return held


# What the replaced places held before the first of the running simulations, and how many run (both under
# _INSTALL_LOCK): the last one to end puts them back, so a user's process is left as it was.
_ORIGINALS: list[tuple[Any, str, Any]] = []
_RUNNING = 0


@contextmanager
def simulating(ledger: HostLedger) -> Iterator[None]:
    """Mark this thread as simulating: offload, the packed-sequence check and attention behave as for real CUDA
    tensors, and DTensor's shape propagation is not counted as memory.

    The replacements are installed in transformers (and torch) while any simulation of the process runs (the app
    runs them in threads: they hand real tensors, and other threads, to the original functions) and restored when
    the last one ends, as accelerate's ``init_on_device`` restores what it patches.
    """
    global _RUNNING
    with _INSTALL_LOCK:
        if _RUNNING == 0:
            _ORIGINALS[:] = [(place, name, _put(place, name, stand_in)) for place, name, stand_in in _replacements()]
        _RUNNING += 1
    _ACTIVE_LEDGER.ledger = ledger
    try:
        yield
    finally:
        _ACTIVE_LEDGER.ledger = None
        with _INSTALL_LOCK:
            _RUNNING -= 1
            if _RUNNING == 0:
                for place, name, original in reversed(_ORIGINALS):
                    _put(place, name, original)
                _ORIGINALS.clear()
