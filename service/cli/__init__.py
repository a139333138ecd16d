"""The ``poissonmark`` command line: one module per command group.

- ``keys``: watermark keys (``service.cli.keys``); ``tokens``: API bearer tokens
  (``service.cli.api_tokens``).
- ``generate`` (``service.cli.generate``) and ``detect`` (``service.cli.detect``, corpus mode in
  ``service.jobs.corpus``): the same service layer as the HTTP routes (``service.jobs.generation``,
  ``service.jobs.detection``), and with ``--json`` the same JSON as their responses.
- ``distill``: train MDraft drafter heads; ``serve``: the HTTP service.

``service.cli.common`` holds the consoles, the error mapping (one line on stderr, exit 2 for bad
input, 1 for the environment) and the stores. Heavy libraries (torch, transformers) are imported
by the commands that need them, when they run: ``keys``, ``tokens`` and ``detect`` never import
torch (``detect`` loads the tokenizer alone, ``sampler.targets.model_files``; tested in a fresh
interpreter).

May import: every room of the service (``ray`` only when ``detect --engine ray`` runs),
``sampler``, ``detector``, ``keyed``. Nothing imports it but its entry point.
"""

from __future__ import annotations

import inspect

import typer

from service.cli import api_tokens, detect, distill, generate, keys, serve
from service.cli.common import plain_when_piped

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Watermarked LLM text by keyed multi-draft speculative sampling (MPFR).",
)
app.callback()(plain_when_piped)
app.add_typer(keys.app, name="keys")
app.command()(generate.generate)
app.command()(detect.detect)
app.add_typer(api_tokens.app, name="tokens")
app.command()(distill.distill)
app.command()(serve.serve)


def _paragraphs(text: str) -> str:
    """``text`` with each paragraph on one line. Rich keeps every line break of a help text
    and wraps it again at the terminal's width, so a docstring's breaks would cut sentences."""
    return "\n\n".join(" ".join(block.split()) for block in inspect.cleandoc(text).split("\n\n"))


def _flowing_help(group: typer.Typer) -> None:
    """Every command's help (its docstring unless given) as paragraphs, in ``group`` and the
    groups under it."""
    for command in group.registered_commands:
        command.help = _paragraphs(command.help or inspect.getdoc(command.callback) or "")
    for sub in group.registered_groups:
        if sub.typer_instance is not None:
            _flowing_help(sub.typer_instance)


_flowing_help(app)


def main() -> None:
    """The ``poissonmark`` entry point (``[project.scripts]``)."""
    app()


__all__ = ["app", "main"]
