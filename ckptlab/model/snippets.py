"""The transformers code for a checkpointing setting, ready to copy.

Pure functions from a setting to Python source. They write the current names
(``activation_checkpointing_enable``, ``TrainingArguments(activation_checkpointing=...)``);
``gradient_checkpointing_*`` are the deprecated aliases older docs use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..errors import SpecError
from .lora import lora_config_fields
from .selective import selective_key, selective_ops


def model_snippet(every_n_layers: int | None, offload: bool = False) -> str:
    """The line that sets up checkpointing on a loaded model.

    Args:
        every_n_layers: checkpoint layers whose 0-based index is a multiple of it; ``None``: off.
        offload: keep the checkpointed inputs in pinned host memory (CUDA only).

    Returns:
        Python source, e.g. ``model.activation_checkpointing_enable(every_n_layers=2, offload=False)``.
    """
    if every_n_layers is None:
        return "model.activation_checkpointing_disable()"
    return f"model.activation_checkpointing_enable(every_n_layers={every_n_layers}, offload={offload})"


def attention_snippet(attn_implementation: str) -> str:
    """The loading line that builds the model with ``attn_implementation``; "" for SDPA, transformers' own default.

    The attention is a keyword of the model (``from_pretrained(..., attn_implementation=...)``), not a field of
    ``TrainingArguments``: Trainer trains whatever attention the model was built with.
    """
    if attn_implementation == "sdpa":
        return ""
    return (
        f'model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="{attn_implementation}")'
        "  # a model keyword: TrainingArguments has none"
    )


def with_attention(code: str, attn_implementation: str) -> str:
    """``code`` after the loading line of :func:`attention_snippet` (``code`` alone for SDPA)."""
    line = attention_snippet(attn_implementation)
    return f"{line}\n{code}" if line else code


def selective_snippet(every_n_layers: int, offload: bool, selective: str | tuple[str, ...]) -> str:
    """The lines that set up selective checkpointing on a loaded model: torch's policy API through transformers.

    Args:
        every_n_layers, offload: as in :func:`model_snippet`.
        selective: a ``RunSpec.selective`` other than "none" (``ckptlab.model.selective``).

    Returns:
        Python source: the imports, the ops to keep, the policy and transformers' call with its
        ``context_fn``; torchtitan's rule (every second ``aten.mm`` recomputed) counts per region.
    """
    lines = [
        "from functools import partial",
        "",
        "import torch",
        "from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts",
        "",
        *policy_lines(selective),
        "",
        *enable_lines(every_n_layers, offload, context_fn=True),
    ]
    return "\n".join(lines)


# What the lines of policy_lines name, as (module, name): the whole code box imports them once.
POLICY_IMPORTS = (
    ("functools", "partial"),
    ("torch", None),
    ("torch.utils.checkpoint", "CheckpointPolicy"),
    ("torch.utils.checkpoint", "create_selective_checkpoint_contexts"),
)


def policy_lines(selective: str | tuple[str, ...]) -> list[str]:
    """A selective policy as code, ending in the ``context_fn`` transformers' call takes (no imports:
    :data:`POLICY_IMPORTS`).

    Args:
        selective: a ``RunSpec.selective`` other than "none" (``ckptlab.model.selective``).

    Returns:
        Lines of Python source: the ops to keep, the policy (torchtitan's rule: every second ``aten.mm`` of a region
        recomputed) and ``context_fn``.
    """
    ops = selective_ops(selective)
    kept = "\n".join(f"    torch.ops.{name}," for name in ops)
    lines = [
        f"KEEP = {{  # selective={selective_key(selective)!r}: these ops' outputs are kept, the rest is recomputed",
        kept,
        "}",
        "",
        "",
    ]
    if selective == "torchtitan":
        lines += [
            "def make_policy():  # torchtitan's rule: save the listed ops, except every second aten.mm of a layer",
            "    mm = [0]",
            "",
            "    def policy(ctx, op, *args, **kwargs):",
            "        keep = op in KEEP",
            "        if keep and op == torch.ops.aten.mm.default:",
            "            mm[0] += 1",
            "            keep = mm[0] % 2 == 1",
            "        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE",
            "",
            "    return policy",
            "",
            "",
            "context_fn = lambda: create_selective_checkpoint_contexts(make_policy())  # noqa: E731",
        ]
    else:
        lines += [
            "def policy(ctx, op, *args, **kwargs):",
            "    keep = op in KEEP or op.overloadpacket in KEEP",
            "    return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE",
            "",
            "",
            "context_fn = partial(create_selective_checkpoint_contexts, policy)",
        ]
    return lines


def enable_lines(every_n_layers: int | None, offload: bool, context_fn: bool = False) -> list[str]:
    """transformers' call on a loaded model for the setting: :func:`model_snippet`'s line, or with a selective
    policy's ``context_fn`` (made by :func:`policy_lines`) the call with its ``activation_checkpointing_kwargs``."""
    if every_n_layers is None or not context_fn:
        return [model_snippet(every_n_layers, offload)]
    return [
        "model.activation_checkpointing_enable(",
        f"    every_n_layers={every_n_layers},",
        f"    offload={offload},",
        '    activation_checkpointing_kwargs={"use_reentrant": False, "context_fn": context_fn},',
        ")",
    ]


def trainer_snippet(
    every_n_layers: int | None,
    offload: bool = False,
    step_fields: Mapping[str, object] | None = None,
    context_fn: bool = False,
) -> str:
    """The ``TrainingArguments`` keyword arguments for the same setting, as a call to copy.

    Args:
        every_n_layers: as in :func:`model_snippet`; ``None``: checkpointing off.
        offload: as in :func:`model_snippet`.
        step_fields: the other fields of the step (``RunSpec.trainer_fields()``: batch, accumulation,
            ``optim``, clipping, mixed precision), written after the checkpointing ones; None adds none.
        context_fn: pass a selective policy's ``context_fn`` (made as in :func:`selective_snippet`) on:
            Trainer pops ``every_n_layers`` and ``offload`` and hands the other keys to the model's
            ``activation_checkpointing_enable`` (transformers 5.24, in ``Trainer``'s training setup).

    Returns:
        Python source of a ``TrainingArguments(...)`` call; ``output_dir`` stands for your other arguments.
    """
    lines = [
        '    output_dir="out",',
        *_checkpointing_lines(every_n_layers, offload, context_fn),
        *_field_lines(step_fields),
    ]
    return "TrainingArguments(\n" + "\n".join(lines) + "\n)"


def _checkpointing_lines(every_n_layers: int | None, offload: bool, context_fn: bool, comment: str = "") -> list[str]:
    """The ``TrainingArguments`` lines of the setting (``comment`` after the switch when it is on)."""
    if every_n_layers is None:
        return ["    activation_checkpointing=False,"]
    selective = ', "use_reentrant": False, "context_fn": context_fn' if context_fn else ""
    return [
        f"    activation_checkpointing=True,{comment}",
        f'    activation_checkpointing_kwargs={{"every_n_layers": {every_n_layers}, "offload": {offload}{selective}}},',
    ]


def _field_lines(fields: Mapping[str, object] | None) -> list[str]:
    # Text in double quotes, as the other lines and transformers' docs write it.
    return [
        f'    {name}="{value}",' if isinstance(value, str) else f"    {name}={value!r},"
        for name, value in (fields or {}).items()
    ]


def lora_snippet(rank: int, targets: Sequence[str]) -> str:
    """The peft lines that wrap a model whose checkpointing is already set (PEFT users enable it on the base first).

    Args:
        rank: the LoRA rank.
        targets: the module names to adapt (resolved: peft needs them for a model it does not know).

    Returns:
        Python source: the lab's ``LoraConfig`` (``ckptlab.model.lora.lora_config_fields``), one field a line, and
        ``model = get_peft_model(model, lora_config)``.
    """
    fields = [f"    {name}={_value(value)}," for name, value in lora_config_fields(rank, targets).items()]
    return "\n".join(["lora_config = LoraConfig(", *fields, ")", "model = get_peft_model(model, lora_config)"])


def _value(value: object) -> str:
    """A literal as the code box writes it: text in double quotes (lists of text too), as transformers' docs."""
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    return repr(value)


def bnb_config_lines(quantization: Mapping[str, object]) -> list[str]:
    """``bnb_config = BitsAndBytesConfig(...)`` with a quantization's fields (its compute dtype as ``torch.<dtype>``).

    Args:
        quantization: ``BitsAndBytesConfig``'s fields (``ckptlab.model.quantize.Quantization.to_dict()``).
    """
    fields = []
    for name, value in quantization.items():
        if name == "bnb_4bit_compute_dtype":
            fields.append(f"    {name}=torch.{value},")
        elif value is not None:
            fields.append(f"    {name}={_value(value)},")
    return ["bnb_config = BitsAndBytesConfig(", *fields, ")"]


# The comment over peft's preparation of a 4-bit base for training, as the lab runs it (ckptlab.model.quantize.prepare).
PREPARE_COMMENT = (
    "# casts float16/bfloat16 parameters to float32 and turns on reentrant checkpointing, which the next line\n"
    "# replaces (as Trainer does with activation_checkpointing=True)"
)


# -- past one GPU: FSDP2 ----------------------------------------------------------------------

GPUS_PER_NODE = 8  # GPUs per machine the launch lines assume beyond one machine (an 8-GPU server)
RDZV_ENDPOINT = "HOST:29500"  # stands for one of the machines and a free port on it


def machines(gpus: int, gpus_per_node: int = GPUS_PER_NODE) -> int:
    """How many machines ``gpus`` GPUs take: 1 up to ``gpus_per_node``, then whole machines.

    Raises:
        SpecError: ``gpus`` < 1, or more than one machine's worth that is not a multiple of ``gpus_per_node``.
    """
    if gpus < 1:
        raise SpecError(key="api.gpus_below_one", gpus=gpus)
    if gpus <= gpus_per_node:
        return 1
    if gpus % gpus_per_node:
        raise SpecError(key="api.gpus_not_whole_machines", gpus=gpus, per_node=gpus_per_node)
    return gpus // gpus_per_node


def torchrun_line(gpus: int, script: str = "train.py", gpus_per_node: int = GPUS_PER_NODE) -> str:
    """The line that starts ``script`` on ``gpus`` GPUs: plain python for one, torchrun for more.

    Past ``gpus_per_node`` the ranks span machines: the same line runs on each, meeting at
    torchrun's c10d rendezvous, and a comment says so.

    Raises:
        ValueError: as :func:`machines`.
    """
    nodes = machines(gpus, gpus_per_node)
    if gpus == 1:
        return f"python {script}"
    if nodes == 1:
        return f"torchrun --nproc-per-node {gpus} {script}"
    return (
        f"torchrun --nnodes {nodes} --nproc-per-node {gpus_per_node} --rdzv-backend c10d "
        f"--rdzv-endpoint {RDZV_ENDPOINT} {script}  # on each of the {nodes} machines"
    )


def ckptlab_run_line(
    gpus: int,
    model: str,
    seq_len: int,
    batch_size: int,
    dtype: str,
    every_n_layers: int | None,
    offload: bool = False,
    optimizer: str = "adamw",
    gpus_per_node: int = GPUS_PER_NODE,
    selective: str | tuple[str, ...] = "none",
    attn_implementation: str = "sdpa",
) -> str:
    """The ``python -m ckptlab run`` line that measures the same step on real GPUs (FSDP2 across them past one).

    Raises:
        ValueError: as :func:`machines`.
    """
    nodes = machines(gpus, gpus_per_node)
    setting = "--no-checkpointing" if every_n_layers is None else f"--every-n-layers {every_n_layers}"
    policy = selective if isinstance(selective, str) else ",".join(selective)
    options = (
        f"--model {model} --seq-len {seq_len} --batch-size {batch_size} --dtype {dtype} {setting}"
        + (" --offload" if offload else "")
        + f" --optimizer {optimizer}"
        + ("" if policy == "none" else f" --selective {policy}")
        + ("" if attn_implementation == "sdpa" else f" --attn-implementation {attn_implementation}")
    )
    if gpus == 1:
        return f"python -m ckptlab run {options}"
    if nodes == 1:
        return f"python -m ckptlab run --nproc-per-node {gpus} --fsdp {options}"
    return (
        f"python -m ckptlab run --nnodes {nodes} --nproc-per-node {gpus_per_node} --rdzv-endpoint {RDZV_ENDPOINT} "
        f"--fsdp {options}  # on each of the {nodes} machines"
    )


def fsdp_snippet(
    every_n_layers: int | None,
    offload: bool = False,
    optimizer: str = "adamw",
    selective: str | tuple[str, ...] = "none",
    attn_implementation: str = "sdpa",
) -> str:
    """A training script's lines for checkpointing under FSDP2, in the order the lab runs them.

    Checkpointing is enabled first (transformers marks its decoder layers), then ``fully_shard`` wraps
    every decoder layer and last the root, and the optimizer is made after sharding so that its
    state is sharded too. The decoder layers are the modules transformers checkpoints
    (``GradientCheckpointingLayer``), whatever the model calls its list of layers.

    Args:
        every_n_layers, offload: as in :func:`model_snippet`.
        optimizer: a ``RunSpec.optimizer``; "none" writes no optimizer line.
        selective: a selective policy: its lines (:func:`selective_snippet`) enable checkpointing instead.
        attn_implementation: the attention the model is loaded with (:func:`attention_snippet`).

    Returns:
        Python source; ``model`` is your loaded model, run under torchrun (:func:`torchrun_line`).
    """
    enable = model_snippet(every_n_layers, offload) + "  # before sharding"
    if every_n_layers is not None and selective != "none":
        enable = "# before sharding:\n" + selective_snippet(every_n_layers, offload, selective)
    lines = [
        "import os",
        "",
        "import torch",
        "import torch.distributed as dist",
        "from torch.distributed.fsdp import fully_shard",
        "from transformers.modeling_layers import GradientCheckpointingLayer",
        "",
        'dist.init_process_group("nccl")  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT',
        'torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))',
        "# model = AutoModelForCausalLM.from_pretrained(...), in the dtype you train in"
        if attn_implementation == "sdpa"
        else f'# model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="{attn_implementation}"), in '
        "the dtype you train in (a model keyword: TrainingArguments has none)",
        enable,
        "for layer in [module for module in model.modules() if isinstance(module, GradientCheckpointingLayer)]:",
        "    fully_shard(layer)  # each decoder layer: gathered for its forward, and again for its rerun",
        "fully_shard(model)  # then the root: embeddings, final norm, head",
    ]
    if optimizer in ("adamw", "adamw_torch_fused"):
        lines.append(
            "optimizer = torch.optim.AdamW(model.parameters(), fused=True)  # Trainer's default; after sharding: "
            "each rank keeps its shard's state"
        )
    elif optimizer == "adamw_torch":
        lines.append("optimizer = torch.optim.AdamW(model.parameters())  # after sharding")
    elif optimizer == "sgd":
        lines.append("optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)  # after sharding")
    elif optimizer != "none":
        lines += [
            f'optimizer_class, kwargs = Trainer.get_optimizer_cls_and_kwargs(TrainingArguments(optim="{optimizer}"))',
            "optimizer = optimizer_class(model.parameters(), **kwargs)  # after sharding, as Trainer builds it",
        ]
    return "\n".join(lines)


def fsdp_trainer_snippet(
    every_n_layers: int | None,
    offload: bool = False,
    step_fields: Mapping[str, object] | None = None,
    context_fn: bool = False,
) -> str:
    """``TrainingArguments`` for the same setting under FSDP2, for Trainer users (transformers 5.24, accelerate 1.16).

    What the source says: ``fsdp=True`` turns FSDP on through accelerate, wrapping each of the model's
    ``_no_split_modules`` (its decoder layers) and then the root; ``fsdp_config["version"] = 2`` is
    FSDP2 (``fully_shard``; 2 is already the default). Checkpointing is transformers' own
    (``activation_checkpointing=True`` and its kwargs, enabled on the model before accelerate
    shards it): the only Trainer route that takes ``every_n_layers`` and ``offload``.
    ``fsdp_config["activation_checkpointing"] = True`` is the other route, accelerate's
    ``checkpoint_wrapper`` on every wrapped layer (every layer, no ``every_n_layers``; its offload,
    accelerate's ``activation_checkpointing_offload``, is not a key TrainingArguments passes on);
    transformers warns that its own argument adds a redundant all-gather under FSDP and prefers
    that route, and Trainer raises a ValueError when both are True.

    Args:
        every_n_layers, offload, step_fields, context_fn: as in :func:`trainer_snippet`.

    Returns:
        Python source of a ``TrainingArguments(...)`` call with comments; launch it with :func:`torchrun_line`.
    """
    lines = [
        '    output_dir="out",',
        "    fsdp=True,  # FSDP through accelerate: each decoder layer (_no_split_modules), then the root",
        '    fsdp_config={"version": 2},  # FSDP2 (fully_shard), the default in transformers 5',
        *_checkpointing_lines(
            every_n_layers, offload, context_fn, "  # transformers' checkpointing, as the lab simulated it"
        ),
        *_field_lines(step_fields),
    ]
    source = "TrainingArguments(\n" + "\n".join(lines) + "\n)"
    if every_n_layers == 1 and not offload:
        source += (
            "\n# Or FSDP's own checkpointing of every layer, which transformers prefers under FSDP (no redundant"
            '\n# all-gather in the backward): fsdp_config={"version": 2, "activation_checkpointing": True} with'
            "\n# activation_checkpointing=False. Both True raises a ValueError in Trainer."
        )
    elif every_n_layers is not None:
        source += (
            '\n# fsdp_config["activation_checkpointing"] checkpoints every layer (no every_n_layers'
            + (", no offload" if offload else "")
            + "): leave it unset here;\n# with activation_checkpointing=True as well, Trainer raises a ValueError."
        )
    return source
