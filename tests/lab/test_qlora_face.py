"""The "4-bit base (QLoRA)" choice: the Lab page's widgets and a shared link carry it and read it back, the
Trade-offs sweep takes it, and the code box loads the base before the checkpointing line."""

from __future__ import annotations

import ast

import pytest

from ckptlab import RunSpec
from ckptlab.lab import lab_view, tradeoffs_view
from ckptlab.lab.query import spec_from_query, spec_to_query
from ckptlab.model.quantize import QLORA
from ckptlab.step.code import training_code


def test_the_qlora_choice_round_trips_through_widgets_and_a_link_and_writes_its_code():
    spec = RunSpec(model="tiny-llama", lora_rank=8, quantization=QLORA)
    values = lab_view.widget_values(spec, "")
    assert values["lab_qlora"] is True and lab_view.spec_from_widgets(values, spec.model, None) == spec
    assert lab_view.spec_from_widgets({**values, "lab_lora": False}, spec.model, None).quantization is None
    assert spec_from_query(spec_to_query(spec)) == (spec, [])
    assert spec_from_query({**spec_to_query(spec), "lora": "off"})[0].quantization is None  # adapters only
    assert spec_to_query(RunSpec()).get("qlora") is None  # links without it stay as they were
    sweep = tradeoffs_view.spec_from_widgets(
        {
            "tradeoffs_model": "tiny-llama", "tradeoffs_seq": [64], "tradeoffs_n": [], "tradeoffs_choose_n": False,
            "tradeoffs_offload": "none", "tradeoffs_batch": 1, "tradeoffs_dtype": "auto", "tradeoffs_repeats": 1,
            "tradeoffs_warmup": 0, "tradeoffs_optimizer": "adamw", "tradeoffs_lora": True, "tradeoffs_lora_rank": 4,
            "tradeoffs_lora_targets": ["q_proj"], "tradeoffs_qlora": True,
        },
        ["q_proj", "v_proj"],
    )  # fmt: skip
    assert sweep.quantization == QLORA and sweep.run_spec(64, 1, False).quantization == QLORA
    code = training_code(sweep.run_spec(64, 1, False))
    ast.parse(code)
    assert 'bnb_4bit_quant_type="nf4"' in code and "prepare_model_for_kbit_training(model)" in code


@pytest.mark.slow  # builds a 4-bit base: bitsandbytes' import and its quantization, a few seconds
def test_a_folder_with_a_4bit_quantization_config_builds_for_the_app_as_for_the_cli(tmp_path):
    """The app's model key carries the folder's quantization, so its build is the 4-bit base the CLI's check reads
    (it refused "4-bit base (QLoRA) without LoRA rank" with the rank set)."""
    import json

    from bitsandbytes.nn import Linear4bit

    from ckptlab.lab.run import build_for_key, model_key
    from ckptlab.model.catalog import load_config
    from ckptlab.model.configs import config_with

    config = config_with(load_config("tiny-llama")[0], {"num_hidden_layers": 1}).to_dict()
    config["quantization_config"] = {**QLORA.to_dict(), "quant_method": "bitsandbytes"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = RunSpec(model=str(tmp_path), seq_len=32, lora_rank=8, device="cpu")
    key = model_key(spec)
    assert QLORA in key
    model, info = build_for_key(key)
    assert info.num_layers == 1 and any(isinstance(module, Linear4bit) for module in model.modules())
