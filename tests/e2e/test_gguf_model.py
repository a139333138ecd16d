"""A GGUF file as the model, end to end: the shipped file requantised to Q8_0 and to F16 with
llama.cpp's own quantize API (``bench.requantize``), passed by path.

- ``load_model(<path>)`` runs llama.cpp on that file (precision ``auto`` picks gguf) and mpfr
  emits basic-uwm's tokens (MPFR Thm. 5.1; exact equality, no statistical allowance);
- the file's tokenizer (converted alone: no weights dequantised) gives the alias's ids, chat
  prompt and fingerprint;
- ``poissonmark keys create`` / ``generate`` / ``detect`` with ``POISSONMARK_MODEL=<path>``: the
  text is watermarked and detected (α = 1e-6: a false detection of one generated text has
  probability at most 1e-6);
- a file that is no GGUF, or is cut short: one line and exit 2 from ``keys create``,
  ``generate``, ``detect`` and ``serve`` (which never starts listening).

The converted copies go to a data dir of this module's own (the test files' paths are new each
run); the quantisation runs once per module (a few seconds each).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from bench.requantize import requantized
from keyed import KeyedSource, Secret
from sampler.completion import complete, prompt_ids
from sampler.decoder import SamplerConfig
from sampler.drafters import make_drafter
from sampler.models import DEFAULT_MODEL, LoadedModel, load_model
from sampler.targets.gguf_files import GgufFileError
from sampler.targets.llamacpp import GgufTarget
from sampler.targets.model_files import (
    load_detection_tokenizer,
    load_tokenizer,
    locate,
    model_tokenizer_fingerprint,
    tokenizer_dir,
    tokenizer_fingerprint,
)
from service.cli import app
from tests.fresh import ROOT

pytestmark = pytest.mark.realmodel

PROMPTS = [
    [{"role": "user", "content": "Name three colours."}],
    [{"role": "user", "content": "Why is the sky blue? One sentence."}],
]
TEXTS = ["Hello, world!", "  Ünïcödé — text\twith\nlines 123", "<|im_start|>user\nhi<|im_end|>"]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("gguf")
    return {"q8_0": requantized("Q8_0", folder), "f16": requantized("F16", folder)}


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pmhome")


@pytest.fixture(scope="module")
def q8(files: dict[str, Path], home: Path) -> LoadedModel:
    return load_model(str(files["q8_0"]), home, device="cpu")


def test_a_gguf_path_runs_on_llama_cpp_with_its_own_weights(
    q8: LoadedModel, files: dict[str, Path]
) -> None:
    assert q8.precision == "gguf"
    assert isinstance(q8.target, GgufTarget)
    assert Path(q8.target.path).resolve() == files["q8_0"].resolve()
    assert q8.name == "SmolLM2-135M-Instruct.Q8_0.gguf"


def test_mpfr_on_the_file_equals_basic_uwm(q8: LoadedModel) -> None:
    drafter = make_drafter("ngram", q8.target)
    for nonce, messages in enumerate(PROMPTS):
        ids = prompt_ids(q8, messages=messages)
        outputs = []
        for config in (
            SamplerConfig("basic-uwm", max_new_tokens=24),
            SamplerConfig("mpfr", 4, 4, 24, tree="auto"),
        ):
            source = KeyedSource(Secret(b"g" * 32), 4, True, nonce)
            speculative = drafter if config.method == "mpfr" else None
            outputs.append(complete(q8, ids, config, source, speculative).result.token_ids)
        assert len(outputs[0]) > 0
        assert list(outputs[1]) == list(outputs[0]), f"prompt {nonce}"


def test_the_files_tokenizer_is_the_alias_tokenizer(
    files: dict[str, Path], home: Path, real_tokenizer: Any, data_dir: Path
) -> None:
    """The F16 file's tokenizer is converted alone (no weights) and equals the alias's."""
    name = str(files["f16"])
    where = tokenizer_dir(name, home)
    assert where.name.endswith(".tokenizer")
    assert not (locate(name, home).directory / "model.safetensors").exists()
    tok = load_detection_tokenizer(name, home)
    for text in TEXTS:
        assert tok(text)["input_ids"] == real_tokenizer(text)["input_ids"], text
    fingerprint = model_tokenizer_fingerprint(tok, name, home)
    assert fingerprint == tokenizer_fingerprint(real_tokenizer)
    assert fingerprint == model_tokenizer_fingerprint(real_tokenizer, DEFAULT_MODEL, data_dir)


def test_a_tokenizer_beside_the_file_overrides_it_when_it_names_its_tokens(
    files: dict[str, Path], home: Path, real_tokenizer: Any, data_dir: Path, tmp_path: Path
) -> None:
    """The alias's tokenizer files beside a link to the F16 file are used (and pass the check
    against the file's 49,152 tokens); one token renamed, the load is refused."""
    (tmp_path / "model.gguf").symlink_to(files["f16"])
    source = tokenizer_dir(DEFAULT_MODEL, data_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, tmp_path / name)
    name = str(tmp_path / "model.gguf")
    assert tokenizer_dir(name, home) == tmp_path
    assert (
        load_tokenizer(name, home)(TEXTS[1])["input_ids"] == real_tokenizer(TEXTS[1])["input_ids"]
    )
    spec = json.loads((tmp_path / "tokenizer.json").read_text())
    spec["model"]["vocab"]["renamed"] = spec["model"]["vocab"].pop("hello")
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(GgufFileError, match="'renamed'"):
        load_tokenizer(name, home)


def test_keys_and_detect_with_the_file_load_no_torch(files: dict[str, Path], home: Path) -> None:
    """Once its tokenizer is converted, ``keys create`` and ``detect`` with the file read the
    tokenizer alone: a fresh interpreter imports neither torch nor transformers."""
    name = str(files["f16"])
    tokenizer_dir(name, home)
    code = """
import contextlib, io, json, sys
from service.cli import app
from tests.fresh import ROOT

def run(*args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        app(list(args), standalone_mode=False)
    return out.getvalue()

key = json.loads(run("keys", "create", "--json"))["key_id"]
found = json.loads(run("detect", "--key", key, "--text", "Some text to test.", "--json"))
assert found["best_key_id"] == key, found
print(sorted({m.split(".")[0] for m in sys.modules} & {"torch", "transformers"}))
"""
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "POISSONMARK_KEK")}
    env |= {"POISSONMARK_HOME": str(home), "POISSONMARK_MODEL": name}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_chat_template_comes_from_the_file(q8: LoadedModel, real_tokenizer: Any) -> None:
    for messages in PROMPTS:
        mine = q8.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        alias = real_tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        assert list(mine["input_ids"] if isinstance(mine, dict) else mine) == list(
            alias["input_ids"] if isinstance(alias, dict) else alias
        )


def test_generate_and_detect_through_the_cli(
    q8: LoadedModel, files: dict[str, Path], home: Path
) -> None:
    """``POISSONMARK_MODEL`` names the Q8_0 file (the copy ``q8`` converted is reused). The key
    is a fresh random one each run, so the answer differs between runs: up to 128 tokens and
    α = 1e-3 keep a miss far less likely than a real fault (this checks the file's path end to
    end; the detector's power by length is measured in ``bench/results/robustness.md``)."""
    env = {"POISSONMARK_HOME": str(home), "POISSONMARK_MODEL": str(files["q8_0"])}
    runner = CliRunner()
    created = runner.invoke(app, ["keys", "create", "--json"], env=env)
    assert created.exit_code == 0, created.output
    key = json.loads(created.stdout)["key_id"]
    generated = runner.invoke(app, [
        "generate", "--key", key, "--prompt", "Tell me about the sea in ten sentences.",
        "--max-new-tokens", "128", "--nonce", "3", "--json",
    ], env=env)  # fmt: skip
    assert generated.exit_code == 0, generated.output
    text = json.loads(generated.stdout)["text"]
    found = runner.invoke(
        app, ["detect", "--key", key, "--text", text, "--alpha", "1e-3", "--json"], env=env
    )
    assert found.exit_code == 0, found.output
    assert json.loads(found.stdout)["verdict"] == "watermarked"


@pytest.fixture(scope="module")
def q8_key(q8: LoadedModel, files: dict[str, Path], home: Path) -> str:
    env = {"POISSONMARK_HOME": str(home), "POISSONMARK_MODEL": str(files["q8_0"])}
    created = CliRunner().invoke(app, ["keys", "create", "--json"], env=env)
    assert created.exit_code == 0, created.output
    return str(json.loads(created.stdout)["key_id"])


@pytest.mark.parametrize("kind", ["text", "cut"])
@pytest.mark.parametrize("command", ["keys", "generate", "detect", "serve"])
def test_a_bad_gguf_is_one_line_and_exit_2(
    tmp_path: Path, files: dict[str, Path], home: Path, q8_key: str, kind: str, command: str
) -> None:
    bad = tmp_path / "bad.gguf"
    if kind == "text":
        bad.write_text("not a model\n")
    else:
        with files["q8_0"].open("rb") as handle:
            bad.write_bytes(handle.read(200_000))  # inside the vocabulary
    env = {"POISSONMARK_HOME": str(home), "POISSONMARK_MODEL": str(bad)}
    args = {
        "keys": ["keys", "create"],
        "generate": ["generate", "--key", q8_key, "--prompt", "hi", "--max-new-tokens", "4"],
        "detect": ["detect", "--text", "Some text."],
        "serve": ["serve", "--port", "0"],
    }[command]
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and str(bad) in lines[0], result.output
    assert "Traceback" not in result.output
