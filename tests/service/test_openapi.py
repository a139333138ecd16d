"""``openapi.yaml`` is generated from the app; this fails when the two drift apart.

Fix a failure by regenerating (``python -m service.http.openapi``) and reviewing the diff: a changed
schema is a changed API contract for every client."""

from __future__ import annotations

from service.http.openapi import OPENAPI_PATH, render


def test_committed_openapi_matches_the_app() -> None:
    assert OPENAPI_PATH.read_text(encoding="utf-8") == render(), (
        "openapi.yaml is stale: run `python -m service.http.openapi` and commit the result"
    )


def test_error_responses_are_documented_as_problem_json() -> None:
    import yaml

    document = yaml.safe_load(render())
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            # the OpenAI-compatible routes answer OpenAI's error shape (service.http.openai_errors)
            errors = (
                "application/json"
                if "openai" in operation.get("tags", [])
                else "application/problem+json"
            )
            for status, response in operation["responses"].items():
                if status.startswith(("4", "5")) and path != "/readyz":
                    assert list(response["content"]) == [errors], (
                        method,
                        path,
                        status,
                    )
            if path.startswith("/v1/"):
                assert operation["security"] == [{"bearer": []}], (method, path)
