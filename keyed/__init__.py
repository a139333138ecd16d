"""The watermark contract: key material, the keyed PRF, labels and the repeated-context rule.

The only home of keyed randomness in poissonmark (DESIGN §1-§2).
"""

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
    warm_up,
)
from keyed.prf import (
    PRF_VERSION,
    SECRET_BYTES,
    SENTINEL,
    Secret,
    clock_uniforms,
    exponential_clocks,
    keys_tensor,
    label_key,
    label_key_words,
    label_keys,
    nonce_key,
    philox4x32_10,
    pivot_array,
    pivots,
    uniforms_from_keys,
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
    "clock_uniforms",
    "detection_plan",
    "detection_plan_arrays",
    "exponential_clocks",
    "keys_tensor",
    "label_at",
    "label_key",
    "label_key_words",
    "label_keys",
    "nonce_key",
    "philox4x32_10",
    "pivot_array",
    "pivots",
    "uniforms_from_keys",
    "warm_up",
]
