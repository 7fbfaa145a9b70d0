"""torchstate's process-wide helpers that need no step: what freezing the imports costs."""

from __future__ import annotations

import gc

from ckptlab.torchstate import freeze_what_is_loaded


def test_freezing_the_imports_walks_no_generation(monkeypatch):
    """The CLI and the app's workers freeze what their imports loaded without a collection first (issue 61): a full
    ``gc.collect()`` there walked a simulate process's 347,000 objects to find none unreachable, 0.15 s of CPU."""
    walked: list[int] = []

    def watch(phase: str, info: dict) -> None:
        if phase == "start":
            walked.append(info["generation"])

    # This test process keeps its collector as it is: only the walk before the freeze is watched.
    monkeypatch.setattr(gc, "freeze", lambda: None)
    gc.callbacks.append(watch)
    try:
        freeze_what_is_loaded()
    finally:
        gc.callbacks.remove(watch)
    assert walked == []
