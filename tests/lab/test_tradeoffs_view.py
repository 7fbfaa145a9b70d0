"""The Trade-offs page's words and numbers (ckptlab.lab.tradeoffs_view) that the page used to work out itself."""

from __future__ import annotations

import pytest

from ckptlab.explore.recommend import recommend
from ckptlab.explore.sweep import sweep
from ckptlab.lab import tradeoffs_view
from ckptlab.show import i18n
from ckptlab.spec import RunSpec
from ckptlab.units import MIB, mib

lang = "en"  # the tests read the English words
VALUES = {
    "tradeoffs_model": "tiny-gpt2",
    "tradeoffs_seq": [64, 32],
    "tradeoffs_choose_n": False,
    "tradeoffs_n": [4, 1],
    "tradeoffs_offload": "no",
    "tradeoffs_batch": 1,
    "tradeoffs_dtype": "auto",
    "tradeoffs_repeats": 1,
    "tradeoffs_warmup": 0,
    "tradeoffs_optimizer": "none",
    "tradeoffs_lora": False,
    "tradeoffs_lora_rank": 8,
    "tradeoffs_lora_targets": ["c_attn"],
}


@pytest.fixture(scope="module")
def result():
    return sweep(
        tradeoffs_view.spec_from_widgets(
            {**VALUES, "tradeoffs_seq": [32], "tradeoffs_choose_n": True, "tradeoffs_n": [1]}, []
        )
    )


def test_the_sweep_spec_follows_the_widgets():
    spec = tradeoffs_view.spec_from_widgets(VALUES, ["c_attn", "c_proj"])
    assert spec.seq_lens == (32, 64) and spec.every_n_layers is None  # every n unless chosen
    assert (spec.lora_rank, spec.lora_targets) == (None, None)
    chosen = tradeoffs_view.spec_from_widgets(
        {**VALUES, "tradeoffs_choose_n": True, "tradeoffs_lora": True}, ["c_attn", "c_proj"]
    )
    assert chosen.every_n_layers == (1, 4) and (chosen.lora_rank, chosen.lora_targets) == (8, ("c_attn",))
    no_targets = tradeoffs_view.spec_from_widgets({**VALUES, "tradeoffs_lora": True}, [])
    assert no_targets.lora_rank is None  # a model without targets: no LoRA
    assert tradeoffs_view.longest(chosen) == RunSpec(model="tiny-gpt2", seq_len=64, batch_size=1, device="auto")


def test_summary_budget_and_recommendation_words(result):
    line = tradeoffs_view.summary(result, "en")
    assert result.model in line and f"{len(result.rows)}" in line
    peaks = sorted(row.peak_bytes for row in result.rows_at(32) if row.peak_bytes is not None)
    median = peaks[len(peaks) // 2]
    budget = tradeoffs_view.default_budget_mib(result, 32)
    # Whole MiB, 5% above the median peak: the median row fits the first budget with room to spare (the bare
    # peak rounded up left "0.1 MiB to spare"; rounded to the nearest, equal peaks fit nowhere).
    headroom = median * (1 + tradeoffs_view.BUDGET_HEADROOM)
    assert budget * MIB >= headroom and budget - headroom / MIB < 1 and budget == int(budget)
    assert tradeoffs_view.default_budget_mib(result, 999) == tradeoffs_view.DEFAULT_BUDGET_MIB
    recommendation = recommend(result.rows, 10**12, seq_len=32)
    words = tradeoffs_view.recommended(recommendation, 32, lang)
    assert recommendation.row.setting in words and mib(recommendation.row.peak_bytes) in words
    assert tradeoffs_view.file_stem(result) == "ckptlab-sweep-tiny-gpt2"


def test_the_running_sweeps_progress_line_is_said_in_the_pages_language():
    from ckptlab.fact import Fact

    line = Fact("progress.sweep_done")
    assert tradeoffs_view.progress_words(line, False, "pt-BR") == "varredura concluída"
    assert tradeoffs_view.progress_words(line, False, "en") == "sweep done"
    assert tradeoffs_view.progress_words(line, True, "ja") == i18n.t("tradeoffs.stopping", "ja")


def test_the_sweeps_estimate_counts_each_row_once_and_says_when_it_is_measured(monkeypatch):
    from ckptlab.lab import run as labrun
    from ckptlab.lab.run import Pace

    pace = Pace()
    monkeypatch.setattr(tradeoffs_view, "PACE", pace)
    spec = tradeoffs_view.spec_from_widgets({**VALUES, "tradeoffs_choose_n": True, "tradeoffs_n": [1]}, [])
    predicted, measured = tradeoffs_view.sweep_estimate(spec)
    rows = [
        spec.run_spec(seq, n, offload, selective=policy, attn_implementation=attention)
        for seq, n, offload, policy, attention in tradeoffs_view.plan_sweep(spec).rows
    ]
    one_run = [labrun.run_estimate(row, alone=True) for row in rows]  # each row once, without a Run's reference
    assert not measured
    assert predicted == pytest.approx(sum(one_run))
    pace.record(rows[-1], 3 * labrun.run_estimate(rows[-1]))  # this server's runs took three times that
    assert tradeoffs_view.sweep_estimate(spec) == (pytest.approx(3 * predicted), True)


def test_a_sweep_whose_longest_row_its_turns_limit_would_stop_is_refused_before_it_starts():
    """Each row of a sweep is one run in its own turn: a row whose estimate (the roofline's steps) is past the run
    limit is refused before the sweep starts, with the line that runs it in a terminal; one that fits starts."""
    from ckptlab.lab.server import NotAllowedError, ServerPolicy

    spec = tradeoffs_view.spec_from_widgets({**VALUES, "tradeoffs_choose_n": True, "tradeoffs_n": [1]}, [])
    longest = max(tradeoffs_view.PACE.estimate(row, alone=True)[0] or 0 for row in tradeoffs_view.sweep_rows(spec))
    tradeoffs_view.check_rows_time(spec, ServerPolicy(run_limit_s=longest * 1.01))
    with pytest.raises(NotAllowedError) as refused:
        tradeoffs_view.check_rows_time(spec, ServerPolicy(run_limit_s=longest * 0.99))
    assert refused.value.key == "server.run_too_long"
    assert refused.value.params["command"].startswith(f"python -m ckptlab run --model {spec.model}")
