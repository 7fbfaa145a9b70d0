"""Predicted memory and recompute for every checkpointing setting, from the config alone.

The model of a step (DESIGN.md): a checkpointed (CP) layer keeps only its input,
``batch x seq x hidden x bytes``; a kept layer holds all its activations; the backward
rebuilds one CP layer's activations at a time while it reruns it; and the rerun costs the
checkpointed layers' share of the forward's work. What is resident after the forward is
then::

    outside + sum(input of each CP layer) + sum(activations of each kept layer)

where ``outside`` is what the embeddings, the final norm, the head and the loss keep.
Two sources give the per-layer activations and ``outside``, and both are shown beside the
measurement with their error:

``"formula"``: Korthikanti et al. 2022 (*Reducing Activation Recomputation in Large
Transformer Models*), who count ``s*b*h*(34 + 5*a*s/h)`` bytes per layer in 16-bit for
GPT-3: 11 for attention (2 QKV input, 4 Q and K, 2 V, 2 output-projection input, 1 dropout
mask), 19 for the MLP (2 input, 8 GeLU input, 8 GeLU output, 1 dropout mask), 4 for the
two LayerNorm inputs, and ``5*a*s/h`` for the attention scores (softmax, dropout mask,
dropout output). The same count, term by term, for the models transformers builds here
(checked tensor by tensor against autograd's saved tensors, see ``tests/explore/test_predict.py``):

- bytes per element ``e`` from the dtype (4 in float32: "fp32 doubling"); statistics,
  the logsumexp and the loss are float32 whatever the dtype;
- no dropout masks: the presets and modern LLMs train with dropout 0;
- no ``s x s`` scores: PyTorch SDPA (the lab's attention) keeps the output and a float32
  logsumexp per head and token instead (flash / memory-efficient kernels);
- GQA: Q and the attention output have ``a*d`` elements per token, K and V ``kv*d`` each;
- the norms: each keeps its input and its output (the next matmul's input), ``4h`` for two;
  transformers' RMSNorm also keeps the normalised tensor before the weight (``+2h``) and
  upcasts its input to float32 (so the input counts 4 bytes); Qwen3's per-head q/k norms
  add the same for Q and K;
- the MLP: SwiGLU (``intermediate_size`` ``i``) keeps gate, SiLU(gate), up and their
  product, ``4i``; a fused GELU ``2i``; GPT-2's ``gelu_new``, written out as
  ``0.5*x*(1+tanh(...))``, ``5i``;
- outside the layers: token ids and shifted labels (int64), the final norm, the rotary
  cos/sin tables (shared by all layers, kept once), and the loss's float32 log-probabilities
  ``b*s*vocab*4``, usually the biggest term.

``"calibrated"``: one measured run with checkpointing off at the same shape gives each
layer's saved bytes (``LayerResult.saved_bytes``) and ``outside`` (resident after the
forward minus the layers' saved bytes). Tensors that every layer shares (the rotary
tables) are first saved by L1 and stay alive under any setting, so L1's excess over the
other layers is moved to ``outside``.

Time: the rerun repeats the checkpointed layers' share of the forward's matmul FLOPs. The
formula turns it into a step-time ratio ``1 + share/3`` (a backward costs two forwards);
the calibrated prediction adds ``share x`` the measured forward time to the measured step.

Every :class:`Prediction` carries provenance kind ``"predicted"``; none is a measurement.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any, Literal

import torch
import transformers
from transformers import PretrainedConfig

from ..errors import SpecError
from ..model import catalog
from ..model.plan import planned_roles, validate_every_n_layers
from ..results import Provenance, RunResult

Method = Literal["formula", "calibrated"]
FLOAT32 = 4  # bytes: statistics, logsumexp, log-probabilities and RMSNorm's upcast input
INDEX = 8  # bytes of an int64 token id
FORMULA_SOURCE = "Korthikanti et al. 2022, s*b*h*(34 + 5*a*s/h), adapted to the architecture"
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Architecture:
    """The shape of a model's layers, as the formula needs it (read from its config)."""

    family: str  # config.model_type
    num_layers: int  # GradientCheckpointingLayer modules
    hidden_size: int  # h
    num_heads: int  # a: query heads
    num_kv_heads: int  # kv: key/value heads (GQA when fewer than a)
    head_dim: int  # d
    intermediate_size: int  # i: MLP width
    vocab_size: int  # V: columns of the logits
    norm: str  # "rms" (transformers' RMSNorm) or "layer" (LayerNorm)
    mlp: str  # "swiglu", "gelu" (fused) or "gelu-composite" (GPT-2's gelu_new)
    qk_norm: bool  # per-head RMSNorm on Q and K (Qwen3)
    rotary: bool  # RoPE: cos/sin tables computed once and shared by the layers
    post_norm: bool  # BERT-style: the norm after the residual, and a transform before the head


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

    @property
    def label(self) -> str:
        return f"predicted ({self.method})"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["provenance"]["label"] = self.provenance.label
        return data


@dataclass(frozen=True)
class Calibration:
    """Per-layer activations and the rest, taken from one measured run with checkpointing off."""

    seq_len: int  # the run's tokens per sequence: calibrated predictions hold for this shape only
    batch_size: int
    device: str  # e.g. "cpu": where the run was measured
    layer_bytes: list[int]  # per layer: what it saves when kept (L1 without the tensors all layers share)
    input_bytes: list[int]  # per layer: its input, what it keeps when checkpointed
    outside_bytes: int  # resident after the forward outside the layers (embeddings, head, loss, shared tables)
    input_saved_as_is: bool  # a layer's saved tensors include its input's storage (so a rerun adds the rest only)
    forward_s: float  # measured median forward (with the loss)
    step_s: float  # measured median step
    source: str  # the run's provenance label


def architecture(model: str | PretrainedConfig | Architecture, num_layers: int | None = None) -> Architecture:
    """The :class:`Architecture` of a preset, a local folder or a config.

    Args:
        model: a preset name, a local directory, a transformers config (or an architecture, returned as is).
        num_layers: the count of checkpointable layers; looked up when a name is given.

    Raises:
        ModelLoadError, UnsupportedModelError: for a name the catalog cannot load.
    """
    if isinstance(model, Architecture):
        return model
    if isinstance(model, PretrainedConfig):
        config = model
    else:
        config, _, _ = catalog.load_config(model)
        num_layers = num_layers or catalog.describe(model).num_layers
    text = config.get_text_config()
    hidden = text.hidden_size
    heads = text.num_attention_heads
    family = config.model_type
    activation = getattr(text, "hidden_act", None) or getattr(text, "activation_function", "gelu")
    swiglu = activation in ("silu", "swish") and getattr(text, "intermediate_size", None) is not None
    if swiglu:
        mlp = "swiglu"
    elif activation == "gelu_new":
        mlp = "gelu-composite"  # transformers' NewGELUActivation is written out op by op
    else:
        mlp = "gelu"
    intermediate = getattr(text, "intermediate_size", None) or getattr(text, "n_inner", None) or 4 * hidden
    return Architecture(
        family=family,
        num_layers=num_layers or text.num_hidden_layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=getattr(text, "head_dim", None) or hidden // heads,
        intermediate_size=intermediate,
        vocab_size=text.vocab_size,
        norm="rms" if hasattr(text, "rms_norm_eps") else "layer",
        mlp=mlp,
        qk_norm=family.startswith("qwen3"),
        rotary=family not in ("gpt2", "bert", "roberta", "distilbert"),
        post_norm=family in ("bert", "roberta"),
    )


def layer_activation_bytes(arch: Architecture, seq_len: int, batch_size: int, element: int) -> int:
    """Formula: bytes one kept layer saves for its backward (see the module docstring).

    Args:
        arch: the model's :class:`Architecture`.
        seq_len, batch_size: the shape of the step.
        element: bytes per element of the activations (4 in float32, 2 in bfloat16).
    """
    h, a, kv, d, i = arch.hidden_size, arch.num_heads, arch.num_kv_heads, arch.head_dim, arch.intermediate_size
    tokens = seq_len * batch_size
    per_token = 0.0
    # Two norms, input and output each (Korthikanti: 2 LayerNorm inputs + the QKV and MLP inputs).
    norm_input = FLOAT32 if arch.norm == "rms" else element
    per_token += 2 * (norm_input * h + element * h)
    if arch.norm == "rms":
        per_token += 2 * (element * h + FLOAT32)  # normalised tensor before the weight, and rsqrt
    else:
        per_token += 2 * 2 * FLOAT32  # mean and rstd
    # Attention: Q and the output over a heads, K and V over kv heads; no s x s scores with SDPA.
    per_token += element * (2 * a * d + 2 * kv * d) + FLOAT32 * a  # + logsumexp
    if arch.qk_norm:
        per_token += (a + kv) * d * (FLOAT32 + element) + FLOAT32 * (a + kv)
    per_token += element * i * {"swiglu": 4, "gelu": 2, "gelu-composite": 5}[arch.mlp]
    return int(tokens * per_token)


def outside_bytes(arch: Architecture, seq_len: int, batch_size: int, element: int) -> int:
    """Formula: bytes resident after the forward outside the layers (embeddings, head, loss, shared tables)."""
    h = arch.hidden_size
    tokens = seq_len * batch_size
    per_token = 2 * INDEX  # token ids (the embedding's backward) and the shifted labels
    per_token += FLOAT32 * arch.vocab_size  # the loss upcasts the logits and keeps the log-probabilities
    if arch.post_norm:
        per_token += (element * h + 2 * FLOAT32) + 4 * element * h  # embeddings' norm; the head's transform
    else:
        norm_input = FLOAT32 if arch.norm == "rms" else element
        per_token += norm_input * h + element * h + (element * h + FLOAT32 if arch.norm == "rms" else 2 * FLOAT32)
    if arch.rotary:
        per_token += 2 * element * arch.head_dim  # cos and sin, computed once, shared by every layer
    return int(tokens * per_token)


def forward_flops(arch: Architecture, seq_len: int, causal: bool = True) -> tuple[float, float]:
    """Matmul FLOPs per token of one layer's forward, and of the whole forward.

    Returns:
        ``(per layer, total)``: 2 FLOPs per multiply-add; attention scores over ``seq_len``
        keys (half of them when causal); the head's ``h x vocab`` matmul outside the layers.
    """
    h, a, kv, d, i = arch.hidden_size, arch.num_heads, arch.num_kv_heads, arch.head_dim, arch.intermediate_size
    projections = h * a * d + 2 * h * kv * d + a * d * h
    mlp = (3 if arch.mlp == "swiglu" else 2) * h * i
    keys = seq_len / 2 if causal else seq_len
    layer = 2 * (projections + mlp) + 2 * 2 * keys * a * d  # QK^T and scores x V
    head = 2 * h * arch.vocab_size + (2 * h * h if arch.post_norm else 0)
    return layer, arch.num_layers * layer + head


def calibrate(off: RunResult) -> Calibration:
    """Per-layer activations and the rest from a measured run with checkpointing off.

    Raises:
        SpecError: if the run had checkpointing on, or has no measurements.
    """
    if off.spec.every_n_layers is not None:
        raise SpecError(
            f"calibrate() needs a run with checkpointing off; this one has every_n_layers={off.spec.every_n_layers}. "
            "Measure the same shape with every_n_layers=None."
        )
    if off.memory is None or off.timing is None:
        raise SpecError(f"calibrate() needs a measured run; this one has status {off.status!r}.")
    saved = [layer.saved_bytes for layer in off.layers]
    layer_bytes = list(saved)
    if len(saved) > 1:
        # Tensors every layer uses (the rotary tables) are deduplicated into L1's count, but they
        # stay resident whatever is checkpointed: they belong outside the layers.
        shared = max(0, saved[0] - int(statistics.median(saved[1:])))
        layer_bytes[0] -= shared
    element = torch.tensor([], dtype=getattr(torch, off.dtype)).element_size()
    rms = architecture(off.spec.model).norm == "rms"
    return Calibration(
        seq_len=off.spec.seq_len,
        batch_size=off.spec.batch_size,
        device=off.device,
        layer_bytes=layer_bytes,
        input_bytes=[layer.input_bytes for layer in off.layers],
        outside_bytes=off.memory.after_forward_bytes - sum(layer_bytes),
        # RMSNorm in a 16-bit dtype keeps a float32 copy of the input, not the input itself.
        input_saved_as_is=not (rms and element != FLOAT32),
        forward_s=off.timing.forward_s,
        step_s=off.timing.step_s,
        source=off.provenance.label,
    )


def element_bytes(dtype: str, device: str = "auto") -> int:
    """Bytes per element for a spec's dtype ("auto": bfloat16 on CUDA, float32 otherwise).

    Args:
        dtype: "auto", "float32", "bfloat16" or "float16".
        device: "auto", "cpu" or "cuda"; with "auto" this machine decides, as a run would.
    """
    if dtype == "auto":
        cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
        return 2 if cuda else 4
    if dtype not in DTYPE_BYTES:
        raise SpecError(f"dtype={dtype!r} is not one of auto, {', '.join(DTYPE_BYTES)}.")
    return DTYPE_BYTES[dtype]


def settings_for(num_layers: int, every_n_layers: Iterable[int] | None = None) -> list[int]:
    """The distinct every_n_layers values to try: 1..num_layers by default, duplicates of a plan dropped.

    Values at or above the layer count all checkpoint only the first layer; only the first
    of them is kept.
    """
    values = list(range(1, num_layers + 1)) if every_n_layers is None else list(every_n_layers)
    kept: list[int] = []
    plans: set[tuple[str, ...]] = set()
    for value in values:
        validate_every_n_layers(value)
        plan = tuple(planned_roles(num_layers, value))
        if plan not in plans:
            plans.add(plan)
            kept.append(value)
    return kept


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
) -> list[Prediction]:
    """Predicted resident activations, rerun cost and step time of each setting.

    Args:
        model: a preset name, a local directory, a transformers config, or its :func:`architecture`.
        seq_len, batch_size: the shape of the step.
        dtype, device: as in :class:`~ckptlab.RunSpec`; they set the bytes per element.
        every_n_layers: the settings to predict (default: 1 .. layers); checkpointing off is always included.
        offload: for each setting, with and/or without offload (offload rows move the CP inputs off the device).
        calibration: a measured run with checkpointing off at the same shape (or its
            :func:`calibrate`); adds the ``"calibrated"`` predictions.
        num_layers: the layer count, when ``model`` is a config (else read from the catalog).

    Returns:
        The ``"formula"`` predictions (off first, then each setting), then the
        ``"calibrated"`` ones in the same order when a calibration is given.

    Raises:
        SpecError: bad shape or setting, or a calibration of another shape.
    """
    for name, value in (("seq_len", seq_len), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpecError(f"{name}={value!r} is not valid: it must be a whole number >= 1.")
    arch = architecture(model, num_layers)
    element = element_bytes(dtype, device)
    settings: list[tuple[int | None, bool]] = [(None, False)]
    for n in settings_for(arch.num_layers, every_n_layers):
        settings += [(n, flag) for flag in dict.fromkeys(offload)]

    cal = None
    if calibration is not None:
        cal = calibrate(calibration) if isinstance(calibration, RunResult) else calibration
        if (cal.seq_len, cal.batch_size) != (seq_len, batch_size) or len(cal.layer_bytes) != arch.num_layers:
            raise SpecError(
                f"the calibration run has seq_len={cal.seq_len}, batch_size={cal.batch_size} and "
                f"{len(cal.layer_bytes)} layers; the prediction asks for seq_len={seq_len}, batch_size={batch_size} "
                f"and {arch.num_layers} layers. Calibrate with a run of the same model and shape."
            )
    layer = layer_activation_bytes(arch, seq_len, batch_size, element)
    input_bytes = seq_len * batch_size * arch.hidden_size * element
    formula = _Source(
        layer_bytes=[layer] * arch.num_layers,
        input_bytes=[input_bytes] * arch.num_layers,
        outside_bytes=outside_bytes(arch, seq_len, batch_size, element),
        input_saved_as_is=not (arch.norm == "rms" and element != FLOAT32),
        provenance=_provenance(FORMULA_SOURCE),
        # Seconds need a measured step to scale; the ratio itself comes from the config alone.
        step_s=None if cal is None else cal.step_s,
    )
    flops = forward_flops(arch, seq_len, causal=arch.family not in ("bert", "roberta"))
    predictions = [formula.predict("formula", n, flag, seq_len, batch_size, *flops) for n, flag in settings]
    if cal is not None:
        source = _Source(
            layer_bytes=cal.layer_bytes,
            input_bytes=cal.input_bytes,
            outside_bytes=cal.outside_bytes,
            input_saved_as_is=cal.input_saved_as_is,
            provenance=_provenance(f"calibrated on one run with checkpointing off, {cal.source}"),
            forward_s=cal.forward_s,
            step_s=cal.step_s,
        )
        predictions += [source.predict("calibrated", n, flag, seq_len, batch_size, *flops) for n, flag in settings]
    return predictions


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

    def predict(
        self,
        method: Method,
        n: int | None,
        offload: bool,
        seq_len: int,
        batch_size: int,
        layer_flops: float,
        total_flops: float,
    ) -> Prediction:
        roles = planned_roles(len(self.layer_bytes), n)
        cp = [index for index, role in enumerate(roles) if role == "CP"]
        moved = sum(self.input_bytes[index] for index in cp)
        kept = sum(self.layer_bytes[index] for index, role in enumerate(roles) if role == "keep")
        resident = self.outside_bytes + kept + (0 if offload else moved)
        # The rerun rebuilds a CP layer's activations next to the input it kept (unless that input
        # is one of its saved tensors, then only the rest is new); offload brings the input back too.
        extra = 0
        for index in cp:
            rebuilt = self.layer_bytes[index] - (self.input_bytes[index] if self.input_saved_as_is else 0)
            extra = max(extra, rebuilt + (self.input_bytes[index] if offload else 0))
        fraction = len(cp) * layer_flops / total_flops
        if method == "formula":
            ratio = 1 + fraction / 3  # a backward costs about two forwards
            step = None if self.step_s is None else self.step_s * ratio
        else:
            step = self.step_s + fraction * self.forward_s
            ratio = step / self.step_s
        return Prediction(
            method=method,
            seq_len=seq_len,
            batch_size=batch_size,
            every_n_layers=n,
            offload=offload,
            cp_layers=len(cp),
            resident_bytes=resident,
            layer_bytes=max(self.layer_bytes),
            rerun_extra_bytes=extra,
            offload_bytes=moved,
            recompute_fraction=fraction,
            step_ratio=ratio,
            step_s=step,
            provenance=self.provenance,
        )


def _provenance(source: str) -> Provenance:
    return Provenance(
        kind="predicted",
        device_name=source,
        torch_version=torch.__version__,
        transformers_version=transformers.__version__,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
