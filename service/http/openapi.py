"""``openapi.yaml``: the API description generated from the app (committed; a test fails when
it drifts). Regenerate with ``python -m service.http.openapi`` after changing a route or schema."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from service.http.app import create_app
from service.settings import Settings

OPENAPI_PATH = Path(__file__).resolve().parents[2] / "openapi.yaml"


def render() -> str:
    """The app's OpenAPI document as YAML (independent of the environment's settings)."""
    schema = create_app(Settings.model_construct()).openapi()
    return str(yaml.safe_dump(schema, sort_keys=False, allow_unicode=True, width=100))


def main() -> None:
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else OPENAPI_PATH
    target.write_text(render(), encoding="utf-8")


if __name__ == "__main__":
    main()
