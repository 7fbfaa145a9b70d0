"""What a ``transformers.Trainer`` does with a checkpointing setting, and where a setting does not do what it looks like.

Trainer (transformers 5.24, ``Trainer.train``) pops ``every_n_layers`` (default 1) and
``offload`` (default False) from ``activation_checkpointing_kwargs`` and passes the rest to
``torch.utils.checkpoint.checkpoint``; an empty rest becomes None, and transformers turns None
into ``use_reentrant=False``. Any other key without ``use_reentrant`` leaves that choice to
torch, whose default is the reentrant variant. :func:`requested_setting` restates that;
:func:`setting_warnings` says, one fact each, what in a setting does not do what it looks like.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

import torch

from ..fact import Fact
from ..model.plan import only_first_layer_notes
from ..show.report import setting_name

# What torch.utils.checkpoint.checkpoint does without use_reentrant (torch 2.4 to 2.13: warn, then reentrant).
TORCH_DEFAULT_USE_REENTRANT = True


@dataclass(frozen=True)
class RequestedSetting:
    """What a run asked for, and what the checkpoint function ends up called with."""

    activation_checkpointing: bool  # TrainingArguments.activation_checkpointing
    every_n_layers: int | None  # popped by Trainer (default 1); None when checkpointing is off
    offload: bool  # popped by Trainer (default False)
    checkpoint_kwargs: dict[str, Any]  # what reaches torch.utils.checkpoint.checkpoint
    use_reentrant: bool  # the checkpoint variant that runs
    use_reentrant_from: Fact  # who chose it: a ``said.trainer.reentrant_from.*`` fact, worded at the edge

    @property
    def title(self) -> str:
        return setting_name(self.every_n_layers, self.offload)


def requested_setting(activation_checkpointing: bool, kwargs: dict[str, Any] | str | None) -> RequestedSetting:
    """What ``TrainingArguments(activation_checkpointing=..., activation_checkpointing_kwargs=...)`` asks for.

    Restates ``Trainer.train`` and ``PreTrainedModel.activation_checkpointing_enable`` of transformers 5.24.
    """
    # TrainingArguments also takes the dict as JSON text.
    parsed = json.loads(kwargs) if isinstance(kwargs, str) else kwargs
    rest = dict(parsed or {})
    every_n_layers = rest.pop("every_n_layers", 1)
    offload = bool(rest.pop("offload", False))
    if not activation_checkpointing:
        return RequestedSetting(False, None, False, {}, False, Fact("trainer.reentrant_from.off"))
    passed, reentrant, source = checkpoint_call(rest)
    return RequestedSetting(True, every_n_layers, offload, passed, reentrant, source)


def checkpoint_call(rest: dict[str, Any]) -> tuple[dict[str, Any], bool, Fact]:
    """(kwargs given to torch's checkpoint, its use_reentrant, who chose it) for the kwargs left after Trainer's pops."""
    if not rest:
        return {"use_reentrant": False}, False, Fact("trainer.reentrant_from.transformers_default")
    if "use_reentrant" in rest:
        return dict(rest), bool(rest["use_reentrant"]), Fact("trainer.reentrant_from.your_kwargs")
    return dict(rest), TORCH_DEFAULT_USE_REENTRANT, Fact("trainer.reentrant_from.torch_default", {"keys": sorted(rest)})


def model_checkpoint_kwargs(model: torch.nn.Module) -> dict[str, Any] | None:
    """The kwargs transformers bound into the checkpoint function of the model's first checkpointed layer."""
    for module in model.modules():
        func = module.__dict__.get("_gradient_checkpointing_func")
        if getattr(module, "gradient_checkpointing", False) and isinstance(func, functools.partial):
            return dict(func.keywords)
    return None


def setting_warnings(requested: RequestedSetting, num_layers: int, device: torch.device) -> list[Fact]:
    """Settings that do not do what they look like they do, one fact each (``said.trainer.warn_*``)."""
    checkpointing = requested.activation_checkpointing
    found = []
    if checkpointing and requested.use_reentrant:
        found.append(Fact("trainer.warn_reentrant", {"use_reentrant_from": requested.use_reentrant_from}))
    if requested.offload and device.type == "cpu":
        found.append(Fact("trainer.warn_offload_on_cpu"))
    if checkpointing and num_layers == 0:
        found.append(Fact("trainer.warn_no_layers"))
    n = requested.every_n_layers if isinstance(requested.every_n_layers, int) else None  # kwargs may hold anything
    return found + (only_first_layer_notes(num_layers, n) if checkpointing else [])
