"""Which model families have Llama's layers, for the backends that reimplement them.

The bfloat16 runner (``sampler.targets.cpu_bf16``) and the static target
(``sampler.targets.static``) compute a Llama decoder layer themselves: RMSNorm, q/k/v with
halves-rotated RoPE (default type) and grouped-query attention over every cached position,
o_proj, a SiLU-gated MLP. Mistral is that layer (its sliding window aside) and Qwen2 adds
biases to q/k/v; both run there. Other families (Gemma: 1 + w norms, scaled embeddings, a
GELU MLP; Qwen3: per-head q/k norms; ...) are refused with the backend to use instead.
"""

from __future__ import annotations

from transformers import PreTrainedModel

__all__ = ["LLAMA_LAYERS", "check_llama_layers"]

LLAMA_LAYERS = ("llama", "mistral", "qwen2")
"""transformers ``model_type``s whose decoder layers are Llama's (Qwen2 with q/k/v biases)."""


def check_llama_layers(model: PreTrainedModel, backend: str, instead: str) -> None:
    """Refuse a model whose layers ``backend`` does not compute.

    Args:
        model: the transformers causal LM (its config and parameter names are read).
        backend: the backend's name for the message, e.g. ``"the bfloat16 runner"``.
        instead: what to use instead, e.g. ``"use precision gguf or float32"``.
    Raises:
        ValueError: naming the model's class (``GemmaForCausalLM``), the families the backend
            supports and ``instead``: a family outside ``LLAMA_LAYERS``, an activation other
            than SiLU, a sliding window shorter than the model's context, biases outside
            q/k/v, or a RoPE type other than the default.
    """
    config = model.config
    kind = getattr(config, "model_type", None)
    supports = f"{backend} supports Llama layers ({', '.join(LLAMA_LAYERS)})"
    name = type(model).__name__
    if kind not in LLAMA_LAYERS:
        raise ValueError(f"{supports}, not {name} ({kind}): {instead}")
    window = getattr(config, "sliding_window", None)
    context = int(getattr(config, "max_position_embeddings", 0) or 0)
    slides = kind == "mistral" or bool(getattr(config, "use_sliding_window", False))
    if slides and window is not None and int(window) < context:
        raise ValueError(
            f"{supports} without a sliding window; {name} attends to the last {window} of "
            f"{context} positions: {instead}"
        )
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{supports} with SiLU; {name} uses {act}: {instead}")
    biased = {k.split(".")[-2] for k, _ in model.named_parameters() if k.endswith(".bias")}
    if biased - {"q_proj", "k_proj", "v_proj"}:
        extra = ", ".join(sorted(biased - {"q_proj", "k_proj", "v_proj"}))
        raise ValueError(f"{supports} with biases on q/k/v only; {name} has {extra}: {instead}")
    rope = getattr(config, "rope_parameters", None) or {"rope_type": "default"}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(
            f"{supports} with the default RoPE; {name} uses {rope.get('rope_type')!r}: {instead}"
        )
