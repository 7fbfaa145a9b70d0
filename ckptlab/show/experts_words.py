"""Words for a mixture-of-experts model: its experts, the path they run, and the simulation's routing assumption."""

from __future__ import annotations

from typing import Any

from .i18n import t


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
