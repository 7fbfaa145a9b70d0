"""Settings in the URL: round trip, and bad values falling back with a warning."""

from __future__ import annotations

import pytest

import ckptlab
from ckptlab import RunSpec
from ckptlab.fact import Fact
from ckptlab.lab.query import gpus_from_query, spec_from_query, spec_to_query
from ckptlab.show.i18n import say


@pytest.mark.parametrize(
    "spec",
    [
        ckptlab.RunSpec(),
        ckptlab.RunSpec(
            model="tiny-qwen3",
            seq_len=1024,
            batch_size=2,
            dtype="bfloat16",
            device="cpu",
            every_n_layers=3,
            offload=True,
            repeats=1,
            warmup=0,
        ),
        ckptlab.RunSpec(model="/tmp/some model", every_n_layers=None),
        ckptlab.RunSpec(optimizer="sgd", lora_rank=8),
        ckptlab.RunSpec(optimizer="none", lora_rank=16, lora_targets=("q_proj", "v_proj")),
        ckptlab.RunSpec(every_n_layers=2, selective="attention"),
    ],
)
def test_round_trip(spec):
    assert spec_from_query(spec_to_query(spec)) == (spec, [])


def test_missing_values_keep_the_defaults():
    assert spec_from_query({}) == (ckptlab.RunSpec(), [])


def test_bad_values_fall_back_each_with_a_warning():
    spec, warnings = spec_from_query(
        {
            "seq": "abc",
            "batch": "0",
            "dtype": "int4",
            "device": "tpu",
            "n": "-2",
            "offload": "maybe",
            "repeats": "9" * 5000,
            "warmup": "1.5",
        }
    )
    assert spec == ckptlab.RunSpec()
    assert [(fact.params["key"], fact.params["value"]) for fact in warnings] == [
        ("seq", "abc"),
        ("batch", "0"),
        ("repeats", "9" * 5000),
        ("warmup", "1.5"),
        ("dtype", "int4"),
        ("device", "tpu"),
        ("n", "-2"),
        ("offload", "maybe"),
    ]
    assert [fact.params["default"] for fact in warnings[:2]] == [RunSpec().seq_len, 1] and warnings[
        4
    ].key == "link.not_available"
    spec.validate()


def test_cuda_is_refused_where_the_page_does_not_offer_it():
    spec, warnings = spec_from_query({"device": "cuda"}, devices=("auto", "cpu"))
    assert spec.device == "auto" and warnings == [
        Fact("link.not_available", {"key": "device", "value": "cuda", "default": "auto", "choices": "auto, cpu"})
    ]


def test_offload_without_checkpointing_is_dropped():
    spec, warnings = spec_from_query({"n": "off", "offload": "1"})
    assert spec.every_n_layers is None and spec.offload is False
    assert warnings == [Fact("link.needs_checkpointing", {"key": "offload", "value": "1", "fallback": "off"})]


def test_a_repeated_key_counts_its_last_value():
    spec, warnings = spec_from_query({"seq": ["128", "256"]})
    assert spec.seq_len == 256 and warnings == []


def test_optimizer_and_lora_in_the_link():
    spec, warnings = spec_from_query({"opt": "SGD", "lora": "8", "targets": "q_proj, v_proj,,q_proj"})
    assert warnings == []
    assert (spec.optimizer, spec.lora_rank, spec.lora_targets) == ("sgd", 8, ("q_proj", "v_proj"))
    assert spec_to_query(spec)["targets"] == "q_proj,v_proj"
    assert "targets" not in spec_to_query(ckptlab.RunSpec(lora_rank=8))  # absent: every projection
    assert spec_from_query({"lora": "off", "targets": "q_proj"}) == (ckptlab.RunSpec(), [])  # targets need LoRA


@pytest.mark.parametrize("query", [{"opt": "adam"}, {"lora": "-1"}, {"lora": "big"}, {"lora": "99999"}])
def test_a_bad_optimizer_or_rank_falls_back_with_a_warning(query):
    spec, warnings = spec_from_query(query)
    assert spec == ckptlab.RunSpec() and len(warnings) == 1
    assert warnings[0].params["key"] == next(iter(query))
    spec.validate()


def test_gpus_in_the_link_are_one_of_the_choices_or_fall_back():
    from ckptlab.explore.gpu_search import GPU_COUNTS
    from ckptlab.lab.query import gpus_from_query

    assert gpus_from_query("8", GPU_COUNTS) == (8, [])
    assert gpus_from_query(["2", "64"], GPU_COUNTS) == (64, [])  # a repeated key: the last counts
    for bad in ("3", "eight", "", "-1"):
        gpus, warnings = gpus_from_query(bad, GPU_COUNTS)
        assert gpus == 1 and [(fact.key, fact.params["key"], fact.params["value"]) for fact in warnings] == [
            ("link.not_one_of", "gpus", bad)
        ]
        assert "64" in warnings[0].params["choices"]


def test_trainers_step_travels_in_the_link_and_bad_values_fall_back():
    spec = ckptlab.RunSpec(
        gradient_accumulation_steps=4, mixed_precision="bf16", max_grad_norm=0.5, optimizer="adafactor"
    )
    query = spec_to_query(spec)
    assert {key: query[key] for key in ("accum", "mp", "clip", "opt")} == {
        "accum": "4",
        "mp": "bf16",
        "clip": "0.5",
        "opt": "adafactor",
    }
    assert spec_from_query(query) == (spec, [])
    assert "accum" not in spec_to_query(ckptlab.RunSpec())  # a default needs no key
    back, warnings = spec_from_query({"accum": "0", "mp": "fp8", "clip": "nan"})
    assert (back.gradient_accumulation_steps, back.mixed_precision, back.max_grad_norm) == (1, "none", 1.0)
    assert [fact.params["key"] for fact in warnings] == ["accum", "mp", "clip"]
    assert warnings[1] == Fact(
        "link.not_one_of", {"key": "mp", "value": "fp8", "default": "none", "choices": "none, bf16, fp16"}
    )


@pytest.mark.parametrize("key", ["model", "seq", "n", "dtype", "targets", "lora"])
def test_a_value_with_a_control_character_falls_back_with_the_usual_warning(key):
    spec, warnings = spec_from_query({key: "tiny\x00llama", "batch": "2"})
    base = RunSpec()
    assert spec.model == base.model and spec.batch_size == 2
    assert warnings == [Fact("link.control_character", {"key": key, "value": "tiny\x00llama"})]
    # Worded with the value's repr: the NUL byte reaches the page escaped, never raw.
    assert say(warnings[0]).startswith(f"{key}='tiny\\x00llama' in the link")
    spec.validate()


def test_gpus_with_a_nul_byte_fall_back():
    gpus, warnings = gpus_from_query("8\x00", (1, 2, 4, 8))
    assert gpus == 1 and len(warnings) == 1


def test_the_selective_policy_travels_in_the_link_only_when_there_is_one():
    assert "selective" not in spec_to_query(RunSpec())
    assert spec_to_query(RunSpec(selective="matmuls"))["selective"] == "matmuls"
    spec, warnings = spec_from_query({"selective": "everything"})
    assert spec.selective == "none"
    assert [(fact.key, fact.params["value"], fact.params["choices"]) for fact in warnings] == [
        ("link.not_one_of", "everything", "none, attention, matmuls, torchtitan")
    ]
    spec, warnings = spec_from_query({"selective": "attention", "n": "off"})
    assert spec.selective == "none" and spec.every_n_layers is None
    assert warnings == [
        Fact("link.needs_checkpointing", {"key": "selective", "value": "attention", "fallback": "none"})
    ]


def test_the_attention_travels_in_the_link_and_a_hub_kernel_or_the_attention_policy_with_eager_falls_back():
    eager = ckptlab.RunSpec(attn_implementation="eager")
    assert spec_to_query(eager)["attn"] == "eager" and "attn" not in spec_to_query(ckptlab.RunSpec())
    assert spec_from_query(spec_to_query(eager)) == (eager, [])
    spec, warnings = spec_from_query({"attn": "kernels-community/flash-attn"})  # no code from the Hub
    assert spec == ckptlab.RunSpec() and [w.key for w in warnings] == ["link.not_one_of"]
    spec, warnings = spec_from_query({"attn": "eager", "selective": "attention"})
    assert spec == eager and [w.key for w in warnings] == ["link.attention_policy_eager"]


def test_a_field_means_one_thing_on_every_face():
    """clip=inf in a link is --max-grad-norm inf (never clip, and the box's top, read back so); lora_targets as a text
    is split on commas by RunSpec as the flag and the link split it, not taken as its characters."""
    import math

    from ckptlab.cli import build_parser
    from ckptlab.cli.args import spec_from_args
    from ckptlab.lab.stepboxes import step_fields, step_widget_values

    argv = ["simulate", "--max-grad-norm", "inf", "--lora-rank", "8", "--lora-targets", "q_proj,v_proj"]
    flagged = spec_from_args(build_parser().parse_args(argv))
    linked, warnings = spec_from_query({"clip": "inf", "lora": "8", "targets": "q_proj,v_proj"})
    assert warnings == []
    assert flagged.max_grad_norm == linked.max_grad_norm == math.inf
    assert step_fields("lab", step_widget_values("lab", linked))["max_grad_norm"] == math.inf
    assert spec_from_query(spec_to_query(linked)) == (linked, [])
    typed = RunSpec(lora_rank=8, lora_targets="q_proj,v_proj")
    assert flagged.lora_targets == linked.lora_targets == typed.lora_targets == ("q_proj", "v_proj")
