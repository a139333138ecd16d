"""Parallel drafter heads on the target's hidden state (MDraft paper §3-4; docs/design.md §7).

At a step whose committed prefix is x_{≤t} (root token x_t), the heads read the target's final
hidden state h_{t−1} (after its last norm, at the token before the root: computed by the previous
verification forward or the prefill) and the embedding of the root token, and predict the L next
tokens x_{t+1}, ..., x_{t+L} in one pass:

    u = W_in [ĥ; ê] + ĥ,  ĥ = rms(h_{t−1}), ê = rms(E(x_t))  (fusion, shared by the heads)
    z_s = u + W_s,2 · SiLU(W_s,1 · u)                         (head s = 1..L, a residual block)
    Q_s(· | x_{≤t}) = softmax(LM_head(norm(z_s)))             (the target's own norm and head)

rms(v) = v / sqrt(mean(v²) + 1e-6) puts both inputs on one scale (the target's final hidden
states are ~15× larger than its embeddings; training stalled without it). The target's
embedding, norm and LM head are frozen and never stored with the heads; W_s,2 and W_in start
at zero, so untrained heads start near the target's own law at t−1 (its norm's gain applies
twice there), a weak but sane drafter. Trained heads for SmolLM2-135M-Instruct ship in
``heads_data/`` (``bench/results/distill_objectives.md``). Q_s does not depend on the drafted
tokens before position s: every node of tree level s gets the same law. That is what
"parallel" means; exactness never depends on it.

Files: ``<dir>/heads.safetensors`` (the trainable weights, float16 by default) and
``<dir>/heads.json`` (``HeadsConfig``: lookahead, hidden size, vocabulary, target fingerprint).

Shapes: n contexts, L heads (lookahead), d the target's hidden size, V vocabulary. Hidden
states h_{t−1} (n, d) and root tokens (n,) int64 -> features (n, L, d) in the heads' dtype
(the target's when loaded, float32 while training; saved as float16) -> logits (n, L, V) in
the target head's dtype.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar, cast

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import PreTrainedModel

from sampler.drafters.base import HiddenRow
from sampler.targets.base import Target
from sampler.targets.transformers import as_target
from sampler.tree import DraftTree

FORMAT = "poissonmark-heads/2"

C = TypeVar("C")
M = TypeVar("M", bound=nn.Module)

SHIPPED_HEADS = Path(__file__).resolve().parent / "heads_data" / "smollm2-135m-instruct"
"""Heads trained for SmolLM2-135M-Instruct by ``scripts/train_drafter.sh`` (spec ``heads``)."""


def output_head(target: PreTrainedModel) -> nn.Linear:
    """The target's LM head (``get_output_embeddings``, which transformers leaves untyped)."""
    return cast(nn.Linear, target.get_output_embeddings())  # type: ignore[no-untyped-call]


_fingerprints: weakref.WeakKeyDictionary[PreTrainedModel, str] = weakref.WeakKeyDictionary()


def load_for_target(
    make: Callable[[C], M],
    config_type: Callable[..., C],
    directory: Path,
    stem: str,
    fmt: str,
    target: PreTrainedModel,
) -> M:
    """A drafter saved as ``<stem>.json`` (its config, with ``format`` and ``target`` fields)
    and ``<stem>.safetensors`` in ``directory``, built by ``make(config)`` on ``target``'s
    device and dtype, in eval mode.

    Raises:
        ValueError: a file missing, a config that does not parse, a format other than ``fmt``,
            a drafter trained for another target (``target_fingerprint``), or weights that do not
            load into ``make(config)``.
    """
    config_path, weights_path = directory / f"{stem}.json", directory / f"{stem}.safetensors"
    if not config_path.is_file() or not weights_path.is_file():
        raise ValueError(f"{directory} must hold {stem}.json and {stem}.safetensors")
    try:
        config = config_type(**json.loads(config_path.read_text()))
    except (json.JSONDecodeError, TypeError) as exc:
        raise ValueError(f"{config_path}: not a {stem} config ({exc})") from None
    found = getattr(config, "format", None)
    if found != fmt:
        raise ValueError(f"{config_path}: format {found!r}, expected {fmt!r}")
    fingerprint = target_fingerprint(target)
    trained_for = getattr(config, "target", None)
    if trained_for != fingerprint:
        raise ValueError(
            f"the {stem} drafter in {directory} was trained for target {trained_for}, "
            f"this target is {fingerprint}"
        )
    param = next(target.parameters())
    module = make(config).to(param.device, param.dtype)
    try:  # load_state_dict copies, converting the dtype
        module.load_state_dict(load_file(str(weights_path)))
    except Exception as exc:  # safetensors' own error type, or shapes that do not fit
        raise ValueError(f"{weights_path}: unreadable or not {config} ({exc})") from None
    return module.eval()


def trained_dir(data_dir: Path, target: PreTrainedModel, stem: str) -> Path:
    """``<data dir>/drafters/<target fingerprint>/<stem>``: where ``poissonmark distill`` writes
    a drafter it trains for ``target`` (``:`` of the fingerprint as ``-``), and where
    ``heads_drafter`` and ``sampler.drafters.eagle.eagle_drafter`` look for one first."""
    return data_dir / "drafters" / target_fingerprint(target).replace(":", "-") / stem


def find_trained(data_dir: Path | None, target: PreTrainedModel, stem: str, shipped: Path) -> Path:
    """The directory of ``target``'s ``stem`` drafter: the one trained for it in ``data_dir``
    (``trained_dir``, where it holds ``<stem>.json``), else the one shipped in the package
    (``shipped``; ``load_for_target`` refuses it for another target)."""
    if data_dir is not None:
        directory = trained_dir(data_dir, target, stem)
        if (directory / f"{stem}.json").is_file():
            return directory
    return shipped


def target_fingerprint(target: PreTrainedModel) -> str:
    """``"sha256:<16 hex>"`` of the target's shape and its LM-head and embedding weights,
    rounded to bfloat16 first so that the float32 (CPU) and bfloat16 (CUDA) loads of one model
    agree.

    Heads are only valid on the target they were trained on; loading them elsewhere is refused.
    Remembered per model object (hashing ~110 MB takes ~0.3 s).
    """
    cached = _fingerprints.get(target)
    if cached is not None:
        return cached
    digest = hashlib.sha256()
    config = target.config
    digest.update(
        json.dumps(
            [config.vocab_size, config.hidden_size, config.num_hidden_layers], sort_keys=True
        ).encode()
    )
    embedding = target.get_input_embeddings().weight
    assert isinstance(embedding, torch.Tensor)
    for weight in (output_head(target).weight, embedding):
        rounded = weight.detach().to("cpu", torch.bfloat16).view(torch.int16)
        digest.update(rounded.contiguous().numpy().tobytes())
    value = "sha256:" + digest.hexdigest()[:16]
    _fingerprints[target] = value
    return value


@dataclass(frozen=True)
class HeadsConfig:
    """What a heads file was trained for.

    Attributes:
        lookahead: L, the number of heads (positions predicted per pass).
        hidden_size: d of the target's hidden state.
        vocab_size: V of the target.
        target: ``target_fingerprint`` of the target.
        objective: the training objective's name (informational).
    """

    lookahead: int
    hidden_size: int
    vocab_size: int
    target: str
    objective: str = ""
    format: str = FORMAT


def _rms(v: torch.Tensor) -> torch.Tensor:
    return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6)


class ParallelHeads(nn.Module):
    """The trainable part: fusion W_in (d × 2d) and L residual blocks (2 · d × d each).

    ``features(hidden, tokens)`` maps (n, d) hidden states and (n,) root tokens to (n, L, d)
    features; ``logits`` applies the frozen target norm and LM head: (n, L, V).
    """

    def __init__(self, config: HeadsConfig) -> None:
        super().__init__()
        d = config.hidden_size
        self.config = config
        self.fuse = nn.Linear(2 * d, d, bias=False)
        self.up = nn.ModuleList(nn.Linear(d, d, bias=False) for _ in range(config.lookahead))
        down = [nn.Linear(d, d, bias=False) for _ in range(config.lookahead)]
        self.down = nn.ModuleList(down)
        nn.init.zeros_(self.fuse.weight)
        for layer in down:
            nn.init.zeros_(layer.weight)

    def features(
        self, hidden: torch.Tensor, token_embedding: torch.Tensor
    ) -> torch.Tensor:  # (n, L, d)
        h, e = _rms(hidden), _rms(token_embedding)
        u = h + self.fuse(torch.cat([h, e], dim=-1))
        return torch.stack(
            [
                u + down(nn.functional.silu(up(u)))
                for up, down in zip(self.up, self.down, strict=True)
            ],
            dim=1,
        )

    def logits(
        self, target: Target | PreTrainedModel, hidden: torch.Tensor, tokens: torch.Tensor
    ) -> torch.Tensor:
        """(n, L, V) drafter logits for (n, d) hidden states h_{t−1} and (n,) root tokens x_t:
        without gradients (decoding) through the target backend's own head where it has one
        (``Target.project``: the packed bfloat16 head of ``sampler.targets.cpu_bf16``, as the
        target's own logits are), else (training, or no such head) through transformers'
        head in the model's dtype."""
        served = as_target(target)
        model = served.model
        dtype = self.fuse.weight.dtype  # the heads' own (float32 while training on bf16 targets)
        embedding = model.get_input_embeddings()(tokens).to(dtype)
        z = self.features(hidden.to(dtype), embedding)  # (n, L, d)
        if not torch.is_grad_enabled():  # decoding, not training
            n, lookahead, d = z.shape
            projected = served.project(z.reshape(n * lookahead, d))
            if projected is not None:
                return projected.view(n, lookahead, -1)
        head = output_head(model)
        out: torch.Tensor = head(model.model.norm(z.to(head.weight.dtype)))
        return out

    def save(self, directory: Path, dtype: torch.dtype = torch.float16) -> None:
        """Write ``heads.safetensors`` (weights in ``dtype``) and ``heads.json``."""
        directory.mkdir(parents=True, exist_ok=True)
        tensors = {
            k: v.detach().to("cpu", dtype).contiguous() for k, v in self.state_dict().items()
        }
        save_file(tensors, str(directory / "heads.safetensors"), metadata={"format": FORMAT})
        (directory / "heads.json").write_text(json.dumps(asdict(self.config), indent=2) + "\n")

    @classmethod
    def load(cls, directory: Path, target: PreTrainedModel) -> ParallelHeads:
        """Load heads for ``target`` (on its device and dtype).

        Raises:
            ValueError: missing files, another format, or heads trained for another target
                (fingerprint, hidden size or vocabulary differ).
        """
        return load_for_target(cls, HeadsConfig, directory, "heads", FORMAT, target)


def new_heads(target: PreTrainedModel, lookahead: int, objective: str = "") -> ParallelHeads:
    """Fresh heads for ``target`` (zero-initialised fusion and residual outputs)."""
    config = HeadsConfig(
        lookahead=lookahead,
        hidden_size=target.config.hidden_size,
        vocab_size=target.config.vocab_size,
        target=target_fingerprint(target),
        objective=objective,
    )
    param = next(target.parameters())
    return ParallelHeads(config).to(param.device, param.dtype)


class HeadsDrafter:
    """``heads:PATH`` — the decoder's drafter from parallel heads (``uses_target_hidden``).

    The decoder hands it the target's hidden state at the token before each step's root
    (``see_target_hidden``) before drafting; level s returns Q_s for every node of that level.
    Without a hidden state (a one-token prompt) it proposes nothing: the tree stays empty.
    One heads pass per step (at level 1); ``calls`` counts levels like every drafter.
    """

    uses_target_hidden = True

    def __init__(self, heads: ParallelHeads, target: Target | PreTrainedModel, name: str) -> None:
        self.heads = heads
        self.target = as_target(target)
        self.vocab_size = self.target.vocab_size
        self.name = name
        self.calls = 0
        self._hidden: HiddenRow | None = None
        self._laws: torch.Tensor | None = None  # (L, V) logits of this step

    def start(self, prompt: list[int]) -> None:
        self._hidden = None
        self._laws = None

    def see_target_hidden(self, hidden: torch.Tensor, row: int | None = None) -> None:
        """(d,) the target's final (normed) hidden state at the token before the next root,
        or row ``row`` of (q, d) ones (``HiddenRow``: indexed when the heads read it)."""
        self._hidden = HiddenRow(hidden, row)
        self._laws = None

    @torch.inference_mode()
    def propose(self, tree: DraftTree, level: int, committed: list[int]) -> torch.Tensor:
        self.calls += 1
        n = len(tree.levels[level - 1])
        if self._hidden is None or level > self.heads.config.lookahead:
            return torch.full((n, self.vocab_size), -torch.inf, dtype=torch.float32)
        if self._laws is None:
            root = torch.tensor([committed[-1]], device=self._hidden.states.device)
            self._laws = self.heads.logits(self.target, self._hidden.get()[None], root)[0]
        return self._laws[level - 1].expand(n, -1)

    def finish_step(self, tree: DraftTree, visited: list[int], committed: list[int]) -> None:
        self._laws = None


@torch.inference_mode()
def prime_heads(drafters: list[HeadsDrafter], roots: list[int]) -> None:
    """The level-1 heads pass of several requests' heads drafters in ONE batched call: each
    drafter that has a hidden state and no laws yet gets Q_1..Q_L (its own row of the batch),
    as its own ``propose`` at level 1 would compute them; drafters sharing one ``heads`` object
    are batched together (``sampler.batch``).

    Args:
        drafters: the drafters of a step, one per request.
        roots: each request's root token (its last committed token).
    """
    groups: dict[int, list[tuple[HeadsDrafter, int]]] = {}
    for drafter, root in zip(drafters, roots, strict=True):
        if drafter._hidden is not None and drafter._laws is None:
            groups.setdefault(id(drafter.heads), []).append((drafter, root))
    for members in groups.values():
        if len(members) == 1:
            continue  # its own propose computes the same row
        head = members[0][0]
        hidden = torch.stack([d._hidden.get() for d, _ in members if d._hidden is not None])
        tokens = torch.tensor([root for _, root in members], device=hidden.device)
        laws = head.heads.logits(head.target, hidden, tokens)  # (n, L, V)
        for row, (drafter, _) in enumerate(members):
            drafter._laws = laws[row]


def heads_drafter(
    path: str, target: Target | PreTrainedModel, data_dir: Path | None = None
) -> HeadsDrafter:
    """Load ``heads:PATH`` for ``target``; an empty ``path`` means the heads trained for it in
    ``data_dir`` (``find_trained``), else the shipped heads (``SHIPPED_HEADS``).

    Raises:
        ValueError: a backend that gives no hidden states (``Target.gives_hidden``), or
            ``ParallelHeads.load``'s errors.
    """
    name = f"heads:{path}" if path else "heads"
    served = as_target(target)
    if not served.gives_hidden:
        raise ValueError(
            f"heads drafting needs the target's hidden states; backend {served.backend()} "
            "gives none"
        )
    model = served.model
    directory = (
        Path(path).expanduser() if path else find_trained(data_dir, model, "heads", SHIPPED_HEADS)
    )
    return HeadsDrafter(ParallelHeads.load(directory, model), served, name)
