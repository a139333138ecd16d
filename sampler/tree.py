"""The draft tree of one speculative step (MPFR paper Alg. 7 / Alg. 10).

Node 0 is the root: the last committed token, whose context is the committed prefix h. A node
at depth s stands for the context h ‖ (path tokens); its multiplicity ν is the number of the B
drafts that passed through it. Nodes are stored level by level (breadth-first), so the nodes of
one depth form a contiguous index range — one drafter call per level, one target call per tree.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from keyed import KeyedSource, Label


@dataclass
class Node:
    """One context of the tree.

    Attributes:
        token: the token that ends this context (the root's is the last committed token).
        parent: index of the parent node, -1 for the root.
        depth: 0 for the root.
        label: the label ℓ(c) of this context (its last m tokens).
        key: context key (κ0, κ1) of Π(c), the keyed source of the next token.
        multiplicity: ν(c), drafts through this node.
        children: drafted next token -> child index (the draft set D(c) is its keys).
    """

    token: int
    parent: int
    depth: int
    label: Label
    key: tuple[int, int]
    multiplicity: int
    children: dict[int, int] = field(default_factory=dict)


class DraftTree:
    """A draft tree rooted at the committed prefix, with keyed sources for every node.

    Args:
        root_token: the last committed token.
        root_label: label of the committed prefix h.
        position: response position of the token drawn at the root context (= tokens emitted).
        history: labels already used at earlier response positions (repeated-context rule).
        source: the request's keyed source, or None for unkeyed methods.
        drafts: B, the root multiplicity.
    """

    def __init__(
        self,
        root_token: int,
        root_label: Label,
        position: int,
        history: set[Label],
        source: KeyedSource | None,
        drafts: int,
    ) -> None:
        self.position = position
        self.history = history
        self.source = source
        self.nodes: list[Node] = []
        self.levels: list[list[int]] = [[]]
        self._add(root_token, -1, root_label, drafts)

    def _repeated(self, label: Label, parent: int) -> bool:
        if label in self.history:
            return True
        while parent >= 0:
            node = self.nodes[parent]
            if node.label == label:
                return True
            parent = node.parent
        return False

    def _add(self, token: int, parent: int, label: Label, multiplicity: int) -> int:
        depth = 0 if parent < 0 else self.nodes[parent].depth + 1
        key = (0, 0)
        if self.source is not None:
            key = self.source.context_key(
                label, self.position + depth, self._repeated(label, parent)
            )
        index = len(self.nodes)
        self.nodes.append(Node(token, parent, depth, label, key, multiplicity))
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
        width = len(self.nodes[parent].label)
        for token, count in counts.items():
            label = (*self.nodes[parent].label, token)[-width:]
            self._add(token, parent, label, count)

    def __len__(self) -> int:
        return len(self.nodes)

    def keys(self, indices: list[int], device: torch.device) -> torch.Tensor:
        """(n, 2) int64 context keys of the given nodes."""
        return torch.tensor([self.nodes[i].key for i in indices], dtype=torch.int64, device=device)

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
