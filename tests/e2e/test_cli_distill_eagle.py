"""``poissonmark distill --drafter eagle`` end to end on a tiny random Llama behind the real
tokenizer: the head is written where the drafter lookup finds it by the model's fingerprint,
``generate --drafter eagle`` (and the default drafter) drafts with it, mpfr's text equals
basic-uwm's for the same key and nonce, a rerun with more steps continues from the
checkpoint, and bad options are one line with exit status 2."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from sampler.drafters import make_drafter
from sampler.drafters.heads import trained_dir
from service.cli import app

pytestmark = pytest.mark.realmodel  # the real tokenizer


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    # A tiny model is per-op overhead; several threads only add contention (as tests/sampler).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pmhome")


@pytest.fixture(scope="module")
def env(home: Path) -> dict[str, str]:
    kept = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "POISSONMARK_KEK")}
    return {**kept, "POISSONMARK_HOME": str(home)}


def invoke(env: dict[str, str], *args: str) -> Any:
    return CliRunner().invoke(app, list(args), env=env)


def test_distill_eagle_trains_a_head_the_lookup_and_generate_use(
    env, home, tiny_model_dir, tmp_path, data_files
):
    prompts = tmp_path / "prompts.jsonl"
    lines = (data_files / "prompts-eli5.jsonl").read_text().splitlines()[:10]
    prompts.write_text("".join(line + "\n" for line in lines))
    args = [
        "distill", "--drafter", "eagle", "--model", str(tiny_model_dir), "--prompts", str(prompts),
        "--lookahead", "3", "--batch", "8", "--draft-vocab", "512", "--max-new-tokens", "12",
        "--warmup", "1", "--device", "cpu", "--json",
    ]  # fmt: skip
    first = invoke(env, *args, "--steps", "3")
    assert first.exit_code == 0, first.output
    result = json.loads(first.stdout)
    assert (result["steps"], result["resumed_from"], result["draft_vocab"]) == (3, 0, 512)
    assert result["train_rollouts"] + result["heldout_rollouts"] == 10
    assert set(result["evaluation"]) == {"T=0.6", "T=1"}
    assert all(1 <= v["tau"] <= 4 and v["contexts"] > 0 for v in result["evaluation"].values())
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    out_dir = trained_dir(home, model, "eagle")
    assert result["out"] == str(out_dir)
    for name in ("eagle.json", "eagle.safetensors", "checkpoint.pt", "training.json",
                 "evaluation.json", "provenance.json"):  # fmt: skip
        assert (out_dir / name).is_file(), name
    found = make_drafter("eagle", model, home)  # by the model's fingerprint
    assert found.name == "eagle" and found.head.config.draft_vocab == 512

    again = invoke(env, *args, "--steps", "5")  # continues from the checkpoint
    assert again.exit_code == 0, again.output
    resumed = json.loads(again.stdout)
    assert (resumed["steps"], resumed["resumed_from"]) == (5, 3)
    training = json.loads((out_dir / "training.json").read_text())
    assert [e["step"] for e in training["log"]] == [1, 2, 3, 4, 5]
    assert resumed["train_seconds"] >= result["train_seconds"]

    made = invoke(env, "keys", "create", "--model", str(tiny_model_dir), "--json")
    assert made.exit_code == 0, made.output
    key = json.loads(made.stdout)["key_id"]
    common = [
        "generate", "--key", key, "--model", str(tiny_model_dir),
        "--prompt", "Why is the sky blue?",
        "--max-new-tokens", "24", "--nonce", "5", "--temperature", "0.7", "--json",
    ]  # fmt: skip
    texts = {}
    for method, drafter in (("basic-uwm", []), ("mpfr", ["--drafter", "eagle"]), ("mpfr", [])):
        shown = invoke(env, *common, "--method", method, *drafter)
        assert shown.exit_code == 0, shown.output
        done = json.loads(shown.stdout)
        assert done["drafter"] == (None if method == "basic-uwm" else "eagle")
        texts[(method, bool(drafter))] = done["token_ids"]
    assert texts[("mpfr", True)] == texts[("basic-uwm", False)] == texts[("mpfr", False)]


EAGLE = ["--drafter", "eagle"]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        pytest.param(
            ["--drafter", "medusa"], "--drafter must be one of heads, eagle", id="drafter"
        ),
        pytest.param(
            [*EAGLE, "--objective", "mdraft"], "the eagle head trains by ce", id="objective"
        ),
        pytest.param([*EAGLE, "--batch", "0"], "batch must be >= 1", id="batch"),
        pytest.param([*EAGLE, "--draft-vocab", "-1"], "--draft-vocab must be >= 0", id="vocab"),
        pytest.param([*EAGLE, "--init", "x"], "--init: heads to start from", id="init"),
    ],
)
def test_distill_eagle_refuses_bad_options_in_one_line(env, bad, message, tmp_path):
    shown = invoke(env, "distill", "--out", str(tmp_path / "x"), *bad)
    assert shown.exit_code == 2, shown.output
    assert message in " ".join(shown.output.split()) and "Traceback" not in shown.output
