"""The keyed PRF (``keyed/prf.py``, docs/design.md §2): known answers, an independent reference,
the U mapping, statistical quality, key separation (case C1), path agreement (case C2) and
the handling of key material.

Reference implementation: ``randomgen.Philox(number=4, width=32)``. It increments its counter
*before* each block, so the block at counter c comes from ``counter=(c - 1) mod 2^128``
(the project's shared REFERENCE.md).
"""

from __future__ import annotations

import hashlib
import math
import struct
from fractions import Fraction

import numpy as np
import pytest
import torch
from randomgen import Philox
from scipy import stats

from keyed.context import KeyedSource
from keyed.prf import PRF_VERSION, SENTINEL, Secret, label_key, nonce_key, pivot_array
from keyed.tensor import clock_uniforms, keys_tensor, philox4x32_10, uniforms_from_keys
from tests.keyed.reference import pivots

MASK32 = 2**32 - 1
VOCAB = 49_152
SECRET_A = Secret(bytes(range(32)))
SECRET_B = Secret(bytes(range(1, 33)))

# Test level for every statistical assertion below. The inputs are fixed, so each test is
# deterministic; α bounds the chance that a correct PRF would have produced a failing input
# set (0.1 % per test), while a real defect (a stuck or shared bit, an ignored key or counter
# word, correlated streams) gives p-values far below 1e-3 at these sample sizes (see the
# power checks at the end of the statistical section).
ALPHA = 1e-3


# ----------------------------------------------------------------------------- helpers


def reference_block(counter: tuple[int, ...], key: tuple[int, int]) -> tuple[int, ...]:
    """Philox4x32-10 block at ``counter`` under ``key`` from randomgen (word 0 first)."""
    c = sum(w << (32 * i) for i, w in enumerate(counter))
    k = key[0] | (key[1] << 32)
    gen = Philox(counter=(c - 1) % 2**128, key=k, number=4, width=32)
    return tuple(int(x) for x in gen.random_raw(4))


def reference_uniform(key: tuple[int, int], token: int, arrival: int) -> float:
    """U = (top 53 bits of x1:x0 + 1/2) / 2^53, exact rational, rounded once to float64."""
    x0, x1, _, _ = reference_block((token, arrival, 0, 0), key)
    top53 = ((x1 << 32) | x0) >> 11
    return float(Fraction(2 * top53 + 1, 2**54))


def ours_block(counter: tuple[int, ...], key: tuple[int, int]) -> tuple[int, ...]:
    words = philox4x32_10(
        tuple(torch.tensor(w, dtype=torch.int64) for w in counter),
        tuple(torch.tensor(w, dtype=torch.int64) for w in key),
    )
    return tuple(int(w) for w in words)


def label_uniforms(
    secret: Secret, label: tuple[int, ...], tokens: list[int], b: int
) -> torch.Tensor:
    """(K, B) uniforms of ``tokens`` at ``label`` for arrivals 1..B."""
    keys = keys_tensor([label_key(secret, label)])
    return clock_uniforms(keys, torch.tensor([tokens], dtype=torch.int64), b)[0]


def random_label_keys(n: int, seed: int, width: int = 4) -> torch.Tensor:
    """(n, 2) context keys of n random labels under SECRET_A."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, VOCAB, size=(n, width))
    return keys_tensor([label_key(SECRET_A, tuple(int(t) for t in row)) for row in labels])


# ------------------------------------------------------------------ Philox known answers

KNOWN_ANSWERS = [
    pytest.param(
        (0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8), id="zeros"
    ),
    pytest.param(
        (MASK32,) * 4, (MASK32,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD), id="ones"
    ),
    pytest.param(
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
        id="pi",
    ),
]


@pytest.mark.parametrize(("counter", "key", "expected"), KNOWN_ANSWERS)
def test_philox_known_answer(counter, key, expected):
    """Random123 published known-answer vectors for Philox4x32-10."""
    assert ours_block(counter, key) == expected


@pytest.mark.parametrize(("counter", "key", "expected"), KNOWN_ANSWERS)
def test_reference_reproduces_known_answer(counter, key, expected):
    """The reference helper itself is right (guards the counter pre-increment handling)."""
    assert reference_block(counter, key) == expected


def test_philox_known_answers_vectorised():
    """All three vectors in one batched call give the same words as one at a time."""
    counters = [p.values[0] for p in KNOWN_ANSWERS]
    keys = [p.values[1] for p in KNOWN_ANSWERS]
    expected = [p.values[2] for p in KNOWN_ANSWERS]
    out = philox4x32_10(
        tuple(torch.tensor([c[i] for c in counters]) for i in range(4)),
        tuple(torch.tensor([k[i] for k in keys]) for i in range(2)),
    )
    got = [tuple(int(w[n]) for w in out) for n in range(len(KNOWN_ANSWERS))]
    assert got == expected


def _edge_words(rng: np.random.Generator, size: tuple[int, int]) -> np.ndarray:
    """uint32 words, ~40 % of them from the edges of the range (near 0, 2^31, 2^32 - 1)."""
    words = rng.integers(0, 2**32, size=size, dtype=np.uint64)
    edges = np.array(
        [0, 1, 2, 2**31 - 1, 2**31, MASK32 - 16, MASK32 - 2, MASK32 - 1, MASK32], dtype=np.uint64
    )
    pick = rng.random(size) < 0.4
    words[pick] = rng.choice(edges, size=int(pick.sum()))
    return words


def test_philox_matches_randomgen_reference():
    """200 random (counter, key) pairs, many words near 2^32 - 1, vs randomgen."""
    rng = np.random.default_rng(20_240_601)
    words = _edge_words(rng, (200, 6))
    words[:5] = MASK32  # all-ones counters and keys (the counter wraps in randomgen)
    words[5:10, 4:] = MASK32  # all-ones keys only
    rows = [tuple(int(w) for w in row) for row in words]
    out = philox4x32_10(
        tuple(torch.tensor([r[i] for r in rows]) for i in range(4)),
        tuple(torch.tensor([r[4 + i] for r in rows]) for i in range(2)),
    )
    for n, row in enumerate(rows):
        got = tuple(int(w[n]) for w in out)
        assert got == reference_block(row[:4], (row[4], row[5])), f"pair {n}: {row}"


# --------------------------------------------------------------------- the U mapping


@pytest.mark.parametrize(
    ("key", "token", "arrival"),
    [
        pytest.param((0, 0), 0, 1, id="zero_key"),
        pytest.param((MASK32, MASK32), VOCAB - 1, 8, id="ones_key"),
        pytest.param((0x12345678, 0x9ABCDEF0), 2**31, 3, id="token_2p31"),
        pytest.param((0xA4093822, 0x299F31D0), 1, 2, id="pi_key"),
        pytest.param((7, MASK32 - 1), MASK32, 1, id="token_max"),
    ],
)
def test_uniform_is_top53_plus_half(key, token, arrival):
    """U(κ, u, j) = (top 53 bits of x1·2^32 + x0 + 0.5) / 2^53, from randomgen words."""
    k = torch.tensor(key, dtype=torch.int64)
    one = uniforms_from_keys(
        k[0], k[1], torch.tensor(token, dtype=torch.int64), torch.tensor(arrival)
    )
    assert one.dtype == torch.float64
    assert one.item() == reference_uniform(key, token, arrival)
    batch = clock_uniforms(k[None, :], torch.tensor([[token]]), arrival)
    assert batch[0, 0, arrival - 1].item() == reference_uniform(key, token, arrival)


def test_uniforms_strictly_inside_unit_interval():
    keys = random_label_keys(200, seed=1)
    tokens = torch.tensor([0, 1, 2, 2**31, VOCAB - 1, MASK32])[None, :].expand(200, -1)
    u = clock_uniforms(keys, tokens, 8)
    assert u.dtype == torch.float64
    assert u.shape == (200, 6, 8)
    assert bool(((u > 0) & (u < 1)).all())


def test_extreme_words_stay_below_one():
    """The largest 53-bit value would round (top53 + 0.5) / 2^53 up to 1; U must stay < 1."""
    from keyed.tensor import _to_unit_interval

    u = _to_unit_interval(torch.tensor([0, 2**52, 2**53 - 2, 2**53 - 1]))
    assert bool((u < 1.0).all()) and bool((u > 0.0).all())
    assert -math.log1p(-u[-1].item()) < 40.0  # the Aaronson term stays finite


@pytest.mark.parametrize("size", [4, 483, 8192, 8193, 100_000])
def test_numpy_fast_path_equals_tensor_philox(size: int):
    """The CPU fast path (numpy uint64) and the device-generic int64 tensor path agree bit for
    bit on random (counter, key) words, including the extremes, for one block, exactly one
    block, one past it and many blocks with a partial last one."""
    import numpy as np

    from keyed.philox import BLOCK, philox4x32_10_numpy

    assert BLOCK == 8192  # the sizes above straddle it
    rng = np.random.default_rng(123)
    words = rng.integers(0, 2**32, size=(4, size), dtype=np.uint64)
    words[:, :4] = [[0, 2**32 - 1, 0, 2**32 - 1]] * 4
    c0, c1, k0, k1 = words
    x0n, x1n = philox4x32_10_numpy(c0.copy(), c1.copy(), k0.copy(), k1.copy())
    t = [torch.from_numpy(w.astype(np.int64)) for w in words]
    zero = torch.zeros_like(t[0])
    x0t, x1t, _, _ = philox4x32_10((t[0], t[1], zero, zero), (t[2], t[3]))
    assert np.array_equal(x0n.astype(np.int64), x0t.numpy())
    assert np.array_equal(x1n.astype(np.int64), x1t.numpy())


# -------------------------------------------------------------- statistical quality


def test_uniforms_are_uniform_ks():
    """KS test of 64,000 uniforms over 800 labels x 20 tokens x 4 arrivals (α above)."""
    keys = random_label_keys(800, seed=2)
    rng = np.random.default_rng(3)
    tokens = torch.from_numpy(rng.integers(0, VOCAB, size=(800, 20)))
    u = clock_uniforms(keys, tokens, 4).flatten().numpy()
    assert u.size == 64_000
    assert stats.kstest(u, "uniform").pvalue > ALPHA


def _grid_chisquare_pvalue(x: np.ndarray, y: np.ndarray, bins: int = 10) -> float:
    """Chi-square p-value that (x, y) are independent U(0,1): counts on a bins x bins grid."""
    counts, _, _ = np.histogram2d(x, y, bins=bins, range=[[0, 1], [0, 1]])
    return float(stats.chisquare(counts.ravel()).pvalue)


def _assert_independent_uniforms(x: np.ndarray, y: np.ndarray) -> None:
    # Joint law on a 10 x 10 grid (expected 500 per cell at n = 50,000): catches dependence
    # of any shape and non-uniform marginals; Pearson r catches linear dependence. α above.
    assert _grid_chisquare_pvalue(x, y) > ALPHA
    assert stats.chi2_contingency(np.histogram2d(x, y, bins=10)[0]).pvalue > ALPHA
    assert stats.pearsonr(x, y).pvalue > ALPHA


N_LABELS, N_TOKENS = 1_000, 50  # 50,000 pairs per independence test


def _labels_and_tokens(seed: int) -> tuple[np.ndarray, torch.Tensor]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, VOCAB, size=(N_LABELS, 4))
    tokens = torch.from_numpy(rng.integers(0, VOCAB - 1, size=(N_LABELS, N_TOKENS)))
    return labels, tokens


def _keys(labels: np.ndarray) -> torch.Tensor:
    return keys_tensor([label_key(SECRET_A, tuple(int(t) for t in row)) for row in labels])


def test_independent_across_neighbouring_labels():
    """U(ℓ, u, 1) vs U(ℓ', u, 1), ℓ' = ℓ with its last id + 1 (the closest other label)."""
    labels, tokens = _labels_and_tokens(seed=4)
    neighbours = labels.copy()
    neighbours[:, -1] += 1
    x = clock_uniforms(_keys(labels), tokens, 1).flatten().numpy()
    y = clock_uniforms(_keys(neighbours), tokens, 1).flatten().numpy()
    _assert_independent_uniforms(x, y)


def test_independent_across_neighbouring_tokens():
    """U(ℓ, u, 1) vs U(ℓ, u + 1, 1)."""
    labels, tokens = _labels_and_tokens(seed=5)
    keys = _keys(labels)
    x = clock_uniforms(keys, tokens, 1).flatten().numpy()
    y = clock_uniforms(keys, tokens + 1, 1).flatten().numpy()
    _assert_independent_uniforms(x, y)


def test_independent_across_arrivals():
    """U(ℓ, u, 1) vs U(ℓ, u, 2)."""
    labels, tokens = _labels_and_tokens(seed=6)
    u = clock_uniforms(_keys(labels), tokens, 2)
    _assert_independent_uniforms(u[..., 0].flatten().numpy(), u[..., 1].flatten().numpy())


def test_statistical_checks_have_power():
    """The checks above reject realistic defects, so passing them means something."""
    labels, tokens = _labels_and_tokens(seed=7)
    u = clock_uniforms(_keys(labels), tokens, 2).flatten().numpy()
    # a mapping that loses the top bit (values only in (0, 1/2)) fails the KS test
    assert stats.kstest(u / 2, "uniform").pvalue < ALPHA
    # an arrival counter that is ignored (U(ℓ,u,2) = U(ℓ,u,1)) fails the independence checks
    assert _grid_chisquare_pvalue(u, u) < ALPHA
    # a weak dependence: y shares 1/8 of its value with x
    rng = np.random.default_rng(8)
    y = (u / 8 + rng.random(u.size) * 7 / 8) % 1.0
    assert stats.pearsonr(u, y).pvalue < ALPHA


# ---------------------------------------------------- key separation (case C1) and domains

C1_TOKENS = [0, 1, 2, VOCAB - 1]
SECRET_PAIRS = [
    pytest.param(SECRET_A, SECRET_B, id="A_vs_B"),
    pytest.param(Secret(bytes(32)), Secret(b"\xff" * 32), id="zeros_vs_ones"),
    pytest.param(Secret(bytes(32)), Secret(bytes(31) + b"\x01"), id="one_bit"),
]


@pytest.mark.parametrize(("a", "b"), SECRET_PAIRS)
@pytest.mark.parametrize(
    "label",
    [
        pytest.param((0, 0, 0, 0), id="zero_label"),
        pytest.param((SENTINEL,) * 4, id="sentinel_label"),
        pytest.param((0,), id="zero_m1"),
        pytest.param((SENTINEL,) * 8, id="sentinel_m8"),
    ],
)
def test_case_c1_every_uniform_depends_on_the_secret(a, b, label):
    """Case C1: no (label, token, arrival) lets the PRF ignore the key, zeros included."""
    ua = label_uniforms(a, label, C1_TOKENS, 4)
    ub = label_uniforms(b, label, C1_TOKENS, 4)
    assert ua.shape == (4, 4)
    assert bool((ua != ub).all())
    assert label_key(a, label) != label_key(b, label)


@pytest.mark.parametrize(("a", "b"), SECRET_PAIRS)
@pytest.mark.parametrize(
    ("nonce", "position"),
    [
        pytest.param(0, 0, id="n0_p0"),
        pytest.param(1, 0, id="n1_p0"),
        pytest.param(0, 7, id="n0_p7"),
        pytest.param(2**64 - 1, MASK32, id="nmax_pmax"),
    ],
)
def test_case_c1_nonce_stream_depends_on_the_secret(a, b, nonce, position):
    ka, kb = nonce_key(a, nonce, position), nonce_key(b, nonce, position)
    assert ka != kb
    toks = torch.tensor([C1_TOKENS])
    ua = clock_uniforms(keys_tensor([ka]), toks, 4)
    ub = clock_uniforms(keys_tensor([kb]), toks, 4)
    assert bool((ua != ub).all())


def test_context_key_matches_documented_construction():
    """κ = BLAKE2b-64(key=secret)(len(tag):u32le ‖ tag ‖ payload), words little-endian."""

    def spec(secret: bytes, tag: bytes, payload: bytes) -> tuple[int, int]:
        digest = hashlib.blake2b(
            struct.pack("<I", len(tag)) + tag + payload, key=secret, digest_size=8
        ).digest()
        return struct.unpack("<II", digest)

    raw = bytes(range(32))
    label = (SENTINEL, 0, 1, VOCAB - 1)
    assert label_key(Secret(raw), label) == spec(raw, b"clock", struct.pack("<5I", 4, *label))
    assert nonce_key(Secret(raw), 2**64 - 1, 9) == spec(
        raw, b"nonce-clock", struct.pack("<QI", 2**64 - 1, 9)
    )


def test_domains_and_widths_are_separated():
    """Same bytes under the two tags, and labels that differ only in m, give different keys."""
    # label (0, 0) has payload 02000000 00000000 00000000; nonce 2, position 0 has the same bytes
    assert struct.pack("<3I", 2, 0, 0) == struct.pack("<QI", 2, 0)
    assert label_key(SECRET_A, (0, 0)) != nonce_key(SECRET_A, 2, 0)
    keys = {label_key(SECRET_A, (0,) * m) for m in range(1, 9)}
    assert len(keys) == 8


# ------------------------------------------------ arrivals, sampler vs detector paths (C2)


def test_first_arrival_does_not_depend_on_num_arrivals():
    """G_{u,1} is the same whatever B is: arrival j is its own counter word."""
    keys = random_label_keys(16, seed=9)
    tokens = torch.arange(VOCAB - 64, VOCAB)[None, :].expand(16, -1)
    one = clock_uniforms(keys, tokens, 1)
    eight = clock_uniforms(keys, tokens, 8)
    assert torch.equal(one, eight[..., :1])
    assert torch.equal(clock_uniforms(keys, tokens, 3), eight[..., :3])


def test_case_c2_sampler_and_detector_paths_agree():
    """Case C2 on the CPU: the detector's pivots equal the sampler's first-arrival clocks."""
    keys = random_label_keys(64, seed=10)
    rng = np.random.default_rng(11)
    vocab = torch.from_numpy(rng.integers(0, VOCAB, size=(64, 50)))
    observed = vocab[:, 17]
    sampler = clock_uniforms(keys, vocab, 4)[:, 17, 0]
    assert torch.equal(pivots(keys, observed), sampler)
    detector = pivot_array(keys.numpy(), observed.numpy())  # the detector's own path
    assert torch.equal(torch.from_numpy(detector), sampler)
    for n in range(0, 64, 13):
        key = (int(keys[n, 0]), int(keys[n, 1]))
        assert sampler[n].item() == reference_uniform(key, int(observed[n]), 1)


def test_everything_stays_on_the_tokens_device():
    """No tensor is left on the CPU when the inputs live elsewhere ('meta' stands in for
    CUDA here: mixing devices raises on both)."""
    keys = torch.zeros((3, 2), dtype=torch.int64, device="meta")
    tokens = torch.zeros((3, 5), dtype=torch.int64, device="meta")
    assert clock_uniforms(keys, tokens, 2).device.type == "meta"
    assert pivots(keys, tokens[:, 0]).device.type == "meta"
    assert (
        uniforms_from_keys(keys[:, 0], keys[:, 1], tokens[:, 0], torch.tensor(1)).device.type
        == "meta"
    )


# ------------------------------------------------------------------------ key material

RAW = bytes.fromhex("8f" * 4 + "13a7c2e9" * 7)


def test_secret_never_shows_its_material():
    secret = Secret(RAW)
    shown = [
        repr(secret),
        str(secret),
        f"{secret}",
        f"{secret!r}",
        "%s" % (secret,),  # noqa: UP031
        "{}".format(secret),  # noqa: UP032
        repr(KeyedSource(secret)),
        repr([secret]),
    ]
    try:
        raise ValueError(f"cannot use key {secret} / {secret!r}")
    except ValueError as exc:
        shown.append(str(exc))
        shown.append(repr(exc))
    for text in shown:
        assert RAW.hex() not in text.lower()
        assert RAW.hex()[:16] not in text.lower()
        assert repr(RAW)[2:-1] not in text
    assert secret.reveal() == RAW


@pytest.mark.parametrize(
    "material",
    [
        pytest.param(b"", id="empty"),
        pytest.param(bytes(31), id="31"),
        pytest.param(bytes(33), id="33"),
        pytest.param("x" * 32, id="str"),
    ],
)
def test_secret_wrong_length_raises(material):
    with pytest.raises(ValueError, match="32") as info:
        Secret(material)
    assert "x" * 32 not in str(info.value)


def test_secret_equality_and_pickle():
    import pickle

    assert Secret(RAW) == Secret(RAW)
    assert Secret(RAW) != Secret(bytes(32))
    assert hash(Secret(RAW)) == hash(Secret(RAW))
    assert pickle.loads(pickle.dumps(Secret(RAW))) == Secret(RAW)


# --------------------------------------------------------------------- input validation


@pytest.mark.parametrize("bad", [-1, 2**32, 2**40])
def test_label_key_rejects_ids_outside_uint32(bad):
    with pytest.raises(ValueError, match=r"2\^32"):
        label_key(SECRET_A, (0, 1, bad, 2))


def test_label_key_accepts_uint32_edges():
    assert label_key(SECRET_A, (0, MASK32)) != label_key(SECRET_A, (MASK32, 0))


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"context_width": 0}, id="width0"),
        pytest.param({"context_width": 65}, id="width65"),
        pytest.param({"nonce": -1}, id="nonce_neg"),
        pytest.param({"nonce": 2**64}, id="nonce_2p64"),
        pytest.param({"prf_version": PRF_VERSION + 1}, id="version_next"),
        pytest.param({"prf_version": 0}, id="version0"),
    ],
)
def test_keyed_source_rejects_bad_parameters(kwargs):
    (name,) = kwargs
    with pytest.raises(ValueError, match=name):
        KeyedSource(SECRET_A, **kwargs)


def test_keyed_source_accepts_edges():
    KeyedSource(SECRET_A, context_width=1, nonce=0)
    KeyedSource(SECRET_A, context_width=64, nonce=2**64 - 1)


@pytest.mark.parametrize(
    ("keys", "tokens", "b"),
    [
        pytest.param(torch.zeros((2, 3)), torch.zeros((2, 4)), 1, id="keys_not_N2"),
        pytest.param(torch.zeros((2, 2)), torch.zeros((3, 4)), 1, id="tokens_rows"),
        pytest.param(torch.zeros((2, 2)), torch.zeros((2, 4)), 0, id="zero_arrivals"),
    ],
)
def test_clock_uniforms_rejects_bad_shapes(keys, tokens, b):
    with pytest.raises(ValueError, match="expected"):
        clock_uniforms(keys.long(), tokens.long(), b)


# ------------------------------------------------------------ KeyedSource.context_key


def test_context_key_repeated_with_masking_uses_nonce_stream():
    src = KeyedSource(SECRET_A, nonce=12345)
    label = (5, 6, 7, 8)
    assert src.context_key(label, 9, repeated=False) == label_key(SECRET_A, label)
    assert src.context_key(label, 9, repeated=True) == nonce_key(SECRET_A, 12345, 9)
    assert src.context_key(label, 9, repeated=True) != label_key(SECRET_A, label)
    assert src.context_key(label, 10, repeated=True) != src.context_key(label, 9, repeated=True)


def test_context_key_without_masking_always_uses_label():
    src = KeyedSource(SECRET_A, masking=False, nonce=12345)
    label = (5, 6, 7, 8)
    assert src.context_key(label, 9, repeated=True) == label_key(SECRET_A, label)
    assert src.context_key(label, 9, repeated=False) == label_key(SECRET_A, label)


def test_context_key_nonces_differ():
    label = (5, 6, 7, 8)
    keys = {KeyedSource(SECRET_A, nonce=n).context_key(label, 3, True) for n in range(50)}
    assert len(keys) == 50
    # the label key never depends on the nonce (position 7: past the prompt window of m = 4)
    assert KeyedSource(SECRET_A, nonce=1).context_key(label, 7, False) == KeyedSource(
        SECRET_A, nonce=2
    ).context_key(label, 7, False)


@pytest.mark.parametrize("width", [1, 4, 8])
def test_context_key_prompt_window_uses_nonce_stream(width):
    """docs/design.md §2: the first m response positions (labels reaching into the prompt) draw from
    the nonce stream with masking on; from position m on, a first use is keyed by its label;
    with masking off every position is keyed by its label."""
    label = tuple(range(5, 5 + width))
    src = KeyedSource(SECRET_A, context_width=width, nonce=77)
    for position in range(width):
        assert src.in_prompt_window(position)
        assert src.context_key(label, position, False) == nonce_key(SECRET_A, 77, position)
    assert not src.in_prompt_window(width)
    assert src.context_key(label, width, False) == label_key(SECRET_A, label)
    unmasked = KeyedSource(SECRET_A, context_width=width, masking=False, nonce=77)
    assert unmasked.context_key(label, 0, False) == label_key(SECRET_A, label)


# ------------------------------------------------------------------------ CPU == CUDA


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cpu_and_cuda_are_bit_identical():
    """Case C2 across devices: 100k (key, token, arrival) triples and raw Philox words."""
    rng = np.random.default_rng(12)
    n = 100_000
    k0 = torch.from_numpy(_edge_words(rng, (n, 1))[:, 0].astype(np.int64))
    k1 = torch.from_numpy(_edge_words(rng, (n, 1))[:, 0].astype(np.int64))
    tokens = torch.from_numpy(rng.integers(0, VOCAB, size=n))
    tokens[:8] = torch.tensor([0, 1, 2, VOCAB - 1, 2**31 - 1, 2**31, MASK32 - 1, MASK32])
    arrivals = torch.from_numpy(rng.integers(1, 9, size=n))
    cpu = uniforms_from_keys(k0, k1, tokens, arrivals)
    cuda = uniforms_from_keys(k0.cuda(), k1.cuda(), tokens.cuda(), arrivals.cuda())
    assert cuda.device.type == "cuda"
    assert torch.equal(cpu, cuda.cpu())

    words = torch.from_numpy(_edge_words(rng, (n, 6)).astype(np.int64))
    counter = tuple(words[:, i] for i in range(4))
    key = tuple(words[:, 4 + i] for i in range(2))
    out_cpu = philox4x32_10(counter, key)
    out_cuda = philox4x32_10(
        tuple(c.cuda() for c in counter),
        tuple(k.cuda() for k in key),
    )
    for a, b in zip(out_cpu, out_cuda, strict=True):
        assert torch.equal(a, b.cpu())

    keys = keys_tensor([(int(a), int(b)) for a, b in zip(k0[:256], k1[:256], strict=True)])
    vocab = tokens[: 256 * 64].reshape(256, 64)
    assert torch.equal(
        clock_uniforms(keys, vocab, 4), clock_uniforms(keys.cuda(), vocab.cuda(), 4).cpu()
    )
    assert torch.equal(pivots(keys, vocab[:, 0]), pivots(keys.cuda(), vocab[:, 0].cuda()).cpu())
