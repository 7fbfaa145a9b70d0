"""The transformers code for a checkpointing setting, ready to copy.

Pure functions from a setting to Python source. They write the current names
(``activation_checkpointing_enable``, ``TrainingArguments(activation_checkpointing=...)``);
``gradient_checkpointing_*`` are the deprecated aliases older docs use.
"""

from __future__ import annotations

from collections.abc import Sequence

# TrainingArguments(optim=...) for each RunSpec.optimizer; "none" (no optimizer step) has no Trainer twin.
TRAINER_OPTIM = {"adamw": "adamw_torch", "sgd": "sgd"}


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


def trainer_snippet(every_n_layers: int | None, offload: bool = False, optimizer: str | None = None) -> str:
    """The ``TrainingArguments`` keyword arguments for the same setting, as a call to copy.

    Args:
        every_n_layers: as in :func:`model_snippet`; ``None``: checkpointing off.
        offload: as in :func:`model_snippet`.
        optimizer: a ``RunSpec.optimizer``: "adamw" adds ``optim="adamw_torch"``, "sgd" ``optim="sgd"``;
            None or "none" add nothing.

    Returns:
        Python source of a ``TrainingArguments(...)`` call; ``output_dir`` stands for your other arguments.
    """
    lines = ['    output_dir="out",']
    if every_n_layers is None:
        lines.append("    activation_checkpointing=False,")
    else:
        lines += [
            "    activation_checkpointing=True,",
            f'    activation_checkpointing_kwargs={{"every_n_layers": {every_n_layers}, "offload": {offload}}},',
        ]
    if optimizer in TRAINER_OPTIM:
        lines.append(f'    optim="{TRAINER_OPTIM[optimizer]}",')
    return "TrainingArguments(\n" + "\n".join(lines) + "\n)"


def lora_snippet(rank: int, targets: Sequence[str]) -> str:
    """The peft line that wraps a model whose checkpointing is already set (PEFT users enable it on the base first).

    Args:
        rank: the LoRA rank.
        targets: the module names to adapt (resolved: peft needs them for a model it does not know).

    Returns:
        Python source, e.g. ``model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj"]))``.
    """
    names = ", ".join(f'"{name}"' for name in targets)
    return f"model = get_peft_model(model, LoraConfig(r={rank}, target_modules=[{names}]))"
