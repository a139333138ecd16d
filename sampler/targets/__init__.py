"""Targets: the model P whose law every emitted token follows, behind one interface.

``base`` holds ``Target`` (and ``TargetLM``, a sequence's KV cache); the backends implement it:
``transformers`` (float32 or float64, and ``as_target``, which wraps a bare transformers
model), ``cpu_bf16`` (the row-invariant bfloat16 runner), ``llamacpp`` with ``llamacpp_kv``
and ``llamacpp_tree`` (precision gguf), ``static`` with ``static_layers`` and ``static_kv``
(the static row layout: CUDA graphs, or eagerly on the CPU). ``families`` says which models
have the Llama layers the runner and the static target compute, ``masks`` builds attention
visibility, ``cpu_features`` reads the CPU, ``model_files`` finds the converted model and its
tokenizer (no torch), ``profile`` measures and keeps a target's forward costs.

May import: ``keyed`` and each other, nothing else of ours: never a drafter, the decoding core
(loop, decoder, batch, the tree chooser) or the trainers.
"""
