"""A key names the model it was made for, and another tokenizer is refused naming both models.

- a record written without a model name (no ``model`` field in its hash; the record itself:
  ``tests/service/test_keystore.py``) still generates and detects, shown as null in JSON;
- HTTP: a key made for tokenizer B used by a service that serves tokenizer A is 409
  ``tokenizer-mismatch`` on generate and detect (OpenAI's shape on the OpenAI routes), the
  detail naming both models and the fingerprints' prefixes, never the secret (a tenant with
  keys of tokenizer B only: 409 ``no-keys`` naming the served model);
  ``GET /v1/keys``, ``GET /v1/models`` and ``/readyz`` name the model;
- CLI: ``keys create``/``keys list`` show the model; ``generate`` and ``detect`` with a key of
  another tokenizer exit 2 with one line naming both.

Tokenizer A is the real SmolLM2 tokenizer behind the tiny random Llama of the service fixtures
(model name ``tiny``); tokenizer B (and the CLI's A) is a word-level tokenizer built with the
``tokenizers`` library in a temporary HF directory with a tiny random Llama beside it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from sampler.targets.model_files import tokenizer_fingerprint
from service.cli import app
from service.keys.record import MODEL_MAX_CHARS
from service.settings import model_name
from tests.service.conftest import Service, ServiceFactory
from tests.service.test_api_keys import problem

WORDS_A = ("hello", "there", "watermark", "text", "model", "key")
WORDS_B = ("bonjour", "le", "monde", "texte", "clef", "modèle", "encore")


def tiny_model_dir(path: Path, words: tuple[str, ...]) -> Path:
    """An HF model directory: a word-level tokenizer over ``words`` (whitespace split, ``<unk>``
    and ``<eos>`` specials) and a 1-layer random Llama of its vocabulary."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<eos>": 1, **{w: i + 2 for i, w in enumerate(words)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece()
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>"
    )
    tokenizer.save_pretrained(path)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        eos_token_id=1,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def model_b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("models") / "tiny-b", WORDS_B)


@pytest.fixture(scope="module")
def fingerprint_b(model_b: Path) -> str:
    from transformers import AutoTokenizer

    return tokenizer_fingerprint(AutoTokenizer.from_pretrained(str(model_b)))


@pytest.fixture(scope="module")
def svc(module_services: ServiceFactory) -> Service:
    return module_services()


def forget_model(svc: Service, key_id: str) -> None:
    """Remove the ``model`` field from a stored record: a record written without it."""
    assert svc.resources.redis.hdel(f"{svc.settings.redis_prefix}key:{key_id}", "model") == 1


# --- the record -------------------------------------------------------------------------------


def test_model_name_is_an_alias_or_a_directory_or_file_name(tmp_path: Path) -> None:
    assert model_name("smollm2-135m-instruct") == "smollm2-135m-instruct"
    (tmp_path / "Qwen3-0.6B").mkdir()
    assert model_name(f"{tmp_path}/Qwen3-0.6B/") == "Qwen3-0.6B"
    assert model_name(str(tmp_path / "Qwen3-0.6B" / "..")) == tmp_path.name
    gguf = "SmolLM2-135M-Instruct.Q8_0.gguf"
    assert model_name(f"/models/{gguf}") == gguf
    assert model_name("a\x00b") == "a?b"
    assert len(model_name("x" * 1000)) == MODEL_MAX_CHARS


# --- HTTP ------------------------------------------------------------------------------------


def test_keys_models_and_readiness_name_the_served_model(svc: Service) -> None:
    fingerprint = svc.resources.fingerprint
    key_id = svc.create_key()
    shown = svc.client.get(f"/v1/keys/{key_id}", headers=svc.admin).json()
    assert (shown["model"], shown["tokenizer"]) == ("tiny", fingerprint)
    listed = svc.client.get("/v1/keys", headers=svc.admin).json()["keys"]
    assert {k["key_id"]: k["model"] for k in listed}[key_id] == "tiny"
    models = svc.client.get("/v1/models", headers=svc.admin)
    assert models.status_code == 200, models.text
    (card,) = models.json()["data"]
    assert (card["id"], card["poissonmark"]["tokenizer"]) == ("tiny", fingerprint)
    ready = svc.client.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert (ready.json()["model"], ready.json()["tokenizer"]) == ("tiny", fingerprint)


def mismatch_detail(svc: Service, path: str, body: dict[str, Any]) -> str:
    detail = problem(svc.client.post(path, json=body, headers=svc.admin), 409, "tokenizer-mismatch")
    return str(detail["detail"])


def test_a_key_of_another_tokenizer_is_409_naming_both_models(
    svc: Service, model_b: Path, fingerprint_b: str
) -> None:
    served = svc.resources.fingerprint
    assert fingerprint_b != served
    record = svc.store.create(fingerprint_b, model=model_name(str(model_b)))
    secret = record.secret.reveal().hex()
    requests: list[tuple[str, dict[str, Any]]] = [
        ("/v1/generate", {"key_id": record.key_id, "prompt": "hi", "max_new_tokens": 2}),
        ("/v1/detect", {"key_id": record.key_id, "text": "hello there"}),
    ]
    for path, body in requests:
        detail = mismatch_detail(svc, path, body)
        assert detail == (
            f"key {record.key_id} was made for model 'tiny-b' (tokenizer {fingerprint_b[:15]}…) "
            f"and cannot be used with model 'tiny' (tokenizer {served[:15]}…): use it with "
            "'tiny-b', or a key made for 'tiny'"
        ), path
        assert secret not in detail
    chat = svc.client.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
              "key_id": record.key_id, "max_tokens": 2},
        headers=svc.admin,
    )  # fmt: skip
    assert chat.status_code == 409, chat.text
    error = chat.json()["error"]
    assert (error["code"], error["param"]) == ("tokenizer_mismatch", "key_id")
    assert "'tiny-b'" in error["message"] and "'tiny'" in error["message"]
    assert fingerprint_b[:15] in error["message"] and secret not in error["message"]
    svc.store.create(fingerprint_b, tenant="only-b", model="tiny-b")
    body = {"text": "hello there"}
    none = svc.client.post("/v1/detect", json=body, headers=svc.token("only-b", ("detect",)))
    assert problem(none, 409, "no-keys")["detail"] == (
        "tenant 'only-b' has no key made for the tokenizer of model 'tiny': create one or give "
        "key_id"
    )


def test_a_record_without_a_model_still_works_and_shows_none(
    svc: Service, fingerprint_b: str
) -> None:
    key_id = svc.create_key()
    forget_model(svc, key_id)
    shown = svc.client.get(f"/v1/keys/{key_id}", headers=svc.admin).json()
    assert shown["model"] is None and shown["tokenizer"] == svc.resources.fingerprint
    assert svc.store.get(key_id).model_shown == "unknown"
    detected = svc.client.post(
        "/v1/detect", json={"key_id": key_id, "text": "hello there"}, headers=svc.admin
    )
    assert detected.status_code == 200, detected.text
    body = {"key_id": key_id, "prompt": "hi", "max_new_tokens": 2, "method": "basic-uwm"}
    generated = svc.client.post("/v1/generate", json=body, headers=svc.admin)
    assert generated.status_code == 200, generated.text
    foreign = svc.store.create(fingerprint_b, model="tiny-b")
    forget_model(svc, foreign.key_id)
    detail = mismatch_detail(svc, "/v1/detect", {"key_id": foreign.key_id, "text": "hello"})
    assert detail.startswith(
        f"key {foreign.key_id} was made for an unnamed model (tokenizer {fingerprint_b[:15]}…) "
        "and cannot be used with model 'tiny'"
    )


# --- CLI -------------------------------------------------------------------------------------


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("REDIS_URL", "POISSONMARK_REDIS_URL", "POISSONMARK_KEK", "POISSONMARK_MODEL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("POISSONMARK_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def invoke(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def refused(result: Result, key_id: str) -> str:
    """The one line of an exit-2 refusal naming both models."""
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: key {key_id} was made for model 'tiny-a' (tokenizer sha256:")
    assert "cannot be used with model 'tiny-b' (tokenizer sha256:" in line
    return line


def test_cli_shows_the_model_and_refuses_another_tokenizer(
    home: Path, tmp_path: Path, model_b: Path
) -> None:
    model_a = tiny_model_dir(tmp_path / "tiny-a", WORDS_A)
    made = invoke("keys", "create", "--model", str(model_a), "--json")
    assert made.exit_code == 0, made.output
    key = json.loads(made.stdout)
    assert key["model"] == "tiny-a" and key["tokenizer"].startswith("sha256:")
    listed = invoke("keys", "list")
    assert listed.exit_code == 0, listed.output
    header, row = listed.stdout.splitlines()
    assert header.split()[:3] == ["KEY", "TENANT", "MODEL"]
    assert row.split()[:3] == [key["key_id"], "default", "tiny-a"]
    as_json = json.loads(invoke("keys", "list", "--json").stdout)["keys"]
    assert [k["model"] for k in as_json] == ["tiny-a"]
    key_id = key["key_id"]
    refused(invoke("detect", "--model", str(model_b), "--key", key_id, "--text", "le"), key_id)
    refused(
        invoke("generate", "--model", str(model_b), "--key", key_id, "--prompt", "le",
               "--precision", "float32", "--max-new-tokens", "2"),
        key_id,
    )  # fmt: skip
    shown = invoke("detect", "--model", str(model_a), "--key", key_id, "--text", "hello there")
    assert shown.exit_code == 0, shown.output
