"""The watermark contract: key material, the keyed PRF, labels and the repeated-context rule.

The only home of keyed randomness in poissonmark (docs/design.md §1-§2). In this package "the
MPFR paper" is *Watermarkable Multi-Draft Speculative Sampling via Poisson Processes* (Liu,
Wan, Gao, Gündüz; arXiv:2609.21858), see docs/design.md. Modules:
- ``keyed.prf``: the construction (``PRF_VERSION``), ``Secret``, context keys, the CPU
  uniforms, the detector's ``pivot_array`` and, for many secrets at once, ``pivot_matrix``;
- ``keyed.context``: labels, ``KeyedSource``, the repeated-context rule, the detection plan;
- ``keyed.philox``: the counter generator in NumPy (the reference and fallback);
- ``keyed._kernels`` / ``keyed._kernel_loader``: the generator and the plan compiled with
  numba, checked against NumPy before use (``warm_up``);
- ``keyed.tensor``: the sampler's clocks on torch tensors (``clock_uniforms``,
  ``exponential_clocks``, ``keys_tensor``), for any device. Not imported here: ``import
  keyed`` loads no torch.

May import: nothing of ours (the bottom of every arrow: ``sampler`` and ``detector`` import
it, never the other way).
"""

from keyed._kernel_loader import warm_up
from keyed.context import (
    SKIP_CODES,
    DetectionPlan,
    KeyedSource,
    Label,
    PlannedPosition,
    SkipReason,
    detection_plan,
    detection_plan_arrays,
    label_at,
)
from keyed.prf import (
    PRF_VERSION,
    SECRET_BYTES,
    SENTINEL,
    Secret,
    label_key,
    label_key_words,
    nonce_key,
    pivot_array,
    pivot_matrix,
)

__all__ = [
    "PRF_VERSION",
    "SECRET_BYTES",
    "SENTINEL",
    "SKIP_CODES",
    "DetectionPlan",
    "KeyedSource",
    "Label",
    "PlannedPosition",
    "Secret",
    "SkipReason",
    "detection_plan",
    "detection_plan_arrays",
    "label_at",
    "label_key",
    "label_key_words",
    "nonce_key",
    "pivot_array",
    "pivot_matrix",
    "warm_up",
]
