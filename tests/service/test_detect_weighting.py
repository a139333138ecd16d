"""``POST /v1/detect`` with ``entropy_weighting``: the weighted test beside the plain one,
computed with the served model, and 4xx naming the field for bad input."""

from __future__ import annotations

import math

import pytest

from detector import DetectOptions, detect
from detector.weighted import entropy_weighted_test
from sampler.entropy import processed_entropy
from sampler.models import LoadedModel
from sampler.processing import Processing
from tests.service.conftest import Service, ServiceFactory
from tests.service.test_api_keys import problem

TEXT = "The quick brown fox jumps over the lazy dog, then naps in the warm afternoon sun."


@pytest.fixture(scope="module")
def svc(module_services: ServiceFactory) -> Service:
    return module_services(max_token_ids=2_000)


def test_the_weighted_test_is_reported_beside_the_verdict(
    svc: Service, tiny_loaded: LoadedModel
) -> None:
    key_id = svc.create_key()
    processing = {"temperature": 0.7, "top_k": 0, "top_p": 0.95}
    body = {"key_id": key_id, "text": TEXT, "entropy_weighting": True, "processing": processing}
    r = svc.client.post("/v1/detect", json=body, headers=svc.admin)
    assert r.status_code == 200, r.text
    found = r.json()
    plain = svc.client.post("/v1/detect", json={"key_id": key_id, "text": TEXT}, headers=svc.admin)
    assert plain.json()["entropy_weighted_p_value"] is None
    assert plain.json()["results"][0]["entropy_weighted"] is None
    # the verdict is the plain one's
    assert found["verdict"] == plain.json()["verdict"]
    assert found["log10_p_value"] == plain.json()["log10_p_value"]
    # the weighted test equals the detector's on the served model's entropies
    result = found["results"][0]
    weighted = result["entropy_weighted"]
    ids = [t["id"] for t in svc.client.post(
        "/v1/detect", json={"key_id": key_id, "text": TEXT, "evidence": True}, headers=svc.admin
    ).json()["results"][0]["tokens"]]  # fmt: skip
    bos = tiny_loaded.tokenizer.bos_token_id
    entropy = processed_entropy(
        tiny_loaded.target, ids, Processing(0.7, 0, 0.95), prefix=[bos]
    ).numpy()
    source = svc.store.get(key_id, None).source(0)
    direct = detect(tiny_loaded.tokenizer, source, token_ids=ids, options=DetectOptions())
    expected = entropy_weighted_test(
        direct.evidence.skip, direct.evidence.terms["aaronson"], entropy
    )
    assert weighted["name"] == "entropy_weighted"
    assert weighted["num_scored"] == result["num_scored"]
    assert weighted["method"] in ("exact", "chernoff_bound")
    assert weighted["log10_p_value"] == pytest.approx(expected.log_p / math.log(10), abs=1e-12)
    assert weighted["keys_corrected_log10_p_value"] == pytest.approx(weighted["log10_p_value"])
    assert found["entropy_weighted_log10_p_value"] == pytest.approx(weighted["log10_p_value"])


def test_multi_key_and_batch(svc: Service) -> None:
    svc.create_key()
    svc.create_key()
    body = {"text": TEXT, "entropy_weighting": True, "max_results": 100}  # every key detailed
    found = svc.client.post("/v1/detect", json=body, headers=svc.admin).json()
    keys = found["num_keys"]
    assert 2 <= keys == len(found["results"])
    smallest = min(r["entropy_weighted"]["log10_p_value"] for r in found["results"])
    assert found["entropy_weighted_log10_p_value"] == pytest.approx(
        min(0.0, smallest + math.log10(keys))
    )
    batch = {"items": [{"text": TEXT}, {"text": "short"}], "entropy_weighting": True}
    r = svc.client.post("/v1/detect/batch", json=batch, headers=svc.admin)
    assert r.status_code == 200, r.text
    assert all(item["entropy_weighted_p_value"] is not None for item in r.json()["results"])


@pytest.mark.parametrize(
    ("body", "field"),
    [
        pytest.param(
            {"entropy_weighting": True, "processing": {"top_p": 0.0}},
            "body.processing.top_p",
            id="top_p",
        ),
        pytest.param(
            {"entropy_weighting": True, "processing": {"temperature": 0.0}},
            "body.processing.temperature",
            id="temperature",
        ),
        pytest.param({"entropy_weighting": "yes"}, "body.entropy_weighting", id="not_bool"),
    ],
)
def test_bad_input_is_422_naming_the_field(svc: Service, body: dict, field: str) -> None:  # type: ignore[type-arg]
    found = problem(
        svc.client.post("/v1/detect", json={"text": TEXT, **body}, headers=svc.admin),
        422,
        "invalid-request",
    )
    assert found["field"] == field


def test_a_text_longer_than_the_model_is_422(svc: Service) -> None:
    key_id = svc.create_key()
    body = {"key_id": key_id, "token_ids": [100] * 1_500, "entropy_weighting": True}
    found = problem(
        svc.client.post("/v1/detect", json=body, headers=svc.admin), 422, "invalid-request"
    )
    assert found["field"] == "entropy_weighting"


def test_processing_without_weighting_is_ignored(svc: Service) -> None:
    """A schema-valid body is never refused: ``processing`` alone changes nothing."""
    key_id = svc.create_key()
    plain = svc.client.post("/v1/detect", json={"key_id": key_id, "text": TEXT}, headers=svc.admin)
    body = {"key_id": key_id, "text": TEXT, "processing": {"temperature": 0.7}}
    with_processing = svc.client.post("/v1/detect", json=body, headers=svc.admin)
    assert with_processing.status_code == plain.status_code == 200
    assert with_processing.json() == plain.json()
    assert with_processing.json()["entropy_weighted_p_value"] is None


PROMPT = "Tell me about foxes."


def _greedy_after(loaded: LoadedModel, prefix: list[int], n: int) -> list[int]:
    """The tiny model's greedy continuation of ``prefix``: under top-k 1 after the prompt each
    of its tokens has probability 1 (weight 0); after BOS alone most do not."""
    import torch

    ids = list(prefix)
    with torch.inference_mode():
        for _ in range(n):
            logits = loaded.model(input_ids=torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
    return ids[len(prefix) :]


def _direct_lr(
    svc: Service, loaded: LoadedModel, key_id: str, ids: list[int], prefix: list[int]
) -> float:
    """The likelihood-ratio log10 p computed here from the detector and the model (top-k 1)."""
    from detector.weighted import likelihood_ratio_test
    from sampler.entropy import position_laws

    laws = position_laws(loaded.target, ids, Processing(1.0, 1, 1.0), prefix=prefix)
    source = svc.store.get(key_id, None).source(0)
    direct = detect(loaded.tokenizer, source, token_ids=ids, options=DetectOptions())
    test = likelihood_ratio_test(
        direct.evidence.skip, direct.evidence.terms["aaronson"], laws.token_logp.numpy()
    )
    return test.log_p / math.log(10)


def test_the_likelihood_ratio_test_is_reported_beside_the_verdict(
    svc: Service, tiny_loaded: LoadedModel
) -> None:
    from sampler.completion import chat_prompt_ids

    key_id = svc.create_key()
    prefix = chat_prompt_ids(tiny_loaded.tokenizer, PROMPT)
    ids = _greedy_after(tiny_loaded, prefix, 24)
    processing = {"temperature": 1.0, "top_k": 1, "top_p": 1.0}
    base = {"key_id": key_id, "token_ids": ids, "likelihood_ratio": True, "processing": processing}
    plain_body = {"key_id": key_id, "token_ids": ids}
    plain = svc.client.post("/v1/detect", json=plain_body, headers=svc.admin).json()
    assert plain["likelihood_ratio_p_value"] is None
    assert plain["results"][0]["likelihood_ratio"] is None
    tested = {}
    for name, extra in (
        ("bos", {}),
        ("prompt", {"prompt": PROMPT}),
        ("messages", {"messages": [{"role": "user", "content": PROMPT}]}),
    ):
        r = svc.client.post("/v1/detect", json={**base, **extra}, headers=svc.admin)
        assert r.status_code == 200, r.text
        found = r.json()
        assert found["verdict"] == plain["verdict"]  # beside the verdict, not in it
        assert found["log10_p_value"] == plain["log10_p_value"]
        assert found["entropy_weighted_p_value"] is None  # only the test asked for
        tested[name] = found["results"][0]["likelihood_ratio"]
        assert found["likelihood_ratio_log10_p_value"] == pytest.approx(
            tested[name]["log10_p_value"]
        )
    bos = tiny_loaded.tokenizer.bos_token_id
    assert tested["bos"]["conditioned_on_prompt"] is False
    assert tested["bos"]["log10_p_value"] == pytest.approx(
        _direct_lr(svc, tiny_loaded, key_id, ids, [bos]), abs=1e-12
    )
    assert tested["prompt"]["conditioned_on_prompt"] is True
    assert tested["prompt"]["log10_p_value"] == pytest.approx(
        _direct_lr(svc, tiny_loaded, key_id, ids, prefix), abs=1e-12
    )
    assert tested["messages"] == tested["prompt"]  # one user message is the prompt
    # after the prompt every token was the model's choice (weight 0); after BOS most were not
    assert tested["prompt"]["weight_sum"] == 0.0 and tested["prompt"]["log10_p_value"] == 0.0
    assert tested["bos"]["weight_sum"] > 0.0


def test_both_model_tests_share_one_request_and_batch_items_carry_their_prompts(
    svc: Service,
) -> None:
    key_id = svc.create_key()
    body = {"key_id": key_id, "text": TEXT, "likelihood_ratio": True, "entropy_weighting": True}
    found = svc.client.post("/v1/detect", json=body, headers=svc.admin).json()
    assert found["entropy_weighted_p_value"] is not None
    assert found["likelihood_ratio_p_value"] is not None
    items = [{"text": TEXT, "prompt": PROMPT}, {"text": TEXT}]
    batch = {"key_id": key_id, "items": items, "likelihood_ratio": True}
    r = svc.client.post("/v1/detect/batch", json=batch, headers=svc.admin)
    assert r.status_code == 200, r.text
    first, second = (item["results"][0]["likelihood_ratio"] for item in r.json()["results"])
    assert first["conditioned_on_prompt"] is True and second["conditioned_on_prompt"] is False
    # without a model test, a prompt changes nothing (never refused either)
    plain = svc.client.post("/v1/detect", json={"key_id": key_id, "text": TEXT}, headers=svc.admin)
    prompted = svc.client.post(
        "/v1/detect", json={"key_id": key_id, "text": TEXT, "prompt": PROMPT}, headers=svc.admin
    )
    assert prompted.status_code == 200 and prompted.json() == plain.json()


@pytest.mark.parametrize(
    ("body", "status", "kind", "field"),
    [
        pytest.param(
            {"prompt": "a", "messages": [{"role": "user", "content": "a"}]},
            422, "invalid-request", "body", id="prompt_and_messages",
        ),
        pytest.param(
            {"messages": [{"role": "robot", "content": "a"}]},
            422, "invalid-request", "body.messages.0.role", id="bad_role",
        ),
        pytest.param({"messages": []}, 422, "invalid-request", "body.messages", id="no_messages"),
        pytest.param(
            {"prompt": "x" * 32_001}, 422, "limit-exceeded", "prompt", id="prompt_too_long"
        ),
        pytest.param({"likelihood_ratio": 1.5}, 422, "invalid-request", "body.likelihood_ratio",
                     id="not_bool"),
    ],
)  # fmt: skip
def test_bad_prompt_input_is_4xx_naming_the_field(
    svc: Service,
    body: dict,  # type: ignore[type-arg]
    status: int,
    kind: str,
    field: str,
) -> None:
    request = {"text": TEXT, "likelihood_ratio": True, **body}
    found = problem(svc.client.post("/v1/detect", json=request, headers=svc.admin), status, kind)
    assert found["field"] == field


def test_a_prompt_and_text_longer_than_the_model_is_422_naming_the_prompt(svc: Service) -> None:
    key_id = svc.create_key()
    body = {
        "key_id": key_id,
        "token_ids": [100] * 900,
        "prompt": "fox " * 200,  # ~200 tokens + the template: past the tiny model's 1,024
        "likelihood_ratio": True,
    }
    found = problem(
        svc.client.post("/v1/detect", json=body, headers=svc.admin), 422, "invalid-request"
    )
    assert found["field"] == "prompt"
    del body["prompt"]
    assert svc.client.post("/v1/detect", json=body, headers=svc.admin).status_code == 200


def test_batch_errors_name_the_item_and_messages_limits_name_their_field(svc: Service) -> None:
    key_id = svc.create_key()
    items = [{"text": TEXT}, {"token_ids": [100] * 900, "messages": [
        {"role": "user", "content": "fox " * 200}]}]  # fmt: skip
    batch = {"key_id": key_id, "items": items, "likelihood_ratio": True}
    found = problem(
        svc.client.post("/v1/detect/batch", json=batch, headers=svc.admin), 422, "invalid-request"
    )
    assert found["field"] == "items[1].messages"  # past the model's positions with the prompt
    halves = [{"role": "user", "content": c * 20_000} for c in "xy"]  # 40,000 > 32,000 chars
    many = {"text": TEXT, "likelihood_ratio": True, "messages": halves}
    found = problem(
        svc.client.post("/v1/detect", json=many, headers=svc.admin), 422, "limit-exceeded"
    )
    assert found["field"] == "messages[].content"


def test_a_prompt_over_max_prompt_tokens_is_limit_exceeded_naming_it(
    module_services: ServiceFactory,
) -> None:
    """Generate's token limit on the chat-templated prompt holds for a detect item's prompt."""
    small = module_services(max_prompt_tokens=64)  # the template alone is ~30
    key_id = small.create_key()
    body = {"key_id": key_id, "text": TEXT, "likelihood_ratio": True, "prompt": "fox " * 80}
    found = problem(
        small.client.post("/v1/detect", json=body, headers=small.admin), 422, "limit-exceeded"
    )
    assert found["field"] == "prompt"
    items = [{"text": TEXT, "prompt": "fox"}, {"text": TEXT, "messages": [
        {"role": "user", "content": "fox " * 80}]}]  # fmt: skip
    batch = {"key_id": key_id, "items": items, "likelihood_ratio": True}
    found = problem(
        small.client.post("/v1/detect/batch", json=batch, headers=small.admin),
        422,
        "limit-exceeded",
    )
    assert found["field"] == "items[1].messages"
    body["prompt"] = "fox"  # a short one passes
    ok = small.client.post("/v1/detect", json=body, headers=small.admin)
    assert ok.status_code == 200, ok.text


def test_the_edit_filtered_test_is_reported_per_key_with_its_own_width(
    svc: Service, tiny_loaded: LoadedModel
) -> None:
    """``edit_filter``: each detailed key's test equals the detector's ``rank_filtered_test``
    on the served model's raw ranks after BOS with that key's context width; the top p is K
    times the smallest; the verdict is the plain one's. The text is the tiny model's greedy
    continuation of BOS (rank 0 everywhere) with three foreign tokens inside (ranked past
    1,000 by the random model), so some labels are left out and some kept."""
    from detector.weighted import rank_filtered_test
    from sampler.entropy import position_laws

    wide, narrow = svc.create_key(context_width=4), svc.create_key(context_width=1)
    bos = tiny_loaded.tokenizer.bos_token_id
    greedy = _greedy_after(tiny_loaded, [bos], 40)
    ids = [*greedy[:20], 504, 2365, 6354, *greedy[20:]]
    rank = position_laws(tiny_loaded.target, ids, Processing(1.0, 50, 1.0), prefix=[bos]).raw_rank
    assert 0 < int((rank >= 1000).sum()) < len(ids) // 2
    plain_body = {"token_ids": ids}
    plain = svc.client.post("/v1/detect", json=plain_body, headers=svc.admin).json()
    assert plain["edit_filtered_p_value"] is None
    assert plain["results"][0]["edit_filtered"] is None
    # the module's store holds every key its tests made: detail them all, not the best 10
    body = {"token_ids": ids, "edit_filter": True, "max_results": 100}
    r = svc.client.post("/v1/detect", json=body, headers=svc.admin)
    assert r.status_code == 200, r.text
    found = r.json()
    assert found["num_keys"] == len(found["results"]) <= 100
    assert found["verdict"] == plain["verdict"]  # beside the verdict, not in it
    assert found["log10_p_value"] == plain["log10_p_value"]
    assert found["entropy_weighted_p_value"] is None  # only the test asked for
    by_key = {result["key_id"]: result["edit_filtered"] for result in found["results"]}
    kept = {}
    for key_id, width in ((wide, 4), (narrow, 1)):
        source = svc.store.get(key_id, None).source(0)
        assert source.context_width == width
        direct = detect(tiny_loaded.tokenizer, source, token_ids=ids, options=DetectOptions())
        expected = rank_filtered_test(
            direct.evidence.skip, direct.evidence.terms["aaronson"], rank.numpy(), width
        )
        test = by_key[key_id]
        assert test["name"] == "edit_filtered" and test["method"] == "exact"
        assert test["log10_p_value"] == pytest.approx(expected.log_p / math.log(10), abs=1e-12)
        assert 0 < test["num_weighted"] == expected.num_weighted < test["num_scored"]
        kept[width] = test["num_weighted"] / test["num_scored"]
    assert kept[1] > kept[4]  # a wider label holds a flagged token more often
    smallest = min(t["log10_p_value"] for t in by_key.values())
    assert found["edit_filtered_log10_p_value"] == pytest.approx(
        min(0.0, smallest + math.log10(found["num_keys"]))
    )
    bad = {"token_ids": ids, "edit_filter": 2}
    r = svc.client.post("/v1/detect", json=bad, headers=svc.admin)
    assert problem(r, 422, "invalid-request")["field"] == "body.edit_filter"
