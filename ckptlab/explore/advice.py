"""When nothing measured fits a budget: what does come closest, and what would fit.

The advice is measured where a measured row backs it (a shorter sequence the sweep ran) and
an estimate otherwise (activations grow about linearly with the tokens; offload moves the
checkpointed inputs), and each sentence says which. Every sentence is a
:class:`~ckptlab.message.Message`, so a page says it in its language.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..message import Message
from ..units import mib
from .sweep_rows import SweepRow, known, known_peak, row_name


def nothing_fits(measured: list[SweepRow], budget: int, label: str, seq_len: int) -> Message:
    if not measured:
        return Message(
            f"No setting was measured at seq_len={seq_len} (every row ran out of memory), so none is known to fit "
            f"in {label}.",
            key="recommend.none_measured",
            params={"seq_len": seq_len, "budget": label},
        )
    smallest = min(measured, key=known_peak)
    peak, over = mib(known_peak(smallest)), mib(known_peak(smallest) - budget)
    return Message(
        f"Nothing measured fits in {label} at seq_len={seq_len}: the smallest peak, {row_name(smallest)}, is "
        f"{peak} MiB, {over} MiB over.",
        key="recommend.nothing_fits",
        params={"budget": label, "seq_len": seq_len, "setting": smallest.setting, "peak_mib": peak, "over_mib": over},
    )


def what_would_fit(rows: Sequence[SweepRow], measured: list[SweepRow], budget: int, seq_len: int) -> list[Message]:
    advice: list[Message] = []
    shorter = sorted(
        (
            row
            for row in rows
            if row.seq_len < seq_len and row.status == "ok" and row.peak_bytes is not None and row.peak_bytes <= budget
        ),
        # The longest length first, then the fastest; a row the sweep stopped before timing last.
        key=lambda row: (-row.seq_len, row.step_s is None, row.step_s or 0.0),
    )
    if shorter:
        row = shorter[0]
        advice.append(
            Message(
                f"A shorter sequence, measured: at seq_len={row.seq_len}, {row_name(row)} fits (peak "
                f"{mib(known_peak(row))} MiB).",
                key="advice.shorter_measured",
                params={"seq_len": row.seq_len, "setting": row.setting, "peak_mib": mib(known_peak(row))},
            )
        )
    if not measured:
        return [
            *advice,
            Message("A shorter sequence or a smaller batch; measure again.", key="advice.shorter_or_smaller"),
        ]
    smallest = min(measured, key=known_peak)
    # Parameters and their gradients do not shrink with the tokens; the activations do, about linearly
    # (SDPA keeps no seq x seq scores). The baseline stands for the parameters, their gradients for as much again.
    fixed = 2 * known(smallest.baseline_bytes, smallest, "measured baseline")
    scaling = known_peak(smallest) - fixed
    if budget <= fixed or scaling <= 0:
        advice.append(
            Message(
                f"No shorter sequence or smaller batch helps: the parameters and their gradients alone (about "
                f"{mib(fixed)} MiB) do not leave room in the budget. Use a smaller model, a 16-bit dtype, or shard "
                "the model (FSDP).",
                key="advice.fixed_too_big",
                params={"fixed_mib": mib(fixed)},
            )
        )
    else:
        share = (budget - fixed) / scaling
        tokens = int(seq_len * share)
        if not shorter and tokens >= 1:
            advice.append(
                Message(
                    f"A shorter sequence (estimate: activations grow with the tokens): about seq_len={tokens} with "
                    f"{row_name(smallest)}; measure it to be sure.",
                    key="advice.shorter_estimate",
                    params={"seq_len": tokens, "setting": smallest.setting},
                )
            )
        batch = smallest.result.spec.batch_size if smallest.result is not None else 1
        if batch > 1 and int(batch * share) >= 1:
            advice.append(
                Message(
                    f"A smaller batch (estimate): about batch_size={int(batch * share)} with {row_name(smallest)}.",
                    key="advice.smaller_batch",
                    params={"batch": int(batch * share), "setting": smallest.setting},
                )
            )
    cp_rows = [row for row in measured if row.every_n_layers is not None and not row.offload and row.offload_bytes]
    if cp_rows and not any(row.offload for row in measured):
        row = min(cp_rows, key=lambda row: known_peak(row) - row.offload_bytes)
        lower = known_peak(row) - row.offload_bytes
        fits = lower <= budget
        advice.append(
            Message(
                f"Offload (CUDA only, not measured here): {row_name(row)} with offload=True would move "
                f"{mib(row.offload_bytes)} MiB of checkpointed inputs to host memory; the peak drops by at most that, "
                f"to about {mib(lower)} MiB ({'which would fit' if fits else 'still over'}; estimate: it drops less "
                "if the peak is in the backward, where the inputs are back on the device).",
                key="advice.offload_would_fit" if fits else "advice.offload_still_over",
                params={"setting": row.setting, "moved_mib": mib(row.offload_bytes), "peak_mib": mib(lower)},
            )
        )
    return advice
