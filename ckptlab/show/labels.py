"""Short labels in the app's languages: a setting, a run, where numbers came from, a meter, an event, what is trained.

One function per thing labelled, used by the figures, the pages and ``ckptlab.lab`` alike;
every word comes from the locale files through :func:`ckptlab.show.i18n.t`. The command
line's English words are in :mod:`ckptlab.show.report`.
"""

from __future__ import annotations

from typing import Any

from ..fact import worded
from ..results import AS_ON_CPU, METHOD_FACTS, NO_GPU, Provenance, Region, RunResult, TimelinePoint
from ..spec import RunSpec
from .i18n import say, t


def setting_label(every_n_layers: int | None, offload: bool, lang: str = "en") -> str:
    """ "every_n_layers=2", "every_n_layers=1, offload" or "checkpointing off", in ``lang``."""
    if every_n_layers is None:
        return t("setting.off", lang)
    return t("setting.on_offload" if offload else "setting.on", lang, n=every_n_layers)


def short_setting_label(every_n_layers: int | None, lang: str = "en") -> str:
    """ "n=2" or "off" (in ``lang``): a tick label that stays horizontal in a half-width column."""
    return t("setting.short_off", lang) if every_n_layers is None else f"n={every_n_layers}"


def run_label(run: RunResult, lang: str = "en") -> str:
    """The setting of a run, for a legend: what ran, so an offload asked for where it does not apply (the CPU)
    says it did not happen (decided on ``memory.offload_applied``)."""
    n, memory = run.spec.every_n_layers, run.memory
    if n is not None and run.spec.offload and memory is not None and not memory.offload_applied:
        return t("setting.on_offload_not_applied", lang, n=n)
    return setting_label(n, run.spec.offload, lang)


def provenance_label(provenance: Provenance | str, lang: str = "en") -> str:
    """Where numbers came from, in ``lang``.

    Args:
        provenance: a result's :class:`~ckptlab.results.Provenance` ("measured on the CPU
            (Intel Xeon, 2 cores)"), or a bare kind (:data:`ckptlab.results.Kind`, e.g.
            ``"measured-cuda"``) where only that is known, as in a table row ("measured on CUDA").
        lang: language of the words.
    """
    if isinstance(provenance, str):
        return t(f"provenance_kind.{provenance}", lang)
    device = provenance.device_name
    if provenance.kind == "simulated":
        # A simulation's device name is the English of one of two facts: said again in ``lang``.
        device = say(AS_ON_CPU if device == worded(AS_ON_CPU) else NO_GPU, lang)
    return t(f"provenance.{provenance.kind}", lang, device=device)


def method_label(method: str, lang: str = "en") -> str:
    """How a number was measured (a result's method key, :data:`ckptlab.results.METHOD_FACTS`), in ``lang``; an
    unknown method (a result read from an older JSON, which wrote the English) as it is."""
    return say(METHOD_FACTS[method], lang) if method in METHOD_FACTS else method


def event_label(point: TimelinePoint | Region, lang: str = "en") -> str:
    """An event of the timeline (or the stretch it starts) for people, e.g. "backward of L3: its rerun, then its
    gradients"."""
    if not point.kind:  # a result read back from a JSON that kept only the English
        return getattr(point, "description", "") or getattr(point, "event", "")
    return t(f"event.{point.kind}", lang, n="" if point.layer is None else point.layer + 1)


def training_label(spec: RunSpec, lang: str = "en") -> str:
    """What the step trains, in words: "AdamW, full fine-tune", "SGD, LoRA rank 8"."""
    optimizer = t(f"optimizer.{spec.optimizer}", lang)
    if spec.lora_rank is None:
        return t("breakdown.training_full", lang, optimizer=optimizer)
    if spec.quantization is not None:
        eight = spec.quantization.bits == 8
        return t(
            "breakdown.training_8bit" if eight else "breakdown.training_qlora",
            lang,
            optimizer=optimizer,
            rank=spec.lora_rank,
        )
    return t("breakdown.training_lora", lang, optimizer=optimizer, rank=spec.lora_rank)


def experts_caption(model: Any, lang: str = "en") -> str | None:
    """One caption for a page, None for a dense model.

    Args:
        model: a :class:`~ckptlab.model.catalog.ModelInfo` or a result's ``ModelSummary``
            (both carry ``experts_implementation``, ``num_experts`` and ``experts_per_token``).
        lang: the page's language.
    """
    if not getattr(model, "experts_implementation", None):
        return None
    return t(
        "experts.caption",
        lang,
        experts=model.num_experts,
        top_k=model.experts_per_token,
        implementation=model.experts_implementation,
    )
