"""The longest-sequence search by the peak's lines beside the bracketing search before it, on five cases, in one run.

    python benchmarks/longest_search.py [--only qlora,moe]

Cases (issue 61), each with a budget whose answer lies well inside the model's positions (a case that reaches its
limit proves nothing about the search): dense (gpt2-small, multi-head attention, 1,024 positions, 1.15 GiB), GQA
(llama-3.2-1b, 24 GiB), MoE (tiny-qwen3-moe, grouped_mm experts, 2,048 positions, 80 MiB), QLoRA (llama-3.1-8b, nf4,
rank 16, on an RTX 4090: docs/qlora.md's), and a sliding window (a Gemma 3 1B shape, ``sliding_window`` 512, five
sliding layers to one full, 16 GiB). Each at every_n_layers=1, Trainer's AdamW, bf16 (QLoRA: its recipe), batch 1,
first guess 512 tokens. Printed first: the command line and the machine's load; then for each case the longest length
and the next one of both searches, their simulations (``LongestSeq.simulations``) and CPU seconds
(``time.process_time``, which the load does not inflate), and whether the answers are the same; last, the load again.
The lines' search needs four simulations where each stretch's high point is a line from the first guess (the step's
peak may still bend there, where the stretch that holds it changes); where they curve, it draws up to ``MAX_LINES``
lines through the lengths nearest the answer, then goes on as the bracketing search. docs/qlora.md has the figures.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformers import AutoConfig  # noqa: E402  (after the path)

from ckptlab import QLORA, RunSpec  # noqa: E402
from ckptlab.explore.longest import LongestSeq, longest_seq  # noqa: E402
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
        "dense (gpt2-small)": (RunSpec(model="gpt2-small", **base), int(1.15 * GIB)),  # type: ignore[arg-type]
        "GQA (llama-3.2-1b)": (RunSpec(model="llama-3.2-1b", **base), 24 * GIB),  # type: ignore[arg-type]
        "MoE (tiny-qwen3-moe)": (RunSpec(model="tiny-qwen3-moe", **base), 80 * MIB),  # type: ignore[arg-type]
        "QLoRA (llama-3.1-8b)": (
            RunSpec(model="llama-3.1-8b", seq_len=512, every_n_layers=1, lora_rank=16, quantization=QLORA),
            24 * GIB,
        ),
        "sliding window (gemma3 1B)": (RunSpec(model=folder, **base), 16 * GIB),  # type: ignore[arg-type]
    }


def _load() -> str:
    return f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated words of the case names (e.g. qlora,moe)")
    args = parser.parse_args()
    words = [word.lower() for word in args.only.split(",") if word]
    print("$ python " + " ".join(sys.argv))
    print(_load(), flush=True)
    print(f"{'case':<28}{'budget':>9}{'limit':>8}{'before':>14}{'sims':>5}{'CPU s':>7}{'line':>14}{'sims':>5}"
          f"{'CPU s':>7}  same")  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        for name, (spec, budget) in cases(folder).items():
            if words and not any(word in name.lower() for word in words):
                continue
            rows = []
            for by_line in (False, True):
                started = time.process_time()
                found = longest_seq(spec, budget, by_line=by_line)
                rows.append((found, time.process_time() - started))
            (before, before_s), (line, line_s) = rows
            same = (line.seq_len, line.over_seq_len) == (before.seq_len, before.over_seq_len)
            print(
                f"{name:<28}{budget / GIB:>8.3f}G{line.limit:>8,}{_pair(before):>14}{before.simulations:>5}"
                f"{before_s:>7.1f}{_pair(line):>14}{line.simulations:>5}{line_s:>7.1f}  {same}",
                flush=True,
            )
    print(_load())


def _pair(found: LongestSeq) -> str:
    """The longest length and the next one simulated (the one that does not fit), or where the search stopped."""
    over = "limit" if found.over_seq_len is None else f"{found.over_seq_len:,}"
    return f"{found.seq_len:,}/{over}"


if __name__ == "__main__":
    main()
