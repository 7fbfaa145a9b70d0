"""Simulation: the published offload table, exact extrapolation, agreement with measurement, no real memory."""

from __future__ import annotations

import resource
from dataclasses import replace

import pytest

from ckptlab import ModelLoadError, RunSpec, SpecError, simulate
from ckptlab.explore.reference import reproduce_pr48444
from ckptlab.model.catalog import load_config
from ckptlab.step.simulate import Reduction
from ckptlab.units import GIB, MIB
from tests.conftest import FAST

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them


def test_reproduces_the_published_offload_table():
    """transformers PR #48444 (README.md, "The published offload table"): freed exactly, plain and offload within 2% (they land to 0.1 MiB)."""
    for row in reproduce_pr48444():
        assert row.simulated_freed_bytes == row.formula_freed_bytes
        assert row.simulated_plain_bytes / MIB == pytest.approx(row.published_plain_mib, rel=0.02)
        assert row.simulated_offload_bytes / MIB == pytest.approx(row.published_offload_mib, rel=0.02)
        assert round(row.simulated_plain_bytes / MIB, 1) == row.published_plain_mib
        assert round(row.simulated_offload_bytes / MIB, 1) == row.published_offload_mib


def test_qwen3_8b_at_128k_keeps_36_gib_of_checkpointed_layer_inputs(tmp_path):
    """Qwen3-8B reaches 128k tokens with YaRN (factor 4 over 32k): a local config with those positions."""
    config, _, _ = load_config("qwen3-8b")
    config.max_position_embeddings = 131072
    config.save_pretrained(tmp_path)
    result = simulate(RunSpec(model=str(tmp_path), seq_len=131072, every_n_layers=1, offload=True))
    assert result.memory.offload_bytes == 36 * GIB == 36 * 131072 * 4096 * 2
    assert result.memory.host_offload_bytes == 36 * GIB


def test_an_8b_simulation_allocates_no_real_memory():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result = simulate(RunSpec(model="llama-3.1-8b", seq_len=8192, every_n_layers=1))
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    # bf16 parameters, the rotary buffer, and AdamW's state: two bf16 moments a parameter and a
    # float32 step counter per parameter tensor (32 layers x 9, embeddings, final norm, head).
    tensors = 32 * 9 + 3
    assert result.memory.optimizer_state_bytes == 4 * result.model.num_params + 4 * tensors
    assert result.memory.baseline_bytes == 2 * result.model.num_params + 512 + result.memory.optimizer_state_bytes
    assert result.memory.baseline_bytes > 14 * GIB
    assert grown < 1 * GIB  # while this process's peak resident memory barely moved
    assert result.provenance.kind == "simulated" and result.timing is None
    assert result.memory.breakdown_at_peak.keys() >= {"parameter", "gradient", "optimizer_state"}


# Each kind of plan once: off, one role, both roles with offload, one checkpointed layer among them (both roles without
# offload, and one role with it, are the replay's cases in tests/step/test_replay.py, against the same exact
# simulation). qwen3-0.6b cut to the fewest layers that fold each plan (Reduction.for_plan; its 28 cost more and
# prove the same folding): 8 where every layer after the first is alike (a unit of one layer: shallow copies of 3
# and 4 layers), 16 at every_n_layers=2 (a unit of two). Gradient accumulation repeats every event once per
# micro-batch: tiny-llama deepened to 8 layers (the fewest that fold a unit of one), 2 and 3 micro-batches.
@pytest.mark.parametrize(
    "model, layers, every_n_layers, offload, accumulation",
    [
        ("qwen3-0.6b", 8, None, False, 1),
        ("qwen3-0.6b", 8, 1, False, 1),
        ("qwen3-0.6b", 16, 2, True, 1),
        ("qwen3-0.6b", 8, 8, False, 1),
        ("tiny-llama", 8, 1, False, 2),
        ("tiny-llama", 8, None, False, 3),
    ],
)
def test_the_fast_path_gives_the_bytes_of_simulating_every_layer(
    shallower, model, layers, every_n_layers, offload, accumulation
):
    """The fast path simulates two shallow copies and extrapolates."""
    spec = RunSpec(
        model=shallower(model, layers),
        seq_len=256 if model == "qwen3-0.6b" else 64,
        every_n_layers=every_n_layers,
        offload=offload,
        gradient_accumulation_steps=accumulation,
    )
    assert Reduction.for_plan(layers, every_n_layers) is not None
    fast, full = simulate(spec), simulate(spec, fast=False)
    assert any(note.key == "note.extrapolated" for note in fast.notes)
    for name in (
        "baseline_bytes",
        "after_forward_bytes",
        "peak_bytes",
        "peak_where",
        "breakdown_after_forward",
        "breakdown_at_peak",
        "offload_bytes",
        "host_offload_bytes",
        "optimizer_state_bytes",
        "timeline",
    ):
        assert getattr(fast.memory, name) == getattr(full.memory, name), name
    assert fast.layers == full.layers
    assert fast.work == full.work is not None  # every op's FLOPs and bytes, by phase and layer (opcount)


# Every plan on the dense decoder; each other structure (GPT-2's Conv1D, BERT's encoder, MoE) off and at one role, its
# both-roles plan (every_n_layers=2) being in tests/step/test_training.py per memory category. tiny-qwen3 is a dense
# decoder as tiny-llama is.
MATCHED = {"tiny-llama": (None, 1, 2, 3), "tiny-gpt2": (None, 1), "tiny-bert": (None, 1), "tiny-qwen3-moe": (None, 1)}


@pytest.mark.parametrize("model", MATCHED)
def test_simulation_matches_a_measured_cpu_run(model, measured):
    """Same spec, float32 as measured on the CPU: resident and peak within 3% (they agree to the byte)."""
    for every_n_layers in MATCHED[model]:
        run = measured(model=model, seq_len=64, every_n_layers=every_n_layers)
        sim = simulate(replace(run.spec, dtype="float32"))
        assert sim.memory.after_forward_bytes == pytest.approx(run.memory.after_forward_bytes, rel=0.03)
        assert sim.memory.peak_bytes == pytest.approx(run.memory.peak_bytes, rel=0.03)
        assert sim.memory.baseline_bytes == run.memory.baseline_bytes
        assert [layer.observed for layer in sim.layers] == [layer.observed for layer in run.layers]
        assert sim.memory.peak_where.description == run.memory.peak_where.description


def test_simulated_offload_moves_layer_inputs_to_host(shallower):
    """offload frees layers x seq x hidden x bytes of device memory and holds it on the host (tiny-qwen3 on 3 of its
    8 layers: the first, one between and the last, simulated whole where 8 took the fold's 3 and 4)."""
    layers, seq_len, hidden = 3, 512, load_config("tiny-qwen3")[0].hidden_size
    spec = RunSpec(model=shallower("tiny-qwen3", layers), seq_len=seq_len, every_n_layers=1, dtype="bfloat16")
    plain, offloaded = simulate(spec), simulate(replace(spec, offload=True))
    layer_inputs = layers * seq_len * hidden * 2  # bfloat16
    assert plain.memory.after_forward_bytes - offloaded.memory.after_forward_bytes == layer_inputs
    assert offloaded.memory.host_offload_bytes == offloaded.memory.offload_bytes == layer_inputs
    assert plain.memory.host_offload_bytes == 0
    assert offloaded.memory.offload_applied and any(note.key == "note.offload_simulated" for note in offloaded.notes)


@pytest.mark.parametrize(
    "changes, error, words",
    [
        ({"every_n_layers": 0}, SpecError, "every_n_layers=0"),
        ({"seq_len": 4096}, SpecError, "seq_len=4096"),
        ({"batch_size": 0}, SpecError, "batch_size=0"),
        ({"model": "no-such-model"}, ModelLoadError, "no-such-model"),
    ],
)
def test_bad_input_is_refused_as_for_a_measured_run(changes, error, words):
    with pytest.raises(error, match=words):
        simulate(replace(FAST, **changes))


@pytest.mark.parametrize("model, dropout", [("tiny-gpt2", "attn_pdrop"), ("tiny-bert", "attention_probs_dropout_prob")])
def test_attention_dropout_takes_the_cuda_kernels_path_in_a_simulation(tmp_path, monkeypatch, model, dropout):
    """With attention dropout, fake CPU tensors would take SDPA's math kernel and keep batch x heads x seq^2
    probabilities; CUDA's kernels keep what they keep without dropout, and so does the simulation."""
    import ckptlab.step.simulate as simulation

    def resident(p: float) -> tuple[int, list[int]]:
        config, _, _ = load_config(model)
        setattr(config, dropout, p)
        folder = tmp_path / f"{model}-{p}"
        config.save_pretrained(folder)
        memory = simulate(RunSpec(model=str(folder), seq_len=512, every_n_layers=None, optimizer="none"))
        return memory.memory.after_forward_bytes, [layer.saved_bytes for layer in memory.layers]

    assert resident(0.1) == resident(0.0)
    monkeypatch.setattr(simulation, "_sdpa_as_on_cuda", simulation._REAL_SDPA)  # the CPU's own path, for contrast
    config, _, _ = load_config(model)
    probabilities = config.num_attention_heads * 512 * 512 * 4  # batch 1, float32
    assert resident(0.1)[0] - resident(0.0)[0] >= config.num_hidden_layers * probabilities


def test_a_mask_the_model_makes_of_ones_is_left_out_as_in_a_real_run(tmp_path):
    """BioGPT makes its padding mask with torch.ones when given none: a real run reads it, finds no padding and builds
    no mask; the simulation cannot read a fake one and kept a 32 x 32 mask (1,024 bytes) until told the batch's answer."""
    from transformers import AutoConfig

    from ckptlab import measure

    config = AutoConfig.for_model(
        "biogpt", hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=128
    )
    config.save_pretrained(tmp_path)
    spec = RunSpec(model=str(tmp_path), seq_len=32, every_n_layers=1, device="cpu", dtype="float32", optimizer="none")
    spec = replace(spec, repeats=1, warmup=0)
    assert simulate(spec).memory.after_forward_bytes == measure(spec, timed=False).memory.after_forward_bytes


def test_a_simulation_leaves_the_process_as_it_was(shallower):
    """The simulation's stand-ins (dropout, save_on_cpu, masking_utils' checks, the SDPA entry, trunc_normal_,
    DTensor's fake-mode lookup) are installed while a simulation runs, kept while another one in the process still
    does (the app's threads), and put back when the last one ends: a real step after them is bit-equal to one before."""
    import threading

    import torch
    import torch.distributed.tensor._sharding_prop as dtensor_sharding_prop
    import transformers.modeling_utils
    from transformers import initialization
    from transformers import masking_utils as masking
    from transformers.modeling_utils import AttentionInterface

    import ckptlab.step.simulate as simulation
    from ckptlab import build_model

    # Each place the simulation replaces, and its stand-in there.
    places = [
        (torch.nn.functional, "dropout", simulation._dropout_as_on_cuda),
        (transformers.modeling_utils, "save_on_cpu", simulation._SimulatedSaveOnCpu),
        (masking, "find_packed_sequence_indices", simulation._unpacked_when_simulating),
        (masking, "_ignore_causal_mask_sdpa", simulation._ignore_causal_when_simulating),
        (masking, "_ignore_bidirectional_mask_sdpa", simulation._ignore_bidirectional_when_simulating),
        (AttentionInterface._global_mapping, "sdpa", simulation._sdpa_as_on_cuda),
        (initialization.TORCH_INIT_FUNCTIONS, "trunc_normal_", simulation._trunc_normal_on_fake),
        (dtensor_sharding_prop, "detect_fake_mode", simulation._propagation_fake_mode),
    ]

    def placed() -> list:
        return [place[name] if isinstance(place, dict) else getattr(place, name) for place, name, _ in places]

    def loss_and_grads() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model, _ = build_model(folder, seed=0, config_overrides={"attention_dropout": 0.2})
        model.train()
        torch.manual_seed(0)  # the dropout's draws
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss.detach(), {name: param.grad for name, param in model.named_parameters()}

    folder = shallower("tiny-llama", 2)
    ids = torch.randint(0, 4096, (1, 32), generator=torch.Generator().manual_seed(1))
    stand_ins = [stand_in for _, _, stand_in in places]
    originals = placed()
    assert not any(original is stand_in for original, stand_in in zip(originals, stand_ins, strict=True))
    loss, grads = loss_and_grads()

    # Another simulation of the process (a thread of the app) runs through the whole of this one.
    entered, leave = threading.Event(), threading.Event()

    def other_simulation() -> None:
        with simulation.simulating(simulation.HostLedger()):
            entered.set()
            leave.wait()

    other = threading.Thread(target=other_simulation)
    other.start()
    entered.wait()
    simulate(RunSpec(model=folder, seq_len=32, every_n_layers=1, dtype="float32", optimizer="none"))
    assert all(now is stand_in for now, stand_in in zip(placed(), stand_ins, strict=True))  # the other still runs
    leave.set()
    other.join()

    assert all(now is original for now, original in zip(placed(), originals, strict=True))
    loss_after, grads_after = loss_and_grads()
    assert torch.equal(loss_after, loss)
    assert grads_after.keys() == grads.keys()
    assert all(torch.equal(grads_after[name], grads[name]) for name in grads)
