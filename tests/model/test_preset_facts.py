"""The presets' facts `python -m ckptlab models` prints are stored as data: each matches the model built from it."""

from __future__ import annotations

import pytest

from ckptlab.model import catalog, presets


@pytest.mark.parametrize("name", list(presets.PRESETS))
def test_stored_facts_are_what_describe_finds(name: str):
    stored = {info.name: info for info in presets.stored_facts()}
    # describe_on_meta() builds the preset on the meta device and counts its layers and parameters.
    assert stored[name] == catalog.describe_on_meta(name) == catalog.describe(name), (
        f"{presets.PRESET_FACTS_FILE.name} is out of date for {name!r}: run "
        "python -c 'from ckptlab.model.catalog import write_preset_facts; write_preset_facts()'"
    )


def test_every_preset_has_stored_facts_and_no_other():
    import json

    stored = json.loads(presets.PRESET_FACTS_FILE.read_text(encoding="utf-8"))
    assert list(stored) == list(presets.PRESETS)
