"""A model handed to :func:`ckptlab.measure` is given back as it came: flags, modes and hooks.

A run switches checkpointing on or off on every layer, switches the attention implementation, registers
transformers' input-embeddings hook (``enable_input_require_grads``, which checkpointing needs), and puts
every module in training mode. On a model the caller owns (``measure(spec, model=...)``, a sweep's model, the
app's cached one) none of that may outlive the run: a later run, or the caller's own training
loop, would start from the lab's settings. :class:`ModelState` records what a run changes and
puts it back.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

# Instance attributes transformers' _set_gradient_checkpointing writes on every module that has a
# ``gradient_checkpointing`` flag (the layers, and some base models); before the first call most
# layers have only the class default.
_CHECKPOINT_ATTRIBUTES = ("gradient_checkpointing", "_gradient_checkpointing_func")
_MISSING = object()


@dataclass
class ModelState:
    """What a run changes on a model: training flags, checkpointing attributes, the input-grads hook."""

    model: nn.Module
    training: list[tuple[nn.Module, bool]]
    checkpointing: list[tuple[nn.Module, str, object]]  # (module, attribute, instance value or _MISSING)
    input_require_grads: bool  # transformers' enable_input_require_grads hook was on
    attention: str | None = (
        None  # the attention implementation it ran (a run may switch it: RunSpec.attn_implementation)
    )

    @classmethod
    def capture(cls, model: nn.Module) -> ModelState:
        modules = list(model.modules())
        return cls(
            model=model,
            training=[(module, module.training) for module in modules],
            checkpointing=[
                (module, name, module.__dict__.get(name, _MISSING))
                for module in modules
                if hasattr(module, "gradient_checkpointing")
                for name in _CHECKPOINT_ATTRIBUTES
            ],
            input_require_grads=bool(getattr(model, "_require_grads_hooks", None))
            or hasattr(model, "_require_grads_hook"),
            attention=getattr(getattr(model, "config", None), "_attn_implementation", None),
        )

    def restore(self) -> None:
        """Put back the flags, the hook and the attention implementation as they were at :meth:`capture`."""
        config = getattr(self.model, "config", None)
        if self.attention is not None and getattr(config, "_attn_implementation", None) != self.attention:
            self.model.set_attn_implementation(self.attention)  # type: ignore[operator]  # a PreTrainedModel's
        for module, training in self.training:
            module.training = training
        for module, name, value in self.checkpointing:
            if value is _MISSING:
                module.__dict__.pop(name, None)
            else:
                setattr(module, name, value)
        # transformers' PreTrainedModel (and a peft wrapper) has the pair; a plain Module has neither.
        disable = getattr(self.model, "disable_input_require_grads", None)
        enable = getattr(self.model, "enable_input_require_grads", None)
        if disable is not None and enable is not None:
            disable()  # the run's hook
            if self.input_require_grads:
                enable()  # the caller's, registered anew
