"""A 4-bit base (RunSpec.quantization): BitsAndBytesConfig's fields read strictly, LoRA required, a JSON round trip,
and the model as transformers and peft make it, measured and simulated."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from ckptlab import RunSpec
from ckptlab.errors import SpecError
from ckptlab.model.catalog import load_config
from ckptlab.model.quantize import Quantization, load_quantization_file

QLORA = {
    "load_in_4bit": True,
    "bnb_4bit_quant_type": "nf4",
    "bnb_4bit_use_double_quant": True,
    "bnb_4bit_compute_dtype": "float32",
}


INT8 = {"load_in_8bit": True, "llm_int8_threshold": 6.0}


def test_an_8bit_setting_is_read_strictly_round_trips_and_comes_from_a_bnb_8bit_folder(tmp_path):
    """Issue 46: load_in_8bit (LLM.int8()) with its own fields; the 4-bit fields it ignores held at their defaults."""
    from transformers import BitsAndBytesConfig

    from ckptlab.model.catalog import load_config
    from ckptlab.step.preflight import with_folder_quantization

    spec = RunSpec(model="tiny-llama", lora_rank=8, quantization={**INT8, "llm_int8_skip_modules": ["o_proj"]})
    spec.validate()
    assert spec.quantization == Quantization(load_in_8bit=True, llm_int8_skip_modules=("o_proj",))
    assert (spec.quantization.bits, spec.quantization.label, spec.quantization.load_in_4bit) == (8, "int8", False)
    assert RunSpec(**json.loads(json.dumps(spec.to_dict()))) == spec
    assert spec.quantization.to_dict() == {
        "load_in_8bit": True,
        "llm_int8_threshold": 6.0,
        "llm_int8_has_fp16_weight": False,
        "llm_int8_skip_modules": ["o_proj"],
    }
    # A "-bnb-8bit" checkpoint's quantization_config, as BitsAndBytesConfig.to_dict writes it (every field).
    written = BitsAndBytesConfig(load_in_8bit=True, llm_int8_threshold=5.0).to_dict()
    config = load_config("tiny-llama")[0].to_dict()
    config["quantization_config"] = written
    (tmp_path / "config.json").write_text(json.dumps(config))
    found = with_folder_quantization(RunSpec(model=str(tmp_path), lora_rank=4)).quantization
    assert found == Quantization(load_in_8bit=True, llm_int8_threshold=5.0)
    assert Quantization.from_config({"load_in_8bit": True, "llm_int8_threshold": 6}) == Quantization(load_in_8bit=True)
    with pytest.raises(SpecError) as caught:
        RunSpec(quantization={**INT8, "llm_int8_threshold": "high"})
    assert caught.value.key == "spec.quantization_value"


def test_the_setting_is_read_strictly_and_round_trips_through_json(tmp_path):
    spec = RunSpec(model="tiny-llama", lora_rank=8, quantization={**QLORA, "quant_method": "bitsandbytes"})
    spec.validate()
    assert spec.quantization == Quantization(True, "nf4", True, "float32")
    assert RunSpec(**json.loads(json.dumps(spec.to_dict()))) == spec
    file = tmp_path / "q.json"
    file.write_text(json.dumps(QLORA))
    assert load_quantization_file(file) == spec.quantization

    # A folder whose config.json carries a bitsandbytes quantization_config (a "-bnb-4bit" checkpoint) uses it.
    from ckptlab.model.catalog import load_config
    from ckptlab.step.preflight import with_folder_quantization

    config = load_config("tiny-llama")[0].to_dict()
    config["quantization_config"] = {**QLORA, "quant_method": "bitsandbytes", "_load_in_4bit": True}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert with_folder_quantization(RunSpec(model=str(tmp_path), lora_rank=4)).quantization == spec.quantization

    refusals = {
        "spec.quantization_keys": lambda: RunSpec(quantization={**QLORA, "bnb_4bit_quant_tpye": "nf4"}),
        "spec.quantization_width": lambda: RunSpec(quantization={**QLORA, "load_in_8bit": True}),
        "spec.quantization_fp16_weight": lambda: RunSpec(quantization={**INT8, "llm_int8_has_fp16_weight": True}),
        "spec.quantization_value": lambda: RunSpec(quantization={**QLORA, "bnb_4bit_quant_type": "nf3"}),
        "spec.quantization_without_lora": RunSpec(quantization=QLORA).validate,
        "spec.quantization_file": lambda: load_quantization_file(tmp_path / "missing.json"),
    }
    for key, action in refusals.items():
        with pytest.raises(SpecError) as caught:
            action()
        assert caught.value.key == key


@pytest.mark.slow
def test_the_simulation_of_a_4bit_base_equals_its_measured_cpu_step_per_category():
    import ckptlab
    from ckptlab.model.quantize import quant_state_tensors

    spec = RunSpec(model="tiny-llama", seq_len=32, repeats=1, warmup=0, lora_rank=8, quantization=QLORA, device="cpu")
    measured, simulated = ckptlab.measure(spec), ckptlab.simulate(spec)
    assert [fact.key for fact in measured.notes[:2]] == ["note.quantized_base", "note.kbit_prepared"]
    for memory in (measured.memory, simulated.memory):
        assert memory.breakdown_at_peak.get("gradient", 0) < memory.breakdown_at_peak["parameter"] / 10  # adapters
    for category, value in measured.memory.breakdown_at_peak.items():
        assert simulated.memory.breakdown_at_peak.get(category) == pytest.approx(value, rel=0.01), category
    assert simulated.memory.peak_bytes == pytest.approx(measured.memory.peak_bytes, rel=0.01)
    assert simulated.memory.after_forward_bytes == pytest.approx(measured.memory.after_forward_bytes, rel=0.01)
    # The simulation's work (ckptlab.step.opcount): bitsandbytes' 4-bit matmul counts its matmul, 2 x tokens x in x
    # out, in the forward and again in the rerun (its autograd Function recomputes without grad mode: torch's
    # recomputation hooks tell), and reads each weight at 4 bits with its block's scale.
    config, _, _ = load_config("tiny-llama")
    h, inter, tokens = config.hidden_size, config.intermediate_size, spec.seq_len
    gemms = [item for item in simulated.work.items if item.cost.op == "bitsandbytes.gemm_4bit.default"]
    for phase in ("forward", "rerun"):
        done = sum(item.cost.flops * item.count for item in gemms if item.phase == phase)
        assert done == config.num_hidden_layers * 2 * tokens * (4 * h * h + 3 * h * inter), phase
    query = next(item.cost for item in gemms if item.cost.flops == 2 * tokens * h * h)
    weight = query.bytes - 2 * tokens * h * 4  # less the float32 input read and output written
    assert h * h // 2 <= weight < h * h // 2 * 1.1
    # The 4-bit states are counted with the parameters: the base's bytes are the packed weights and their states.
    model, _ = ckptlab.build_model("tiny-llama", quantization=spec.quantization)
    states = sum(
        tensor.untyped_storage().nbytes() for tensor in {id(t): t for t in quant_state_tensors(model)}.values()
    )
    weights = sum(param.untyped_storage().nbytes() for param in model.parameters())
    assert states > 0 and measured.memory.breakdown_baseline["parameter"] >= weights + states - 4096


@pytest.mark.slow  # bitsandbytes' import and two builds of tiny-llama (one on fake tensors)
def test_the_preflight_floor_counts_a_4_bit_base_at_the_bytes_the_built_model_holds():
    """Issue 46: the floor checked before a run counts the base as bitsandbytes stores it (packed weights, their
    states, the embeddings and head in float32 after peft's cast), the bytes the built model holds, not 16 bits."""
    import torch

    import ckptlab
    from ckptlab.model.quantize import quant_state_tensors
    from ckptlab.step.preflight import base_bytes, step_floor

    spec = RunSpec(model="tiny-llama", lora_rank=8, quantization=QLORA, device="cpu")
    info = ckptlab.describe("tiny-llama")
    model, _ = ckptlab.build_model("tiny-llama", dtype=torch.bfloat16, quantization=spec.quantization)
    tensors = [*model.parameters(), *quant_state_tensors(model)]
    held = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())
    assert base_bytes(spec, info, torch.bfloat16) == held < info.num_params * 2
    sixteen_bit = RunSpec(model="tiny-llama", lora_rank=8, device="cpu")
    assert step_floor(sixteen_bit, info, torch.bfloat16) - step_floor(spec, info, torch.bfloat16) == (
        info.num_params * 2 - held
    )


@pytest.mark.slow  # bitsandbytes' import, a real CPU step and its simulation on tiny-llama
def test_the_simulation_of_an_8bit_base_equals_its_measured_cpu_step_per_category(monkeypatch):
    """Issue 46: an 8-bit base (Linear8bitLt, Int8Params) made as transformers loads one, measured on the CPU and
    simulated on fake tensors: equal per category, the row scales (SCB) counted as parameters, and the notes say the
    figures are bitsandbytes' CPU path (a CUDA GPU's outlier columns and float16 input copies are not counted)."""
    import torch

    import ckptlab
    from ckptlab.explore.predict import predict
    from ckptlab.model.lora import adapter_parameters, projection_shapes
    from ckptlab.model.quantize import model_quantization, quant_state_tensors

    spec = RunSpec(model="tiny-llama", seq_len=16, repeats=1, warmup=0, lora_rank=8, quantization=INT8, device="cpu")
    # What note.int8_cpu_path says: a training step takes bitsandbytes' CPU path (MatMul8bitFp), never MatMul8bitLt
    # (CUDA's, with the outlier columns and float16 input copies), so the threshold changes no byte of it.
    from bitsandbytes.autograd import _functions as bnb_functions

    def cuda_path(*args: object, **kwargs: object) -> None:
        raise AssertionError("MatMul8bitLt ran: note.int8_cpu_path no longer says what the step does")

    monkeypatch.setattr(bnb_functions.MatMul8bitLt, "forward", staticmethod(cuda_path))
    measured, simulated = ckptlab.measure(spec), ckptlab.simulate(spec)
    no_outliers = replace(spec, quantization=Quantization(load_in_8bit=True, llm_int8_threshold=0.0))
    assert ckptlab.simulate(no_outliers).memory.breakdown_at_peak == simulated.memory.breakdown_at_peak
    for result in (measured, simulated):
        assert [fact.key for fact in result.notes[:3]] == [
            "note.quantized_base_8bit",
            "note.kbit_prepared",
            "note.int8_cpu_path",
        ]
    for category, value in measured.memory.breakdown_at_peak.items():
        print(category, value, simulated.memory.breakdown_at_peak.get(category))
        assert simulated.memory.breakdown_at_peak.get(category) == pytest.approx(value, rel=0.01), category
    assert simulated.memory.peak_bytes == pytest.approx(measured.memory.peak_bytes, rel=0.01)
    # The parameters: the int8 weights, their float32 row scales (SCB), the float32 embeddings, norms and head
    # (peft's cast), and the float32 adapters; predict counts the base from the same build on fake tensors.
    model, _ = ckptlab.build_model("tiny-llama", quantization=spec.quantization)
    assert model_quantization(model) == spec.quantization
    int8 = [module for module in model.modules() if type(module).__name__ == "Linear8bitLt"]
    assert int8 and all(module.weight.dtype == torch.int8 for module in int8)
    scales = sum(tensor.untyped_storage().nbytes() for tensor in quant_state_tensors(model))
    assert scales == 4 * sum(module.out_features for module in int8)  # one float32 scale per output row
    base = sum(param.untyped_storage().nbytes() for param in model.parameters()) + scales
    adapters = 4 * adapter_parameters(8, projection_shapes(model))
    print("parameters: measured", measured.memory.breakdown_baseline["parameter"], "base", base, "scales", scales)
    assert measured.memory.breakdown_baseline["parameter"] == base + adapters
    shape = {"seq_len": 16, "lora_rank": 8, "device": "cpu", "dtype": "float32", "every_n_layers": [1]}
    (_, predicted) = predict("tiny-llama", quantization=spec.quantization, **shape)
    (_, sixteen_bit) = predict("tiny-llama", **shape)
    assert predicted.parameter_bytes == simulated.memory.breakdown_baseline["parameter"] < sixteen_bit.parameter_bytes


# -- issue 56: other quantization methods, and long skip lists ------------------------------------------------


@pytest.mark.parametrize(
    "quantization, words",
    [
        ({"quant_method": "gptq", "bits": 4}, "asks for a gptq quantization"),
        ({"quant_method": "awq", "bits": 4}, "asks for a awq quantization"),
        ({"quant_method": "fp8"}, "asks for a fp8 quantization"),
        ({"load_in_4bit": True}, "without a quant_method (load_in_4bit)"),
    ],
    ids=["gptq", "awq", "fp8", "no-method"],
)
def test_a_folder_quantized_by_another_method_is_refused_by_name_not_run_as_16_bits(tmp_path, quantization, words):
    from ckptlab.step.preflight import with_folder_quantization
    from tests.model.test_folders import config_folder

    folder = config_folder(tmp_path, "tiny-llama", quantization_config=quantization)
    with pytest.raises(SpecError, match=re.escape(words)):
        with_folder_quantization(RunSpec(model=str(folder), lora_rank=8))


@pytest.mark.parametrize("count", [6_000, 100_000])
def test_a_skip_list_past_the_regex_cache_is_refused_at_once(count):
    from ckptlab.model.quantize import MAX_SKIP_MODULES

    names = [f"model.layers.{index}.mlp" for index in range(count)]
    with pytest.raises(SpecError, match=f"lists {count:,} module names; the lab takes at most {MAX_SKIP_MODULES}"):
        Quantization.from_config({"load_in_4bit": True, "llm_int8_skip_modules": names})
    assert Quantization.from_config({"load_in_4bit": True, "llm_int8_skip_modules": names[:MAX_SKIP_MODULES]})


@pytest.mark.slow  # bitsandbytes' and peft's import, tiny-llama built on fake tensors
def test_checkpointing_off_leaves_none_of_the_input_gradient_hooks_peft_registered():
    """Issue 62: prepare_model_for_kbit_training registers the embeddings' input-gradient hook twice (itself, then
    through transformers' checkpointing) and transformers keeps the last handle only; with checkpointing off the
    other stayed on and the first layer kept tensors a Trainer's step without checkpointing does not keep
    (``prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)`` registers none)."""
    import torch

    from ckptlab.model.catalog import load_config, quantized_on_fake

    config, _, task = load_config("tiny-llama")
    model, _ = quantized_on_fake(config, task, torch.float32, Quantization(**QLORA))
    assert model.get_input_embeddings()._forward_hooks  # on: the embeddings' output requires grad
    model.disable_input_require_grads()  # what turning checkpointing off calls (measure's apply_setting, simulate)
    assert not model.get_input_embeddings()._forward_hooks
