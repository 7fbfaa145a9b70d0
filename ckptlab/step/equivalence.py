"""Checkpointing must not change what is learned: the same loss and gradients with it on and off.

transformers' non-reentrant checkpoint saves and restores the RNG state around the rerun,
so even with dropout the recomputed forward draws the same masks. :func:`check_gradients`
proves it for a spec: two models built from the same seed, one step each on the same tokens
under the same RNG seed, one with the spec's checkpointing and one without, and the
trained parameters' gradients compared exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..model import catalog
from ..model.lora import adapted
from ..model.selective import enable_checkpointing
from ..spec import RunSpec
from ..torchstate import exclusive
from .preflight import resolve_device, resolve_dtype
from .training import trainable_parameters
from .trainstep import random_batch

DROPOUT = 0.1  # switched on so that the check covers the RNG state the rerun must restore


@dataclass(frozen=True)
class GradientCheck:
    """A spec's step against the same step with checkpointing off."""

    loss_equal: bool  # the two losses are the same number
    gradients_compared: int  # trained parameters whose gradients were compared
    max_abs_difference: float  # largest |difference| over all gradient elements (0.0 when equal)
    dropout: float  # dropout probability set in the config for the check

    @property
    def equal(self) -> bool:
        return self.loss_equal and self.max_abs_difference == 0.0


@exclusive  # process-wide torch state: ckptlab.torchstate
def check_gradients(spec: RunSpec, dropout: float = DROPOUT, attention_dropout: float | None = None) -> GradientCheck:
    """Compare one step of ``spec`` with the same step with checkpointing off, bit for bit.

    Args:
        spec: the setting to check (model, shape, checkpointing, offload, LoRA); its optimizer is not run.
        dropout: the attention and hidden dropout set in the model's config for the check.
        attention_dropout: the attention's own dropout, where it differs (None: ``dropout``). With
            attention dropout in training, SDPA on the CPU takes its math path, which the
            ``"attention"`` selective policy has no op to keep in (``ckptlab.model.selective``).

    Raises:
        SpecError, ModelLoadError: for bad input.
    """
    spec.validate()
    device = resolve_device(spec.device)
    dtype = resolve_dtype(spec.dtype, device, spec.mixed_precision)
    offload_applies = spec.offload and device.type == "cuda"
    gradients = []
    for checkpointing in (False, True):
        model, _ = catalog.build_model(
            spec.model,
            dtype=dtype,
            device=device,
            seed=spec.seed,
            config_overrides=_dropout_overrides(spec, dropout, attention_dropout),
            attn_implementation=spec.attn_implementation,
        )
        if checkpointing and spec.every_n_layers is not None:  # spec.checkpointing
            enable_checkpointing(model, spec.every_n_layers, offload_applies, spec.selective)
        batch = random_batch(model, replace(spec, every_n_layers=None), device)
        with adapted(model, spec.lora_rank, spec.lora_targets) as trained:
            trained.train()
            torch.manual_seed(spec.seed)
            loss = trained(**batch).loss
            loss.backward()
            gradients.append((loss.detach(), [_gradient(param) for param in trainable_parameters(trained)]))
        del model, trained, loss
    (loss_off, grads_off), (loss_on, grads_on) = gradients
    worst = max(((a - b).abs().max().item() for a, b in zip(grads_off, grads_on)), default=0.0)
    return GradientCheck(
        loss_equal=bool(torch.equal(loss_off, loss_on)),
        gradients_compared=len(grads_on),
        max_abs_difference=worst,
        dropout=dropout,
    )


ATTENTION_DROPOUT_FIELDS = ("attention_dropout", "attention_probs_dropout_prob", "attn_pdrop")


def _dropout_overrides(spec: RunSpec, dropout: float, attention_dropout: float | None = None) -> dict[str, float]:
    """The dropout fields the model's config has (names differ by architecture), set to ``dropout``
    (the attention's to ``attention_dropout`` when given)."""
    config, _, _ = catalog.load_config(spec.model)
    names = (
        "attention_dropout",
        "hidden_dropout",
        "attention_probs_dropout_prob",
        "hidden_dropout_prob",
        "attn_pdrop",
        "resid_pdrop",
        "embd_pdrop",
        "dropout",
    )
    chosen = {name: dropout for name in names if isinstance(getattr(config, name, None), (int, float))}
    if attention_dropout is not None:
        chosen |= {name: attention_dropout for name in ATTENTION_DROPOUT_FIELDS if name in chosen}
    return chosen


def _gradient(param: torch.nn.Parameter) -> torch.Tensor:
    """A trained parameter's gradient; zeros for one the loss does not reach (its ``grad`` stays None)."""
    return torch.zeros_like(param) if param.grad is None else param.grad.detach().clone()
