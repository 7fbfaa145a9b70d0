"""The formula: what a transformers layer saves for its backward, from the config alone.

Korthikanti et al. 2022 (*Reducing Activation Recomputation in Large Transformer Models*)
count ``s*b*h*(34 + 5*a*s/h)`` bytes per layer in 16-bit for GPT-3: 11 for attention
(2 QKV input, 4 Q and K, 2 V, 2 output-projection input, 1 dropout mask), 19 for the MLP
(2 input, 8 GeLU input, 8 GeLU output, 1 dropout mask), 4 for the two LayerNorm inputs, and
``5*a*s/h`` for the attention scores (softmax, dropout mask, dropout output). The same
count, term by term, for the models transformers builds here (checked tensor by tensor
against autograd's saved tensors, see ``tests/explore/test_predict.py``):

- bytes per element ``e`` from the dtype (4 in float32: "fp32 doubling"); statistics,
  the logsumexp and the loss are float32 whatever the dtype;
- no dropout masks: the presets and modern LLMs train with dropout 0;
- no ``s x s`` scores: PyTorch SDPA (the lab's default attention) keeps the output and a float32
  logsumexp per head and token instead (flash / memory-efficient kernels); with eager attention
  (``attn_implementation="eager"``, :func:`eager_scores_bytes`) the ``a*s^2`` term comes back: each
  layer keeps its softmax probabilities, ``b*a*s^2`` in float32 and, in 16 bits, their cast copy too
  (``2 + 4`` bytes: the Playbook's ``5*a*s/h`` without dropout; GPT-2 and BERT take the softmax in 16
  bits and keep ``2``), no logsumexp, and under GQA the keys
  and values repeated to ``a`` heads (``repeat_kv``); its float ``b x s x s`` mask is an input of every
  checkpointed layer, kept once while any layer is checkpointed (:func:`eager_mask_bytes`);
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
  ``b*s*vocab*4``, usually the biggest term;
- mixture of experts (Mixtral, Qwen2-MoE, Qwen3-MoE through transformers' ``grouped_mm``
  experts, ``ckptlab.model.experts``): the MLP term becomes the router's float32
  probabilities ``4E`` and top-k ids ``8k`` per token (plus ``4 + 4k`` when it renormalises
  the top-k), and per routed copy (``k`` per token) the gathered input ``h``, the gate and
  up projections ``2i``, SiLU(gate) ``i``, their product ``i``, the down projection's output
  ``h``, the routing weight and three int64 permutation indices; the shared expert
  (Qwen2-MoE) is a SwiGLU MLP ``4i_s`` plus its sigmoid gate and gated output. Every
  expert's parameters count in the training terms (:mod:`.predict_training`). Other MoE
  families are flagged ``experts_counted=False``: their experts are left out, and said so.

The counts are a full fine-tune's; with LoRA see :mod:`.predict_training`. Used by
:func:`ckptlab.predict` (:mod:`.predict`), which puts the layers together per setting.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PretrainedConfig

from ..errors import SpecError, not_one_of
from ..fact import Fact
from ..model import catalog
from ..spec import MIXED_PRECISIONS
from ..step.preflight import resolve_dtype, simulated_device_type_of
from ..step.training import MIXED_PRECISION_DTYPES

FLOAT32 = 4  # bytes: statistics, logsumexp, log-probabilities and RMSNorm's upcast input
INDEX = 8  # bytes of an int64 token id
FORMULA_SOURCE = "Korthikanti et al. 2022, s*b*h*(34 + 5*a*s/h), adapted to the architecture"


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
    experts: int = 0  # E: routed experts per layer (0: a dense MLP)
    experts_per_token: int = 0  # k: top-k experts each token is routed to
    expert_intermediate_size: int = 0  # i_e: one expert's MLP width
    shared_expert_intermediate_size: int = 0  # i_s: the shared expert's width (Qwen2-MoE), 0 for none
    renormalizes_top_k: bool = False  # the router divides the top-k weights by their sum
    float32_routing_weights: bool = False  # Mixtral keeps the routing weights in float32 in any dtype
    experts_counted: bool = True  # False: an MoE the formula does not know; its experts' activations are left out
    # Per checkpointing layer, the index of the one that holds it (Zamba2's mamba_decoder), None at the top; empty
    # when none is nested (ModelInfo.nested_in): a layer inside a checkpointed one keeps nothing, reruns with it.
    nested_in: tuple[int | None, ...] = ()


# What a prediction says of an MoE (Prediction.facts; English in said.predict.* of the locale files).
EXPERTS_COUNTED_NOTE = Fact("predict.experts_counted")


def experts_not_counted_note(family: str) -> Fact:
    """The fact that the formula leaves out the experts' activations of ``family`` (its predictions are too low)."""
    return Fact("predict.experts_not_counted", {"family": family})


# Families whose MoE layers the formula counts, term by term (checked against autograd's saved tensors).
COUNTED_MOE_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe")


def _moe_fields(family: str, text: PretrainedConfig) -> dict:
    """The Architecture's MoE fields from a config (empty for a dense model)."""
    top_k = getattr(text, "num_experts_per_tok", 0) or 0
    experts = (
        getattr(text, "num_local_experts", 0) or getattr(text, "num_experts", 0) or getattr(text, "n_routed_experts", 0)
    )
    if not top_k or not experts:
        return {}
    # Qwen-MoE models may mix dense and sparse layers; the formula counts one kind of layer.
    alike = not getattr(text, "mlp_only_layers", None) and getattr(text, "decoder_sparse_step", 1) == 1
    fields = {
        "experts": experts,
        "experts_per_token": top_k,
        "experts_counted": family in COUNTED_MOE_FAMILIES and alike,
    }
    if family == "mixtral":
        fields |= {
            "expert_intermediate_size": text.intermediate_size,
            "renormalizes_top_k": True,
            "float32_routing_weights": True,
        }
    elif family in ("qwen2_moe", "qwen3_moe"):
        fields |= {
            "expert_intermediate_size": text.moe_intermediate_size,
            "renormalizes_top_k": bool(getattr(text, "norm_topk_prob", False)),
            "shared_expert_intermediate_size": getattr(text, "shared_expert_intermediate_size", 0) or 0,
        }
    return fields


def architecture(model: str | PretrainedConfig | Architecture, num_layers: int | None = None) -> Architecture:
    """The :class:`Architecture` of a preset, a local folder or a config.

    Args:
        model: a preset name, a local directory, a transformers config (or an architecture, returned as is).
        num_layers: the count of checkpointable layers; looked up when a name is given (with the layers nested in
            others, ``nested_in``).

    Raises:
        ModelLoadError, UnsupportedModelError: for a name the catalog cannot load.
    """
    if isinstance(model, Architecture):
        return model
    nested: tuple[int | None, ...] = ()
    if isinstance(model, PretrainedConfig):
        config = model
    else:
        config, _, _ = catalog.load_config(model)
        if not num_layers:
            info = catalog.describe(model)
            num_layers, nested = info.num_layers, info.nested_in
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
        **_moe_fields(family, text),
        nested_in=nested,
    )


# Families whose eager attention takes the softmax in the activations' dtype (GPT-2's, BERT's); the others
# (Llama, Qwen, Mistral, Gemma, ...) take it in float32 and cast the probabilities back.
SOFTMAX_IN_DTYPE = ("gpt2", "bert", "roberta", "distilbert")


def eager_scores_bytes(arch: Architecture, seq_len: int, batch_size: int, element: int) -> int:
    """Formula: the ``a*s^2`` term eager attention adds to one layer (no dropout): its softmax probabilities. Llama's
    family keeps them in float32 for the softmax's backward and, in 16 bits, their cast copy too (the value
    matmul's); GPT-2 and BERT take the softmax in the element's dtype and keep it once."""
    upcast = arch.family not in SOFTMAX_IN_DTYPE
    per_score = FLOAT32 + (element if element != FLOAT32 else 0) if upcast else element
    return batch_size * arch.num_heads * seq_len * seq_len * per_score


def eager_mask_bytes(seq_len: int, batch_size: int, weights_element: int) -> int:
    """Formula: eager attention's float causal mask (``b x 1 x s x s`` in the weights' dtype), an input of every
    checkpointed layer: kept once while any layer is checkpointed (SDPA's CUDA path takes ``is_causal``, no mask)."""
    return batch_size * seq_len * seq_len * weights_element


# What an MLP saves per token, in ``i``-wide tensors: SwiGLU's gate, SiLU(gate), up and their product; a fused GELU's
# input and output; GPT-2's gelu_new written out op by op.
_MLP_SAVED = {"swiglu": 4, "gelu": 2, "gelu-composite": 5}


def layer_activation_bytes(
    arch: Architecture, seq_len: int, batch_size: int, element: int, attention: str = "sdpa"
) -> int:
    """Formula: bytes one kept layer saves for its backward (see the module docstring).

    Args:
        arch: the model's :class:`Architecture`.
        seq_len, batch_size: the shape of the step.
        element: bytes per element of the activations (4 in float32, 2 in bfloat16).
        attention: the attention implementation ("sdpa" and "flash_attention_2" keep the same; "eager" the scores).
    """
    h, a, kv, d, i = arch.hidden_size, arch.num_heads, arch.num_kv_heads, arch.head_dim, arch.intermediate_size
    tokens = seq_len * batch_size
    if attention == "eager":
        scores = eager_scores_bytes(arch, seq_len, batch_size, element)
        # No logsumexp; keys and values repeated to the query heads (repeat_kv copies them under GQA).
        sdpa = layer_activation_bytes(arch, seq_len, batch_size, element)
        return sdpa + scores - tokens * (FLOAT32 * a - element * 2 * (a - kv) * d)
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
    if arch.experts:
        return int(tokens * (per_token + _moe_per_token(arch, element))) + 4 * arch.experts  # + int32 offsets
    per_token += element * i * _MLP_SAVED[arch.mlp]
    return int(tokens * per_token)


def _moe_per_token(arch: Architecture, element: int) -> float:
    """An MoE block's saved bytes per token (its input is the norm's output, counted above)."""
    if not arch.experts_counted:
        return 0.0
    h, k, i = arch.hidden_size, arch.experts_per_token, arch.expert_intermediate_size
    router = FLOAT32 * arch.experts + INDEX * k + (FLOAT32 * (1 + k) if arch.renormalizes_top_k else 0)
    weight = FLOAT32 if arch.float32_routing_weights else element
    routed = k * (element * (2 * h + 4 * i) + weight + 3 * INDEX)
    # The shared expert (Qwen2-MoE): SwiGLU, gated output, sigmoid.
    shared = element * (4 * arch.shared_expert_intermediate_size + h + 1) if arch.shared_expert_intermediate_size else 0
    return router + routed + shared


def persistent_outside_bytes(arch: Architecture, seq_len: int, batch_size: int, element: int) -> int:
    """Formula: what outside the layers stays resident until the embeddings' backward, the last: token ids (the
    embedding's backward) and the shifted labels, the rotary cos/sin tables every layer shares, BERT's embeddings'
    norm. The rest of :func:`outside_bytes` (the loss's log-probabilities, the final norm, the head's transform) is
    freed before the first layer's backward."""
    h = arch.hidden_size
    per_token = 2 * INDEX
    if arch.post_norm:
        per_token += element * h + 2 * FLOAT32  # the embeddings' norm
    if arch.rotary:
        per_token += 2 * element * arch.head_dim  # cos and sin, computed once, shared by every layer
    return seq_len * batch_size * per_token


def outside_bytes(arch: Architecture, seq_len: int, batch_size: int, element: int) -> int:
    """Formula: bytes resident after the forward outside the layers (embeddings, head, loss, shared tables)."""
    h = arch.hidden_size
    per_token = FLOAT32 * arch.vocab_size  # the loss upcasts the logits and keeps the log-probabilities
    if arch.post_norm:
        per_token += 4 * element * h  # the head's transform
    else:
        norm_input = FLOAT32 if arch.norm == "rms" else element
        per_token += norm_input * h + element * h + (element * h + FLOAT32 if arch.norm == "rms" else 2 * FLOAT32)
    return int(seq_len * batch_size * per_token) + persistent_outside_bytes(arch, seq_len, batch_size, element)


def embeddings_backward_bytes(arch: Architecture, seq_len: int, batch_size: int, element: int) -> int:
    """Formula: what the embeddings' backward, the step's last, holds besides the gradients: the token ids it indexes
    by and the gradient reaching it (``b*s*h``); the shared tables and the labels are gone by then."""
    return seq_len * batch_size * (INDEX + element * arch.hidden_size)


def loss_backward_bytes(arch: Architecture, seq_len: int, batch_size: int) -> int:
    """Formula: what the loss's backward adds beside the float32 log-probabilities it still holds: their gradient
    and the logits' upcast gradient, both float32 (``b*s*V*4`` each), whatever the dtype."""
    return 2 * FLOAT32 * arch.vocab_size * seq_len * batch_size


def second_half_bytes(arch: Architecture, seq_len: int, batch_size: int, element: int, attention: str = "sdpa") -> int:
    """Formula: what one layer saves after its attention's core (the MLP, the norm before it, the output
    projection's input and, with eager attention, what the value matmul saved: the values, repeated to the query heads,
    and in 16 bits its cast copy of the probabilities): the backward frees it before it reaches the attention's core
    (eager's softmax; SDPA's fused kernel holds its values until its backward ends), a layer's second moment
    (:func:`backward_temp_bytes`).
    """
    h, a, d = arch.hidden_size, arch.num_heads, arch.head_dim
    tokens = seq_len * batch_size
    # RMSNorm: its upcast input, output, normalised tensor and rsqrt; LayerNorm: input, output, mean and rstd.
    norm = FLOAT32 + element * h + (FLOAT32 + element) * h if arch.norm == "rms" else 2 * (element * h + FLOAT32)
    mlp = _moe_per_token(arch, element) if arch.experts else element * arch.intermediate_size * _MLP_SAVED[arch.mlp]
    per_token = norm + mlp + element * a * d  # + the output projection's input
    copy = 0
    if attention == "eager":
        per_token += element * a * d  # the value matmul's values, its backward done before the softmax's
        if arch.family not in SOFTMAX_IN_DTYPE and element != FLOAT32:
            copy = batch_size * a * seq_len * seq_len * element
    return int(tokens * per_token) + copy


def backward_temp_bytes(
    arch: Architecture, seq_len: int, batch_size: int, element: int, attention: str = "sdpa"
) -> tuple[int, int]:
    """Formula: the temporaries of one layer's backward at its two high moments, ``(MLP, attention)``.

    The MLP's, at its activation's backward: the gradient coming in (``b*s*h``) and the gradients of its ``i``-wide
    tensors (SwiGLU: the down projection's input, the gate's and the up projection's, ``3i``; a fused GELU ``2i``;
    GPT-2's written-out GELU ``3i``), less the down projection's input, which its backward (the layer's first, which
    has made that projection's gradient: ``TrainingBytes.layer_gradient_moments``) has freed; an MoE's routed copies
    ``3k*i_e`` beside the gradient coming in and the residual's. The attention's core holds the residual's gradient
    and the output's or the values' (``2*b*s*h``) and adds, with eager attention, the probabilities' gradient and the
    scores' (``2*b*a*s^2``, float32 where the softmax is upcast: the lab's simulation of a CUDA step counts 12 bytes a
    score with the probabilities), with SDPA the query's, keys' and values' gradients.
    """
    h, a, kv, d = arch.hidden_size, arch.num_heads, arch.num_kv_heads, arch.head_dim
    tokens = seq_len * batch_size
    flowing = 2 * tokens * h * element
    if arch.experts:
        wide = 3 * arch.experts_per_token * arch.expert_intermediate_size + 3 * arch.shared_expert_intermediate_size
        mlp = tokens * element * wide + flowing
    else:
        wide = {"swiglu": 3, "gelu": 2, "gelu-composite": 3}[arch.mlp] - 1  # the down projection's input freed
        mlp = tokens * element * (wide * arch.intermediate_size + h)
    if attention == "eager":
        gradient = FLOAT32 if arch.family not in SOFTMAX_IN_DTYPE else element
        core = 2 * batch_size * a * seq_len * seq_len * gradient
    else:
        core = tokens * element * (a * d + 2 * kv * d)
    return mlp, core + flowing


# The selective policies the formula counts (ckptlab.model.selective); the others are simulated or measured.
COUNTED_POLICIES = ("none", "attention", "matmuls")


def selective_kept_bytes(
    arch: Architecture, selective: str, seq_len: int, batch_size: int, element: int, attention: str = "sdpa"
) -> int:
    """Formula: bytes a selective policy keeps in one CP layer (the kept ops' outputs), besides the layer's input.

    - ``"attention"``: the fused SDPA op's output (``a*d`` per token) and its float32 logsumexp
      (``a`` per token); the CUDA kernels' RNG seed and offset (a few bytes) are left out.
    - ``"matmuls"``: that, plus every projection's output: Q ``a*d``, K and V ``kv*d`` each, the output
      projection ``h``; the MLP's matmuls (SwiGLU gate, up ``i`` each and down ``h``; a GELU MLP ``i``
      and ``h``). In an MoE layer the router's logits ``E`` and the shared expert's matmuls
      (``2i_s + h`` and its gate's 1); the routed experts run as grouped matmuls, which the policy does
      not list. All are kept whether or not the backward needs them (SAC keeps what it is told). With eager
      attention there is no fused op: its two bmm outputs instead, the scores ``a*s`` and their product with
      V ``a*d`` per token (``"attention"`` with eager is refused: ``ckptlab.model.attention``).

    Raises:
        SpecError: a policy the formula does not count (torchtitan's, or op names): simulate it.
    """
    if selective not in COUNTED_POLICIES:
        raise SpecError(
            key="predict.selective_not_counted",
            counted=", ".join(COUNTED_POLICIES),
            selective=selective,
            policy=str(selective),
        )
    if selective == "none":
        return 0
    h, a, kv, d, i = arch.hidden_size, arch.num_heads, arch.num_kv_heads, arch.head_dim, arch.intermediate_size
    per_token = element * a * (seq_len + d) if attention == "eager" else element * a * d + FLOAT32 * a
    if selective == "matmuls":
        per_token += element * (a * d + 2 * kv * d + h)
        if arch.experts:
            shared = arch.shared_expert_intermediate_size
            per_token += element * (arch.experts + (2 * shared + h + 1 if shared else 0))
        elif arch.mlp == "swiglu":
            per_token += element * (2 * i + h)
        else:
            per_token += element * (i + h)
    return seq_len * batch_size * per_token


def selective_skipped_flops(arch: Architecture, selective: str, seq_len: int, causal: bool = True) -> float:
    """Matmul FLOPs per token of one CP layer's rerun that a policy takes from its cache instead.

    ``"attention"``: the scores and their product with V; ``"matmuls"``: every matmul of the layer
    (what is left to rerun is elementwise work the formula does not count). Early stop aside: the
    rerun stops after the last tensor the backward needs, which the formula leaves out.
    """
    if selective == "none":
        return 0.0
    layer, _ = forward_flops(arch, seq_len, causal)
    keys = seq_len / 2 if causal else seq_len
    attention = 2 * 2 * keys * arch.num_heads * arch.head_dim
    return layer if selective == "matmuls" else attention


def forward_flops(arch: Architecture, seq_len: int, causal: bool = True) -> tuple[float, float]:
    """Matmul FLOPs per token of one layer's forward, and of the whole forward.

    Returns:
        ``(per layer, total)``: 2 FLOPs per multiply-add; attention scores over ``seq_len``
        keys (half of them when causal); the head's ``h x vocab`` matmul outside the layers.
    """
    h, a, kv, d, i = arch.hidden_size, arch.num_heads, arch.num_kv_heads, arch.head_dim, arch.intermediate_size
    projections = h * a * d + 2 * h * kv * d + a * d * h
    mlp = (3 if arch.mlp == "swiglu" else 2) * h * i
    if arch.experts:
        # The router, k routed experts and the shared expert: the work of the active parameters.
        mlp = h * arch.experts + 3 * h * (arch.experts_per_token * arch.expert_intermediate_size)
        mlp += 3 * h * arch.shared_expert_intermediate_size
    keys = seq_len / 2 if causal else seq_len
    layer = 2 * (projections + mlp) + 2 * 2 * keys * a * d  # QK^T and scores x V
    head = 2 * h * arch.vocab_size + (2 * h * h if arch.post_norm else 0)
    return layer, arch.num_layers * layer + head


def element_bytes(dtype: str, device: str = "auto", mixed_precision: str = "none") -> int:
    """Bytes per element of what a step computes: the mixed precision's dtype when there is one (Trainer's
    ``bf16=True`` autocasts the forward, FSDP2's policy all-gathers bf16 parameters, so the activations are
    16-bit over float32 master weights), else the weights' dtype, 'auto' resolved as a simulation resolves it
    (``step.preflight.simulated_device_type_of`` and ``resolve_dtype``: bfloat16 unless the device is "cpu").

    Raises:
        SpecError: a dtype that is not "auto", "float32", "bfloat16" or "float16", or a mixed precision that
            is not one of ``spec.MIXED_PRECISIONS``.
    """
    if mixed_precision != "none":
        if mixed_precision not in MIXED_PRECISION_DTYPES:
            raise not_one_of("mixed_precision", mixed_precision, MIXED_PRECISIONS)
        return MIXED_PRECISION_DTYPES[mixed_precision].itemsize
    return resolve_dtype(dtype, torch.device(simulated_device_type_of(device))).itemsize
