"""A real Trainer QLoRA step (a 4-bit base loaded by transformers, peft's prepare_model_for_kbit_training, LoRA,
bf16, activation checkpointing, gradient accumulation 2), tracked by torch's own MemTracker with the 4-bit states
counted, peaks as `ckptlab run --training-args F --quantization-config Q --lora-rank R` and as its simulation,
folded (tiny-llama deepened to 8 layers: the fewest that fold every layer checkpointed)."""

from __future__ import annotations

import contextlib
import io
import json
import warnings

import pytest
import torch
from torch.distributed._tools.mem_tracker import MemTracker

import ckptlab
from ckptlab.cli import main
from ckptlab.model.quantize import quant_state_tensors

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them

SEQ, RANK, LAYERS = 32, 8, 8
QUANTIZATION = {
    "load_in_4bit": True,
    "bnb_4bit_quant_type": "nf4",
    "bnb_4bit_use_double_quant": True,
    "bnb_4bit_compute_dtype": "float32",
}
TRAINING_ARGS = {
    "per_device_train_batch_size": 1,
    "gradient_accumulation_steps": 2,
    "bf16": True,
    "activation_checkpointing": True,
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class _Untracked:
    """A hook handle for a frozen parameter: torch refuses a gradient hook on it (MemTracker would register one)."""

    def remove(self) -> None:
        pass


def _tracker_callback(step: int):
    from transformers import TrainerCallback

    class Track(TrainerCallback):
        """MemTracker around Trainer's step ``step`` (a steady state: the optimizer's state exists)."""

        peak = 0

        def on_step_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
            if state.global_step + 1 != step:
                return
            self.tracker = MemTracker()
            for param in model.parameters():
                if not param.requires_grad:
                    self.tracker._param_to_grad_hook_handles[param] = (_Untracked(), _Untracked())
            self.tracker.track_external(model, optimizer, *quant_state_tensors(model))  # the 4-bit states: "Other"
            self.tracker.__enter__()

        def on_substep_end(self, args, state, control, **kwargs):
            if hasattr(self, "tracker") and not self.peak:
                self.tracker.reset_mod_stats()  # the model runs again in this step (accumulation); the peak stays

        def on_step_end(self, args, state, control, **kwargs):
            if hasattr(self, "tracker") and not self.peak:
                self.tracker.__exit__(None, None, None)
                self.peak = max(self.tracker.get_tracker_snapshot("peak")[torch.device("cpu")].values())

    return Track()


def test_a_trainer_qlora_step_peaks_as_the_labs_run_and_its_folded_simulation(tmp_path, shallower):
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, Trainer, TrainingArguments

    deeper = shallower("tiny-llama", LAYERS)
    ckptlab.build_model(deeper)[0].save_pretrained(tmp_path / "model")  # random weights, quantized on loading
    config = BitsAndBytesConfig(**{**QUANTIZATION, "bnb_4bit_compute_dtype": torch.float32})
    model = AutoModelForCausalLM.from_pretrained(
        tmp_path / "model", quantization_config=config, device_map="cpu", dtype=torch.float32
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model = prepare_model_for_kbit_training(model)
    model = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=2 * RANK, lora_dropout=0.0, target_modules=TARGETS))
    track = _tracker_callback(step=2)
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        **TRAINING_ARGS,
    )
    generator = torch.Generator().manual_seed(0)
    rows = [torch.randint(model.config.vocab_size, (SEQ,), generator=generator) for _ in range(4)]
    data = [{"input_ids": ids, "labels": ids} for ids in rows]
    callback = ckptlab.CheckpointingCallback()  # its report, on step 1, says the base is 4-bit and how
    Trainer(model=model, args=args, train_dataset=data, callbacks=[track, callback]).train()
    (said,) = [fact for fact in callback.report.facts if fact.key == "trainer.quantized_base"]
    assert "bnb_4bit_quant_type='nf4', bnb_4bit_use_double_quant=True" in said.params["fields"]

    (tmp_path / "args.json").write_text(json.dumps(TRAINING_ARGS))
    (tmp_path / "q.json").write_text(json.dumps(QUANTIZATION))
    flags = ["--training-args", str(tmp_path / "args.json"), "--quantization-config", str(tmp_path / "q.json")]
    flags += ["--lora-rank", str(RANK), "--model", deeper, "--seq-len", str(SEQ), "--json", "--device", "cpu"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["run", *flags, "--repeats", "1", "--warmup", "1", "--quiet"]) == 0
    lab = json.loads(out.getvalue())
    assert lab["spec"]["quantization"]["bnb_4bit_quant_type"] == "nf4" and lab["spec"]["mixed_precision"] == "bf16"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["simulate", *flags, "--dtype", "float32"]) == 0
    simulated = json.loads(out.getvalue())
    assert "note.extrapolated" in [fact["key"] for fact in simulated["facts"]]  # the fold, under accumulation
    # Stock MemTracker's module hooks keep each earlier micro-batch's embeddings' output and its .grad (float32) to
    # the step's end, which the allocator frees (issue 62; tests/step/test_memory_meters.py): the lab counts them freed.
    held_by_tracker = (TRAINING_ARGS["gradient_accumulation_steps"] - 1) * 2 * SEQ * lab["model"]["hidden_size"] * 4
    for memory in (lab["memory"], simulated["memory"]):
        assert memory["peak_bytes"] == pytest.approx(track.peak, rel=0.005)
        assert memory["peak_bytes"] == pytest.approx(track.peak - held_by_tracker, abs=64)
