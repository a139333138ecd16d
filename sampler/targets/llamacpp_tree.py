"""A llama.cpp forward's draft tree as sequence ids (``sampler.targets.llamacpp_kv``'s module
docstring): the tree's parents read from its visibility, and each node's leaves, so that a
query row whose first sequence id is its leaf's sees exactly its ancestors and itself.

Shapes: q new tokens of one forward.
"""

from __future__ import annotations

import numpy as np


class Plan:
    """A forward's new tokens and their tree, until ``keep``."""

    def __init__(
        self,
        base: int,
        tokens: list[int],
        depths: list[int],
        parents: list[int],
        leaf_of: list[int],
        seqs_of: list[list[int]],
        chain: bool,
    ) -> None:
        self.base, self.tokens, self.depths, self.parents = base, tokens, depths, parents
        self.leaf_of, self.seqs_of, self.chain = leaf_of, seqs_of, chain
        self.leaves = max(leaf_of, default=0) + 1


def tree_parents(new: np.ndarray, depths: list[int]) -> list[int]:
    """Parents (-1 for the root) of q new tokens whose (q, q) visibility ``new`` must be
    "ancestor or self" of a tree rooted at token 0 with parents before children.

    Raises:
        ValueError: ``new`` or ``depths`` is not such a tree.
    """
    q = len(depths)
    parents = [-1] * q
    if depths[0] != 0 or not new[0, 0] or new[0, 1:].any():
        raise ValueError("token 0 must be the tree's root (depth 0, seeing only itself)")
    for i in range(1, q):
        row = new[i]
        seen = np.flatnonzero(row[:i])
        if not row[i] or row[i + 1 :].any() or not len(seen):
            raise ValueError(f"token {i} must see itself and its ancestors, none after it")
        parent = int(seen[-1])
        if (
            depths[i] != depths[parent] + 1
            or not np.array_equal(row[:parent], new[parent, :parent])
            or len(seen) != depths[i]
        ):
            raise ValueError(f"token {i}'s visibility is not its ancestors' plus itself")
        parents[i] = parent
    return parents


def sequences(parents: list[int]) -> tuple[list[int], list[list[int]]]:
    """Leaf numbers of a tree: leaf k (in node order) is the cache's k-th id; each node gets
    one leaf under it first (the one its attention reads) and then every other leaf under it."""
    q = len(parents)
    children = [0] * q
    for parent in parents[1:]:
        children[parent] += 1
    leaves = [i for i in range(q) if children[i] == 0]
    under: list[list[int]] = [[] for _ in range(q)]
    for seq, leaf in enumerate(leaves):
        node = leaf
        while node != -1:
            under[node].append(seq)
            node = parents[node]
    leaf_of = [seqs[0] for seqs in under]
    return leaf_of, under
