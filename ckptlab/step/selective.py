"""Selective checkpointing, observed: what a policy kept in each CP layer, and what the rerun ran again.

The policy (``ckptlab.model.selective``) says what it means to keep; this module counts what
happened, in the observed memory step (:class:`~ckptlab.step.probe.LayerProbe` with
``track_saved``):

- **kept**, in the forward: torch calls the policy with each op's output
  (``SelectiveCheckpointContext.op_output``) and caches the outputs of the ops it answers
  ``MUST_SAVE`` for. The observer wraps the policy, counts those ops and adds up their storages'
  bytes (each storage once): the bytes that SAC's cache holds until the backward. They are not
  autograd's saved tensors, so the probe's ``saved_tensors_hooks`` never sees them.
- **rerun**, in the backward: SAC's recompute context is a dispatch mode that serves the cached
  ops from its cache and lets every other op run again. The observer puts a counting mode on each
  side of it: the one above sees every op the rerun meets, the one below only those that really
  ran again. What the rerun met but did not run was taken from the cache (``reused_ops``).

Timed steps run without the observer: the policy is torch's alone there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from typing import Any, Protocol

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import (
    SAC_IGNORED_OPS,
    CheckpointPolicy,
    create_selective_checkpoint_contexts,
    noop_context_fn,
)
from torch.utils.weak import WeakIdKeyDictionary

from ..errors import Command, Option, SpecError
from ..fact import Fact
from ..model.selective import NONE, SelectivePolicy, op_name, selective_key
from ..results import LayerResult
from ..spec import RunSpec


class LayerCounts(Protocol):
    """The fields of a layer's counts this module fills (``ckptlab.step.probe.LayerCounts``)."""

    selective: str
    kept_bytes: int
    kept_ops: dict[str, int]
    rerun_ops: dict[str, int]
    reused_ops: dict[str, int]


USER_POLICY = "context_fn"  # a layer's policy key when the user's own context_fn ran it (observed, not the lab's)
Locate = Callable[[], LayerCounts | None]  # the counts of the layer running now, None outside the layers


class _CountingMode(TorchDispatchMode):
    """Counts the ops that reach it, by name, and runs them."""

    def __init__(self, counts: dict[str, int]) -> None:
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func not in SAC_IGNORED_OPS:  # detach: checkpoint adds a different number in forward and rerun
            name = op_name(func)
            self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


class _Rerun:
    """SAC's recompute context between two counters; on exit, what the rerun took from the cache."""

    def __init__(self, recompute: AbstractContextManager[Any], region: dict[str, LayerCounts]) -> None:
        self._met: dict[str, int] = {}
        self._ran: dict[str, int] = {}
        # Entered in this order: the last one entered sees an op first.
        self._contexts = (_CountingMode(self._ran), recompute, _CountingMode(self._met))
        self._region = region

    def __enter__(self) -> _Rerun:
        for context in self._contexts:
            context.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        for context in reversed(self._contexts):
            context.__exit__(*exc)
        counts = self._region.get("layer")
        if counts is None:
            return
        for name, ran in self._ran.items():
            counts.rerun_ops[name] = counts.rerun_ops.get(name, 0) + ran
        for name, met in self._met.items():
            reused = met - self._ran.get(name, 0)
            if reused > 0:
                counts.reused_ops[name] = counts.reused_ops.get(name, 0) + reused


class SelectiveObserver:
    """Makes a policy's SAC contexts so that one step's kept ops, kept bytes and rerun ops are counted.

    Args:
        locate: the :class:`LayerCounts` of the layer running now (the probe knows), or None.
    """

    def __init__(self, locate: Locate) -> None:
        self._locate = locate

    def contexts(self, policy: SelectivePolicy) -> tuple[AbstractContextManager[Any], AbstractContextManager[Any]]:
        observed, region = self._observing(policy.region_policy())
        forward, recompute = create_selective_checkpoint_contexts(observed)
        return forward, _Rerun(recompute, region)

    def user_contexts(self, context_fn: Callable[[], Any]) -> Callable[[], Any]:
        """A user's own ``context_fn`` (their policy, through transformers' kwargs), observed as it runs.

        Their contexts run as they are; the policy function of the forward context torch's
        ``create_selective_checkpoint_contexts`` made is wrapped, so what it answered MUST_SAVE (or
        PREFER_SAVE) is counted, and the rerun runs between the counters. A context that is not
        torch's SAC (no ``policy_fn``) runs unobserved: its layer keeps ``selective == "none"``.
        """

        def contexts() -> Any:
            forward, recompute = context_fn()
            decide = getattr(forward, "policy_fn", None)  # torch's _CachingTorchDispatchMode keeps it there
            if not callable(decide):
                return forward, recompute
            observed, region = self._observing(decide, label=USER_POLICY)
            forward.policy_fn = observed
            return forward, _Rerun(recompute, region)

        return contexts

    def _observing(
        self, decide: Callable[..., Any], label: str | None = None
    ) -> tuple[Callable[..., CheckpointPolicy], dict[str, LayerCounts]]:
        """``decide`` wrapped to count what it keeps into the running layer's counts, and that region's layer."""
        region: dict[str, LayerCounts] = {}  # "layer": the counts of the layer this region runs in
        storages: WeakIdKeyDictionary = WeakIdKeyDictionary()

        def observed(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
            decision = decide(ctx, func, *args, **kwargs)
            if isinstance(decision, bool):  # torch takes a bool too: True is PREFER_SAVE
                decision = CheckpointPolicy.PREFER_SAVE if decision else CheckpointPolicy.PREFER_RECOMPUTE
            if "layer" not in region:
                located = self._locate()
                if located is None:
                    return decision
                region["layer"] = located
                if label is not None and located.selective == NONE:
                    located.selective = label
            if decision in (CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE):
                counts = region["layer"]
                name = op_name(func)
                counts.kept_ops[name] = counts.kept_ops.get(name, 0) + 1
                for tensor in tensors_in(ctx.op_output):
                    storage = tensor.untyped_storage()
                    if storage not in storages:
                        storages[storage] = True
                        counts.kept_bytes += storage.nbytes()
            return decision

        return observed, region

    @contextmanager
    def watching(self, policies: list[SelectivePolicy]) -> Iterator[None]:
        """Observe the regions of these policies for the duration of the block."""
        for policy in policies:
            policy.observer = self
        try:
            yield
        finally:
            for policy in policies:
                if policy.observer is self:
                    policy.observer = None


@contextmanager
def watching_context_fns(layers: Sequence[nn.Module], observer: SelectiveObserver) -> Iterator[None]:
    """Observe, for the block, the checkpointed layers that run a ``context_fn`` of the user's own.

    transformers binds the checkpoint function with its kwargs on each layer
    (``_gradient_checkpointing_func``, a ``functools.partial``); here each such layer gets the same
    function with the user's ``context_fn`` observed (:meth:`SelectiveObserver.user_contexts`),
    and its own back after. The lab's policies are observed by :meth:`SelectiveObserver.watching`.
    """
    replaced: list[tuple[nn.Module, Any]] = []
    for layer in layers:
        function = getattr(layer, "_gradient_checkpointing_func", None)
        context_fn = getattr(function, "keywords", {}).get("context_fn")
        if not getattr(layer, "gradient_checkpointing", False) or context_fn in (None, noop_context_fn):
            continue
        if isinstance(getattr(context_fn, "__self__", None), SelectivePolicy):
            continue
        assert isinstance(function, partial)  # it has keywords: transformers' partial(checkpoint, **kwargs)
        keywords = {**function.keywords, "context_fn": observer.user_contexts(context_fn)}
        # setattr: nn.Module's __setattr__ is typed for tensors and modules; this is a plain attribute.
        setattr(layer, "_gradient_checkpointing_func", partial(function.func, *function.args, **keywords))  # noqa: B010
        replaced.append((layer, function))
    try:
        yield
    finally:
        for layer, function in replaced:
            setattr(layer, "_gradient_checkpointing_func", function)  # noqa: B010


def tensors_in(value: Any) -> list[torch.Tensor]:
    """The tensors in a hook's args or output, or an op's output, in order (tuples, lists and ModelOutputs)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [tensor for item in value for tensor in tensors_in(item)]
    return []


def check_simulated_selective(spec: RunSpec) -> None:
    """Refuse to simulate what the simulation could not: a selective policy under FSDP2 with an optimizer step.

    Simulated under FSDP2 with AdamW's state (torch 2.13, a fake process group, fake tensors), SAC's rerun met
    view ops its forward had not recorded ("aten.view.default invocation index 12 ... not found in storage");
    the forward and backward alone (optimizer "none") run and are tested, and real ranks (gloo) measure it.

    Raises:
        SpecError: ``spec.selective_with_fsdp``, naming the policy, the optimizer and what to do instead.
    """
    if spec.fsdp and spec.selective != NONE and spec.every_n_layers is not None and spec.optimizer != "none":
        raise SpecError(
            key="spec.selective_with_fsdp",
            fsdp=Option("fsdp", True),
            option=Option("selective", selective_key(spec.selective)),
            optimizer_option=Option("optimizer", spec.optimizer),
            no_optimizer=Option("optimizer", "none"),
            launch=Command(
                "measure",
                (Option("world_size", 2), Option("fsdp", True), Option("selective", selective_key(spec.selective))),
            ),
            policy=selective_key(spec.selective),
            optimizer=spec.optimizer,
        )


def selective_notes(spec: RunSpec, layers: list[LayerResult], offload_applied: bool = False) -> list[Fact]:
    """What a reader must know about a run's selective policy: the loud mismatch, and where offload leaves it.

    A CP layer where the policy kept nothing (or ran without it) is recomputed in full, as plain
    checkpointing: the step is not the one asked for, and says so (``RunResult.plan_matches`` is False).
    With offload applied (CUDA, or simulated), the kept outputs stay on the device: said with their bytes.
    """
    if spec.selective == NONE:
        return []
    notes: list[Fact] = []
    kept = sum(layer.kept_bytes for layer in layers)
    if offload_applied and kept:
        notes.append(Fact("note.selective_offload", {"bytes": kept}))
    wanted = selective_key(spec.selective)
    missed = [layer.name for layer in layers if layer.enabled == "CP" and not layer.selective_as(wanted)]
    if not missed:
        return notes
    return [*notes, Fact("note.selective_matched_nothing", {"policy": wanted, "rows": ", ".join(missed)})]
