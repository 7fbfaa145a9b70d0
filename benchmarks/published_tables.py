"""Published training-memory tables beside the lab's simulation of each row: the figure, the lab's, the error, why.

    python benchmarks/published_tables.py [--only torchtune,pr48444,bert,torchtitan] [--markdown]

Every lab figure is **simulated** (fake tensors: no memory is allocated, an 8B model runs on a
laptop) for a CUDA device, with the setup the source states, built from the model's config (no
weights). Each row says which metric the source reports, because they are not the same quantity:

- ``active`` / ``allocated``: bytes in live tensors (torch.cuda.memory_stats ``active_bytes`` and
  ``allocated_bytes`` peaks differ only by blocks freed but not yet reusable): what the lab counts;
- ``reserved``: what the caching allocator holds from the driver, allocated plus its cache;
- ``nvidia-smi``: reserved plus the CUDA context (about 0.3-1.3 GiB, driver- and GPU-dependent).

A row is "expressible" when the lab can run the source's setup (model, shape, dtype, optimizer,
checkpointing, sharding); the rest are printed with what the lab cannot express, and the error
of an expressible row says how close the lab is. Sources (all public):

- torchtune README, "Optimization flags": Llama 3.2 3B, full_finetune_single_device, batch 2,
  max sequence 4096, bf16, A100; "Peak Memory Active (GiB)";
- transformers PR #48444 (as in ``ckptlab.explore.reference``): Qwen3 configs on one H100, bf16,
  every layer checkpointed, memory allocated after the forward minus before, MiB;
- transformers docs v4.21, "Efficient Training on a Single GPU": bert-large-uncased, batch 4,
  seq 512, fp32, Trainer's AdamW; "GPU memory occupied" from NVML (nvidia-smi), which the guide
  shows at 1,343 MB with nothing but the CUDA context;
- torchtitan docs/performance.md, Table 1: Llama 3.1 8B on 8 H100, FSDP2, local batch 2 (seq 8192,
  torchtitan's Llama 3 8B default), selective activation checkpointing; "Memory(GiB)".
- Unsloth's documentation, Llama 3.1 8B QLoRA (rank 32, batch 1), the longest context per GPU memory for
  "HF + FA2": a card's memory and the tokens that fit it. The lab's figure is its simulated peak at the
  published length (the bytes error), and its own longest length on that card
  (``ckptlab.explore.longest.longest_seq``: the token error, aimed within 10%).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transformers import BertConfig, LlamaConfig, PretrainedConfig

from ckptlab import RunSpec, simulate
from ckptlab.explore.reference import PR_48444_ROWS, pr48444_config, simulate_resident_after_forward
from ckptlab.results import MemoryResult, memory_of
from ckptlab.units import GIB, MIB

WITHIN = 0.05  # an expressible row reproduces its source within 5%


@dataclass(frozen=True)
class PublishedRow:
    """One published figure, the setup it was measured with, and the lab's simulation of it."""

    table: str  # which published table (its key for --only)
    source: str  # where it was published
    setup: str  # what was run, in the source's words
    metric: str  # "active", "allocated", "reserved" or "nvidia-smi" (see the module docstring)
    published_bytes: int  # the published figure, in bytes (GiB and MiB are 2**30 and 2**20 bytes)
    lab: Callable[[], LabFigure]  # the lab's figure for the same row (a simulation)
    expressible: bool  # the lab runs the source's setup; else ``why`` says what it lacks
    why: Callable[[LabFigure], str]  # the gap in words, given the lab's figure


@dataclass(frozen=True)
class LabFigure:
    """The lab's figure of a row, in bytes, and the simulated step's memory where the figure is a peak."""

    num_bytes: int
    memory: MemoryResult | None = None
    detail: str = ""  # what else the lab's figure found (the longest sequence of a context-length row)


@dataclass(frozen=True)
class Reproduced:
    """A row with the lab's figure and the seconds its simulation took."""

    row: PublishedRow
    lab: LabFigure
    seconds: float

    @property
    def lab_bytes(self) -> int:
        return self.lab.num_bytes

    @property
    def error(self) -> float:
        """(lab - published) / published."""
        return self.lab_bytes / self.row.published_bytes - 1

    @property
    def within(self) -> bool:
        return self.row.expressible and abs(self.error) <= WITHIN


def _folder(config: PretrainedConfig, name: str) -> str:
    """The config saved to a folder of its own: the lab builds a model from a folder, no weights needed."""
    folder = Path(tempfile.gettempdir()) / "ckptlab-published" / name  # the same folder each run: none pile up
    config.save_pretrained(folder)  # makes the folder; writes the config anew
    return str(folder)


def llama_3_2_3b() -> LlamaConfig:
    """meta-llama/Llama-3.2-3B's config (its published config.json), the weights tied."""
    return LlamaConfig(
        hidden_size=3072,
        intermediate_size=8192,
        num_hidden_layers=28,
        num_attention_heads=24,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=128256,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        architectures=["LlamaForCausalLM"],
    )


def bert_large_uncased() -> BertConfig:
    """google-bert/bert-large-uncased's config, dropout included (0.1 on the hidden states and attention)."""
    return BertConfig(
        hidden_size=1024,
        num_hidden_layers=24,
        num_attention_heads=16,
        intermediate_size=4096,
        vocab_size=30522,
        max_position_embeddings=512,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        architectures=["BertForMaskedLM"],
    )


def _peak(spec: RunSpec) -> Callable[[], LabFigure]:
    def figure() -> LabFigure:
        memory = memory_of(simulate(spec))
        return LabFigure(memory.peak_bytes, memory)

    return figure


def _logits_why(lacks: str) -> Callable[[LabFigure], str]:
    """The gap of a row whose source avoids the float32 logits the lab's loss holds (a chunked loss)."""

    def why(lab: LabFigure) -> str:
        memory = lab.memory
        held = ""
        if memory is not None and memory.logits_set_the_peak:
            held = f"; the loss sets the lab's peak, {(memory.logits_bytes_at_peak or 0) / GIB:.2f} GiB of it float32 logits"
        return f"not expressible: {lacks}{held}"

    return why


def torchtune_rows() -> list[PublishedRow]:
    """torchtune README, "Optimization flags" (Llama 3.2 3B, batch 2 x 4096, bf16, A100)."""
    source = "torchtune README, Optimization flags (A100)"
    base = RunSpec(
        model=_folder(llama_3_2_3b(), "llama-3.2-3b"),
        seq_len=4096,
        batch_size=2,
        dtype="bfloat16",
        every_n_layers=None,
        optimizer="adamw_torch",  # torch.optim.AdamW, multi-tensor on CUDA, as the recipe's optimizer
        max_grad_norm=0.0,  # the recipe's clip_grad_norm: null (the lab still computes the norm, a few MiB)
    )
    checkpointed = replace(base, every_n_layers=1)
    return [
        PublishedRow(
            "torchtune",
            source,
            "+ Packed Dataset: Llama 3.2 3B, batch 2 x 4096 packed, bf16, AdamW, no AC",
            "active",
            round(60.0 * GIB),
            _peak(base),
            True,
            lambda lab: "the same setup; a packed batch is full 4096-token rows, as the lab's",
        ),
        PublishedRow(
            "torchtune",
            source,
            "+ Activation Checkpointing (on + Compile + Chunked Cross Entropy)",
            "active",
            round(24.9 * GIB),
            _peak(checkpointed),
            False,
            _logits_why("torch.compile and torchtune's chunked cross-entropy"),
        ),
    ]


def pr48444_rows() -> list[PublishedRow]:
    """transformers PR #48444: resident after the forward, every layer checkpointed, plain and offload."""
    rows = []
    for row in PR_48444_ROWS:
        config = pr48444_config(row.layers, row.hidden)
        for offload, published in ((False, row.published_plain_mib), (True, row.published_offload_mib)):
            rows.append(
                PublishedRow(
                    "pr48444",
                    "transformers PR #48444 (H100)",
                    f"Qwen3Model {row.layers} x {row.hidden} x {row.seq_len}, bf16, every layer checkpointed"
                    + (", offload" if offload else ""),
                    "allocated",
                    round(published * MIB),
                    lambda config=config, seq=row.seq_len, offload=offload: LabFigure(
                        simulate_resident_after_forward(config, seq, offload)
                    ),
                    True,
                    lambda lab: "the same harness: memory_allocated after the forward minus before",
                )
            )
    return rows


BERT_GUIDE_MB = 14949  # "GPU memory occupied" after vanilla training, NVML's MiB
BERT_GUIDE_CONTEXT_MB = 1343  # the same reading with only the CUDA context (a 1 x 1 tensor) on the GPU


def bert_rows() -> list[PublishedRow]:
    """transformers docs v4.21, Efficient Training on a Single GPU: vanilla training of bert-large-uncased."""
    spec = RunSpec(
        model=_folder(bert_large_uncased(), "bert-large"),
        seq_len=512,
        batch_size=4,
        dtype="float32",
        every_n_layers=None,
        optimizer="adamw_torch",  # the guide's Trainer default then: an AdamW with float32 moments
        # v4.21's BERT attention was eager: per layer the softmax probabilities, their dropout mask and the dropped
        # probabilities (batch x heads x 512^2 = 16.8M elements: 144 MiB, 3.4 GiB over 24 layers).
        attn_implementation="eager",
    )
    return [
        PublishedRow(
            "bert",
            "transformers docs v4.21, Efficient Training on a Single GPU",
            "bert-large-uncased, batch 4 x 512, fp32, Trainer's AdamW, no AC, eager attention as in v4.21 (less "
            "1,343 MiB of CUDA context)",
            "nvidia-smi",
            (BERT_GUIDE_MB - BERT_GUIDE_CONTEXT_MB) * MIB,
            _peak(spec),
            False,
            lambda lab: (
                "not expressible: NVML counts what the allocator reserved (its cache of freed blocks included), the "
                "lab the live tensors' peak; and the guide trains a sequence-classification head, the lab a masked-LM "
                "one (its 30,522-word logits, float32 in the loss). The attention is v4.21's eager, as in the guide"
            ),
        )
    ]


def torchtitan_rows() -> list[PublishedRow]:
    """torchtitan docs/performance.md, Table 1: Llama 3.1 8B, 8 H100, FSDP2, local batch 2, selective AC."""
    spec = RunSpec(
        model="llama-3.1-8b",
        seq_len=8192,
        batch_size=2,
        dtype="float32",  # float32 master weights ...
        mixed_precision="bf16",  # ... under FSDP2's MixedPrecisionPolicy(bf16, float32), torchtitan's default
        world_size=8,
        fsdp=True,
        every_n_layers=1,
    )
    return [
        PublishedRow(
            "torchtitan",
            "torchtitan docs/performance.md, Table 1 (H100)",
            "Llama 3.1 8B, FSDP2 over 8 GPUs, local batch 2 x 8192, selective AC; lab: full AC, rank 0",
            "reserved",
            round(82.4 * GIB),
            _peak(spec),
            False,
            lambda lab: (
                "not expressible: op-level selective AC under FSDP2 does not run in the lab's simulation yet "
                "(full AC keeps less), and torchtitan's figure is what the allocator reserved"
            ),
        )
    ]


UNSLOTH_HF_FA2 = {12: 932, 16: 2551, 24: 5789, 40: 12264, 48: 15502, 80: 28454}  # GB of the card: tokens
UNSLOTH_QUANTIZATION = {
    "load_in_4bit": True,
    "bnb_4bit_quant_type": "nf4",  # the "-bnb-4bit" checkpoints' and QLoRA's
    "bnb_4bit_use_double_quant": True,
    "bnb_4bit_compute_dtype": "bfloat16",
}


def unsloth_rows() -> list[PublishedRow]:
    """Unsloth's documentation: Llama 3.1 8B QLoRA, rank 32, batch 1, longest context per card, "HF + FA2"."""
    from ckptlab.explore.longest import longest_seq

    spec = RunSpec(
        model="llama-3.1-8b",
        batch_size=1,
        dtype="bfloat16",  # the base loaded in bf16 (prepare_model_for_kbit_training casts the rest to float32)
        mixed_precision="bf16",  # TrainingArguments(bf16=True)
        every_n_layers=1,  # HF's gradient checkpointing, every layer
        lora_rank=32,  # every attention and MLP projection (the source is silent: Unsloth's default targets)
        quantization=UNSLOTH_QUANTIZATION,
        optimizer="adamw_8bit",  # what Unsloth's notebooks train with: bitsandbytes' 8-bit AdamW
    )

    def figure(card_gib: int, tokens: int) -> Callable[[], LabFigure]:
        def lab() -> LabFigure:
            memory = memory_of(simulate(replace(spec, seq_len=tokens)))
            longest = longest_seq(replace(spec, seq_len=tokens), card_gib * GIB)
            error = longest.seq_len / tokens - 1
            return LabFigure(memory.peak_bytes, memory, f"lab's longest {longest.seq_len:,} tokens ({error:+.0%})")

        return lab

    def why(lab: LabFigure) -> str:
        return (
            f"{lab.detail}; assumed where the source is silent: nf4 with double quantization, every projection "
            "adapted, bitsandbytes' 8-bit AdamW (the notebooks' optim='adamw_8bit') over float32 adapters, "
            "SDPA (its flash kernel keeps what FA2 keeps); a card's memory is the budget, the CUDA context and "
            "the allocator's cache are not counted"
        )

    return [
        PublishedRow(
            "unsloth",
            "Unsloth docs, Llama 3.1 8B QLoRA context length (HF + FA2)",
            f"{card} GB card: {tokens:,} tokens, rank 32, batch 1",
            "card memory",
            card * GIB,
            figure(card, tokens),
            True,
            why,
        )
        for card, tokens in UNSLOTH_HF_FA2.items()
    ]


TABLES: dict[str, Callable[[], list[PublishedRow]]] = {
    "torchtune": torchtune_rows,
    "pr48444": pr48444_rows,
    "bert": bert_rows,
    "torchtitan": torchtitan_rows,
    "unsloth": unsloth_rows,
}


def reproduce(rows: Iterable[PublishedRow]) -> list[Reproduced]:
    """Simulate every row."""
    done = []
    for row in rows:
        start = time.perf_counter()
        figure = row.lab()
        done.append(Reproduced(row, figure, time.perf_counter() - start))
    return done


def _size(num_bytes: int) -> str:
    return f"{num_bytes / GIB:,.2f} GiB" if num_bytes >= GIB else f"{num_bytes / MIB:,.1f} MiB"


def table_markdown(done: Iterable[Reproduced]) -> str:
    """The rows as a Markdown table: source, setup, metric, published, lab (simulated), error, why."""
    lines = [
        "| source | setup | metric | published | lab (simulated) | error | why |",
        "|---|---|---|---|---|---|---|",
    ]
    for item in done:
        row = item.row
        mark = " (within 5%)" if item.within else ""
        lines.append(
            f"| {row.source} | {row.setup} | {row.metric} | {_size(row.published_bytes)} | {_size(item.lab_bytes)} "
            f"| {item.error:+.1%}{mark} | {row.why(item.lab)} |"
        )
    return "\n".join(lines)


def table_text(done: Iterable[Reproduced]) -> str:
    """The rows for a terminal: one block each."""
    blocks = []
    for item in done:
        row = item.row
        verdict = "within 5%" if item.within else ("outside 5%" if row.expressible else "not like for like")
        blocks.append(
            f"{row.source}\n  {row.setup}\n  metric: {row.metric}; published {_size(row.published_bytes)}, lab "
            f"{_size(item.lab_bytes)} (simulated, {item.seconds:.0f} s): error {item.error:+.1%}, {verdict}\n"
            f"  why: {row.why(item.lab)}"
        )
    return "\n\n".join(blocks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(TABLES), help=f"tables to reproduce, of {', '.join(TABLES)}")
    parser.add_argument(
        "--markdown", action="store_true", help="print one Markdown table (for docs/published-tables.md)"
    )
    args = parser.parse_args()
    names = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in names if name not in TABLES]
    if unknown:
        parser.error(f"--only {','.join(unknown)}: not a table; use some of {', '.join(TABLES)}")
    done = reproduce(row for name in names for row in TABLES[name]())
    print(table_markdown(done) if args.markdown else table_text(done))
    within = sum(item.within for item in done)
    print(
        f"\n{within} of {len(done)} rows reproduced within 5% ({sum(row.row.expressible for row in done)} expressible)"
    )


if __name__ == "__main__":
    main()
