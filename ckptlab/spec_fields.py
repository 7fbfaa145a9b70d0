"""Each :class:`~ckptlab.spec.RunSpec` field declared once: its flag, its key in a link, its widget, its
``TrainingArguments`` name, the locale key of its label, and its bounds (the one home of the limits).

The edges derive their tables from :data:`FIELDS` instead of mapping each field again:

- the command line (``ckptlab.cli.args``): ``add_run_arguments`` adds each shared :attr:`SpecField.cli` flag, and
  ``add_spec_flags`` those a command names (argparse's help text stays there); a command that takes a field its own
  way (``sweep``'s lists) says so there; ``argv_from_spec`` writes them back for launched ranks;
- the link (``ckptlab.lab.query``): ``spec_to_query``, the one writer, writes each :attr:`SpecField.link` key (of the
  fields a page shows) and ``spec_from_query`` reads it the way :attr:`Link.reads` says, within the field's bounds;
- the widgets (``ckptlab.lab.widgets``, the one codec, ``pages/``): each :attr:`SpecField.widget`'s session-state
  name, its kind, the function that draws it and the limits it offers;
- the validation (``RunSpec.validate``) and the reading of a user's ``TrainingArguments``
  (``ckptlab.training_args.DEFAULTED_NAMES``);
- the errors' words in the app (``ckptlab.show.wording.APP_WIDGETS``): a setting is named by its widget's label.

A field whose edge is special names its function there (:attr:`Cli.special`, :attr:`Widget.drawn_by`), so the special
case is found from here. A field without a link or a widget says why (:attr:`SpecField.no_link`,
:attr:`SpecField.no_widget`). ``tests/test_spec_fields.py`` checks that every field reaches every edge.

This module imports nothing heavy (no torch, no transformers): the CLI's ``--help`` reads it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from .alloc_conf import ALLOC_CONF_CHOICES, check_alloc_conf
from .fact import Fact
from .model.attention import ATTN_IMPLEMENTATIONS, available_attentions
from .model.quantize import QLORA
from .model.selective import CHOICES as SELECTIVE_CHOICES

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
# Optimizers by the names of TrainingArguments.optim, built as Trainer builds them (ckptlab.step.training),
# and the lab's own two: "adamw" is Trainer's default (adamw_torch_fused for torch >= 2.8), "none" stops after
# the backward (lessons on activations alone). The low-bit ones need their package (spec.LOW_BIT_PACKAGES).
OPTIMIZERS = (
    "adamw",
    "adamw_torch_fused",
    "adamw_torch",
    "adafactor",
    "sgd",
    "adagrad",
    "rmsprop",
    "adamw_torch_8bit",
    "adamw_torch_4bit",
    "adamw_bnb_8bit",
    "adamw_8bit",
    "paged_adamw_8bit",
    "paged_adamw_32bit",
    "none",
)
# Trainer's mixed precision: "bf16"/"fp16" is TrainingArguments(bf16=True)/(fp16=True), autocast over the weights;
# under FSDP2 ranks it is fully_shard's MixedPrecisionPolicy instead (RunSpec.mixed_precision_via says which).
MIXED_PRECISIONS = ("none", "bf16", "fp16")

# The limits. A spec's (RunSpec.validate): bounds that keep one run finite (README, "Limits"), each refused with
# one message naming it. A page's (a link and the widgets): what a shared link or a box offers, tighter.
MAX_WORLD_SIZE = 1024  # the most ranks a spec may name (a simulation's fake process group goes this far)
MAX_REPEATS = 1000  # timed steps: a median of a thousand is as good as it gets
MAX_WARMUP = 100  # untimed steps: the allocator and caches settle within a few
MAX_TOKENS = 2**24  # seq_len x batch_size of one step (16,777,216: 128 sequences of 128k tokens)
MAX_SEED = 2**32 - 1 - MAX_WORLD_SIZE  # rank r seeds with seed + r, which must stay a 32-bit seed (numpy's range)
MAX_ACCUMULATION_STEPS = 256  # micro-batches per optimizer step a spec may name; each is a forward and a backward
MAX_LORA_RANK = 65_536  # the widest projection of any model; the model's own narrowest one bounds it first
SEQ_MAX = 262_144  # a page's sequence length
BATCH_MAX = 256  # a page's batch
REPEATS_MAX = 50  # a page's timed steps
WARMUP_MAX = 20  # a page's untimed steps
LORA_RANK_MAX = 1024  # a page's LoRA rank
CLIP_MAX = 1e6  # max_grad_norm in a link and the box: far above any gradient norm a step sees
# max_grad_norm's "never clip": Trainer clips to an infinite bound (the norm is still computed). The flag's "inf", a
# link's clip=inf and the box's top (CLIP_MAX) all mean it (SpecField.never).
NEVER_CLIP = math.inf

# How argparse reads a flag's value (``ckptlab.cli.args`` has one reader for each).
CliType = Literal["text", "int", "float", "choice", "switch", "names", "policy"]
# How a link's value is read (``ckptlab.lab.query`` has one reader for each, and reads them in its order):
# "text" (stripped, not empty), "int" (a whole number within low..offered), "offered" (one of the page's choices,
# as written), "every_n" (a whole number >= 1, or off), "flag" (1/0, yes/no, ...), "one_of" (one of the choices,
# any case), "number" (a finite number, clamped to low..offered), "rank_or_off" (1..offered, or off), "preset" (a flag
# that sets a named value, Link.on, or None), "names" (a comma-separated list, each once).
# "names" is read by :func:`split_names`, as the flag and RunSpec read a text of names.
LinkReads = Literal["text", "int", "offered", "every_n", "flag", "one_of", "number", "rank_or_off", "preset", "names"]


@dataclass(frozen=True)
class Cli:
    """A field's flag. ``special`` names the functions of ``ckptlab.cli.args`` (``ADD_SPECIAL``, ``ARGV_SPECIAL``)
    that add the flag and write it back instead of the plain rule (a flag with its value; a switch where on)."""

    flag: str
    type: CliType = "text"
    metavar: str | None = None
    # One of add_run_arguments' flags, on every command that describes a spec; False: the commands that take it name it
    # (add_spec_flags: run's and sweep's --repeats, simulate's --world-size)
    shared: bool = True
    special: str | None = None


@dataclass(frozen=True)
class Link:
    """A field's key in a shared link and how it is read back."""

    key: str
    reads: LinkReads
    always: bool = False  # written even at its default (the first keys a link ever had); else only when it differs
    # The field's value when the flag is on: True ("flag"; off: False) or a named value ("preset"; off: None).
    on: object = True


@dataclass(frozen=True)
class Widget:
    """A field's widget on the pages: its session-state name after the page's prefix (``lab_seq``), its kind
    ("number", "select", "toggle", "slider", "multiselect") and the function of ``pages/_common.py`` that draws it
    on every page that has it (``drawn_by``; None: each page draws it itself, under ``<prefix>_<name>``). A number
    box offers ``low`` to ``offered`` (:class:`SpecField`) in steps of ``step``."""

    name: str
    kind: Literal["number", "select", "toggle", "slider", "multiselect"]
    drawn_by: str | None = None
    step: float = 1


@dataclass(frozen=True)
class SpecField:
    """One RunSpec field at every edge; ``None`` where it has no such edge (with the reason, for a link or a
    widget)."""

    name: str  # the RunSpec field
    cli: Cli | None = None
    link: Link | None = None
    widget: Widget | None = None
    label: str | None = None  # the locale key of its widget's label (the app names the setting by it in an error)
    trainer: str | None = None  # the TrainingArguments field a reading names when a file leaves it to Trainer
    low: int | float | None = None  # the least a link or a widget offers (and a spec may name, but max_grad_norm)
    high: int | float | None = None  # the most a spec may name (RunSpec.validate); None: no bound of its own
    why: Fact | None = None  # what ``high`` protects, said with the refusal (errors.check_at_most); with ``high``
    offered: int | float | None = None  # the most a link or a widget offers
    choices: tuple[object, ...] = ()  # the values it takes, where they are a list
    choices_here: Callable[[], tuple[str, ...]] | None = None  # the choices this machine has, where fewer
    # A number field's value that means "no bound at all" (max_grad_norm: NEVER_CLIP). The flag takes it as it is; a
    # link reads it as it is, not clamped to ``offered`` (ckptlab.lab.query); a box, which cannot hold it, shows it as
    # its top, ``offered``, and reads its top back as it (ckptlab.lab.stepboxes).
    never: float | None = None
    no_link: str = ""  # why it has no key in a link
    no_widget: str = ""  # why no page has a widget for it
    # The field's own check, which RunSpec.validate calls with its value (raising SpecError): where a library's reading
    # of a text decides what it may be (PYTORCH_CUDA_ALLOC_CONF read as torch reads it), that reading validates it.
    check: Callable[[object], None] | None = None

    def offered_choices(self) -> tuple[object, ...]:
        """The choices a link or a widget offers on this machine."""
        return self.choices_here() if self.choices_here is not None else self.choices


def devices_here() -> tuple[str, ...]:
    """The devices a page offers on this machine: "cuda" only where torch sees one."""
    import torch  # here, not at the top: the CLI's --help reads this module before torch loads

    return DEVICES if torch.cuda.is_available() else tuple(device for device in DEVICES if device != "cuda")


# The order is the command line's (its --help lists them so) and a link's.
FIELDS: tuple[SpecField, ...] = (
    SpecField(
        "model",
        Cli("--model", special="model"),  # and --revision, which travels inside the name (owner/name@revision)
        Link("model", "text", always=True),
        Widget("model", "select"),  # presets, and entries for the folder picker and a Hub name (modelbox.LOCAL, HUB)
        label="common.model",
    ),
    SpecField(
        "seq_len",
        Cli("--seq-len", "int"),
        Link("seq", "int", always=True),
        Widget("seq", "number", step=128),
        label="common.seq_len",
        low=1,
        offered=SEQ_MAX,  # the spec's bound is seq_len x batch_size (MAX_TOKENS)
    ),
    SpecField(
        "batch_size",
        Cli("--batch-size", "int"),
        Link("batch", "int", always=True),
        Widget("batch", "number"),
        label="lab.batch",
        trainer="per_device_train_batch_size",
        low=1,
        offered=BATCH_MAX,
    ),
    SpecField(
        "repeats",
        Cli("--repeats", "int", shared=False),
        Link("repeats", "int", always=True),
        Widget("repeats", "number"),
        label="lab.repeats",
        low=1,
        high=MAX_REPEATS,
        why=Fact("bound.repeats"),
        offered=REPEATS_MAX,
    ),
    SpecField(
        "warmup",
        Cli("--warmup", "int", shared=False),
        Link("warmup", "int", always=True),
        Widget("warmup", "number"),
        label="lab.warmup",
        low=0,
        high=MAX_WARMUP,
        why=Fact("bound.warmup"),
        offered=WARMUP_MAX,
    ),
    SpecField(
        "every_n_layers",
        Cli("--every-n-layers", "int", special="checkpointing"),  # or --no-checkpointing
        Link("n", "every_n", always=True),
        Widget("n", "slider"),  # up to the model's layers, under a toggle (<prefix>_ckpt) for off
        trainer="activation_checkpointing",
        low=1,
    ),
    SpecField(
        "offload",
        Cli("--offload", "switch"),
        Link("offload", "flag", always=True),
        Widget("offload", "toggle"),
        label="tradeoffs.offload",
    ),
    SpecField(
        "dtype",
        Cli("--dtype", "choice"),
        Link("dtype", "offered", always=True),
        Widget("dtype", "select"),  # labelled "dtype", the field's own name, in every language
        choices=DTYPES,
    ),
    SpecField(
        "device",
        Cli("--device", "choice"),
        Link("device", "offered", always=True),  # the page's devices: "cuda" only where there is one
        Widget("device", "select"),
        label="lab.device",
        choices=DEVICES,
        choices_here=lambda: devices_here(),
    ),
    SpecField(
        "seed",
        Cli("--seed", "int"),
        low=0,
        high=MAX_SEED,
        why=Fact("bound.seed", {"largest": 2**32 - 1}),
        no_link="a page's runs take the default seed: a link names the settings, not the random draw",
        no_widget="a page's runs take the default seed",
    ),
    SpecField(
        "optimizer",
        Cli("--optimizer", "choice", metavar="NAME"),
        Link("opt", "one_of", always=True),
        Widget("optimizer", "select", drawn_by="optimizer_box"),
        label="training.optimizer",
        trainer="optim",
        choices=OPTIMIZERS,
    ),
    SpecField(
        "optim_args",
        Cli("--optim-args", metavar="TEXT"),
        no_link="free text for Trainer's optimizer: the command line and Python only",
        no_widget="free text for Trainer's optimizer: the command line and Python only",
    ),
    SpecField(
        "gradient_accumulation_steps",
        Cli("--gradient-accumulation-steps", "int", metavar="K"),
        Link("accum", "int"),
        Widget("accumulation", "number", drawn_by="step_boxes"),
        label="training.accumulation",
        trainer="gradient_accumulation_steps",
        low=1,
        high=MAX_ACCUMULATION_STEPS,
        why=Fact("bound.accumulation"),
        offered=MAX_ACCUMULATION_STEPS,
    ),
    SpecField(
        "max_grad_norm",
        Cli("--max-grad-norm", "float", metavar="X"),
        Link("clip", "number"),
        Widget("max_grad_norm", "number", drawn_by="step_boxes", step=0.1),
        label="training.max_grad_norm",
        trainer="max_grad_norm",
        low=0.0,
        offered=CLIP_MAX,
        never=NEVER_CLIP,
    ),
    SpecField(
        "mixed_precision",
        Cli("--mixed-precision", "choice"),
        Link("mp", "one_of"),
        Widget("mixed_precision", "select", drawn_by="step_boxes"),
        label="training.mixed_precision",
        trainer="bf16",  # or fp16: TrainingArguments has a flag for each
        choices=MIXED_PRECISIONS,
    ),
    SpecField(
        "lora_rank",
        Cli("--lora-rank", "int", metavar="R"),
        Link("lora", "rank_or_off", always=True),
        Widget("lora_rank", "number", drawn_by="lora_boxes"),  # under a toggle (<prefix>_lora)
        label="training.lora_rank",
        low=1,
        high=MAX_LORA_RANK,
        why=Fact("bound.lora_rank"),
        offered=LORA_RANK_MAX,
    ),
    SpecField(
        "lora_targets",
        Cli("--lora-targets", "names", metavar="NAMES"),
        Link("targets", "names"),
        Widget("lora_targets", "multiselect", drawn_by="lora_boxes"),  # the model's projections, once it is read
        label="training.lora_targets",
    ),
    SpecField(
        "selective",
        Cli("--selective", "policy", metavar="POLICY"),  # a policy's name or op names
        Link("selective", "one_of"),
        Widget("selective", "select"),  # the named policies; op names from Python and the command line only
        label="selective.label",
        choices=SELECTIVE_CHOICES,
    ),
    SpecField(
        "quantization",
        Cli("--quantization-config", metavar="FILE.json", special="quantization_file"),  # a file's fields
        Link("qlora", "preset", on=QLORA),  # QLoRA's setting
        Widget("qlora", "toggle", drawn_by="lora_boxes"),
        label="training.qlora",
    ),
    SpecField(
        "attn_implementation",
        Cli("--attn-implementation", metavar="KERNEL"),  # checked by the spec (flash_attention_2 needs its package)
        Link("attn", "one_of"),
        Widget("attention", "select", drawn_by="step_boxes"),  # a model keyword, drawn beside Trainer's step
        label="training.attention",
        choices=ATTN_IMPLEMENTATIONS,
        choices_here=available_attentions,
    ),
    SpecField(
        "world_size",
        Cli(
            "--world-size", "int", metavar="N", shared=False, special="ranks"
        ),  # simulate's; run's is --nproc-per-node (x --nnodes)
        widget=Widget("gpus", "select"),  # At scale's GPUs, in its link as gpus= (ckptlab.lab.query.gpus_from_query)
        label="at_scale.gpus",
        low=1,
        high=MAX_WORLD_SIZE,
        why=Fact("bound.world_size"),
        no_link="At scale's own key, gpus= (gpus_from_query): one of the GPU counts it searches",
    ),
    SpecField(
        "fsdp",
        Cli("--fsdp", "switch", shared=False),
        no_link="At scale shards whenever it has more than one GPU",
        no_widget="At scale shards whenever it has more than one GPU",
    ),
    SpecField(
        "alloc_conf",
        Cli("--alloc-conf", metavar="TEXT"),  # any PYTORCH_CUDA_ALLOC_CONF string torch reads
        Link("alloc", "text"),
        Widget("alloc_conf", "select"),  # At scale's settings of the caching allocator (choices); any text from a link
        label="at_scale.alloc_conf",
        choices=ALLOC_CONF_CHOICES,
        check=check_alloc_conf,
    ),
)

FIELD: dict[str, SpecField] = {field.name: field for field in FIELDS}


def split_names(text: str) -> tuple[str, ...]:
    """A comma-separated text of names as the names, each stripped and once, in order (``"q_proj, v_proj"`` ->
    ``("q_proj", "v_proj")``): the one reading of a list of names written as text, by the flag (``--lora-targets``,
    ``--selective``), the link (``targets=``) and ``RunSpec(lora_targets="q_proj,v_proj")``."""
    return tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))


def closed_choices() -> tuple[SpecField, ...]:
    """The fields whose value is one of their choices and nothing else (RunSpec.validate; argparse's choices)."""
    return tuple(field for field in FIELDS if field.cli is not None and field.cli.type == "choice")


def drawn_by(function: str) -> tuple[SpecField, ...]:
    """The fields whose widgets one function of ``pages/_common.py`` draws (``"step_boxes"``: Trainer's side of the
    step and the attention)."""
    return tuple(field for field in FIELDS if field.widget is not None and field.widget.drawn_by == function)
