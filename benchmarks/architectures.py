"""Every causal-LM architecture of the installed transformers: a tiny config, a measured step and a simulation.

    python benchmarks/architectures.py [--out benchmarks/architectures.jsonl] [--only llama,gemma3_text]
                                       [--seq-len 32] [--limit-s 300] [--table docs/architectures.md]

For each model type with a causal-LM class (``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``) the config class's defaults
are shrunk (:func:`tiny_config`: a few layers, small widths and vocabulary; per-layer lists such as
``layer_types`` kept in step by the lab's own ``config_with``), saved to a folder, and run on the CPU in float32
at every_n_layers 1 and 2: ``measure`` (one untimed memory step) and ``simulate --device cpu``. One row each,
printed as it comes and appended to ``--out`` as JSON; a rerun skips the rows already there (resumable). A row
says whether the plan held (observed reruns equal to transformers' rule, nested layers with their parents), the
bytes after the forward and at the peak, measured and simulated, or the one-line reason it could not run.
``--table`` writes the Markdown summary of ``--out`` (architectures covered, exact, refused with reason).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import signal
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SETTINGS = (1, 2)
TOLERANCE = 0.005  # measured against simulated, relative: what "exact" allows (most agree to the byte)
DEPTH = 4

# The shrinking: each key that a config has is set to this (widths that divide, small vocabulary, few experts).
SMALL: dict[str, Any] = {
    "hidden_size": 64,
    "n_embd": 64,
    "d_model": 64,
    "num_attention_heads": 4,
    "n_head": 4,
    "num_key_value_heads": 2,
    "num_kv_heads": 2,
    "head_dim": 16,
    "attention_head_dim": 16,
    "intermediate_size": 128,
    "ffn_hidden_size": 128,
    "n_inner": 128,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "expert_intermediate_size": 32,
    "vocab_size": 256,
    "max_position_embeddings": 256,
    "n_positions": 256,
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_group": 1,
    "topk_group": 1,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "kv_lora_rank": 16,
    "q_lora_rank": 32,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    "sliding_window": 16,
    "mamba_d_state": 8,
    "ssm_state_size": 8,
    "state_size": 8,
    "mamba_n_heads": 4,
    "n_mamba_heads": 2,
    "mamba_chunk_size": 32,
    "chunk_size": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "adapter_rank": 8,
    "rope_dim": 8,
}
DEPTH_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
IDS = ("pad_token_id", "bos_token_id", "eos_token_id")


# What was found about rows that are not plain (the table's last section): one line of cause each, checked.
NOTES: dict[str, str] = {
    "gemma3": "Gemma3ForConditionalGeneration: its SigLIP vision tower's 12 layers are checkpointing layers that "
    "transformers' rule counts (16 in all) and a text batch never runs; the plan holds on the layers that ran.",
    "got_ocr2": "GotOcr2ForConditionalGeneration: its vision encoder's 12 layers are counted by transformers' rule "
    "(16 in all) and never run on a text batch; the plan holds on the layers that ran.",
    "big_bird": "After the forward exact since the padding mask the model makes of ones is left out. The peak at "
    "every_n_layers=2: 8,192 bytes high (one 32 x 64 float32 hidden state) after n=1 ran in the same process, equal "
    "when n=2 runs alone; the backward's timeline differs by 8,192 bytes either way. A lead, not checked: BigBird "
    "switches itself from block_sparse to original_full attention in its first forward at 32 tokens (the measured "
    "step's warm-up, the simulated step's own forward).",
    **{
        name: "Row measured before the padding-mask fix (below): its excess after the forward is that mask's size "
        "(+1,024 bytes under SDPA, +4,096 under eager, and the masks kept layers hold at n=2); the rerun with the "
        "fix did not finish on the loaded machine (the same fix made bart, biogpt, blenderbot and "
        "blenderbot-small exact)."
        for name in ("marian", "mbart", "pegasus", "rembert")
    },
    "megatron-bert": "Row measured before the padding-mask fix (below), +4,096 bytes after the forward: rerun by hand "
    "with the fix, exact at every_n_layers 1 and 2 (after the forward 115,720 and 428,040 bytes, peak 1,505,032).",
    "roformer": "Row measured before the padding-mask fix (below), +4,096 bytes after the forward: rerun by hand with "
    "the same answer patched in, exact at every_n_layers 1 and 2 (after the forward 117,768 and 438,280 bytes).",
}

# Found and fixed while the table was made (the rows above are after the fixes).
FIXED = (
    "Wrapped configs (gemma3, llama4, qwen3_5, mllama, got_ocr2, emu3, fuyu: a config that holds a text config): the "
    "shallow copies' depth was asked of the wrapper, which has no num_hidden_layers; it is now its text config's.",
    "BERT-like encoders, BART-like encoder-decoders and BioGPT (the 'differs' rows: +1,024 bytes after the forward "
    "under SDPA, +4,096 under eager, at 32 tokens): the model makes its padding mask with torch.ones when given none; "
    "a real run reads it, finds no padding and builds no mask, a fake tensor cannot be read, so the simulation kept "
    "a b x 1 x s x s mask. The simulation now answers as the unpadded batch does.",
    "Vision towers (SigLIP's init through trunc_normal_, which draws until no value is out of bounds) made a "
    "decision from values at build time under fake tensors; the draw is left out (no byte changes).",
)


def architectures() -> list[str]:
    """Every model type with a causal-LM class in the installed transformers, in transformers' order."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def tiny_config(model_type: str):
    """The config class's defaults, shrunk: :data:`DEPTH` layers, :data:`SMALL` sizes, per-layer lists in step.

    Built afresh from the changed values (not rebuilt from the defaults' dict): fields a config derives in its
    ``__post_init__`` (Zamba2's ``mamba_headdim``, ``hybrid_layer_ids``) are derived again from the small sizes.

    Raises:
        Exception: whatever transformers raises for a config the shrinking cannot make valid.
    """
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config = CONFIG_MAPPING[model_type]()
    text = config.get_text_config()
    changes: dict[str, Any] = {key: value for key, value in SMALL.items() if _has(text, key)}
    for key in IDS:  # token ids inside the small vocabulary
        value = getattr(text, key, None)
        if isinstance(value, int) and value >= SMALL["vocab_size"]:
            changes[key] = 0 if key == "pad_token_id" else 1
    if "kv_lora_rank" in changes:  # MLA (DeepSeek): the rotary part is the head_dim the rotary tables use
        changes["head_dim"] = SMALL["qk_rope_head_dim"]
    depth_key = next((key for key in DEPTH_KEYS if _has(text, key)), None)
    if depth_key is not None:
        changes[depth_key] = DEPTH
        changes.update(_window(text.to_dict(), getattr(text, "num_hidden_layers", None)))
    if text is config:
        return type(config)(**changes)
    sub = next(name for name in config.sub_configs if getattr(config, name, None) is text)
    return type(config)(**{sub: changes})


def _window(values: dict[str, Any], depth: Any) -> dict[str, list[Any]]:
    """:data:`DEPTH` consecutive layers of the per-layer lists, where they hold the most kinds (Gemma 3's default
    pattern opens with five sliding layers: L21-L24 hold a full one); none without such lists."""
    from ckptlab.model.configs import per_layer_lists

    keys = per_layer_lists(values, depth)
    if not keys or not isinstance(depth, int) or depth <= DEPTH:
        return {}

    def kinds(start: int) -> int:
        return sum(len({repr(item) for item in values[key][start : start + DEPTH]}) for key in keys)

    start = max(range(depth - DEPTH + 1), key=lambda start: (kinds(start), -start))
    return {key: list(values[key][start : start + DEPTH]) for key in keys}


def _has(config, key: str) -> bool:
    return key in config.to_dict() or key in (getattr(config, "attribute_map", None) or {})


class TooLong(BaseException):  # not an Exception: the rows' own handlers must let it through
    """The architecture took longer than ``--limit-s``."""


@contextlib.contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    def stop(signum, frame):
        raise TooLong(f"took longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def reason(error: BaseException) -> str:
    """One line: the exception's type and the first line of its message, cut to 160 characters."""
    text = str(error).strip().split("gives an invalid config: ")[-1]  # the lab's SpecError: its cause
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):  # a validator's header, then its cause
        lines = [f"{lines[0]} {lines[1]}"]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:200]


def rows_for(model_type: str, seq_len: int, folder: Path) -> list[dict[str, Any]]:
    """The rows of one architecture: one per setting, or one row with the reason it cannot run."""
    from ckptlab import RunSpec, describe, measure, simulate
    from ckptlab.model.plan import planned_roles, rerun_roles

    started = time.perf_counter()
    try:
        config = tiny_config(model_type)
        config.save_pretrained(folder)
        info = describe(str(folder))
    except Exception as error:  # a refusal is a row: the benchmark goes on to the next architecture
        return [{"model_type": model_type, "every_n_layers": None, "refused": reason(error)}]
    rows = []
    for every_n_layers in SETTINGS:
        row: dict[str, Any] = {"model_type": model_type, "every_n_layers": every_n_layers, "layers": info.num_layers}
        row["kind"] = kind_of(info)
        spec = RunSpec(
            model=str(folder),
            seq_len=seq_len,
            every_n_layers=every_n_layers,
            device="cpu",
            dtype="float32",
            optimizer="none",
            repeats=1,
            warmup=0,
        )
        try:
            run = measure(spec, timed=False)
            sim = simulate(spec)
        except Exception as error:
            row["refused"] = reason(error)
            rows.append(row)
            break  # the other setting meets the same reason
        rule = rerun_roles(planned_roles(info.num_layers, every_n_layers), info.nested_in)
        row["plan_ok"] = reran(run.layers) == ran(rule, run.layers) and run.plan_matches
        row["sim_plan_ok"] = reran(sim.layers) == ran(rule, sim.layers)
        for name in ("after_forward_bytes", "peak_bytes"):
            row[f"measured_{name}"] = getattr(run.memory, name)
            row[f"simulated_{name}"] = getattr(sim.memory, name)
        row["exact"] = (
            row["plan_ok"]
            and row["sim_plan_ok"]
            and all(
                abs(row[f"simulated_{name}"] - row[f"measured_{name}"]) <= TOLERANCE * row[f"measured_{name}"]
                for name in ("after_forward_bytes", "peak_bytes")
            )
        )
        rows.append(row)
    for row in rows:
        row["seconds"] = round(time.perf_counter() - started, 1)
    return rows


def reran(layers) -> list[str]:
    """The observed roles of the layers the step ran (a vision tower's layers do not run on a text batch)."""
    return [layer.observed for layer in layers if layer.forward_calls]


def ran(rule: list[str], layers) -> list[str]:
    """The rule's roles of the layers the step ran."""
    return [role for role, layer in zip(rule, layers, strict=True) if layer.forward_calls]


def kind_of(info) -> str:
    """A word on what the architecture is: nested, MoE, layers that differ, or dense."""
    if info.nested_in:
        return "nested"
    if info.num_experts:
        return "moe"
    return "dense" if info.layers_alike else "layers differ"


def done_rows(out: Path) -> list[dict[str, Any]]:
    if not out.exists():
        return []
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines() if line.strip()]


def line_of(row: dict[str, Any]) -> str:
    """A printed row."""
    head = f"{row['model_type']:<28} n={row['every_n_layers']}"
    if "refused" in row:
        return f"{head}  refused: {row['refused']}"

    def diff(name: str) -> str:
        measured, simulated = row[f"measured_{name}"], row[f"simulated_{name}"]
        return f"{measured:>10,} {simulated:>10,} ({(simulated - measured) / measured:+.2%})"

    return (
        f"{head}  {row['kind']:<13} plan {'ok' if row['plan_ok'] else 'MISMATCH'}"
        f"  after fwd {diff('after_forward_bytes')}  peak {diff('peak_bytes')}  {'exact' if row['exact'] else 'DIFFERS'}"
    )


def table(rows: list[dict[str, Any]]) -> str:
    """The Markdown summary: counts, then one line per architecture."""
    by_type: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_type.setdefault(row["model_type"], []).append(row)
    ran = {name: rs for name, rs in by_type.items() if not any("refused" in row for row in rs)}
    exact = [name for name, rs in ran.items() if all(row["exact"] for row in rs)]
    lines = [
        "# Every causal-LM architecture, measured and simulated",
        "",
        "`python benchmarks/architectures.py` (then `--table docs/architectures.md`): each model type of the installed",
        "transformers with a causal-LM class, its config's defaults shrunk to a tiny model (4 layers, hidden 64,",
        "vocabulary 256; per-layer lists such as `layer_types` kept in step, a window of the default pattern that holds",
        "the most kinds), one measured CPU step and one `simulate --device cpu` (float32, 32 tokens, no optimizer) at",
        "every_n_layers 1 and 2. Plan: the layers that reran equal transformers' rule (a keep layer nested in a",
        "checkpointed one rerunning with it). Figures: simulated against measured bytes after the forward and at the",
        "peak. Kind: what the lab found on the tiny model (dense, MoE, layers that differ, nested checkpointing layers).",
        "",
        f"Architectures run: {len(by_type)} of {len(architectures())} with a causal-LM class; "
        f"ran at every_n_layers 1 and 2: {len(ran)}; exact (plan as transformers' rule, measured = simulated "
        f"within {TOLERANCE:.1%} after the forward and at the peak): {len(exact)}; refused: {len(by_type) - len(ran)}.",
        "",
        "| architecture | kind | layers | n=1 after fwd / peak (sim vs measured) | n=2 after fwd / peak | result |",
        "|---|---|---|---|---|---|",
    ]
    for name, rs in sorted(by_type.items()):
        refused = next((row["refused"] for row in rs if "refused" in row), None)
        cells = []
        for row in rs:
            if "refused" in row:
                continue
            parts = [
                (row[f"simulated_{key}"] - row[f"measured_{key}"]) / row[f"measured_{key}"]
                for key in ("after_forward_bytes", "peak_bytes")
            ]
            cells.append(f"{parts[0]:+.2%} / {parts[1]:+.2%}" + ("" if row["plan_ok"] else " plan MISMATCH"))
        cells += [""] * (2 - len(cells))
        first = rs[0]
        result = (
            f"refused: {refused.replace('|', '/')}"
            if refused
            else ("exact" if all(row["exact"] for row in rs) else "differs")
        )
        lines.append(
            f"| {name} | {first.get('kind', '')} | {first.get('layers', '')} | {cells[0]} | {cells[1]} | {result} |"
        )
    notes = [f"- **{name}**: {NOTES[name]}" for name in sorted(by_type) if name in NOTES]
    if notes:
        lines += ["", "## Rows to read with a note", "", *notes]
    lines += ["", "## Found and fixed while the table was made", "", *(f"- {line}" for line in FIXED)]
    missing = [name for name in architectures() if name not in by_type]
    if missing:
        lines += ["", f"Not run yet ({len(missing)}; the benchmark resumes where it stopped): {', '.join(missing)}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", default="benchmarks/architectures.jsonl", help="rows as JSON lines (resumed)")
    parser.add_argument("--only", default="", help="comma-separated model types (default: all)")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--limit-s", type=int, default=300, help="seconds an architecture may take")
    parser.add_argument("--table", default="", help="write the Markdown summary of --out here and stop")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.table:
        Path(args.table).write_text(table(done_rows(out)), encoding="utf-8")
        return 0
    import transformers

    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore")
    wanted = [name for name in args.only.split(",") if name] or architectures()
    seen = {row["model_type"] for row in done_rows(out)}
    print(f"transformers {transformers.__version__}: {len(wanted)} architectures, {len(seen & set(wanted))} done")
    for model_type in wanted:
        if model_type in seen:
            continue
        with tempfile.TemporaryDirectory() as folder:
            try:
                with time_limit(args.limit_s), contextlib.redirect_stdout(io.StringIO()):
                    rows = rows_for(model_type, args.seq_len, Path(folder))
            except TooLong as error:
                rows = [{"model_type": model_type, "every_n_layers": None, "refused": reason(error)}]
        with out.open("a", encoding="utf-8") as file:
            for row in rows:
                file.write(json.dumps(row) + "\n")
                print(line_of(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
