"""The model box the Lab, At-scale and Trade-offs pages share: one label, one caption, one duration (issue 57)."""

from dataclasses import replace

import ckptlab
from ckptlab.lab.modelbox import HUB, LOCAL, duration, model_caption, model_label, params_label
from ckptlab.show import i18n


def test_a_preset_reads_the_same_on_every_page_in_the_readers_language():
    tiny, real = ckptlab.describe("tiny-llama"), ckptlab.describe("qwen3-8b")
    size = params_label(real.num_params, "en")
    assert size == "8.19B" and params_label(real.num_params, "pt-BR") == "8,19 B"
    assert params_label(135_000_000, "en") == "135.0M"
    assert model_label("qwen3-8b", real, "en") == f"qwen3-8b · {real.num_layers} layers · {size}"
    assert model_label("qwen3-8b", real, "pt-BR") == f"qwen3-8b · {real.num_layers} camadas · 8,19 B"
    # the Lab page sorts its presets into groups: the same label after the group
    assert model_label("tiny-llama", tiny, "en", grouped=True) == "tiny · " + model_label("tiny-llama", tiny, "en")
    assert model_label(LOCAL, None, "ja") == i18n.t("lab.local_dir", "ja")
    assert model_label(HUB, None, "en") == i18n.t("lab.hub_entry", "en")


def test_the_caption_says_layers_hidden_and_positions_or_infinity():
    info = ckptlab.describe("qwen3-8b")
    caption = model_caption(info, "en")
    assert info.family in caption and f"{info.max_positions:,}" in caption and f"{info.num_layers} layers" in caption
    assert "∞" in model_caption(replace(info, max_positions=None), "en")


def test_one_duration_in_seconds_minutes_or_hours():
    # 150 s read "2 min" on the Lab page and "2.5 min" on At scale; 9,000 s "2 h" and "150.0 min"
    assert [duration(s, "en") for s in (59.4, 150, 9000)] == ["59 s", "2.5 min", "2.5 h"]
    assert duration(150, "pt-BR") == "2,5 min"
