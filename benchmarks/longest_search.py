"""The longest-sequence search by the peak's line beside the bracketing search before it, on five cases, in one run.

    python benchmarks/longest_search.py [--only qlora,moe]

Cases (issue 61): dense (gpt2-small, multi-head attention), GQA (llama-3.2-1b), MoE (tiny-qwen3-moe, real
routing), QLoRA (llama-3.1-8b, nf4, rank 16, on an RTX 4090: docs/qlora.md's), and a sliding window (a Gemma 3
1B shape, ``sliding_window`` 512, five sliding layers to one full). Each at every_n_layers=1, Trainer's AdamW,
bf16, batch 1, first guess 512 tokens. Printed for each: the longest length and the next one of both searches,
their simulations (``LongestSeq.simulations``) and CPU seconds (``time.process_time``), and whether the answers
are the same. The line's search needs four simulations where the peak is linear; where it is not, it goes on as
the bracketing search from what it simulated.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformers import AutoConfig  # noqa: E402  (after the path)

from ckptlab import QLORA, RunSpec  # noqa: E402
from ckptlab.explore.longest import longest_seq  # noqa: E402
from ckptlab.units import GIB, MIB  # noqa: E402

GEMMA3_1B = {  # google/gemma-3-1b-pt's text config: 26 layers, sliding window 512, five sliding to one full
    "num_hidden_layers": 26,
    "hidden_size": 1152,
    "intermediate_size": 6912,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "vocab_size": 262144,
    "sliding_window": 512,
    "max_position_embeddings": 32768,
}


def cases(folder: str) -> dict[str, tuple[RunSpec, int]]:
    """name -> (spec, budget in bytes)."""
    AutoConfig.for_model("gemma3_text", **GEMMA3_1B).save_pretrained(folder)
    base = {"seq_len": 512, "every_n_layers": 1, "dtype": "bfloat16"}
    return {
        "dense (gpt2-small)": (RunSpec(model="gpt2-small", **base), 3 * GIB),  # type: ignore[arg-type]
        "GQA (llama-3.2-1b)": (RunSpec(model="llama-3.2-1b", **base), 24 * GIB),  # type: ignore[arg-type]
        "MoE (tiny-qwen3-moe)": (RunSpec(model="tiny-qwen3-moe", **base), 160 * MIB),  # type: ignore[arg-type]
        "QLoRA (llama-3.1-8b)": (
            RunSpec(model="llama-3.1-8b", seq_len=512, every_n_layers=1, lora_rank=16, quantization=QLORA),
            24 * GIB,
        ),
        "sliding window (gemma3 1B)": (RunSpec(model=folder, **base), 16 * GIB),  # type: ignore[arg-type]
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated words of the case names (e.g. qlora,moe)")
    args = parser.parse_args()
    words = [word.lower() for word in args.only.split(",") if word]
    print(f"{'case':<28}{'budget':>10}{'line: longest':>15}{'sims':>6}{'CPU s':>8}{'before':>10}{'sims':>6}"
          f"{'CPU s':>8}  same")  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        for name, (spec, budget) in cases(folder).items():
            if words and not any(word in name.lower() for word in words):
                continue
            rows = []
            for by_line in (True, False):
                started = time.process_time()
                found = longest_seq(spec, budget, by_line=by_line)
                rows.append((found, time.process_time() - started))
            (line, line_s), (before, before_s) = rows
            same = (line.seq_len, line.over_seq_len) == (before.seq_len, before.over_seq_len)
            print(
                f"{name:<28}{budget / GIB:>8.2f}G{line.seq_len:>15,}{line.simulations:>6}{line_s:>8.1f}"
                f"{before.seq_len:>10,}{before.simulations:>6}{before_s:>8.1f}  {same}",
                flush=True,
            )


if __name__ == "__main__":
    main()
