"""Before a measured run: the device and dtype a spec names, the spec against its model, and building the model.

Everything here can refuse a run before anything heavy is allocated: a sequence longer than the
model's positions, checkpointing asked of a class that cannot checkpoint, parameters that alone
exceed the device, or (on the CPU, where an out-of-memory kills the process) parameters and
gradients above the free host memory.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from transformers import PreTrainedModel

from ..errors import Command, DoesNotFitError, Option, SpecError, not_one_of
from ..fact import Fact
from ..model import catalog
from ..model.attention import check_flash_device
from ..model.catalog import ModelInfo
from ..model.folder_checks import check_fits, memory_limit
from ..model.lora import adapted_shapes, adapter_parameters, check_rank
from ..model.quantize import config_quantization
from ..spec import RunSpec
from ..torchstate import exclusive
from ..units import parameter_count
from .stopping import Progress

DTYPE_BY_NAME = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def device_type_of(name: str) -> str:
    """Where ``spec.device`` runs, "cuda" or "cpu": "auto" takes CUDA when there is one. The one rule of 'auto';
    no check that a CUDA device exists (a prediction may be for a GPU this machine lacks)."""
    return "cuda" if name == "cuda" or (name == "auto" and torch.cuda.is_available()) else "cpu"


def simulated_device_type_of(name: str) -> str:
    """The device a figure that answers for a GPU (a simulation, a prediction) stands for: "cpu" when named, else
    "cuda", "auto" included whatever this machine has (their point is the GPU a person does not have). The one rule
    of 'auto' for them; a measured run reads 'auto' as the machine it runs on (:func:`device_type_of`)."""
    return "cpu" if name == "cpu" else "cuda"


def resolve_device(name: str) -> torch.device:
    """The device for ``spec.device`` (:func:`device_type_of`), on this machine.

    Raises:
        SpecError: for "cuda" on a machine where torch sees no CUDA device.
    """
    if name == "cuda" and not torch.cuda.is_available():
        raise SpecError(key="spec.no_cuda", option=Option("device", "cuda"), torch=torch.__version__)
    if device_type_of(name) == "cuda":
        # The current device: 0 in a single process, the rank's own GPU once fsdp.py has set it.
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def resolve_dtype(name: str, device: torch.device, mixed_precision: str = "none") -> torch.dtype:
    """The weights' dtype for ``spec.dtype``: "auto" is float32 on the CPU (bf16 matmuls are slow there) and
    under mixed precision (Trainer's ``bf16=True`` keeps float32 master weights), else bfloat16 on CUDA."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" and mixed_precision == "none" else torch.float32
    if name not in DTYPE_BY_NAME:
        raise not_one_of("dtype", name, ("auto", *DTYPE_BY_NAME))
    return DTYPE_BY_NAME[name]


def simulated_dtype(spec: RunSpec) -> torch.dtype:
    """The weights' dtype a simulation of ``spec`` runs in: its dtype on the device it stands for
    (:func:`simulated_device_type_of`; "auto" is bfloat16 there, float32 under mixed precision or on a named CPU)."""
    return resolve_dtype(spec.dtype, torch.device(simulated_device_type_of(spec.device)), spec.mixed_precision)


def validate_for_model(spec: RunSpec, info: ModelInfo) -> None:
    """Check the spec against the model's limits.

    Raises:
        SpecError: a sequence longer than the model's positions (``RunSpec.check_model_limits``), a LoRA rank above
            the model's projections.
        UnsupportedModelError: checkpointing asked of a class transformers cannot checkpoint.
    """
    spec.check_model_limits(info)
    if spec.lora_rank is not None:
        check_rank(spec.lora_rank, _adapted(spec, info), info.name)


@dataclass(frozen=True)
class CheckedSpec:
    """A spec checked once against itself and its model, with the device and dtype it runs on.

    What every way to a step needs before it builds anything (:func:`check_spec`): the app's check of
    its widgets, the queue's refusal, :func:`load_model` and the step itself read this, rather than each
    validating the spec and describing its model again.
    """

    spec: RunSpec
    info: ModelInfo
    device: torch.device
    dtype: torch.dtype  # the weights' (resolve_dtype: 'auto' and mixed precision resolved)


def check_spec(spec: RunSpec, info: ModelInfo | None = None) -> CheckedSpec:
    """``spec`` validated, against its model too (``info``, or the catalog's description), its device and dtype resolved.

    Raises:
        SpecError, ModelLoadError, UnsupportedModelError: naming the bad value and the fix.
    """
    spec = with_folder_quantization(spec)
    spec.validate()
    info = catalog.describe(spec.model) if info is None else info
    validate_for_model(spec, info)
    device = resolve_device(spec.device)
    check_flash_device(spec.attn_implementation, device.type)
    return CheckedSpec(spec, info, device, resolve_dtype(spec.dtype, device, spec.mixed_precision))


def with_folder_quantization(spec: RunSpec) -> RunSpec:
    """``spec`` with the 4-bit or 8-bit quantization its model's config.json asks for (a "-bnb-4bit" or "-bnb-8bit" folder's
    ``quantization_config``) where the spec names none; else ``spec`` itself.

    Raises:
        SpecError: a bitsandbytes quantization_config the lab does not take.
    """
    if spec.quantization is not None or not isinstance(spec.model, str):
        return spec
    config, _, _ = catalog.load_config(spec.model)
    found = config_quantization(config)
    return spec if found is None else replace(spec, quantization=found)


def refuse_beyond_machine(checked: CheckedSpec) -> None:
    """Refuse a run that cannot fit this machine, before anything is built: the parameters alone over the device's
    memory (never fits), with their gradients over the free host memory (the CPU), or the step's floor over the
    machine's. The app says it before a run queues: a batch far beyond the machine never takes a turn.

    Raises:
        DoesNotFitError: naming what does not fit and what would.
    """
    info, dtype, device = checked.info, checked.dtype, checked.device
    quantization = checked.spec.quantization
    stored = None if quantization is None else (base_bytes(checked.spec, info, dtype), quantization.label)
    check_fits(info, dtype, device, stored)
    # A LoRA base is frozen, so "parameters and their gradients" overcounts it: its floor (the adapters and their
    # gradients) is step_floor's, which then names the rank.
    full = checked.spec.lora_rank is None
    refusal = (host_memory_refusal(info, dtype, device) if full else None) or step_floor_refusal(
        checked.spec, info, dtype, device
    )
    if refusal is not None:
        raise refusal


@exclusive  # process-wide torch state: ckptlab.torchstate
def load_model(spec: RunSpec | CheckedSpec, progress: Progress | None = None) -> tuple[PreTrainedModel, ModelInfo]:
    """Build the model of ``spec`` on its device and dtype, once it is checked (:func:`check_spec`, done here for a
    plain spec) and fits (:func:`refuse_beyond_machine`).

    Raises:
        SpecError, ModelLoadError: for bad input.
        DoesNotFitError: when the parameters alone exceed the device's memory, or with their
            gradients would not fit in the free host memory.
    """
    checked = spec if isinstance(spec, CheckedSpec) else check_spec(spec)
    refuse_beyond_machine(checked)
    info = checked.info
    if progress is not None:
        progress(building_fact(info), 0.0)
    return catalog.build_model(
        checked.spec.model,
        dtype=checked.dtype,
        device=checked.device,
        seed=checked.spec.seed,
        quantization=checked.spec.quantization,
        attn_implementation=checked.spec.attn_implementation,
    )


def building_fact(info: ModelInfo) -> Fact:
    """What building ``info``'s model is said as: its name, its parameter count, random or loaded weights."""
    return Fact(
        "progress.building_loaded" if info.weights == "loaded" else "progress.building_random",
        {"name": info.name, "parameters": parameter_count(info.num_params)},
    )


def host_memory_refusal(info: ModelInfo, dtype: torch.dtype, device: torch.device) -> DoesNotFitError | None:
    """The refusal of a CPU run whose parameters and gradients alone exceed the free RAM (None if it may run).

    On the CPU an out-of-memory does not raise: the kernel kills the process (and the app
    with it). So the lab refuses upfront, from a prediction that is labelled as one.
    """
    if device.type != "cpu":
        return None
    available = available_host_bytes()
    if available is None:
        return None
    element = torch.tensor([], dtype=dtype).element_size()
    # parameters + gradients + buffers, before any activation
    needed = 2 * info.num_params * element + info.buffer_bytes
    if needed <= 0.8 * available:
        return None
    return DoesNotFitError(
        key="model.host_memory",
        name=info.name,
        needed=needed,
        parameters=parameter_count(info.num_params),
        element=element,
        buffers=info.buffer_bytes,
        available=available,
    )


def step_floor(spec: RunSpec, info: ModelInfo, dtype: torch.dtype) -> int:
    """Bytes one training step of ``spec`` holds at least, whatever its checkpointing: a floor, not an estimate.

    The parameters, the buffers, and the gradients of what is trained (the whole model, or under LoRA only the adapters,
    ``rank x (in + out)`` each: a frozen base has no gradients); the logits of every token, in the model's
    dtype and again in float32 (transformers' loss upcasts them: ``ForCausalLMLoss``); and each layer's
    input, which even a checkpointed layer keeps. Everything else a step holds only adds to it.
    """
    element = torch.tensor([], dtype=dtype).element_size()
    tokens = spec.seq_len * spec.batch_size
    logits = tokens * info.vocab_size * (element + 4)
    inputs = tokens * info.hidden_size * element * max(info.num_layers, 1)
    weights = base_bytes(spec, info, dtype) + info.buffer_bytes  # buffers are resident beside the parameters
    return weights + _trained_parameters(spec, info) * element + logits + inputs


def base_bytes(spec: RunSpec, info: ModelInfo, dtype: torch.dtype) -> int:
    """The model's own parameters as the step holds them: in ``dtype``, or a 4-bit base as bitsandbytes stores it
    (packed weights, their quant states, the modules kept in 16 bits after peft's float32 cast), counted on the model
    the run builds, on fake tensors (``catalog.quantized_parameter_bytes``). Its buffers come beside them
    (``info.buffer_bytes``)."""
    if spec.quantization is None:
        return info.num_params * torch.tensor([], dtype=dtype).element_size()
    return catalog.quantized_parameter_bytes(spec.model, dtype, spec.quantization)


def _trained_parameters(spec: RunSpec, info: ModelInfo) -> int:
    """The parameters a step has gradients for: all of them, or LoRA's adapters (which also add their own weights,
    counted here twice: the adapters and their gradients)."""
    if spec.lora_rank is None:
        return info.num_params
    return 2 * adapter_parameters(spec.lora_rank, _adapted(spec, info))


def _adapted(spec: RunSpec, info: ModelInfo) -> list[tuple[str, int, int]]:
    return adapted_shapes(catalog.projection_shapes(info.name), spec.lora_targets)


def step_floor_refusal(
    spec: RunSpec, info: ModelInfo, dtype: torch.dtype, device: torch.device
) -> DoesNotFitError | None:
    """The refusal of a measured run whose :func:`step_floor` exceeds the machine's memory, before anything is built.

    A batch of 100,000 sequences on the CPU would otherwise grow to many GiB before it ran out
    (and on the CPU an out-of-memory kills the process). None: it may run.
    """
    limit = memory_limit(device)
    if limit is None:
        return None
    available = available_host_bytes() if device.type == "cpu" else None
    room = min(limit[0], available) if available is not None else limit[0]
    needed = step_floor(spec, info, dtype)
    if needed <= room:
        return None
    tokens = spec.seq_len * spec.batch_size
    if spec.lora_rank is not None:
        adapters = (
            2 * adapter_parameters(spec.lora_rank, _adapted(spec, info)) * torch.tensor([], dtype=dtype).element_size()
        )
        return DoesNotFitError(
            key="model.step_floor_lora",
            option=Option("seq_len", spec.seq_len, words=f"seq_len {spec.seq_len}"),
            lora_rank=Option("lora_rank"),
            where=limit[1],
            simulate=Command("simulate", (Option("model", info.name), Option("lora_rank", spec.lora_rank))),
            rank=spec.lora_rank,
            adapters=adapters,
            seq=spec.seq_len,
            batch=spec.batch_size,
            tokens=tokens,
            name=info.name,
            needed=needed,
            room=room,
        )
    return DoesNotFitError(
        key="model.step_floor",
        option=Option("seq_len", spec.seq_len, words=f"seq_len {spec.seq_len}"),
        where=limit[1],
        simulate=Command("simulate", (Option("model", info.name),)),
        seq=spec.seq_len,
        batch=spec.batch_size,
        tokens=tokens,
        name=info.name,
        needed=needed,
        room=room,
    )


def available_host_bytes() -> int | None:
    """MemAvailable from /proc/meminfo, or None where there is no such file."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
