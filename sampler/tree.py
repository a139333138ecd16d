"""The draft tree of one speculative step (MPFR paper Alg. 7 / Alg. 10).

Node 0 is the root: the last committed token, whose context is the committed prefix h. A node
at depth s stands for the context h ‖ (path tokens); its multiplicity ν is the number of the B
drafts that passed through it. Nodes are stored level by level (breadth-first), so the nodes of
one depth form a contiguous index range — one drafter call per level, one target call per tree.

Shapes: n nodes of a draft tree. Parent indices and depths n ints; the ancestor mask (n, n)
bool ([i, j]: node j is node i or one of its ancestors).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Node:
    """One context of the tree.

    Attributes:
        token: the token that ends this context (the root's is the last committed token).
        parent: index of the parent node, -1 for the root.
        depth: 0 for the root.
        multiplicity: ν(c), drafts through this node.
        children: drafted next token -> child index (the draft set D(c) is its keys).
    """

    token: int
    parent: int
    depth: int
    multiplicity: int
    children: dict[int, int] = field(default_factory=dict)


class DraftTree:
    """A draft tree rooted at the committed prefix: structure only (tokens, parents,
    multiplicities). What a method draws at a node is its policy's business
    (``sampler.policies``); keyed context keys are a function of the tree and the sequence's
    history (``sampler.policies.context_keys``).

    Args:
        root_token: the last committed token.
        drafts: B, the root multiplicity.
    """

    def __init__(self, root_token: int, drafts: int) -> None:
        self.nodes: list[Node] = []
        self.levels: list[list[int]] = [[]]
        self._add(root_token, -1, drafts)

    def _add(self, token: int, parent: int, multiplicity: int) -> int:
        depth = 0 if parent < 0 else self.nodes[parent].depth + 1
        index = len(self.nodes)
        self.nodes.append(Node(token, parent, depth, multiplicity))
        while len(self.levels) <= depth:
            self.levels.append([])
        self.levels[depth].append(index)
        if parent >= 0:
            self.nodes[parent].children[token] = index
        return index

    def add_drafts(self, parent: int, drafts: list[int]) -> None:
        """Merge the drafts sampled at ``parent`` into children with multiplicities."""
        counts: dict[int, int] = {}
        for token in drafts:
            counts[token] = counts.get(token, 0) + 1
        for token, count in counts.items():
            self._add(token, parent, count)

    def level(self, depth: int) -> list[int]:
        """Indices of the nodes at ``depth`` (empty past the deepest level)."""
        return self.levels[depth] if depth < len(self.levels) else []

    def __len__(self) -> int:
        return len(self.nodes)

    def is_chain(self) -> bool:
        """Whether every node is the child of the one before it (node i's parent is i − 1):
        its tree-attention mask is the causal one."""
        return all(node.parent == i - 1 for i, node in enumerate(self.nodes))

    def ancestors(self, upto: int | None = None) -> torch.Tensor:
        """(n, n) bool: [i, j] is True when node j is node i or one of its ancestors."""
        n = len(self.nodes) if upto is None else upto
        anc = torch.zeros((n, n), dtype=torch.bool)
        for i in range(n):
            parent = self.nodes[i].parent
            if parent >= 0:
                anc[i] = anc[parent]
            anc[i, i] = True
        return anc

    def path_tokens(self, index: int) -> list[int]:
        """Tokens from the first drafted node down to ``index`` (root excluded)."""
        out: list[int] = []
        while index > 0:
            out.append(self.nodes[index].token)
            index = self.nodes[index].parent
        return out[::-1]
