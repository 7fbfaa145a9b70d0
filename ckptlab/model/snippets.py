"""The transformers code for a checkpointing setting, ready to copy.

Pure functions from a setting to Python source. They write the current names
(``activation_checkpointing_enable``, ``TrainingArguments(activation_checkpointing=...)``);
``gradient_checkpointing_*`` are the deprecated aliases older docs use.
"""

from __future__ import annotations


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


def trainer_snippet(every_n_layers: int | None, offload: bool = False) -> str:
    """The ``TrainingArguments`` keyword arguments for the same setting, as a call to copy.

    Args:
        every_n_layers: as in :func:`model_snippet`; ``None``: checkpointing off.
        offload: as in :func:`model_snippet`.

    Returns:
        Python source of a ``TrainingArguments(...)`` call; ``output_dir`` stands for your other arguments.
    """
    if every_n_layers is None:
        return 'TrainingArguments(\n    output_dir="out",\n    activation_checkpointing=False,\n)'
    return (
        "TrainingArguments(\n"
        '    output_dir="out",\n'
        "    activation_checkpointing=True,\n"
        f'    activation_checkpointing_kwargs={{"every_n_layers": {every_n_layers}, "offload": {offload}}},\n'
        ")"
    )
