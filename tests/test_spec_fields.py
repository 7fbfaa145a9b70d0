"""Each RunSpec field is declared once (ckptlab.spec_fields) and reaches every edge from there: a flag of the
command line, a key of a link that reads back a value other than the default, and a widget of the pages (or the
reason it has none)."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from ckptlab import RunSpec
from ckptlab.cli import build_parser
from ckptlab.cli.args import ADD_SPECIAL, ARGV_SPECIAL, argv_from_spec, option_flags, spec_from_args
from ckptlab.lab.query import READERS, spec_from_query, spec_to_query
from ckptlab.spec_fields import FIELD, FIELDS, SpecField

ROOT = Path(__file__).resolve().parents[1]
PAGES = {path.name: path.read_text() for path in (ROOT / "pages").glob("*.py")}
# A field whose value means something only beside another's (LoRA's targets and a 4-bit base need a rank).
NEEDS = {"lora_targets": {"lora_rank": 8}, "quantization": {"lora_rank": 8}}


def test_every_runspec_field_is_declared_once():
    assert [field.name for field in FIELDS] == list(FIELD)  # no field twice
    assert set(FIELD) == {field.name for field in dataclasses.fields(RunSpec)}


@pytest.mark.parametrize("field", [field for field in FIELDS if field.cli is not None], ids=lambda field: field.name)
def test_a_declared_flag_is_a_flag_of_the_command_line(field: SpecField):
    assert field.cli is not None
    flags = option_flags(build_parser())
    commands = [command for command, table in flags.items() if field.name in table]
    assert commands, f"no command has a flag setting {field.name}"
    assert any(flags[command][field.name].name == field.cli.flag for command in commands), (field.cli.flag, commands)
    if field.cli.shared:
        assert all(field.name in flags[command] for command in ("run", "simulate", "sweep"))
    special = field.cli.special
    assert special is None or special in ADD_SPECIAL or special in ARGV_SPECIAL, special


def _other_value(field: SpecField) -> object:
    """A value of ``field`` other than RunSpec's default, as its declaration allows."""
    assert field.link is not None
    default = getattr(RunSpec(), field.name)
    reads = field.link.reads
    if reads in ("offered", "one_of"):
        return next(choice for choice in field.offered_choices() if choice != default)
    if reads in ("flag", "preset"):
        return field.link.on
    if reads == "every_n":
        return None  # off
    if reads == "rank_or_off":
        return 2 if default is None else None
    if reads == "number":
        return default / 2
    if reads == "int":
        return default + 1 if default + 1 <= field.offered else default - 1
    if reads == "names":
        return ("q_proj", "v_proj")
    assert reads == "text", reads
    if field.choices:  # a text its own check reads (alloc_conf): one the widget offers
        return next(choice for choice in field.choices if choice != default)
    return f"{default}-other"


@pytest.mark.parametrize("field", FIELDS, ids=lambda field: field.name)
def test_a_declared_field_travels_in_a_link_or_says_why_not(field: SpecField):
    if field.link is None:
        assert field.no_link, f"{field.name}: no link key and no reason"
        return
    assert field.link.reads in READERS
    spec = RunSpec(**{**NEEDS.get(field.name, {}), field.name: _other_value(field)})
    spec.validate()  # a value the field takes
    query = spec_to_query(spec)
    assert field.link.key in query
    assert spec_from_query(query) == (spec, [])
    assert len({field.link.key for field in FIELDS if field.link is not None}) == sum(
        field.link is not None for field in FIELDS
    )


@pytest.mark.parametrize("field", FIELDS, ids=lambda field: field.name)
def test_a_declared_field_has_a_widget_or_says_why_not(field: SpecField):
    if field.widget is None:
        assert field.no_widget, f"{field.name}: no widget and no reason"
        return
    name = field.widget.name
    if field.widget.drawn_by is not None:
        common = PAGES["_common.py"]
        body = re.search(rf"^def {field.widget.drawn_by}\(.*?(?=^def |\Z)", common, re.S | re.M)
        assert body is not None, f"pages/_common.py has no {field.widget.drawn_by}"
        called = [page for page, text in PAGES.items() if f"{field.widget.drawn_by}(" in text and page != "_common.py"]
        assert called, f"no page calls {field.widget.drawn_by}"
        assert f'_{name}"' in body.group(0) or field.widget.drawn_by == "optimizer_box", name
    else:
        assert any(re.search(rf'"\w+_{name}"', text) for text in PAGES.values()), f"no page has a <prefix>_{name}"
    if field.widget.kind == "number":
        assert field.low is not None and field.offered is not None, f"{field.name}: a number box needs its limits"
    if field.label is not None:
        assert any(f'"{field.label}"' in text for text in PAGES.values()), field.label


# A number box whose limits are written beside it, by its key, and why it stays so for now.
LITERAL_LIMITS = {
    "at_scale_seq": "min_value=1, max_value=SEQ_MAX: the seq_len field's own limits, so offered('seq_len') says the "
    "same; the At-scale page is being edited elsewhere",
}


def _literal_limits(call: ast.Call) -> list[str]:
    """A number box's limits written as numbers: its positional min and max, or min_value/max_value."""
    limits = [ast.unparse(arg) for arg in call.args[1:3] if isinstance(arg, (ast.Constant, ast.UnaryOp))]
    limits += [
        f"{keyword.arg}={ast.unparse(keyword.value)}"
        for keyword in call.keywords
        if keyword.arg in ("min_value", "max_value") and isinstance(keyword.value, (ast.Constant, ast.UnaryOp))
    ]
    return limits


def test_a_pages_number_boxes_take_their_limits_from_a_declaration():
    """A box's least and most come from the field's declaration (pages/_common.offered) or another declared bound
    (a budget's: explore.budget), not a number written at the box (the Trade-offs page's batch stopped at 64, its
    repeats at 20, against the declared 256 and 50)."""
    written = []
    for page, text in PAGES.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("number_input"):
                key = next((ast.unparse(k.value).strip("\"'") for k in node.keywords if k.arg == "key"), "")
                limits = _literal_limits(node)
                if limits and key not in LITERAL_LIMITS:
                    written.append((page, key, limits))
    assert not written, written


# What a launched rank is given: every field the launcher passes on, away from its default (a rank refuses LoRA,
# so the LoRA fields go in a spec of their own; the world size and a 4-bit base's file are not passed on, by design).
RANK_SPECS = [
    RunSpec(
        model="tiny-gpt2",
        seq_len=48,
        batch_size=2,
        dtype="float32",
        device="cpu",
        every_n_layers=2,
        offload=True,
        repeats=3,
        warmup=1,
        seed=7,
        optimizer="sgd",
        optim_args="momentum=0.9",
        gradient_accumulation_steps=2,
        max_grad_norm=0.25,
        mixed_precision="bf16",
        selective="matmuls",
        attn_implementation="eager",
    ),
    RunSpec(every_n_layers=None, lora_rank=4, lora_targets=("q_proj",), selective="none"),
    RunSpec(selective=("aten.mm", "aten.bmm")),
]


@pytest.mark.parametrize("spec", RANK_SPECS, ids=["recipe", "lora", "op names"])
def test_a_launched_rank_reads_back_the_spec_it_was_given(spec: RunSpec):
    """``argv_from_spec`` is what ``run --nproc-per-node`` hands each rank: parsed by ``run``, it is the spec again."""
    args = build_parser().parse_args(["run", *argv_from_spec(spec)])
    assert spec_from_args(args, repeats=args.repeats, warmup=args.warmup) == spec


def test_every_declared_bound_is_refused_through_the_one_refusal():
    """RunSpec.validate reads each field's declared ``high`` (and its ``why``): one past it is refused as
    ``spec.at_most`` naming the field, so a bound cannot be restated, or forgotten, in the validation."""
    from ckptlab.errors import SpecError
    from ckptlab.spec import RunSpec
    from ckptlab.spec_fields import FIELDS

    bounded = [field for field in FIELDS if field.high is not None]
    assert {field.name for field in bounded} >= {"repeats", "warmup", "seed", "gradient_accumulation_steps"}
    needs = {"world_size": {"fsdp": True}}  # ranks are FSDP2's
    for field in bounded:
        assert field.why is not None, field.name
        with pytest.raises(SpecError) as caught:
            RunSpec(model="tiny-llama", **{field.name: field.high + 1}, **needs.get(field.name, {})).validate()
        assert caught.value.key == "spec.at_most" and caught.value.params["name"] == field.name, field.name
        RunSpec(model="tiny-llama", **{field.name: field.high}, **needs.get(field.name, {})).validate()  # allowed
