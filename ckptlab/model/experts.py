"""Mixture-of-experts layers: which experts implementation runs them, and their shape.

transformers 5.x builds the experts of Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-style and
most other MoE models as one module holding every expert's weights as 3D tensors, decorated
with ``@use_experts_implementation``. Its ``forward`` dispatches on
``config._experts_implementation``: ``"eager"`` (a Python loop over the experts that were
hit, whose shapes depend on the routing), ``"batched_mm"`` (gathers one weight matrix per
routed token: memory grows with ``tokens x top_k x weights``), ``"grouped_mm"`` (sorts the
routed copies by expert and runs one ``torch.nn.functional.grouped_mm``), and kernels from
the Hub. Left unset, transformers picks ``"grouped_mm"`` for any class that supports the
setting (``PreTrainedModel.get_correct_experts_implementation``), on every device and dtype;
inside it, ``transformers.integrations.moe._can_use_grouped_mm`` takes torch's grouped GEMM
on the CPU (torch >= 2.9) and on CUDA GPUs of compute capability 8.0 and up, and its own
per-expert loop elsewhere, with the same tensors either way.

The lab asks for ``"grouped_mm"`` explicitly (:data:`EXPERTS_IMPLEMENTATION`), for the
measured step and the simulation alike, so both run the path a user's training gets, and
records it in :class:`~ckptlab.model.catalog.ModelInfo`. With it every tensor's shape
depends only on ``tokens x top_k``: how the router splits the tokens among the experts
changes the work each expert does, not a single byte (``benchmarks/moe.py`` measures it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch.nn as nn
from transformers import PretrainedConfig

from ..fact import Fact

# The experts implementation the lab runs: transformers' own default, chosen explicitly.
EXPERTS_IMPLEMENTATION = "grouped_mm"

ROUTING_NOTE = Fact("note.routing")


@dataclass(frozen=True)
class ExpertsShape:
    """The experts of a model, counted on its (meta) modules."""

    implementation: str | None  # the experts implementation the model runs; None: no experts module
    num_experts: int  # routed experts per MoE layer (0: dense)
    experts_per_token: int  # top_k: experts each token is routed to
    moe_layers: int  # checkpointable layers holding routed experts


def supports_experts_implementation(model_class: type) -> bool:
    """True when transformers lets ``experts_implementation`` be set on this class (its experts are decorated)."""
    can_set = getattr(model_class, "_can_set_experts_implementation", None)
    return bool(can_set and can_set())


def is_experts_module(module: nn.Module) -> bool:
    """True for a module ``@use_experts_implementation`` decorated: every expert's weights as 3D tensors."""
    return hasattr(module, "has_gate") and hasattr(module, "is_transposed") and hasattr(module, "num_experts")


def experts_count(module: nn.Module) -> int:
    """``num_experts`` of an experts module (:func:`is_experts_module`)."""
    # transformers sets it as a plain int; torch's stubs type any Module attribute Tensor | Module.
    return int(cast(int, module.num_experts))


def experts_shape(config: PretrainedConfig, layers: Sequence[nn.Module], implementation: str | None) -> ExpertsShape:
    """How many experts, how many per token and how many MoE layers ``layers`` hold.

    Args:
        config: the model's config (``num_experts_per_tok`` gives top_k).
        layers: the model's checkpointable layers.
        implementation: the experts implementation the model was built with.
    """
    experts = [next((m for m in layer.modules() if is_experts_module(m)), None) for layer in layers]
    moe = [module for module in experts if module is not None]
    if not moe:
        return ExpertsShape(implementation=None, num_experts=0, experts_per_token=0, moe_layers=0)
    text = config.get_text_config()
    return ExpertsShape(
        implementation=implementation,
        num_experts=experts_count(moe[0]),
        experts_per_token=int(getattr(text, "num_experts_per_tok", 0) or 0),
        moe_layers=len(moe),
    )


def layer_kind(layer: nn.Module) -> tuple:
    """What makes a layer run as it does: its modules, its parameters' shapes and dtypes, and each module's own
    per-layer settings (Gemma 3's ``attention_type`` and ``sliding_window``, Llama 4's ``use_rope``, ...).

    Two layers of one kind differ only in their place: ``layer_idx`` and the like are left out.
    """
    modules = tuple((name, type(module).__name__, _settings(module)) for name, module in layer.named_modules())
    params = tuple((name, tuple(p.shape), p.dtype) for name, p in layer.named_parameters())
    return modules, params


_SETTING_TYPES = (bool, int, float, str, type(None))


def _settings(module: nn.Module) -> tuple:
    # Plain values the module keeps for itself; a layer's index says where it is, not what it does.
    return tuple(
        sorted(
            (key, value)
            for key, value in vars(module).items()
            if isinstance(value, _SETTING_TYPES)
            and not key.startswith("_")
            and key != "gradient_checkpointing"  # transformers' flag: the plan, not the kind
            and not any(word in key for word in ("idx", "index", "layer_id", "layer_number", "block_id"))
        )
    )


def layers_alike(layers: Sequence[nn.Module]) -> bool:
    """True when every layer is of one kind (:func:`layer_kind`): the same code with the same per-layer settings.

    A model whose layers differ (Qwen2-MoE's ``mlp_only_layers`` or ``decoder_sparse_step``,
    DeepSeek's first dense layers, Gemma 3's sliding and full attention) cannot be folded into
    shallow copies one layer to a unit (:func:`layer_period`).
    """
    return layer_period(layers) <= 1


def layer_period(layers: Sequence[nn.Module]) -> int:
    """The fewest leading layers whose kinds repeat through the model (Gemma 3: 6, five sliding and one full); the
    layer count when no pattern repeats, 1 when every layer is of one kind or there are none."""
    kinds = [layer_kind(layer) for layer in layers]
    for period in range(1, len(kinds)):
        if all(kinds[index] == kinds[index % period] for index in range(period, len(kinds))):
            return period
    return max(len(kinds), 1)


def experts_note(info: Any) -> Fact:
    """The note of a result on which experts implementation ran, and the experts' shape."""
    return Fact(
        "note.experts",
        {
            "moe_layers": info.moe_layers,
            "experts": info.num_experts,
            "per_token": info.experts_per_token,
            "implementation": repr(info.experts_implementation),
        },
    )


def moe_parts(layer: nn.Module) -> tuple[nn.Module | None, nn.Module | None]:
    """A layer's router and experts modules, ``(None, None)`` for a dense layer.

    The router is the experts' sibling that picks them: transformers names it ``gate``
    (Mixtral, Qwen2/3-MoE, DeepSeek) or ``router`` (gpt-oss, ...).
    """
    for parent in layer.modules():
        children = dict(parent.named_children())
        found = next((child for child in children.values() if is_experts_module(child)), None)
        if found is not None:
            router = children.get("gate", children.get("router"))
            return router, found
    return None, None
