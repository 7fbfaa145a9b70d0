"""Published step-time factors of activation checkpointing beside the roofline's predictions (issue 59).

    python benchmarks/published_time.py [--only korthikanti,torchtune,torchtitan,h200,transformers]

Each row is simulated (fake tensors, the lab's counted work: ``RunResult.work``) with the setup its source states,
and timed on the source's GPU by ``ckptlab.explore.roofline`` with the constants as they are in roofline.py: no
constant is fitted here (the one fitted figure is the H200 run's off forward, ``benchmarks/fit_roofline.py``).
It prints, per row, the published factor (a checkpointed step over the step without), the predicted one and their
difference (target: within 0.08), and where a source publishes an absolute time or throughput, that figure beside
the prediction (target: within 25%). docs/published-tables.md holds the table and, where a row is off, why.

Sources (all public):

- Korthikanti et al. 2022 (arXiv 2205.05198), Table 4: one layer of their 22B GPT (h 6144, 64 heads, s 2048,
  micro-batch 4: Table 3) on A100s with tensor parallel 8; forward 7.7 ms, backward 11.9 ms, full recompute's
  backward 19.5 ms (the layer x1.39). The lab runs ONE layer with the per-GPU shapes of tensor parallel 8: 8 of the
  64 heads (head dim 96) and an eighth of the MLP; a Llama layer (three MLP matmuls) with an intermediate of 2048
  has the FLOPs of GPT's two matmuls of 6144 x 3072. Beside the layer's counted ops, what Megatron runs there:
  tensor parallel's two all-reduces of the s x b x h output in the forward (timed on the A100's NVLink as the roofline
  times a collective, ``tensor_parallel_all_reduce_s``), its backward's two overlapped with the weight gradients
  (section 6.2), and a full recompute that reruns the whole forward, all-reduces included (Megatron's reentrant
  CheckpointFunction; transformers' non-reentrant checkpoint stops earlier).
- torchtune README, "Optimization flags": Llama 3.2 3B, batch 2 x 4096 packed, bf16, A100, AdamW: "+ Activation
  Checkpointing" 7,210 tokens/s after 9,174 (x1.27, with torch.compile and chunked cross-entropy on); "+ Packed
  Dataset" (eager, no AC) 7,075 tokens/s: the absolute figure.
- torchtitan docs/performance.md, its 2024 Llama 2 table: Llama 2 13B, FSDP2 over 64 A100 80 GB, local batch 2 x
  4096: no AC 2,162 WPS, "selective layer" AC (every 2nd layer) 1,914 (x1.13). Issue 59's quote (Llama 3 8B on 8
  H100, full AC 10-11% fewer tokens/s) is in no version of that page read (docs/published-tables.md): every H100
  table there compares torch.compile and Float8 under one AC setting, never AC against none.
- this project's H200 run (docs/gpu-results.md, section 3): qwen3-0.6b, 4096 tokens, bf16, forward and backward
  only: every_n_layers 2 x1.24, 4 x1.11, 1 x2.10 (wide spread: 190-221 ms; x1.67 in the first run).
- transformers docs, gradient checkpointing: "about 20% slower", no model named; the lab's headline case here
  (qwen3-8b, 8192 tokens, bf16, AdamW, one H100: issue 59's `simulate` example), every layer checkpointed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from published_tables import _folder, llama_3_2_3b
from transformers import LlamaConfig

from ckptlab import RunSpec, simulate
from ckptlab.explore.gpus import GPU_SPECS, GpuSpec
from ckptlab.explore.roofline import (
    GPU_EFFICIENCY,
    TimePrediction,
    item_seconds,
    predict_time,
    result_tokens,
    step_work,
)
from ckptlab.step.work import OpCost, StepWork, WorkItem

TENSOR_PARALLEL = 8  # Korthikanti et al.'s Table 3: every model runs tensor parallel 8 (one DGX A100's NVLink)
WITHIN_FACTOR = 0.08  # a published factor reproduced within +-0.08
WITHIN_ABSOLUTE = 0.25  # a published time or throughput within 25%
FORWARD_BACKWARD = ("forward", "loss", "backward", "rerun")  # a step timed without its optimizer


@dataclass(frozen=True)
class Step:
    """One simulated setting's counted work and its prediction on the row's GPU."""

    work: StepWork
    prediction: TimePrediction

    def seconds(self, phases: tuple[str, ...] | None = None, layer: int | str | None = "all") -> float:
        """The predicted seconds of ``phases`` (all: None) of ``layer`` ("all": the whole step)."""
        gpu = GPU_SPECS[self.prediction.device]
        return sum(
            item_seconds(item, gpu, efficiency=GPU_EFFICIENCY, f32="float32")
            for item in self.work.items
            if (phases is None or item.phase in phases) and (layer == "all" or item.layer == layer)
        )


def step(spec: RunSpec, gpu: str) -> Step:
    """``spec`` simulated and its work timed on ``gpu`` (float32 matmuls as torch's default: no TF32)."""
    result = simulate(spec)
    work = step_work(result)
    if work is None:
        raise SystemExit("The simulated result carries no counted work (RunResult.work): nothing to predict.")
    prediction = predict_time(
        work, GPU_SPECS[gpu], tokens=result_tokens(result), world_size=spec.world_size, f32="float32"
    )
    return Step(work, prediction)


@dataclass(frozen=True)
class Row:
    """A published factor, the lab's, and an absolute figure where the source gives one."""

    source: str
    setup: str
    published: float  # the checkpointed step over the plain one
    predicted: float
    absolute: str = ""  # "published X, predicted Y (error)" where the source gives a time or throughput
    absolute_error: float | None = None

    @property
    def error(self) -> float:
        return self.predicted - self.published

    @property
    def within(self) -> bool:
        return abs(self.error) <= WITHIN_FACTOR


def tensor_parallel_all_reduce_s(activation_bytes: int, gpu: GpuSpec, ranks: int = TENSOR_PARALLEL) -> float:
    """One of Megatron's tensor-parallel all-reduces of a layer's s x b x h activation: a ring over ``ranks`` GPUs on
    the card's GPU-to-GPU link, timed as the roofline times every collective (``item_seconds``: the ring's bytes at
    E_GPU_LINK of the link)."""
    cost = OpCost("_c10d_functional.all_reduce.default", "bfloat16", 0, activation_bytes)
    return item_seconds(WorkItem("collective", 0, cost, 1), gpu, world_size=ranks, efficiency=GPU_EFFICIENCY)


def korthikanti() -> list[Row]:
    """Korthikanti et al. 2022, Table 4: one 22B layer, per-GPU shapes of tensor parallel 8, A100.

    What the row runs beside the layer's ops (section 4.2.1 and 6.2 of the paper): Megatron's tensor parallelism
    all-reduces the layer's s x b x h output twice in the forward (f-bar, after the attention and after the MLP), on
    the critical path; the backward's two (f) overlap the weight gradients' matmuls ("an optimization in the backward
    pass where we overlap all-reduce communication with the linear weight's gradient computation"), so a layer's
    backward costs the larger of the two, as the roofline's FSDP2 overlap; and its full recompute (Megatron's own
    reentrant CheckpointFunction) reruns the layer's whole forward, all-reduces included, where torch's
    non-reentrant checkpoint (transformers') stops once the saved tensors are back.
    """
    layer = LlamaConfig(
        hidden_size=6144,
        num_attention_heads=8,  # 64 heads / 8 GPUs
        num_key_value_heads=8,
        head_dim=96,  # 6144 / 64
        intermediate_size=2048,  # three Llama matmuls of 6144 x 2048 = GPT's two of 6144 x (4 x 6144 / 8)
        num_hidden_layers=1,
        vocab_size=1024,  # the head is outside the layer and not in the layer's time
        max_position_embeddings=2048,
        architectures=["LlamaForCausalLM"],
    )
    seq_len, micro_batch, hidden = 2048, 4, 6144  # Table 3: the 22B model, micro-batch 4
    spec = RunSpec(
        model=_folder(layer, "korthikanti-22b-tp8-layer"),
        seq_len=seq_len,
        batch_size=micro_batch,
        dtype="bfloat16",
        optimizer="none",
        every_n_layers=None,  # RunSpec's default checkpoints every layer
    )
    gpu = GPU_SPECS["A100 80 GB"]
    off, full = step(spec, gpu.name), step(replace(spec, every_n_layers=1), gpu.name)
    all_reduces = 2 * tensor_parallel_all_reduce_s(seq_len * micro_batch * hidden * 2, gpu)
    forward = off.seconds(("forward",), 0) + all_reduces  # exposed: the next op needs the sum
    backward = max(off.seconds(("backward",), 0), all_reduces)  # hidden behind the weight gradients
    rerun = forward  # Megatron's full recompute: the whole forward again, its all-reduces included
    transformers_rerun = full.seconds(("rerun",), 0) + all_reduces  # what torch's non-reentrant checkpoint reruns
    published_ms = 7.7 + 11.9
    predicted_ms = (forward + backward) * 1e3
    return [
        Row(
            "Korthikanti et al. 2022, Table 4 (A100)",
            "one 22B layer, per-GPU shapes of TP 8 (8 heads of 96, MLP / 8), s 2048, micro-batch 4, bf16, TP's "
            "all-reduces on NVLink 3; full recompute (Megatron's: the whole forward again)",
            (7.7 + 19.5) / published_ms,
            (forward + backward + rerun) / (forward + backward),
            f"layer forward {forward * 1e3:.1f} ms (published 7.7; {all_reduces * 1e3:.2f} of it the two all-reduces), "
            f"backward {backward * 1e3:.1f} (11.9); forward + backward {predicted_ms:.1f} ms against "
            f"{published_ms:.1f}; transformers' rerun would give x"
            f"{(forward + backward + transformers_rerun) / (forward + backward):.2f}",
            predicted_ms / published_ms - 1,
        )
    ]


def torchtune() -> list[Row]:
    """torchtune README, Optimization flags: Llama 3.2 3B, 2 x 4096, bf16, AdamW, A100."""
    spec = RunSpec(
        model=_folder(llama_3_2_3b(), "llama-3.2-3b"),
        seq_len=4096,
        batch_size=2,
        dtype="bfloat16",
        optimizer="adamw_torch",
        max_grad_norm=0.0,
        every_n_layers=None,
    )
    off, full = step(spec, "A100 80 GB"), step(replace(spec, every_n_layers=1), "A100 80 GB")
    tokens_s = off.prediction.tokens_per_s
    return [
        Row(
            "torchtune README, Optimization flags (A100)",
            "Llama 3.2 3B, 2 x 4096 packed, bf16, AdamW; every layer checkpointed",
            9174 / 7210,
            full.prediction.seconds / off.prediction.seconds,
            f"no AC, eager ('+ Packed Dataset'): {tokens_s:,.0f} tokens/s predicted against 7,075",
            tokens_s / 7075 - 1,
        )
    ]


def llama_2_13b() -> LlamaConfig:
    """Llama 2 13B as torchtitan builds it (its ``llama2`` "13B" flavour): dim 5120, 40 layers, 40 heads, the FFN
    rounded up to a multiple of 256 (13,824), a 32,000 vocabulary, 4,096 positions."""
    return LlamaConfig(
        hidden_size=5120,
        intermediate_size=13824,
        num_hidden_layers=40,
        num_attention_heads=40,
        num_key_value_heads=40,
        vocab_size=32000,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        architectures=["LlamaForCausalLM"],
    )


def torchtitan() -> list[Row]:
    """torchtitan docs/performance.md (its 2024 version): Llama 2 13B, FSDP2 over 64 A100 80 GB, local batch 2 x 4096;
    no AC 2,162 WPS (61.1% MFU), "selective layer" AC (every 2nd layer: ``selective_ac_option`` "2") 1,914 WPS."""
    spec = RunSpec(
        model=_folder(llama_2_13b(), "llama-2-13b"),
        seq_len=4096,  # "the default sequence length in Llama 2 is 4096"
        batch_size=2,
        dtype="float32",
        mixed_precision="bf16",  # FSDP2's MixedPrecisionPolicy(bf16, float32), torchtitan's default
        world_size=64,
        fsdp=True,
        optimizer="adamw_torch",
        max_grad_norm=1.0,
        every_n_layers=None,
    )
    off, every_2 = step(spec, "A100 80 GB"), step(replace(spec, every_n_layers=2), "A100 80 GB")
    tokens_s = off.prediction.tokens_per_s
    return [
        Row(
            "torchtitan docs/performance.md, Llama 2 table (A100 80 GB)",
            "Llama 2 13B, FSDP2 over 64 GPUs, local batch 2 x 4096, bf16 compute (float32 master weights), AdamW; "
            "selective layer AC: every 2nd layer (rank 0)",
            2162 / 1914,
            every_2.prediction.seconds / off.prediction.seconds,
            f"no AC: {tokens_s:,.0f} tokens/s a GPU predicted against 2,162 (MFU {off.prediction.mfu:.1%} against "
            f"61.1%); exposed collectives {off.prediction.by_phase['collective'] * 1e3:.0f} ms of "
            f"{off.prediction.seconds * 1e3:,.0f} ms",
            tokens_s / 2162 - 1,
        )
    ]


def h200() -> list[Row]:
    """This project's H200 run, section 3: qwen3-0.6b, 4096 tokens, bf16, forward and backward only."""
    spec = RunSpec(model="qwen3-0.6b", seq_len=4096, dtype="bfloat16", optimizer="none", every_n_layers=None)
    off = step(spec, "H200 141 GB")
    rows = []
    for n, published in ((2, 1.24), (4, 1.11), (1, 2.10)):
        setting = step(replace(spec, every_n_layers=n), "H200 141 GB")
        absolute, absolute_error = "", None
        if n == 2:
            off_ms = off.seconds(FORWARD_BACKWARD) * 1e3
            absolute, absolute_error = f"off {off_ms:.1f} ms predicted against 102.4", off_ms / 102.4 - 1
        rows.append(
            Row(
                "this project, docs/gpu-results.md section 3 (H200)",
                f"qwen3-0.6b, 4096 tokens, bf16, forward and backward; every_n_layers={n}"
                + (" (wide spread: 190-221 ms, x1.67 in run 1)" if n == 1 else ""),
                published,
                setting.seconds(FORWARD_BACKWARD) / off.seconds(FORWARD_BACKWARD),
                absolute,
                absolute_error,
            )
        )
    return rows


def transformers_docs() -> list[Row]:
    """transformers docs: gradient checkpointing makes training "about 20% slower"; qwen3-8b at 8k on one H100."""
    spec = RunSpec(model="qwen3-8b", seq_len=8192, dtype="bfloat16", optimizer="adamw_torch", every_n_layers=None)
    off, full = step(spec, "H100 80 GB"), step(replace(spec, every_n_layers=1), "H100 80 GB")
    return [
        Row(
            "transformers docs, gradient checkpointing",
            "'about 20% slower' (no model named); lab: qwen3-8b, 8192 tokens, bf16, AdamW, one H100, every layer",
            1.20,
            full.prediction.seconds / off.prediction.seconds,
            f"off {off.prediction.seconds * 1e3:.0f} ms, {off.prediction.tokens_per_s:,.0f} tokens/s, "
            f"MFU {off.prediction.mfu:.0%}",
        )
    ]


ROWS: dict[str, Callable[[], list[Row]]] = {
    "korthikanti": korthikanti,
    "torchtune": torchtune,
    "torchtitan": torchtitan,
    "h200": h200,
    "transformers": transformers_docs,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(ROWS), help="comma-separated: " + ",".join(ROWS))
    args = parser.parse_args()
    print("| source | setup | published | predicted | error | within 0.08 | absolute (published, predicted) |")
    print("|---|---|---|---|---|---|---|")
    for name in args.only.split(","):
        start = time.perf_counter()
        for row in ROWS[name]():
            absolute = row.absolute
            if row.absolute_error is not None:
                verdict = "within" if abs(row.absolute_error) <= WITHIN_ABSOLUTE else "outside"
                absolute += f" ({row.absolute_error:+.1%}, {verdict} 25%)"
            print(
                f"| {row.source} | {row.setup} | x{row.published:.2f} | x{row.predicted:.2f} | {row.error:+.2f} | "
                f"{'yes' if row.within else 'no'} | {absolute} |",
                flush=True,
            )
        print(f"<!-- {name}: {time.perf_counter() - start:.0f} s -->", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
