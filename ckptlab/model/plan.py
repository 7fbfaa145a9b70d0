"""Which layers transformers checkpoints, predicted and read back.

transformers 5.x (``PreTrainedModel._set_gradient_checkpointing``) walks ``model.modules()``
in order, counts only the modules that inherit ``GradientCheckpointingLayer``, and sets
``gradient_checkpointing = (index % every_n_layers == 0)`` on the one with 0-based index
``index``. :func:`planned_roles` restates that rule so the lab can draw a plan before a
model exists; :func:`observed_roles` reads the flags back from a model on which
``activation_checkpointing_enable`` was called, so the plan shown is the one that ran.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from ..errors import Option, SpecError
from ..fact import Fact, worded

if TYPE_CHECKING:
    import torch.nn as nn
    from transformers.modeling_layers import GradientCheckpointingLayer

Role = Literal["CP", "keep"]
CP: Role = "CP"
KEEP: Role = "keep"


def validate_every_n_layers(every_n_layers: int) -> None:
    """Raise :class:`SpecError` unless ``every_n_layers`` is an int >= 1."""
    if isinstance(every_n_layers, bool) or not isinstance(every_n_layers, int) or every_n_layers < 1:
        raise SpecError(
            key="spec.every_n_layers",
            option=Option("every_n_layers", every_n_layers),
            off=Option("every_n_layers", None),
            value=every_n_layers,
        )


def planned_roles(num_layers: int, every_n_layers: int | None) -> list[Role]:
    """The role of each layer under ``activation_checkpointing_enable(every_n_layers=...)``.

    Args:
        num_layers: how many ``GradientCheckpointingLayer`` modules the model has.
        every_n_layers: the setting, or ``None`` for checkpointing off.

    Returns:
        One role per layer, in module order: ``"CP"`` if the layer is checkpointed
        (keeps only its input and reruns its forward in the backward), else ``"keep"``.

    Raises:
        SpecError: if ``every_n_layers`` is not an int >= 1 or ``num_layers`` < 0.
    """
    if num_layers < 0:
        raise SpecError(key="api.negative_layers", num_layers=num_layers)
    if every_n_layers is None:
        return [KEEP] * num_layers
    validate_every_n_layers(every_n_layers)
    return [CP if index % every_n_layers == 0 else KEEP for index in range(num_layers)]


def checkpointable_layers(model: nn.Module) -> list[GradientCheckpointingLayer]:
    """The modules transformers counts for ``every_n_layers``, in the order it counts them."""
    # Imported here: the plan's rule (planned_roles, the spec's checks) answers before transformers loads.
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [module for module in model.modules() if isinstance(module, GradientCheckpointingLayer)]


def nested_in(model: nn.Module) -> list[int | None]:
    """Per checkpointing layer, the index of the nearest checkpointing layer that holds it (None at the top).

    Zamba2's hybrid layer holds a ``mamba_decoder`` that is a ``GradientCheckpointingLayer`` too: transformers
    counts both in module order, and the child runs inside its parent's forward, so a checkpointed parent's rerun
    runs the child again whatever the child's own flag.
    """
    from transformers.modeling_layers import GradientCheckpointingLayer

    names = [name for name, module in model.named_modules() if isinstance(module, GradientCheckpointingLayer)]
    parents: list[int | None] = []
    for index, name in enumerate(names):
        holders = [other for other in range(index) if name.startswith(names[other] + ".")]
        parents.append(holders[-1] if holders else None)
    return parents


def rerun_roles(flags: Sequence[Role], parents: Sequence[int | None]) -> list[Role]:
    """What each layer does in the backward: CP (it reruns) when its flag says so or a layer holding it reruns.

    Under non-reentrant checkpointing a checkpointed child of a checkpointed parent still runs twice in all (once
    in the forward, once in the parent's rerun), never three times: it is CP either way. ``parents`` empty: no
    layer is nested and the roles are the flags.
    """
    roles = list(flags)
    for index, parent in enumerate(parents):
        if parent is not None and roles[parent] == CP:
            roles[index] = CP
    return roles


def rerun_inside(flags: Sequence[Role], parents: Sequence[int | None]) -> list[int | None]:
    """Per layer, the index of the checkpointed layer inside whose rerun a keep layer reruns; None elsewhere."""
    roles = rerun_roles(flags, parents)
    found: list[int | None] = [None] * len(flags)
    for index, parent in enumerate(parents):
        if parent is not None and flags[index] != CP and roles[parent] == CP:
            # The outermost checkpointed holder: the one whose rerun the backward runs.
            found[index] = found[parent] if found[parent] is not None else parent
    return found


def observed_roles(model: nn.Module) -> list[Role]:
    """Read back, from the flags transformers set, which layers are checkpointed.

    Unlike :func:`planned_roles`, this reports what the model will actually do, so a
    difference between the two (an override in a model class, a future change in
    transformers) shows up instead of being assumed away.
    """
    return [CP if layer.gradient_checkpointing else KEEP for layer in checkpointable_layers(model)]


def describe_plan(num_layers: int, every_n_layers: int | None, nested_in: Sequence[int | None] = ()) -> str:
    """One sentence on what the setting does for this layer count, for notes and captions (English, from the
    locale files' ``said.plan.*``).

    ``nested_in`` (``ModelInfo.nested_in``): a keep layer inside a checkpointed one reruns with it, and the
    sentence says so ("L2 reruns inside L1's rerun").
    """
    return worded(plan_fact(num_layers, every_n_layers, nested_in))


def plan_fact(num_layers: int, every_n_layers: int | None, nested_in: Sequence[int | None] = ()) -> Fact:
    """:func:`describe_plan`'s sentence as a fact, for a page to word in its language."""
    if every_n_layers is None:
        return Fact("plan.off", {"layers": num_layers})
    roles = planned_roles(num_layers, every_n_layers)
    cp = [f"L{index + 1}" for index, role in enumerate(roles) if role == CP]
    values = {"n": every_n_layers, "cp": len(cp), "layers": num_layers, "names": ", ".join(cp)}
    if every_n_layers == 1:
        fact = Fact("plan.all", values)
    elif every_n_layers >= num_layers > 0:
        fact = Fact("plan.only_first", values)
    else:
        fact = Fact("plan.checkpointed", values)
    inside = rerun_inside(roles, nested_in) if nested_in else []
    reruns = tuple(
        Fact("plan.reruns_inside", {"layer": f"L{index + 1}", "parent": f"L{parent + 1}"})
        for index, parent in enumerate(inside)
        if parent is not None
    )
    return Fact("plan.with_nested", {"plan": fact, "reruns": reruns}) if reruns else fact


def only_first_layer_notes(num_layers: int, every_n_layers: int | None) -> list[Fact]:
    """The note a run or a simulation carries when every_n_layers is not smaller than the layers (only L1 is
    checkpointed); none otherwise."""
    if every_n_layers is None or not every_n_layers >= num_layers > 1:
        return []
    return [Fact("note.only_first_layer", {"n": every_n_layers, "layers": num_layers})]
