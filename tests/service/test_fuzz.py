"""Property-based API fuzzing with schemathesis against the running app (live server, tiny
model): whatever the generated input, no 5xx, and every response matches ``openapi.yaml``
(status documented, content type, body schema, headers); schema-invalid input is refused.

The committed ``openapi.yaml`` is the schema under test (``test_openapi`` keeps it equal to
the app's). Half of the generated key ids are swapped for a real key of the caller's tenant so
the fuzzer reaches generation and detection, not only 404s.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import checks
from schemathesis.config import SchemathesisConfig

from service.errors import KEY_ID_PATTERN as KEY_ID
from service.http.app import create_app
from tests.service.conftest import LiveServer, Service, make_settings

ROOT = Path(__file__).resolve().parents[2]
# Schema-invalid input may be refused as too large (413, documented for every body): a
# generated body of 3.2 MB got 413 in CI, which schemathesis's default list does not name.
REJECTED = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429"]
CONFIG = SchemathesisConfig.from_dict(
    {"checks": {"negative_data_rejection": {"expected-statuses": REJECTED}}}
)
schema = schemathesis.openapi.from_path(ROOT / "openapi.yaml", config=CONFIG)
_swap = itertools.count()
ADMIN_TOKEN = secrets.token_urlsafe(32)


@schema.auth()
class AdminToken:
    """The admin token on every case; schemathesis itself leaves it off where a case tests
    missing credentials."""

    def get(self, case: Any, context: Any) -> str:
        return ADMIN_TOKEN

    def set(self, case: Any, data: str, context: Any) -> None:
        case.headers = case.headers or {}
        case.headers["Authorization"] = f"Bearer {data}"


@pytest.fixture(scope="module")
def fuzz_service(tmp_path_factory: pytest.TempPathFactory, tiny_loaded: Any) -> Iterator[Service]:
    import httpx

    limits = {
        "max_new_tokens": 8,
        "max_prompt_tokens": 256,
        "max_text_chars": 2000,
        "max_token_ids": 500,
        "max_batch": 4,
        "detect_rate_limit": 100_000,
    }
    app_settings = make_settings(tmp_path_factory.mktemp("fuzz"), admin_token=ADMIN_TOKEN, **limits)
    app = create_app(app_settings, loader=lambda _: tiny_loaded)
    with LiveServer(app) as server, httpx.Client(base_url=server.url) as client:
        svc = Service(app, client, app_settings)
        svc.key_id = svc.create_key()  # type: ignore[attr-defined]
        yield svc


@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    database=None,
    derandomize=True,  # the same examples on every run: a fresh CI clone cannot draw new ones
    suppress_health_check=list(HealthCheck),
)
def test_no_server_error_and_responses_match_the_schema(case: Any, fuzz_service: Service) -> None:
    key_id = fuzz_service.key_id  # type: ignore[attr-defined]
    if next(_swap) % 2:  # swap only well-formed ids, so negative cases stay negative
        for where in (case.body, case.path_parameters):
            if isinstance(where, dict) and KEY_ID.fullmatch(str(where.get("key_id"))):
                where["key_id"] = key_id
    case.call_and_validate(
        base_url=str(fuzz_service.client.base_url),
        excluded_checks=[
            # valid-by-schema input may still be refused: unknown keys (404), limits that are
            # settings (422), a revoked key (409); those statuses are documented
            checks.positive_data_acceptance,
        ],
        timeout=60,
    )
