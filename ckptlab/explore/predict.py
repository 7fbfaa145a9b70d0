"""Predicted memory and recompute for every checkpointing setting, from the config alone.

The model of a step (docs/measuring.md, "What is measured, and how"): a checkpointed (CP) layer keeps only its input,
``batch x seq x hidden x bytes``; a kept layer holds all its activations; the backward
rebuilds one CP layer's activations at a time while it reruns it; and the rerun costs the
checkpointed layers' share of the forward's work. What is resident after the forward is
then::

    outside + sum(input of each CP layer) + sum(activations of each kept layer)

where ``outside`` is what the embeddings, the final norm, the head and the loss keep.
Two sources give the per-layer activations and ``outside``, and both are shown beside the
measurement with their error:

``"formula"``: Korthikanti et al. 2022, adapted term by term to the architectures
transformers builds (:mod:`.formula`). It counts a full fine-tune's activations.

``"calibrated"`` (:mod:`.calibration`): one measured run with checkpointing off at the same shape gives each
layer's saved bytes (``LayerResult.saved_bytes``) and ``outside`` (resident after the
forward minus the layers' saved bytes). Tensors that every layer shares (the rotary
tables) are first saved by L1 and stay alive under any setting, so L1's excess over the
other layers is moved to ``outside``.

Time: the rerun repeats the checkpointed layers' share of the forward's matmul FLOPs. The
formula turns it into a step-time ratio ``1 + share/3`` (a backward costs two forwards);
the calibrated prediction adds ``share x`` the measured forward time to the measured step.

Training: parameters, gradients, the optimizer's state and the step's peak are arithmetic
on the model built on the meta device (:mod:`.predict_training`): exact for every
optimizer and for LoRA.

Every :class:`Prediction` carries provenance kind ``"predicted"``; none is a measurement.

What a reader must know about a prediction's numbers (an MoE's experts left out, LoRA's approximate activations,
the backward's estimated peak) are facts (``Prediction.facts``, :class:`~ckptlab.fact.Fact`), worded at the edge
by :func:`ckptlab.show.i18n.say` in the page's language. ``Prediction.notes`` stays what it always was for the
Python API and the JSON (``to_dict``): the same facts as English sentences, worded from ``said.<key>``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

import torch
from transformers import PretrainedConfig

from ..errors import Option, SpecError, check_at_most, check_whole_number, expect_type
from ..fact import Fact, worded
from ..model.attention import EAGER, FLASH_ATTENTION_2
from ..model.folder_checks import MAX_LAYERS
from ..model.plan import planned_roles, rerun_roles, validate_every_n_layers
from ..model.presets import DEFAULT_PRESET
from ..model.quantize import Quantization
from ..results import Provenance, RunResult
from ..spec import LOW_BIT_PACKAGES, RunSpec
from ..step.preflight import resolve_dtype, simulated_device_type_of
from ..step.provenance import made_now
from .calibration import Calibration, calibrate
from .formula import (
    EXPERTS_COUNTED_NOTE,
    FLOAT32,
    FORMULA_SOURCE,
    Architecture,
    architecture,
    backward_temp_bytes,
    eager_mask_bytes,
    element_bytes,
    embeddings_backward_bytes,
    experts_not_counted_note,
    forward_flops,
    layer_activation_bytes,
    loss_backward_bytes,
    outside_bytes,
    persistent_outside_bytes,
    second_half_bytes,
    selective_kept_bytes,
    selective_skipped_flops,
)
from .predict_training import LORA_ACTIVATIONS_NOTE, BackwardMoments, PeakPhase, TrainingBytes, training_bytes

Method = Literal["formula", "calibrated"]
BACKWARD_PEAK_NOTE = Fact("predict.backward_peak")  # the peak is the backward's: an estimate, not exact arithmetic


@dataclass(frozen=True)
class Prediction:
    """What one setting is predicted to cost. Never a measurement: see ``provenance``."""

    method: Method  # "formula" (config alone) or "calibrated" (from one measured run with checkpointing off)
    seq_len: int  # tokens per sequence
    batch_size: int  # sequences per step
    every_n_layers: int | None  # None: checkpointing off
    offload: bool  # the checkpointed inputs live in host memory (CUDA only)
    cp_layers: int  # how many layers the setting checkpoints
    resident_bytes: int  # activations resident after the forward (above the baseline)
    layer_bytes: int  # one kept layer's activations (the largest): what the backward rebuilds during a rerun
    rerun_extra_bytes: int  # added on top while the backward reruns one CP layer (0 with checkpointing off)
    offload_bytes: int  # inputs of the CP layers: moved to host with offload on CUDA
    recompute_fraction: float  # the rerun's share of the forward's FLOPs
    step_ratio: float  # predicted step time over checkpointing off
    step_s: float | None  # predicted step time; None without a measured step to scale
    provenance: Provenance  # kind "predicted", always
    optimizer: str = "adamw"  # as RunSpec.optimizer
    lora_rank: int | None = None  # as RunSpec.lora_rank; None: full fine-tune
    # The training terms (predict_training): exact arithmetic; None when predicted from an Architecture alone.
    parameter_bytes: int | None = None  # every parameter on the device (LoRA: the base and the adapters)
    buffer_bytes: int | None = None  # the model's buffers
    gradient_bytes: int | None = None  # gradients of the trained parameters (LoRA: the adapters only)
    optimizer_state_bytes: int | None = None  # the optimizer's moments and step counters (predict_training)
    optimizer_temp_bytes: int | None = None  # held during optimizer.step() only (none fused; foreach: a copy)
    peak_bytes: int | None = None  # the step's predicted peak, total (parameters included)
    peak_phase: PeakPhase | None = None  # "optimizer" (exact) or "backward" (an estimate, see predict_training)
    activations_approximate: bool = False  # True: the formula's full fine-tune activations stand in for LoRA's
    experts: int = 0  # routed experts per MoE layer of the architecture (0: dense)
    experts_counted: bool = True  # False: an MoE whose experts' activations the formula leaves out (see facts)
    facts: tuple[Fact, ...] = ()  # what a reader must know about these numbers (worded by i18n.say at the edge)
    selective: str = "none"  # the selective policy of the CP layers (formula.COUNTED_POLICIES)
    kept_bytes: int = 0  # what that policy keeps in all CP layers (in resident_bytes; stays on the device with offload)

    @property
    def label(self) -> str:
        return f"predicted ({self.method})"

    @property
    def notes(self) -> tuple[str, ...]:
        """The facts in English, as a prediction's notes always read (the Python API's and the JSON's)."""
        return tuple(worded(fact) for fact in self.facts)

    def to_dict(self) -> dict[str, Any]:
        """Every field; ``notes`` in English where it always was, and the same notes typed under ``facts``."""
        data: dict[str, Any] = {}
        for name, value in asdict(self).items():
            if name == "facts":
                data["notes"] = self.notes
            data[name] = value
        data["provenance"]["label"] = self.provenance.label
        data["facts"] = [fact.to_dict() for fact in self.facts]
        return data


def settings_for(num_layers: int, every_n_layers: Iterable[int] | None = None) -> list[int]:
    """The distinct every_n_layers values to try: 1..num_layers by default, duplicates of a plan dropped.

    Values at or above the layer count all checkpoint only the first layer; only the first
    of them is kept.
    """
    values = list(range(1, num_layers + 1)) if every_n_layers is None else list(every_n_layers)
    first_of_plan: dict[tuple[str, ...], int] = {}
    for value in values:
        validate_every_n_layers(value)
        first_of_plan.setdefault(tuple(planned_roles(num_layers, value)), value)
    return list(first_of_plan.values())


def predict(
    model: str | PretrainedConfig | Architecture,
    *,
    seq_len: int,
    batch_size: int = 1,
    dtype: str = "auto",
    device: str = "auto",
    every_n_layers: Sequence[int] | None = None,
    offload: Sequence[bool] = (False,),
    calibration: RunResult | Calibration | None = None,
    num_layers: int | None = None,
    optimizer: str = "adamw",
    lora_rank: int | None = None,
    lora_targets: Sequence[str] | None = None,
    selective: str = "none",
    mixed_precision: str = "none",
    attn_implementation: str = "sdpa",
    quantization: Quantization | Mapping[str, Any] | None = None,
) -> list[Prediction]:
    """Predicted resident activations, rerun cost and step time of each setting.

    Args:
        model: a preset name, a local directory, a transformers config, or its :func:`architecture`.
        seq_len, batch_size: the shape of the step.
        dtype, device: as in :class:`~ckptlab.RunSpec`; they set the bytes per element. "auto" is read as
            :func:`~ckptlab.simulate` reads it (``step.preflight.simulated_device_type_of``): a CUDA step, in
            bfloat16 unless mixed precision asks for float32 weights, on any machine; name "cpu" for the CPU.
        every_n_layers: the settings to predict (default: 1 .. layers); checkpointing off is always included.
        offload: for each setting, with and/or without offload (offload rows move the CP inputs off the device).
        calibration: a measured run with checkpointing off at the same shape (or its
            :func:`calibrate`); adds the ``"calibrated"`` predictions.
        num_layers: the layer count, when ``model`` is a config (else read from the catalog).
        optimizer, lora_rank, lora_targets: as in :class:`~ckptlab.RunSpec`: they set the
            parameters, gradients, optimizer state and the peak (:mod:`.predict_training`).
            With LoRA the formula's activations are a full fine-tune's
            (``activations_approximate``); the calibrated ones are the run's own.
        selective: the selective policy of the CP layers ("none", "attention" or "matmuls"): each CP
            layer keeps the policy's outputs (:func:`~.formula.selective_kept_bytes`) and its rerun
            skips their FLOPs; checkpointing off is unchanged.
        mixed_precision: as in :class:`~ckptlab.RunSpec`: "bf16" or "fp16" computes in 16 bits over float32
            master weights ('auto' dtype is then float32, as a run resolves it), so the activations are 16-bit
            and the parameters, gradients and optimizer state float32.
        attn_implementation: as in :class:`~ckptlab.RunSpec`: "eager" adds each kept layer's ``a*s^2`` softmax
            probabilities (:func:`~.formula.eager_scores_bytes`) and, while any layer is checkpointed, its
            float mask once (:func:`~.formula.eager_mask_bytes`); "flash_attention_2" keeps what SDPA keeps.
        quantization: as in :class:`~ckptlab.RunSpec` (a 4-bit base; needs ``lora_rank``): the parameters are the
            base as bitsandbytes stores it (:func:`~.predict_training.training_bytes`), counted on the model the
            simulation builds; the activations stay the formula's (LoRA's approximation).

    Returns:
        The ``"formula"`` predictions (off first, then each setting), then the
        ``"calibrated"`` ones in the same order when a calibration is given. From an
        :class:`Architecture` alone the training terms and the peak are None (nothing to count).

    Raises:
        SpecError: bad shape, setting, optimizer or LoRA, or a calibration of another shape or spec.
    """
    example = "ckptlab.predict('tiny-llama', seq_len=1024)"
    expect_type("ckptlab.predict", "model", model, (str, os.PathLike, PretrainedConfig, Architecture), example)
    if isinstance(every_n_layers, int) and not isinstance(every_n_layers, bool):
        every_n_layers = (every_n_layers,)  # one setting, as RunSpec takes it
    if isinstance(offload, bool):
        offload = (offload,)
    every_example = "ckptlab.predict('tiny-llama', seq_len=1024, every_n_layers=[1, 2])"
    if every_n_layers is not None:
        expect_type("ckptlab.predict", "every_n_layers", every_n_layers, (list, tuple, range), every_example)
        check_at_most("len(every_n_layers)", len(every_n_layers), MAX_LAYERS, Fact("bound.layers"))
    expect_type("ckptlab.predict", "offload", offload, (list, tuple), "ckptlab.predict(..., offload=[False, True])")
    for flag in offload:
        expect_type("ckptlab.predict", "each offload", flag, bool, "ckptlab.predict(..., offload=[False, True])")
    if num_layers is not None:
        check_whole_number("num_layers", num_layers)
        check_at_most("num_layers", num_layers, MAX_LAYERS, Fact("bound.layers"))
    # The shape, dtype, device, optimizer, LoRA and mixed precision checked as a run's are: RunSpec's checks are the
    # one home of these bounds (16,777,216 tokens a step among them). The model is checked above (a config too).
    checked = RunSpec(
        model=os.fspath(model) if isinstance(model, (str, os.PathLike)) else DEFAULT_PRESET,
        seq_len=seq_len,
        batch_size=batch_size,
        dtype=dtype,
        device=device,
        # A low-bit optimizer's state is predicted without its package (RunSpec refuses to run one without it).
        optimizer="adamw" if optimizer in LOW_BIT_PACKAGES else optimizer,
        lora_rank=lora_rank,
        lora_targets=None if lora_targets is None else tuple(lora_targets),
        selective=selective,
        mixed_precision=mixed_precision,
        # flash_attention_2 is predicted without its package (it keeps what SDPA's flash kernel keeps).
        attn_implementation="sdpa" if attn_implementation == FLASH_ATTENTION_2 else attn_implementation,
        quantization=quantization,  # type: ignore[arg-type]  # a mapping is read as one (RunSpec.__post_init__)
    )
    checked.validate()
    arch = architecture(model, num_layers)
    # 'auto' read as a simulation reads it (a CUDA step in bf16 unless the device is named): a prediction answers
    # for the same GPU, so the same call of both with their defaults counts the same step.
    device_type = simulated_device_type_of(device)
    weights_dtype = resolve_dtype(dtype, torch.device(device_type), mixed_precision)
    element = element_bytes(dtype, device, mixed_precision)
    training = None
    if not isinstance(model, Architecture):
        training = training_bytes(
            model,
            weights_dtype,
            optimizer=optimizer,
            lora_rank=lora_rank,
            lora_targets=lora_targets,
            device=device_type,
            quantization=checked.quantization,
        )
    settings: list[tuple[int | None, bool]] = [(None, False)]
    for n in settings_for(arch.num_layers, every_n_layers):
        settings += [(n, flag) for flag in dict.fromkeys(offload)]

    cal = None
    if calibration is not None:
        cal = calibrate(calibration) if isinstance(calibration, RunResult) else calibration
        if (cal.seq_len, cal.batch_size) != (seq_len, batch_size) or len(cal.layer_bytes) != arch.num_layers:
            raise SpecError(
                key="api.calibration_shape",
                cal_seq=Option("seq_len", cal.seq_len),
                cal_batch=Option("batch_size", cal.batch_size),
                cal_layers=len(cal.layer_bytes),
                seq=Option("seq_len", seq_len),
                batch=Option("batch_size", batch_size),
                layers=arch.num_layers,
            )
        asked = (optimizer, lora_rank, tuple(lora_targets) if lora_targets else None)
        if (cal.optimizer, cal.lora_rank, cal.lora_targets) != asked:
            raise SpecError(
                key="api.calibration_spec",
                cal_optimizer=Option("optimizer", cal.optimizer),
                cal_rank=Option("lora_rank", cal.lora_rank),
                cal_targets=Option("lora_targets", cal.lora_targets),
                optimizer=Option("optimizer", optimizer),
                rank=Option("lora_rank", lora_rank),
                targets=Option("lora_targets", asked[2]),
            )
    causal = arch.family not in ("bert", "roberta")
    kept_per_layer = selective_kept_bytes(arch, selective, seq_len, batch_size, element, attn_implementation)
    skipped = selective_skipped_flops(arch, selective, seq_len, causal)
    layer = layer_activation_bytes(arch, seq_len, batch_size, element, attn_implementation)
    input_bytes = seq_len * batch_size * arch.hidden_size * element
    mask = eager_mask_bytes(seq_len, batch_size, weights_dtype.itemsize) if attn_implementation == EAGER else 0
    outside = outside_bytes(arch, seq_len, batch_size, element)
    # The backward's moments, from the formula for either source: what the loss's backward adds, what a layer's
    # backward frees before its attention's and the temporaries of both (a calibration measures none of them).
    backward = _Backward(
        loss_bytes=loss_backward_bytes(arch, seq_len, batch_size),
        freed_before_layers=outside - persistent_outside_bytes(arch, seq_len, batch_size, element),
        second_half_bytes=second_half_bytes(arch, seq_len, batch_size, element, attn_implementation),
        temp_bytes=backward_temp_bytes(arch, seq_len, batch_size, element, attn_implementation),
        end_bytes=embeddings_backward_bytes(arch, seq_len, batch_size, element),
    )
    formula = _Source(
        layer_bytes=[layer] * arch.num_layers,
        input_bytes=[input_bytes] * arch.num_layers,
        outside_bytes=outside,
        input_saved_as_is=not (arch.norm == "rms" and element != FLOAT32),
        provenance=made_now("predicted", FORMULA_SOURCE),
        # Seconds need a measured step to scale; the ratio itself comes from the config alone.
        step_s=None if cal is None else cal.step_s,
        selective=selective,
        kept_layer_bytes=kept_per_layer,
        skipped_flops=skipped,
        checkpointed_shared_bytes=mask,
        nested_in=arch.nested_in,
        backward=backward,
    )
    flops = forward_flops(arch, seq_len, causal=causal)
    predictions = [
        _with_training(*formula.predict("formula", n, flag, seq_len, batch_size, *flops), training, lora_rank)
        for n, flag in settings
    ]
    predictions = [_with_experts(prediction, arch) for prediction in predictions]
    if cal is not None:
        source = _Source(
            layer_bytes=cal.layer_bytes,
            input_bytes=cal.input_bytes,
            outside_bytes=cal.outside_bytes,
            input_saved_as_is=cal.input_saved_as_is,
            provenance=made_now("predicted", f"calibrated on one run with checkpointing off, {cal.source}"),
            forward_s=cal.forward_s,
            step_s=cal.step_s,
            selective=selective,
            kept_layer_bytes=kept_per_layer,
            skipped_flops=skipped,
            checkpointed_shared_bytes=mask,
            nested_in=arch.nested_in,
            backward=backward,
        )
        predictions += [
            _with_training(*source.predict("calibrated", n, flag, seq_len, batch_size, *flops), training, lora_rank)
            for n, flag in settings
        ]
    return predictions


def _held_by(index: int, nested_in: Sequence[int | None]) -> list[int]:
    """The layers inside layer ``index``, at any depth."""
    held: list[int] = []
    for child, parent in enumerate(nested_in):
        if parent is not None and (parent == index or parent in held):
            held.append(child)
    return held


def _with_experts(prediction: Prediction, arch: Architecture) -> Prediction:
    """The formula's prediction flagged and noted for an MoE architecture (unchanged for a dense one)."""
    if not arch.experts:
        return prediction
    if arch.experts_counted:
        return replace(prediction, experts=arch.experts, facts=prediction.facts + (EXPERTS_COUNTED_NOTE,))
    note = experts_not_counted_note(arch.family)
    return replace(prediction, experts=arch.experts, experts_counted=False, facts=prediction.facts + (note,))


def _with_training(
    prediction: Prediction, moments: BackwardMoments, training: TrainingBytes | None, lora_rank: int | None
) -> Prediction:
    """The prediction with the step's parameters, gradients, optimizer state and peak (the backward's from its
    ``moments``)."""
    approximate = lora_rank is not None and prediction.method == "formula"
    facts: tuple[Fact, ...] = (LORA_ACTIVATIONS_NOTE,) if approximate else ()
    if training is None:
        return replace(prediction, lora_rank=lora_rank, activations_approximate=approximate, facts=facts)
    peak, phase = training.peak(moments)
    if phase == "backward":
        facts += (BACKWARD_PEAK_NOTE,)
    return replace(
        prediction,
        optimizer=training.optimizer,
        lora_rank=lora_rank,
        parameter_bytes=training.parameter_bytes,
        buffer_bytes=training.buffer_bytes,
        gradient_bytes=training.gradient_bytes,
        optimizer_state_bytes=training.optimizer_state_bytes,
        optimizer_temp_bytes=training.optimizer_temp_bytes,
        peak_bytes=peak,
        peak_phase=phase,
        activations_approximate=approximate,
        facts=facts,
    )


@dataclass(frozen=True)
class _Backward:
    """The formula's terms of the backward's moments (:class:`~.predict_training.BackwardMoments`), in bytes."""

    loss_bytes: int  # the loss's backward, beside all the forward left (formula.loss_backward_bytes)
    freed_before_layers: int  # of outside: the log-probabilities, the final norm's (formula.persistent_outside_bytes)
    second_half_bytes: int  # a layer's, freed before its attention's backward (formula.second_half_bytes)
    temp_bytes: tuple[int, int]  # a layer's backward's temporaries: its MLP's, its attention's (backward_temp_bytes)
    end_bytes: int  # the embeddings' backward, besides the gradients (formula.embeddings_backward_bytes)


@dataclass
class _Source:
    """Per-layer numbers from one source (formula or calibration), and the step they imply."""

    layer_bytes: list[int]
    input_bytes: list[int]
    outside_bytes: int
    input_saved_as_is: bool
    provenance: Provenance
    forward_s: float | None = None
    step_s: float | None = None
    selective: str = "none"  # the CP layers' selective policy
    kept_layer_bytes: int = 0  # what it keeps in one CP layer (formula)
    skipped_flops: float = 0.0  # matmul FLOPs per token of one CP layer's rerun it takes from its cache
    checkpointed_shared_bytes: int = 0  # an input every CP layer shares, kept once if any is CP (eager's mask)
    nested_in: tuple[int | None, ...] = ()  # Architecture.nested_in: the layer holding each layer, if any
    backward: _Backward = _Backward(0, 0, 0, (0, 0), 0)

    def predict(
        self,
        method: Method,
        n: int | None,
        offload: bool,
        seq_len: int,
        batch_size: int,
        layer_flops: float,
        total_flops: float,
    ) -> tuple[Prediction, BackwardMoments]:
        """One setting's prediction, and its backward's moments for the peak (``_with_training``)."""
        roles = planned_roles(len(self.layer_bytes), n)
        # A layer nested in a checkpointed one (Zamba2's mamba_decoder) keeps nothing: the parent's checkpoint drops
        # all it holds, and the parent's rerun runs it again whatever its own flag (model.plan.rerun_roles).
        inside = [False] * len(roles)
        for index, parent in enumerate(self.nested_in):
            inside[index] = parent is not None and (roles[parent] == "CP" or inside[parent])
        reruns = rerun_roles(roles, self.nested_in) if self.nested_in else roles
        cp = [index for index, role in enumerate(roles) if role == "CP" and not inside[index]]
        moved = sum(self.input_bytes[index] for index in cp)
        kept = sum(self.layer_bytes[index] for index, role in enumerate(roles) if role == "keep" and not inside[index])
        # What a selective policy keeps is SAC's cache, not autograd's saved tensors: offload leaves it on the device.
        selective_kept = len(cp) * self.kept_layer_bytes
        # An input every CP layer shares (eager's mask), kept once on the device; offload copies it to the host.
        shared = self.checkpointed_shared_bytes if cp and not offload else 0
        resident = self.outside_bytes + kept + (0 if offload else moved) + selective_kept + shared
        # The rerun rebuilds a CP layer's activations next to the input it kept (unless that input
        # is one of its saved tensors, then only the rest is new); offload brings the input back too.
        extra = 0
        rebuilt_by: dict[int, int] = {}
        for index in cp:
            rebuilt = self.layer_bytes[index] - (self.input_bytes[index] if self.input_saved_as_is else 0)
            rebuilt += sum(self.layer_bytes[child] for child in _held_by(index, self.nested_in))  # rerun with it
            rebuilt = max(rebuilt - self.kept_layer_bytes, 0)  # the cached outputs are already resident
            rebuilt_by[index] = rebuilt + (self.input_bytes[index] if offload else 0)
            extra = max(extra, rebuilt_by[index])
        moments = self._moments(roles, inside, rebuilt_by, resident, shared, offload)
        fraction = reruns.count("CP") * (layer_flops - self.skipped_flops) / total_flops
        if method == "formula":
            ratio = 1 + fraction / 3  # a backward costs about two forwards
            step = None if self.step_s is None else self.step_s * ratio
        else:
            assert self.step_s is not None and self.forward_s is not None  # a calibration always carries both
            step = self.step_s + fraction * self.forward_s
            ratio = step / self.step_s
        prediction = Prediction(
            method=method,
            seq_len=seq_len,
            batch_size=batch_size,
            every_n_layers=n,
            offload=offload,
            cp_layers=roles.count("CP"),  # the flags transformers sets (a nested one among them)
            resident_bytes=resident,
            layer_bytes=max(self.layer_bytes),
            rerun_extra_bytes=extra,
            offload_bytes=moved,
            recompute_fraction=fraction,
            step_ratio=ratio,
            step_s=step,
            provenance=self.provenance,
            selective=self.selective if cp else "none",
            kept_bytes=selective_kept,
        )
        return prediction, moments

    def _moments(
        self,
        roles: Sequence[str],
        inside: Sequence[bool],
        rebuilt_by: Mapping[int, int],
        resident: int,
        shared: int,
        offload: bool,
    ) -> BackwardMoments:
        """The backward's moments: the loss's, then each layer's two (its MLP's, its attention's), then the
        embeddings'. At a layer's, the layers before it still hold what they kept (a CP layer its input, a kept
        layer its activations), the layers after it nothing (their backward is done), and the log-probabilities and
        the final norm's tensors are gone; the layer holds all it keeps or rebuilds, then, at its attention's
        backward, its second half is freed. The embeddings' backward holds little but the gradients."""
        backward = self.backward
        # What stays from the first layer's backward to the last: outside's ids, labels, shared tables, eager's mask.
        persistent = max(self.outside_bytes - backward.freed_before_layers, 0) + shared
        mlp_temp, attention_temp = backward.temp_bytes
        held_before = 0  # by the layers before the one whose backward runs
        layers: list[tuple[int, int]] = []
        for index, role in enumerate(roles):
            if inside[index]:
                layers.append((0, 0))  # it reruns inside its parent, whose moments count it
                continue
            if role == "CP":
                own = self.input_bytes[index] + self.kept_layer_bytes + rebuilt_by[index]
                if offload:
                    own -= self.input_bytes[index]  # rebuilt_by brought it back already
                keeps = self.kept_layer_bytes + (0 if offload else self.input_bytes[index])
            else:
                own = keeps = self.layer_bytes[index]
            alive = persistent + held_before + own
            layers.append((alive + mlp_temp, max(alive - backward.second_half_bytes, 0) + attention_temp))
            held_before += keeps
        return BackwardMoments(
            loss_bytes=resident + backward.loss_bytes, layer_bytes=tuple(layers), end_bytes=backward.end_bytes
        )


def resident_by_setting(
    model: str,
    batch_size: int,
    mixed_precision: str,
    dtype: str,
    device: str,
    lengths: Sequence[int],
    every_n_layers: Sequence[int],
) -> dict[tuple[int | None, bool], list[int]]:
    """The formula's resident bytes after the forward for each (every_n_layers, offload), off included, at each of
    ``lengths``: the dashed continuation of a sweep's measured series (``show.figures.tradeoff.seq_len_figure``)."""
    arch = architecture(model)
    resident: dict[tuple[int | None, bool], list[int]] = {}
    for length in lengths:
        for p in predict(
            arch,
            seq_len=length,
            batch_size=batch_size,
            dtype=dtype,
            device=device,
            every_n_layers=list(every_n_layers),
            offload=[False, True],
            mixed_precision=mixed_precision,
        ):
            resident.setdefault((p.every_n_layers, p.offload), []).append(p.resident_bytes)
    return resident
