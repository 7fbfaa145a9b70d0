"""The attention kernel a model is built with: transformers' ``attn_implementation``, a checkpointing decision too.

``RunSpec.attn_implementation`` (``--attn-implementation``) names it:

- ``"sdpa"`` (the default, as transformers' own): torch's ``scaled_dot_product_attention``. Its fused
  kernels (flash and memory-efficient on CUDA, the CPU's flash path) keep the output and a float32
  logsumexp of ``heads x seq`` a layer, and recompute the ``seq x seq`` probabilities in the backward:
  the trade activation checkpointing makes, inside one op.
- ``"eager"``: transformers' own matmul, softmax, dropout and matmul. It keeps each layer's softmax
  probabilities, ``batch x heads x seq^2`` (float32 in float32; under bf16 the float32 softmax is cast
  back, and its half-precision copy is what the value matmul keeps): the ``5·a·s/h`` term of the
  Ultra-Scale Playbook's activation formula. On a model without dropout, eager minus SDPA after the forward
  is ``layers x batch x heads x (seq^2 - seq) x element`` bytes (the probabilities kept, the logsumexp not).
- ``"flash_attention_2"``: the flash-attn package's kernels, on CUDA only and where the package is
  installed (one message otherwise). A simulation stands for it with SDPA's flash kernel, which keeps
  the same bytes (the output and the logsumexp), and says so.

Kernels from the Hugging Face Hub (``"kernels-community/flash-attn"``, any name with a "/") are refused:
the lab downloads no code. A class that refuses SDPA (Gemma 2's soft-capping, BLOOM, GPT-Neo, ...) keeps
eager, and a run of it says so in a note (:func:`attention_notes`).

``RunSpec.attn_implementation`` is a model keyword (``from_pretrained(..., attn_implementation=...)``),
not a ``TrainingArguments`` field: Trainer runs whatever the model was built with.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from ..errors import Option, SpecError, not_one_of
from ..fact import Fact

SDPA = "sdpa"
EAGER = "eager"
FLASH_ATTENTION_2 = "flash_attention_2"
ATTN_IMPLEMENTATIONS = (SDPA, EAGER, FLASH_ATTENTION_2)
FLASH_PACKAGE = ("flash_attn", "pip install flash-attn")


def check_attn_implementation(value: object, selective: object = "none") -> None:
    """Raise :class:`SpecError` for an attention implementation the lab does not build with, or that the
    selective policy ``selective`` cannot go with.

    The ``"attention"`` policy keeps the outputs of SDPA's fused attention op (``ckptlab.model.selective``).
    Eager attention calls no such op, so the pair would keep nothing: it is refused, with one message, rather
    than read as "keep eager's product after the softmax" (``"matmuls"`` keeps that, and the scores).

    Raises:
        SpecError: ``spec.attention_from_hub`` for a kernel of the Hub (a name with "/"), ``spec.flash_attention_package``
            for flash_attention_2 without its package, ``spec.attention_policy_eager`` for the attention policy with
            eager, ``spec.not_one_of`` for anything else unknown.
    """
    if isinstance(value, str) and "/" in value:
        raise SpecError(
            key="spec.attention_from_hub",
            option=Option("attn_implementation", value),
            value=value,
            choices=", ".join(ATTN_IMPLEMENTATIONS),
        )
    if value not in ATTN_IMPLEMENTATIONS:
        raise not_one_of("attn_implementation", value, ATTN_IMPLEMENTATIONS)
    if value == EAGER and selective == "attention":
        raise SpecError(
            key="spec.attention_policy_eager",
            policy=Option("selective", "attention"),
            option=Option("attn_implementation", EAGER),
            matmuls=Option("selective", "matmuls"),
            sdpa=Option("attn_implementation", SDPA),
        )
    if value == FLASH_ATTENTION_2 and importlib.util.find_spec(FLASH_PACKAGE[0]) is None:
        raise SpecError(
            key="spec.flash_attention_package",
            option=Option("attn_implementation", value),
            sdpa=Option("attn_implementation", SDPA),
            package=FLASH_PACKAGE[0],
            pip=FLASH_PACKAGE[1],
        )


def available_attentions(device_type: str | None = None) -> tuple[str, ...]:
    """The implementations a spec may name here: flash_attention_2 only where its package is installed (and, given
    a ``device_type``, on CUDA); a page offers these, a link falls back from any other."""
    flash = importlib.util.find_spec(FLASH_PACKAGE[0]) is not None and device_type in (None, "cuda")
    return ATTN_IMPLEMENTATIONS if flash else (SDPA, EAGER)


def check_flash_device(attn_implementation: str, device_type: str) -> None:
    """Raise :class:`SpecError` for flash_attention_2 on a device other than CUDA (the package's kernels are CUDA's).

    Raises:
        SpecError: ``spec.flash_attention_cuda``.
    """
    if attn_implementation == FLASH_ATTENTION_2 and device_type != "cuda":
        raise SpecError(
            key="spec.flash_attention_cuda",
            option=Option("attn_implementation", attn_implementation),
            sdpa=Option("attn_implementation", SDPA),
            eager=Option("attn_implementation", EAGER),
            device=device_type,
        )


def implementation_for(model_class: Any, asked: str) -> str | None:
    """What to pass transformers as ``attn_implementation`` for ``asked`` on ``model_class``; None: nothing, the
    class's own default (eager), for SDPA asked of a class that refuses it (transformers would raise)."""
    if asked == SDPA and not getattr(model_class, "_supports_sdpa", False):
        return None
    return asked


def attention_used(model: Any) -> str:
    """The attention implementation a built model runs (its config's), "eager" where it says none."""
    return str(getattr(model.config, "_attn_implementation", None) or EAGER)


def use_attention(model: Any, asked: str) -> None:
    """Switch a built model to ``asked`` (transformers' ``set_attn_implementation``) where it runs another and its
    class takes ``asked``: a model built once serves runs of either implementation (the app's, a sweep's)."""
    wanted = implementation_for(type(model), asked) or EAGER
    if attention_used(model) != wanted:
        model.set_attn_implementation(wanted)


def attention_notes(model_class: Any, config: Any, asked: str) -> list[Fact]:
    """A note where ``model_class`` runs another attention than ``asked`` (a class that refuses SDPA keeps eager);
    none for a model without attention heads (Mamba's)."""
    used = implementation_for(model_class, asked) or EAGER
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if used == asked or not getattr(text, "num_attention_heads", None):
        return []
    return [Fact("note.attention_kept", {"model_class": model_class.__name__, "asked": asked, "used": used})]
