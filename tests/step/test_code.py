"""The code box, executed: for every combination the Lab page offers, the pasted code builds the model the lab measured.

Every snippet is executed as the text a person copies, in this one process, on one tiny llama folder with saved random
weights (``training_code`` of a spec whose model is that folder: the folder's path stands where a model's name goes),
down to its ``TrainingArguments`` (no training step). Then the model it built is compared with the lab's own build of
the same spec (``catalog.build_model`` and ``lora.adapted``, as ``measure`` builds it): the trainable parameters, and
transformers' ``gradient_checkpointing`` flag on each layer against the lab's plan (``planned_roles``).

What differs from a GPU user's paste, on this CPU: nothing in the text. ``offload=True`` is only enabled here (its
``save_on_cpu`` runs at the first forward, which the test does not reach); the 4-bit base loads through bitsandbytes'
CPU backend with the box's own ``device_map="auto"`` (the CPU here). bitsandbytes and peft are imported first through
the lab's ``libraries`` (no Hub kernel lookup from a test), so the box's imports find them loaded.
"""

from __future__ import annotations

import ast
import itertools
import warnings
from dataclasses import dataclass

import pytest
import torch
from torch.utils.checkpoint import checkpoint
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.modeling_layers import GradientCheckpointingLayer

from ckptlab.model import catalog
from ckptlab.model.libraries import import_peft
from ckptlab.model.lora import adapted
from ckptlab.model.plan import CP, KEEP, planned_roles
from ckptlab.model.quantize import QLORA
from ckptlab.model.selective import CHOICES as SELECTIVE_CHOICES
from ckptlab.spec import RunSpec
from ckptlab.step.code import import_lines, training_code

LAYERS = 2  # n=1 checkpoints both, n=2 the first only: the plans differ
RANK = 8  # the issue's rank


@dataclass(frozen=True)
class Case:
    """One combination of the Lab page's boxes."""

    lora: bool
    qlora: bool
    attention: str
    every_n_layers: int | None
    offload: bool
    selective: str
    accumulation: int

    def spec(self, folder: str) -> RunSpec:
        return RunSpec(
            model=folder,
            every_n_layers=self.every_n_layers,
            offload=self.offload,
            selective=self.selective,
            attn_implementation=self.attention,
            lora_rank=RANK if self.lora else None,
            quantization=QLORA if self.qlora else None,
            gradient_accumulation_steps=self.accumulation,
        )

    def __str__(self) -> str:
        base = "qlora" if self.qlora else "lora" if self.lora else "full"
        setting = "off" if self.every_n_layers is None else f"n={self.every_n_layers}"
        return f"{base}-{self.attention}-{setting}{'+offload' if self.offload else ''}-{self.selective}-acc{self.accumulation}"


# The checkpointing settings the page offers: off, or every_n_layers 1/2 with offload off/on and each policy.
SETTINGS = [(None, False, "none")] + [
    (n, offload, policy) for n in (1, 2) for offload in (False, True) for policy in SELECTIVE_CHOICES
]
# Without a 4-bit base, pairwise: each setting twice, once a full fine-tune and once LoRA, with the two attentions
# between them (alternating with the setting) and accumulation 1 and 2 (alternating with LoRA and every second
# setting): every pair of values of two axes meets (checked in the test).
FULL_AND_LORA = [
    Case(lora, False, attention, n, offload, policy, 1 + (index // 2 + lora) % 2)
    for index, (n, offload, policy) in enumerate(SETTINGS)
    for lora, attention in ((False, ("sdpa", "eager")[index % 2]), (True, ("eager", "sdpa")[index % 2]))
]
# With a 4-bit base (QLoRA, only with LoRA; a second a load): every value of every axis once.
QLORA_CASES = [
    Case(True, True, "eager", 1, False, "matmuls", 1),  # the issue's case: QLoRA + eager + selective matmuls
    Case(True, True, "sdpa", None, False, "none", 2),
    Case(True, True, "sdpa", 2, True, "attention", 1),
    Case(True, True, "eager", 2, False, "torchtitan", 2),
    Case(True, True, "sdpa", 1, True, "none", 2),
]
ISSUE_CASES = [Case(True, False, "sdpa", 1, False, "none", 1), QLORA_CASES[0]]  # LoRA r=8; QLoRA+eager+matmuls


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    """A two-layer llama with random weights, saved: what ``from_pretrained`` loads, 4-bit too."""
    path = tmp_path_factory.mktemp("tiny-llama")
    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    import_peft()  # bitsandbytes and peft as the lab imports them: the box's imports then find them loaded
    return str(path)


@pytest.fixture(scope="module")
def lab_trainable(folder):
    """The trainable parameters of the lab's own build of a spec (LoRA or not, 4-bit or not), counted once each."""
    counts: dict[tuple[bool, bool], int] = {}

    def count(case: Case) -> int:
        key = (case.lora, case.qlora)
        if key not in counts:
            spec = case.spec(folder)
            model, _ = catalog.build_model(folder, quantization=spec.quantization)
            with adapted(model, spec.lora_rank, spec.lora_targets) as trained:
                counts[key] = sum(p.numel() for p in trained.parameters() if p.requires_grad)
        return counts[key]

    return count


def _run(code: str, tmp_path) -> dict:
    """The box executed as pasted (``output_dir="out"`` lands in ``tmp_path``): its variables."""
    scope: dict = {"__name__": "__main__"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(code, "code_box.py", "exec"), scope)
    return scope


def _problems(case: Case, folder: str, tmp_path, lab_trainable) -> list[str]:
    """What is wrong with the box of ``case`` when executed (empty: it builds the lab's model)."""
    spec = case.spec(folder)
    code = training_code(spec)
    tree = ast.parse(code)
    problems = []
    imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    if tree.body[: len(imports)] != imports:
        problems.append(f"{case}: a statement before the imports")
    names = [alias.asname or alias.name for node in imports for alias in node.names]
    if len(names) != len(set(names)):
        problems.append(f"{case}: a name imported twice: {sorted(names)}")
    try:
        scope = _run(code, tmp_path)
    except Exception as error:  # the paste fails as a person would see it
        return [*problems, f"{case}: {type(error).__name__}: {error}"]
    model = scope["model"]
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if trainable != lab_trainable(case):
        problems.append(f"{case}: {trainable:,} trainable parameters, the lab trains {lab_trainable(case):,}")
    layers = [module for module in model.modules() if isinstance(module, GradientCheckpointingLayer)]
    flags = [CP if layer.gradient_checkpointing else KEEP for layer in layers]  # transformers' own flag
    if flags != planned_roles(LAYERS, case.every_n_layers):
        problems.append(f"{case}: layers {flags}, the lab's plan {planned_roles(LAYERS, case.every_n_layers)}")
    for layer in (layer for layer in layers if layer.gradient_checkpointing):
        function = layer._gradient_checkpointing_func
        if (function.func is not checkpoint) != case.offload:  # transformers wraps checkpoint in save_on_cpu
            problems.append(f"{case}: offload is not {case.offload}")
        policy = scope.get("context_fn") if case.selective != "none" else None
        if function.keywords.get("context_fn") is not policy:
            problems.append(f"{case}: the layer's context_fn is not the policy's")
        if function.keywords.get("use_reentrant") is not False:
            problems.append(f"{case}: reentrant checkpointing (prepare_model_for_kbit_training's) left on")
    if model.config._attn_implementation != case.attention:
        problems.append(f"{case}: attention {model.config._attn_implementation}")
    quantized = any(type(module).__name__ == "Linear4bit" for module in model.modules())
    if quantized != case.qlora:
        problems.append(f"{case}: 4-bit layers: {quantized}")
    args = scope.get("args")
    if args is None or args.gradient_accumulation_steps != case.accumulation:
        problems.append(f"{case}: TrainingArguments' accumulation is not {case.accumulation}")
    elif args.activation_checkpointing != spec.checkpointing:
        problems.append(f"{case}: TrainingArguments' checkpointing is not {spec.checkpointing}")
    return problems


@pytest.mark.slow  # loads models (a 4-bit one about a second)
@pytest.mark.parametrize("case", ISSUE_CASES, ids=str)
def test_the_issue_58_boxes_build_the_measured_model(case, folder, tmp_path, monkeypatch, lab_trainable):
    """LoRA r=8 (no get_peft_model: a full fine-tune); QLoRA + eager + matmuls (the model line before the imports,
    the 4-bit load without the attention, torch imported twice)."""
    monkeypatch.chdir(tmp_path)
    problems = _problems(case, folder, tmp_path, lab_trainable)
    assert not problems, "\n".join(problems)


@pytest.mark.slow  # loads 38 models, 4 of them 4-bit (about a second each)
def test_every_combination_the_lab_page_offers_builds_the_measured_model(folder, tmp_path, monkeypatch, lab_trainable):
    monkeypatch.chdir(tmp_path)
    cases = FULL_AND_LORA + QLORA_CASES
    for axis in ("lora", "qlora", "attention", "every_n_layers", "offload", "selective", "accumulation"):
        assert {getattr(case, axis) for case in cases} == {getattr(case, axis) for case in _full_product()}, axis
    for one, other in itertools.combinations(
        ("lora", "attention", "every_n_layers", "offload", "selective", "accumulation"), 2
    ):
        wanted = {(getattr(case, one), getattr(case, other)) for case in _full_product() if not case.qlora}
        assert {(getattr(case, one), getattr(case, other)) for case in FULL_AND_LORA} >= wanted, (one, other)
    # the issue's cases run in their own test above
    problems = [
        problem
        for case in cases
        if case not in ISSUE_CASES
        for problem in _problems(case, folder, tmp_path, lab_trainable)
    ]
    assert not problems, "\n".join(problems)


def _full_product() -> list[Case]:
    """Every combination of the boxes (QLoRA only with LoRA): the values each axis must take in the cases run."""
    return [
        Case(lora, qlora, attention, n, offload, policy, accumulation)
        for lora, qlora in ((False, False), (True, False), (True, True))
        for attention in ("sdpa", "eager")
        for n, offload, policy in SETTINGS
        for accumulation in (1, 2)
    ]


def test_the_imports_are_sorted_as_isort_sorts_them():
    lines = import_lines(
        {("torch", None), ("functools", "partial"), ("transformers", "TrainingArguments"), ("peft", "get_peft_model")}
        | {("peft", "LoraConfig"), ("transformers", "AutoModelForCausalLM")}
    )
    assert lines == [
        "from functools import partial",
        "",
        "import torch",
        "from peft import LoraConfig, get_peft_model",
        "from transformers import AutoModelForCausalLM, TrainingArguments",
    ]


def test_a_preset_says_where_a_model_name_goes():
    code = training_code(RunSpec(model="tiny-llama", every_n_layers=2, lora_rank=4, lora_targets=("q_proj",)))
    assert "\"tiny-llama\",  # the lab's preset tiny-llama: your model's name or folder" in code
    assert 'target_modules=["q_proj"]' in code


def test_mixed_precision_on_the_cpu_writes_what_training_arguments_needs_there():
    """``TrainingArguments(bf16=True)`` raises on a machine without a GPU unless ``use_cpu=True`` (issue 58): a spec on
    the CPU writes it (and RunSpec.from_training_args reads it back as the device); "auto" leaves the machine to choose
    and says so in a comment; neither without mixed precision on "auto"."""
    on_cpu = _keywords(training_code(RunSpec(model="tiny-llama", device="cpu", mixed_precision="bf16")))
    assert on_cpu["bf16"] is True and on_cpu["use_cpu"] is True
    auto = training_code(RunSpec(model="tiny-llama", mixed_precision="bf16"))
    assert "use_cpu" not in _keywords(auto)
    assert "# bf16=True needs a GPU: on a machine without one add use_cpu=True, or it raises" in auto
    assert "use_cpu" not in training_code(RunSpec(model="tiny-llama"))


def _keywords(code: str) -> dict:
    """The keywords of the box's ``TrainingArguments(...)`` call, as literals (read from the text, no model built)."""
    call = next(
        node
        for node in ast.walk(ast.parse(code))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "TrainingArguments"
    )
    return {
        keyword.arg: ast.literal_eval(keyword.value)
        for keyword in call.keywords
        if keyword.arg != "activation_checkpointing_kwargs"
    }
