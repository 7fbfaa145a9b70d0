"""One widget-to-spec codec and one link writer (ckptlab.lab.widgets, issue 57): each page's widgets give back the
spec they were filled from, each page's link reads back as its spec, and a field declared once (ckptlab.spec_fields)
reaches the flags, the link and every page's widgets by itself. Unit tests: no model is built, no step runs."""

from __future__ import annotations

import dataclasses
import math

import pytest

from ckptlab import spec_fields
from ckptlab.cli import build_parser
from ckptlab.cli.args import argv_from_spec, option_flags, spec_from_args
from ckptlab.explore.gpu_search import GPU_COUNTS
from ckptlab.lab import at_scale_view, lab_view, tradeoffs_view
from ckptlab.lab.query import gpus_from_query, spec_from_query, spec_to_query
from ckptlab.lab.targets import settle
from ckptlab.model.quantize import QLORA
from ckptlab.spec import RunSpec
from ckptlab.spec_fields import Cli, Link, Widget

PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj"]  # a model's LoRA choices, in its order
SPECS = {
    "default": RunSpec(model="tiny-qwen3", dtype="bfloat16"),
    "lora": RunSpec(
        model="tiny-qwen3", dtype="float32", seq_len=1024, batch_size=2, lora_rank=16, lora_targets=("q_proj", "v_proj")
    ),
    "qlora": RunSpec(model="tiny-qwen3", dtype="bfloat16", lora_rank=8, quantization=QLORA, optimizer="sgd"),
    "selective": RunSpec(
        model="tiny-qwen3",
        dtype="float32",
        every_n_layers=2,
        offload=True,
        selective="attention",
        gradient_accumulation_steps=4,
        mixed_precision="bf16",
        max_grad_norm=0.5,
    ),
    "attention": RunSpec(model="tiny-qwen3", dtype="float16", attn_implementation="eager", max_grad_norm=math.inf),
    "off": RunSpec(model="tiny-qwen3", dtype="float32", every_n_layers=None, repeats=7, warmup=0),
}
ALL = pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS)


def _shown(page, spec_or_request) -> dict[str, object]:
    """The fields a page shows, as ``spec_or_request`` holds them."""
    return {name: getattr(spec_or_request, name) for name in page.spec_fields()}


def _at_scale_values(spec: RunSpec) -> dict[str, object]:
    return {
        **at_scale_view.widget_values(spec, "", tiny=True),
        "at_scale_gpus": 4,
        "at_scale_gpu": at_scale_view.CUSTOM,
    }


@ALL
def test_the_lab_pages_widgets_give_back_their_spec_and_so_does_its_link(spec):
    values = lab_view.widget_values(spec, "")
    assert lab_view.spec_from_widgets(values, spec.model, spec.lora_targets) == spec
    assert spec_from_query(spec_to_query(spec)) == (spec, [])  # the page's link (pages/lab.py)


@ALL
def test_the_at_scale_pages_widgets_give_back_their_spec_and_so_does_its_link(spec):
    values = {**_at_scale_values(spec), "at_scale_budget_gib": 24.5, "at_scale_selective": ["attention"]}
    request = at_scale_view.request_from_widgets(values, spec.model, 8, spec.lora_targets)
    assert _shown(at_scale_view.PAGE, request) == _shown(at_scale_view.PAGE, spec) and request.world_size == 4

    link = at_scale_view.query(values, spec.model, spec.lora_targets)
    # Read back as the page reads it: its fields' keys, then its own (gpus=, gpu=, selective=).
    read, warnings = spec_from_query(
        {k: v for k, v in link.items() if k in at_scale_view.LINK_KEYS}, default=at_scale_view.DEFAULT
    )
    assert warnings == [] and _shown(at_scale_view.PAGE, read) == _shown(at_scale_view.PAGE, spec)
    assert gpus_from_query(link["gpus"], GPU_COUNTS) == (4, [])
    assert at_scale_view.gpu_from_link(link["gpu"]) == (at_scale_view.CUSTOM, 24.5, [])
    assert at_scale_view.policies_from_link(link["selective"]) == (["attention"], [])


@ALL
def test_the_trade_offs_pages_widgets_give_back_their_spec(spec):
    axes = {
        "tradeoffs_seq": [spec.seq_len],
        "tradeoffs_n": [],
        "tradeoffs_choose_n": False,
        "tradeoffs_offload": "no",
        "tradeoffs_selective": ["none"],
    }
    values = tradeoffs_view.PAGE.values(spec)
    # The page settles the targets box once it has read the model (None: all of its projections).
    values["tradeoffs_lora_targets"] = settle(
        values["tradeoffs_lora_targets"], PROJECTIONS, values["tradeoffs_targets_for"], spec.model
    ).chosen
    sweep = tradeoffs_view.spec_from_widgets({**values, **axes}, PROJECTIONS)
    assert _shown(tradeoffs_view.PAGE, sweep) == _shown(tradeoffs_view.PAGE, spec)


def test_a_field_declared_once_reaches_the_flags_the_link_and_every_pages_widgets(monkeypatch):
    """Accumulation declared again with a flag, a link key and a widget of other names: every face follows the
    declaration alone (no table of the CLI, the link writer and reader or a page's codec names it)."""
    old = spec_fields.FIELD["gradient_accumulation_steps"]
    new = dataclasses.replace(
        old, cli=Cli("--micro-batches", "int"), link=Link("mb", "int"), widget=Widget("micro", "number", "step_boxes")
    )
    fields = tuple(new if field is old else field for field in spec_fields.FIELDS)
    monkeypatch.setattr(spec_fields, "FIELDS", fields)
    monkeypatch.setattr(spec_fields, "FIELD", {field.name: field for field in fields})
    spec = RunSpec(gradient_accumulation_steps=3)

    parser = build_parser()
    for command in ("run", "simulate", "sweep"):
        assert option_flags(parser)[command]["gradient_accumulation_steps"].name == "--micro-batches"
    args = parser.parse_args(["run", "--micro-batches", "3"])
    assert spec_from_args(args, repeats=args.repeats, warmup=args.warmup) == spec
    argv = argv_from_spec(spec)  # what a launched rank is given
    assert argv[argv.index("--micro-batches") + 1] == "3" and "--gradient-accumulation-steps" not in argv

    assert spec_to_query(spec)["mb"] == "3" and "accum" not in spec_to_query(spec)
    assert spec_from_query({"mb": "3"}) == (spec, [])

    for page in (lab_view.PAGE, at_scale_view.PAGE, tradeoffs_view.PAGE):
        values = page.values(spec)
        assert values[f"{page.prefix}_micro"] == 3 and f"{page.prefix}_accumulation" not in values
        assert page.fields(values)["gradient_accumulation_steps"] == 3
    assert at_scale_view.query(_at_scale_values(spec), spec.model, None)["mb"] == "3"
