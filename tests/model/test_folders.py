"""Bad model folders (issue 13): one message naming the file and the field, exit 2, nothing built first.

Every folder is made here in tmp_path from a tiny preset's config (and, for the weight
files, a one-layer GPT-2 saved with save_pretrained), then one field or file is broken.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import GPT2LMHeadModel

from ckptlab import DoesNotFitError, ModelLoadError, build_model, describe, measure
from ckptlab.cli import main
from ckptlab.model import catalog, configs, folder_checks, weight_checks
from tests.conftest import FAST

QUICK = ["--seq-len", "64", "--repeats", "1", "--warmup", "0"]


def config_folder(folder: Path, preset: str = "tiny-llama", **changes) -> Path:
    """``folder`` holding the preset's config.json with ``changes`` written over it."""
    config, _, _ = catalog.load_config(preset)
    config.save_pretrained(folder)
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    return folder


SMALL_GPT2 = {
    "n_layer": 1,
    "n_embd": 32,
    "n_head": 2,
    "vocab_size": 128,
    "n_positions": 64,
    "bos_token_id": 127,
    "eos_token_id": 127,
}


def weights_folder(folder: Path, bin_file: bool = False) -> Path:
    """A one-layer GPT-2 saved with its weights (model.safetensors, or pytorch_model.bin)."""
    config = catalog.config_with(catalog.load_config("tiny-gpt2")[0], SMALL_GPT2)
    GPT2LMHeadModel(config).save_pretrained(folder)  # not catalog's builders, which some tests block
    if bin_file:
        from safetensors.torch import load_file

        state = load_file(folder / "model.safetensors")
        (folder / "model.safetensors").unlink()
        torch.save(state, folder / "pytorch_model.bin")
    return folder


@pytest.fixture
def nothing_built(monkeypatch):
    """Fail the test if transformers builds a config or a model, even on the meta device."""

    def built(*args, **kwargs):
        raise AssertionError("built something before refusing")

    monkeypatch.setattr(configs.AutoConfig, "from_pretrained", built)
    monkeypatch.setattr(catalog, "build_on_meta", built)
    monkeypatch.setattr(catalog, "instantiate", built)


@pytest.fixture
def nothing_allocated(monkeypatch):
    """Fail the test if a model with real storage is built (the meta-device count is allowed)."""

    def built(*args, **kwargs):
        raise AssertionError("allocated the model before refusing")

    monkeypatch.setattr(catalog, "instantiate", built)
    monkeypatch.setattr(catalog.AutoModelForCausalLM, "from_pretrained", built)


# -- config.json: sizes and counts ---------------------------------------------------------

BAD_FIELDS = [
    # (preset, changes, words the message must hold)
    ("tiny-llama", {"hidden_size": -64}, "hidden_size=-64"),
    ("tiny-llama", {"vocab_size": -5}, "vocab_size=-5"),
    ("tiny-llama", {"num_attention_heads": 0}, "num_attention_heads=0"),
    ("tiny-gpt2", {"n_head": 0}, "n_head=0"),
    ("tiny-llama", {"intermediate_size": 0}, "intermediate_size=0"),
    ("tiny-llama", {"num_hidden_layers": -1}, "num_hidden_layers=-1"),
    ("tiny-llama", {"hidden_size": "384"}, 'hidden_size="384"'),
    ("tiny-llama", {"hidden_size": 384.5}, "hidden_size=384.5"),
    ("tiny-bert", {"num_attention_heads": True}, "num_attention_heads=true"),
]


@pytest.mark.parametrize(
    "preset, changes, words",
    BAD_FIELDS,
    ids=[f"{p}-{next(iter(c))}={next(iter(c.values()))}" for p, c, _ in BAD_FIELDS],
)
def test_a_size_that_is_not_a_positive_whole_number_is_named(tmp_path, preset, changes, words, nothing_built):
    folder = config_folder(tmp_path, preset, **changes)
    with pytest.raises(ModelLoadError) as raised:
        describe(str(folder))
    message = str(raised.value)
    assert words in message and str(folder / "config.json") in message and "positive whole number" in message
    assert "\n" not in message


def test_heads_that_do_not_divide_the_width_are_named(tmp_path):
    # GPT-2 derives head_dim from n_embd / n_head and does not check it in its config.
    folder = config_folder(tmp_path, "tiny-gpt2", n_head=7)
    with pytest.raises(ModelLoadError, match=r"sets n_embd=256 and n_head=7, but 7 heads do not divide 256.*e\.g\. 8"):
        describe(str(folder))


def test_llama_heads_that_do_not_divide_the_width_keep_transformers_words_on_one_line(tmp_path):
    folder = config_folder(tmp_path, num_attention_heads=7)
    with pytest.raises(ModelLoadError) as raised:
        describe(str(folder))
    message = str(raised.value)
    assert "config.json" in message and "number of attention heads (7)" in message and "\n" not in message


def test_key_value_heads_that_do_not_divide_the_heads_are_named(tmp_path):
    folder = config_folder(tmp_path, num_attention_heads=6, num_key_value_heads=4)
    with pytest.raises(ModelLoadError, match="num_attention_heads=6 and num_key_value_heads=4"):
        describe(str(folder))


def test_a_config_built_from_a_good_folder_still_loads(tmp_path):
    info = describe(str(config_folder(tmp_path, "tiny-qwen3")))
    assert (info.num_layers, info.hidden_size, info.weights) == (8, 256, "random")


# -- config.json: not a config ------------------------------------------------------------


def test_deeply_nested_json_is_one_message(tmp_path, nothing_built):
    (tmp_path / "config.json").write_text("[" * 10_000 + "]" * 10_000)
    with pytest.raises(ModelLoadError, match="nested too deeply"):
        describe(str(tmp_path))


def test_a_json_array_is_not_a_config(tmp_path, nothing_built):
    (tmp_path / "config.json").write_text("[1, 2, 3]")
    with pytest.raises(ModelLoadError, match="holds a JSON list, not an object"):
        describe(str(tmp_path))


# -- absurd sizes: refused from the config, nothing built ---------------------------------


@pytest.mark.parametrize("layers", [10**5, 10**9])
def test_absurd_depth_is_refused_before_transformers_builds_anything(tmp_path, layers, nothing_built):
    # tiny-qwen3: its config builds a per-layer list, minutes for 10**9 layers.
    folder = config_folder(tmp_path, "tiny-qwen3", num_hidden_layers=layers)
    with pytest.raises(ModelLoadError) as raised:
        describe(str(folder))
    assert f"num_hidden_layers={layers:,}" in str(raised.value) and f"at most {folder_checks.MAX_LAYERS:,}" in str(
        raised.value
    )


def test_absurd_depth_is_refused_under_another_name(tmp_path, nothing_built):
    folder = config_folder(tmp_path, "tiny-gpt2", n_layer=10**6)
    with pytest.raises(ModelLoadError, match="n_layer=1,000,000"):
        describe(str(folder))


HUGE = [
    ({"vocab_size": 10**10}, "vocab_size=10000000000"),
    ({"hidden_size": 10**7, "num_attention_heads": 1, "num_key_value_heads": 1}, "hidden_size=10000000"),
    ({"intermediate_size": 10**9}, "6,912.01B parameters"),
]


@pytest.mark.parametrize("changes, words", HUGE, ids=["vocab", "hidden", "intermediate"])
def test_parameters_beyond_the_machines_memory_are_refused_before_allocating(
    tmp_path, changes, words, nothing_allocated
):
    folder = config_folder(tmp_path, **changes)
    with pytest.raises(DoesNotFitError) as raised:
        build_model(str(folder))
    message = str(raised.value)
    assert words in message and "parameters" in message and "physical memory of this machine" in message
    assert "Nothing was built" in message and "\n" not in message


def test_the_size_rule_uses_the_gpus_total_memory_on_cuda(tmp_path, monkeypatch):
    monkeypatch.setattr(
        folder_checks, "memory_limit", lambda device: (80 * 2**30, "H100-80", "the 80.0 GiB of H100-80")
    )
    info = describe(str(config_folder(tmp_path, vocab_size=10**9)))  # 384 x 1e9 x 2 embeddings: 768B parameters
    with pytest.raises(
        DoesNotFitError,
        match=r"does not fit on H100-80: its 768.\d\dB parameters .* in bfloat16, more than the 80.0 GiB",
    ):
        folder_checks.check_fits(info, torch.bfloat16, "cuda")
    folder_checks.check_fits(replace(info, num_params=10**9), torch.bfloat16, "cuda")  # 2 GB: fits


def test_describe_still_accepts_a_huge_config_for_simulation(tmp_path):
    # simulate() runs real sizes on fake tensors: a config larger than this machine is its point.
    info = describe(str(config_folder(tmp_path, vocab_size=10**10)))
    assert info.num_params > 10**12


# -- weight files -------------------------------------------------------------------------


def test_truncated_safetensors_is_named(tmp_path, nothing_allocated):
    folder = weights_folder(tmp_path)
    weights = folder / "model.safetensors"
    with open(weights, "r+b") as f:
        f.truncate(weights.stat().st_size // 2)
    with pytest.raises(ModelLoadError, match=r"model\.safetensors' is cut off"):
        describe(str(folder))


@pytest.mark.parametrize("length", [2**62, 200_000_000])
def test_absurd_safetensors_header_is_named(tmp_path, length, nothing_allocated):
    folder = weights_folder(tmp_path)
    with open(folder / "model.safetensors", "r+b") as f:
        f.write(struct.pack("<Q", length))
    with pytest.raises(ModelLoadError, match=f"declares a header of {length:,} bytes"):
        build_model(str(folder))


def test_empty_safetensors_is_named(tmp_path):
    folder = weights_folder(tmp_path)
    (folder / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelLoadError, match=r"model\.safetensors' is 0 bytes long"):
        describe(str(folder))


def test_weights_whose_shapes_contradict_the_config_name_the_tensor(tmp_path, nothing_allocated):
    folder = weights_folder(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": 100}))
    with pytest.raises(ModelLoadError) as raised:
        build_model(str(folder))
    assert "transformer.wte.weight with shape [128, 32], but config.json gives [100, 32] (vocab_size=100)" in str(
        raised.value
    )


def test_a_pickle_that_is_not_plain_tensors_is_refused_in_one_line(tmp_path, nothing_allocated):
    folder = weights_folder(tmp_path, bin_file=True)
    state = torch.load(folder / "pytorch_model.bin")
    state["surprise"] = os.system  # a global torch's weights_only unpickler blocks
    torch.save(state, folder / "pytorch_model.bin")
    with pytest.raises(ModelLoadError) as raised:
        build_model(str(folder))
    message = str(raised.value)
    assert "pytorch_model.bin' holds Python objects besides tensors" in message and "weights_only=True" in message
    assert "\n" not in message


def test_truncated_pytorch_model_bin_is_named(tmp_path, nothing_allocated):
    folder = weights_folder(tmp_path, bin_file=True)
    weights = folder / "pytorch_model.bin"
    with open(weights, "r+b") as f:
        f.truncate(weights.stat().st_size // 2)
    with pytest.raises(ModelLoadError, match=r"pytorch_model\.bin' cannot be read as a torch\.save file"):
        describe(str(folder))


def test_good_weights_still_load(tmp_path):
    for bin_file in (False, True):
        folder = weights_folder(tmp_path / str(bin_file), bin_file=bin_file)
        model, info = build_model(str(folder))
        assert info.weights == "loaded" and model.transformer.wte.weight.shape == (128, 32)


def test_transformers_errors_on_loading_become_one_line(tmp_path):
    # What from_pretrained raises when a file passes the header checks but not safetensors' own.
    from safetensors import SafetensorError

    error = weight_checks.weights_error(str(tmp_path), SafetensorError("Error while deserializing header: oops"))
    assert "model.safetensors' could not be read by safetensors (Error while deserializing header: oops)" in str(error)
    mismatch = RuntimeError("You set `ignore_mismatched_sizes` to `False`, thus raising an error.")
    assert "do not have the shapes its config.json gives" in str(weight_checks.weights_error(str(tmp_path), mismatch))
    assert weight_checks.weights_error(str(tmp_path), torch.OutOfMemoryError("CUDA out of memory")) is None


# -- the command line: exit 2, one line, no traceback -------------------------------------


def _cli_case(tmp_path: Path, case: str) -> Path:
    if case == "negative hidden_size":
        return config_folder(tmp_path, hidden_size=-64)
    if case == "zero heads":
        return config_folder(tmp_path, num_attention_heads=0)
    if case == "deep JSON":
        (tmp_path / "config.json").write_text("[" * 10_000 + "]" * 10_000)
        return tmp_path
    if case == "billion layers":
        return config_folder(tmp_path, "tiny-qwen3", num_hidden_layers=10**9)
    if case == "huge vocab":
        return config_folder(tmp_path, vocab_size=10**10)
    folder = weights_folder(tmp_path, bin_file=case == "pickle")
    if case == "truncated safetensors":
        with open(folder / "model.safetensors", "r+b") as f:
            f.truncate(1000)
    if case == "pickle":
        state = torch.load(folder / "pytorch_model.bin")
        torch.save({**state, "surprise": os.system}, folder / "pytorch_model.bin")
    return folder


CLI_CASES = [
    ("negative hidden_size", "hidden_size=-64"),
    ("zero heads", "num_attention_heads=0"),
    ("deep JSON", "nested too deeply"),
    ("billion layers", "num_hidden_layers=1,000,000,000"),
    ("huge vocab", "does not fit on this CPU"),
    ("truncated safetensors", "model.safetensors"),
    ("pickle", "weights_only=True"),
]


@pytest.mark.parametrize("case, words", CLI_CASES, ids=[case for case, _ in CLI_CASES])
def test_the_command_line_prints_one_line_and_exits_2(tmp_path, case, words, capsys):
    folder = _cli_case(tmp_path, case)
    capsys.readouterr()
    assert main(["run", "--model", str(folder), *QUICK]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert words in err and str(folder) in err and "Traceback" not in err


@pytest.mark.slow  # a subprocess: python -m ckptlab
def test_python_dash_m_on_a_bad_folder_exits_2_without_traceback(tmp_path):
    import subprocess

    folder = config_folder(tmp_path, vocab_size=-5)
    done = subprocess.run(
        [sys.executable, "-m", "ckptlab", "run", "--model", str(folder), *QUICK],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: ") and "vocab_size=-5" in done.stderr and "Traceback" not in done.stderr


def test_measure_raises_the_same_errors(tmp_path):
    with pytest.raises(ModelLoadError, match="num_attention_heads=0"):
        measure(replace(FAST, model=str(config_folder(tmp_path, num_attention_heads=0))))


def test_a_quantization_whose_package_is_missing_is_one_line(tmp_path, capsys):
    import importlib.util

    from ckptlab.cli import main

    if importlib.util.find_spec("bitsandbytes") is not None:
        pytest.skip("bitsandbytes is installed here: the message for a missing package cannot be met")
    folder = weights_folder(tmp_path / "q")
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (folder / "config.json").write_text(json.dumps(config))
    code = main(["run", "--model", str(folder), "--seq-len", "16", "--repeats", "1", "--warmup", "0"])
    err = capsys.readouterr().err
    assert code == 2 and "asks for a quantization whose package is missing" in err and "Traceback" not in err, err


# -- issue 56: nested configs, buffers, malformed fields, overflowing numbers --------------

TINY_TEXT = {  # a two-layer Gemma 3 text model, the language half of the nested configs below
    "model_type": "gemma3_text",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "intermediate_size": 64,
    "vocab_size": 256,
}
NESTED_DEPTHS = [
    # (config.json, the field the message names): each a depth transformers would loop over on the meta device
    (
        {"model_type": "gemma3", "text_config": TINY_TEXT, "vision_config": {"model_type": "siglip_vision_model",
                                                                             "num_hidden_layers": 10**9}},
        "vision_config.num_hidden_layers=1,000,000,000",
    ),
    (
        {"model_type": "blt", **{part: {"num_hidden_layers": 10**7} for part in ("encoder_config", "decoder_config",
                                                                                  "patcher_config")}},
        "config.num_hidden_layers=10,000,000",
    ),
    (
        {"model_type": "mllama", "vision_config": {"model_type": "mllama_vision_model", "num_global_layers": 10**7}},
        "vision_config.num_global_layers=10,000,000",
    ),
    ({"model_type": "mllama", "vision_config": {"num_hidden_layers": 1e7}}, "vision_config.num_hidden_layers=10000000.0"),
    ({"model_type": "llama", "num_hidden_layers": 2, "layer_types": ["full_attention"] * 10**5}, "layer_types"),
]  # fmt: skip


@pytest.mark.parametrize(
    "raw, words", NESTED_DEPTHS, ids=["gemma3-vision", "blt", "mllama-global", "mllama-1e7", "list"]
)
def test_nested_depths_and_per_layer_lists_are_bounded_before_anything_is_built(tmp_path, raw, words, nothing_built):
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ModelLoadError) as raised:
        describe(str(tmp_path))
    assert words in str(raised.value) and "\n" not in str(raised.value)


MALFORMED = [
    ({"architectures": 5}, "architectures=5"),
    ({"quantization_config": "bitsandbytes"}, 'quantization_config="bitsandbytes"'),
    ({"quantization_config": ["bitsandbytes"]}, 'quantization_config=["bitsandbytes"]'),
    ({"num_local_experts": 4, "num_experts_per_tok": 9}, "num_experts_per_tok=9 and num_local_experts=4"),
]


@pytest.mark.parametrize("changes, words", MALFORMED, ids=["architectures", "quant-str", "quant-list", "experts"])
def test_malformed_fields_are_one_line_before_anything_is_built(tmp_path, changes, words, nothing_built):
    folder = config_folder(tmp_path, "tiny-llama", **changes)
    with pytest.raises(ModelLoadError) as raised:
        describe(str(folder))
    assert words in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize("literal", ["1e400", "-1e400"])
def test_a_number_that_overflows_to_infinity_is_refused_as_infinity_is(tmp_path, literal, nothing_built):
    folder = config_folder(tmp_path, rms_norm_eps=0.5)  # then written as the literal JSON parses to inf
    (folder / "config.json").write_text((folder / "config.json").read_text().replace("0.5", literal))
    with pytest.raises(ModelLoadError, match=f"holds {literal}, which is no finite number"):
        describe(str(folder))


def test_the_size_rule_counts_the_buffers_bert_holds_for_its_positions(tmp_path, monkeypatch):
    # BERT 1 wide with 2^28 positions: 268.4M parameters (1.0 GiB in float32), and position_ids and token_type_ids
    # of 2^28 int64 each (4.0 GiB) that parameters() does not list.
    small = {"hidden_size": 1, "num_attention_heads": 1, "intermediate_size": 1, "num_hidden_layers": 1}
    info = describe(str(config_folder(tmp_path, "tiny-bert", max_position_embeddings=2**28, **small)))
    assert info.buffer_bytes == 2 * 2**28 * 8
    monkeypatch.setattr(folder_checks, "memory_limit", lambda device: (2 * 2**30, "H100-2", "the 2.0 GiB of H100-2"))
    with pytest.raises(DoesNotFitError, match=r"and its buffers \(4.0 GiB: position ids and the like\) take 5.0 GiB"):
        folder_checks.check_fits(info, torch.float32, "cuda")
