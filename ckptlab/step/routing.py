"""What a router did with real tensors: tokens per expert, and a routing forced to its most uneven.

The simulation does not route (fake tensors have no values; ``ckptlab.model.experts``
explains why the bytes do not depend on it). These helpers let a measured run show that
claim: :func:`expert_load` counts how a real forward split the tokens, and
:func:`collapse_routing` zeroes the routers' weights, so that every score ties and every
token goes to the same top-k experts.
"""

from __future__ import annotations

import torch

from ..errors import SpecError
from ..model.experts import experts_count, moe_parts
from ..model.plan import checkpointable_layers
from .trainstep import Batch


def expert_load(model: torch.nn.Module, batch: Batch) -> list[int]:
    """Tokens routed to each expert of the model's first MoE layer in one forward of ``batch`` (no gradients).

    Raises:
        ValueError: the model has no MoE layer.
    """
    parts = [moe_parts(layer) for layer in checkpointable_layers(model)]
    router, experts = next(((r, e) for r, e in parts if r is not None and e is not None), (None, None))
    if router is None or experts is None:
        raise SpecError(key="api.no_moe_layer", model_class=type(model).__name__)
    seen: list[torch.Tensor] = []
    # transformers' top-k routers return (logits, scores, indices); the indices are (tokens, top_k).
    handle = router.register_forward_hook(lambda module, args, output: seen.append(output[-1].detach()))
    try:
        with torch.no_grad():
            model(**batch)
    finally:
        handle.remove()
    return torch.bincount(seen[0].flatten(), minlength=experts_count(experts)).tolist()


def collapse_routing(model: torch.nn.Module) -> int:
    """Zero every router's weight: equal scores, so all tokens go to the same top-k experts. Returns the routers changed."""
    changed = 0
    for layer in checkpointable_layers(model):
        router, _ = moe_parts(layer)
        weight = getattr(router, "weight", None)  # None for a dense layer (no router)
        if isinstance(weight, torch.Tensor):
            with torch.no_grad():
                weight.zero_()
            changed += 1
    return changed
