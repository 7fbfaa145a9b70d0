"""The float32 logits' share of a peak: transformers' loss upcasts the whole logits, outside every layer."""

from __future__ import annotations

import pytest

from ckptlab import RunSpec, measure, run_report, simulate
from ckptlab.model.catalog import load_config
from ckptlab.results import MemoryResult, RunResult
from ckptlab.show.peak_words import logits_sentence

BATCH, SEQ, VOCAB = 2, 128, 32768  # a vocabulary this large makes the loss the peak of a 6-layer model
LOGITS = BATCH * SEQ * VOCAB * 4  # one float32 tensor of the logits' size: 32 MiB


@pytest.fixture(scope="module")
def big_vocab(tmp_path_factory) -> str:
    """tiny-llama with a 32k vocabulary, as a local folder."""
    config, _, _ = load_config("tiny-llama")
    config.vocab_size = VOCAB
    folder = tmp_path_factory.mktemp("big-vocab")
    config.save_pretrained(folder)
    return str(folder)


def _spec(model: str, dtype: str) -> RunSpec:
    return RunSpec(
        model=model, seq_len=SEQ, batch_size=BATCH, every_n_layers=1, optimizer="none", dtype=dtype, repeats=1, warmup=0
    )


def _logits_in(memory: MemoryResult, kind: str) -> int | None:
    return next(point.region_peak_logits_bytes for point in memory.timeline if point.kind == kind)


def test_in_bf16_the_loss_sets_the_peak_and_the_field_counts_its_float32_logits(big_vocab):
    result = simulate(_spec(big_vocab, "bfloat16"))
    memory = result.memory
    # The loss's forward holds the float32 copy of the bf16 logits and cross-entropy's float32 log-softmax.
    assert _logits_in(memory, "loss") == 2 * LOGITS
    # Its backward: the log-softmax cross-entropy saved, its gradient, and the gradient of the float32 logits.
    assert memory.peak_where.kind == "backward" and memory.logits_set_the_peak
    assert memory.logits_bytes_at_peak == 3 * LOGITS == 100_663_296
    assert memory.logits_bytes_at_peak > 0.5 * memory.peak_bytes  # most of this peak: no checkpointing frees it
    report = run_report(result)
    assert "The loss sets this peak" in report and "use_liger_kernel=True" in report
    assert RunResult.from_dict(result.to_dict()).memory.logits_bytes_at_peak == 3 * LOGITS  # the JSON keeps it


@pytest.mark.slow  # a real step on a 32k vocabulary, about 8 s on 2 cores
def test_measured_on_the_cpu_the_logits_bytes_are_the_simulated_ones(big_vocab):
    """Float32 weights: the logits are float32 already (``.float()`` is no copy), the rest as in bf16."""
    measured, simulated = measure(_spec(big_vocab, "float32")).memory, simulate(_spec(big_vocab, "float32")).memory
    for kind, tensors in (("loss", 2), ("backward", 3)):
        assert _logits_in(measured, kind) == _logits_in(simulated, kind) == tensors * LOGITS, kind


def test_where_the_peak_is_elsewhere_nothing_is_said_of_the_logits():
    result = simulate(RunSpec(model="tiny-llama", seq_len=256))  # with AdamW: the peak comes after the loss
    assert result.memory.peak_where.kind not in ("loss", "backward") and not result.memory.logits_set_the_peak
    assert logits_sentence(result.memory) == "" and "The loss sets this peak" not in run_report(result)
