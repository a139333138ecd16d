"""Clients of the OpenAI API that no one here wrote, against ``/v1`` of a live server with the
real model: LangChain's ``ChatOpenAI`` (``invoke`` and ``stream``) and LiteLLM's
``completion`` (plain and streamed) answer with the generation ``POST /v1/generate`` makes for
the same key and nonce (the key and method passed as their extra body, the nonce as ``seed``),
and ``POST /v1/detect`` finds the key's watermark in that text.

Opt-in (``-m clients``): they need the ``test`` extra's ``langchain-openai`` and ``litellm``
(importing LiteLLM alone takes seconds) and the real model; the official SDK's own tests are
``test_openai_api.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from sampler.models import LoadedModel
from tests.service.conftest import LiveServer, Service, make_settings

pytestmark = [pytest.mark.clients, pytest.mark.realmodel]

PROMPT = "Write a short, vivid story about a lighthouse keeper and a storm."
MESSAGES = [{"role": "user", "content": PROMPT}]
# 40 tokens of basic-uwm on this prompt clear alpha = 0.01 by far (test_openai_api.py)
NEW_TOKENS, NONCE, METHOD = 40, 42, "basic-uwm"


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory, real_model: LoadedModel) -> Iterator[Service]:
    from service.http.app import create_app

    settings = make_settings(tmp_path_factory.mktemp("clients"))
    app = create_app(settings, loader=lambda _: real_model)
    with LiveServer(app) as server, httpx.Client(base_url=server.url, timeout=600) as client:
        yield Service(app, client, settings)


def keyed_text(svc: Service) -> tuple[dict[str, str], str, str]:
    """A token (headers) with a fresh key of its tenant, and ``/v1/generate``'s text for that
    key, ``PROMPT``, ``NEW_TOKENS`` and ``NONCE``: what every client must answer."""
    user = svc.token("acme", ("generate", "detect", "keys"))
    key_id = svc.create_key(user)
    same = svc.client.post(
        "/v1/generate",
        json={
            "key_id": key_id,
            "messages": MESSAGES,
            "max_new_tokens": NEW_TOKENS,
            "nonce": NONCE,
            "method": METHOD,
        },
        headers=user,
    )
    assert same.status_code == 200, same.text
    return user, key_id, str(same.json()["text"])


def assert_watermarked(svc: Service, headers: dict[str, str], key_id: str, text: str) -> None:
    found = svc.client.post("/v1/detect", json={"key_id": key_id, "text": text}, headers=headers)
    assert found.status_code == 200, found.text
    assert found.json()["verdict"] == "watermarked", found.json()  # p < 0.01


def test_langchain_chat_openai_invoke_and_stream(real: Service) -> None:
    chat_models = pytest.importorskip("langchain_openai")
    headers, key_id, expected = keyed_text(real)
    model = real.client.get("/v1/models", headers=headers).json()["data"][0]["id"]
    chat = chat_models.ChatOpenAI(
        model=model,
        base_url=f"{real.client.base_url}/v1",
        api_key=headers["Authorization"].removeprefix("Bearer "),
        max_tokens=NEW_TOKENS,
        seed=NONCE,
        max_retries=0,
        extra_body={"key_id": key_id, "method": METHOD},
    )
    answer = chat.invoke(PROMPT)
    assert answer.content == expected
    streamed = list(chat.stream(PROMPT))
    assert len(streamed) > 1  # token by token, not one block
    assert "".join(str(chunk.content) for chunk in streamed) == expected
    assert_watermarked(real, headers, key_id, str(answer.content))


# LiteLLM's GitHub Copilot provider, imported by every call, declares a TypedDict pydantic warns of
@pytest.mark.filterwarnings("ignore:Item.* using the `ReadOnly` qualifier:UserWarning")
def test_litellm_completion_plain_and_streamed(
    real: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    # LiteLLM fetches its model price list from GitHub when imported, unless told not to
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    litellm = pytest.importorskip("litellm")
    headers, key_id, expected = keyed_text(real)
    model = real.client.get("/v1/models", headers=headers).json()["data"][0]["id"]
    args: dict[str, Any] = {
        "model": f"openai/{model}",  # LiteLLM's provider prefix: any OpenAI-compatible server
        "api_base": f"{real.client.base_url}/v1",
        "api_key": headers["Authorization"].removeprefix("Bearer "),
        "messages": MESSAGES,
        "max_tokens": NEW_TOKENS,
        "seed": NONCE,
        "num_retries": 0,
        "extra_body": {"key_id": key_id, "method": METHOD},
    }
    answer = litellm.completion(**args)
    text = answer.choices[0].message.content
    assert text == expected
    chunks = list(litellm.completion(**args, stream=True))
    assert len(chunks) > 1
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert_watermarked(real, headers, key_id, text)
