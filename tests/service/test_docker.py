"""``docker/``: the compose file validates against the Compose Specification schema (a copy in
``docker/compose-spec.json``, no Docker engine needed) and has what the deployment promises;
the image's command is the documented ``poissonmark serve``; the build needs no image registry
and keeps the host's CA store and the torch wheel out of the image. The real engine run is
``scripts/compose_smoke.sh`` (``tests/service/test_compose_smoke.py``, marker ``compose``)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from service.cli import app as cli

DOCKER = Path(__file__).resolve().parents[2] / "docker"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((DOCKER / "docker-compose.yml").read_text())  # type: ignore[no-any-return]


def test_compose_file_matches_the_compose_spec(compose: dict[str, Any]) -> None:
    schema = json.loads((DOCKER / "compose-spec.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(compose), key=str)
    assert errors == [], [e.message for e in errors]


def test_the_schema_catches_a_broken_file(compose: dict[str, Any]) -> None:
    schema = json.loads((DOCKER / "compose-spec.json").read_text())
    broken = {**compose, "services": {"redis": {**compose["services"]["redis"], "ports": 6379}}}
    assert list(jsonschema.Draft7Validator(schema).iter_errors(broken))


def test_redis_persists_with_aof_and_has_a_healthcheck(compose: dict[str, Any]) -> None:
    redis = compose["services"]["redis"]
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--appendfsync") + 1] == "always"
    assert redis["healthcheck"]["test"][-1] == "ping"
    volume, target = redis["volumes"][0].split(":")
    assert target == command[command.index("--dir") + 1]  # the AOF lives in the volume
    assert volume in compose["volumes"]  # a named volume
    assert "ports" not in redis  # reachable from the service only


def test_redis_requires_the_password_and_never_shows_it(compose: dict[str, Any]) -> None:
    """Whoever can write to Redis could mint tokens for any tenant: compose's Redis requires a
    password, given to redis-server on its standard input (not in its arguments, which the
    process list shows), to the healthcheck's redis-cli and to the service's URL."""
    redis = compose["services"]["redis"]
    required = r"\$\{POISSONMARK_REDIS_PASSWORD:\?.+\}"
    assert re.fullmatch(required, redis["environment"]["REDISCLI_AUTH"])
    shell, flag, script, name, *options = redis["command"]
    assert (shell, flag, name) == ("sh", "-c", "redis-server")
    lines = script.splitlines()
    assert lines == ['exec redis-server - "$$@" <<EOF', "requirepass $$REDISCLI_AUTH", "EOF"]
    assert "--protected-mode" not in options and "--requirepass" not in options
    for service in ("poissonmark", "poissonmark-gpu"):
        url = compose["services"][service]["environment"]["REDIS_URL"]
        assert re.fullmatch(r"redis://:" + required + r"@redis:6379/0", url)


def test_no_image_comes_from_a_registry(compose: dict[str, Any]) -> None:
    """Redis runs on the local Debian base (docker/build_base.sh), not ``redis:*``."""
    base = "${POISSONMARK_BASE_IMAGE:-poissonmark-base:bookworm}"
    assert compose["services"]["redis"]["image"] == base
    assert compose["services"]["poissonmark"]["build"]["args"]["BASE_IMAGE"] == base
    assert compose["services"]["redis"]["user"] == "redis"  # not root
    assert "name" not in compose  # Debian's docker-compose 1.29 refuses a top-level name


@pytest.mark.parametrize("name", ["poissonmark", "poissonmark-gpu"])
def test_service_waits_for_redis_and_is_configured_by_environment(
    compose: dict[str, Any], name: str
) -> None:
    service = compose["services"][name]
    assert service["depends_on"]["redis"]["condition"] == "service_healthy"
    env = service["environment"]
    assert env["REDIS_URL"].startswith("redis://:") and env["REDIS_URL"].endswith("@redis:6379/0")
    for secret in ("POISSONMARK_KEK", "POISSONMARK_ADMIN_TOKEN"):
        assert re.fullmatch(r"\$\{" + secret + r":\?.+\}", env[secret])  # required, no default
    assert all(port.startswith("127.0.0.1:") for port in service["ports"])  # loopback only
    volume, target = service["volumes"][0].split(":")
    assert target == env["POISSONMARK_HOME"] and volume in compose["volumes"]  # model cache
    assert service["command"] == ["poissonmark", "serve"]


def test_gpu_is_an_optional_profile(compose: dict[str, Any]) -> None:
    gpu = compose["services"]["poissonmark-gpu"]
    assert gpu["profiles"] == ["gpu"]
    assert "profiles" not in compose["services"]["poissonmark"]  # plain `up` is CPU
    device = gpu["deploy"]["resources"]["reservations"]["devices"][0]
    assert device["capabilities"] == ["gpu"]
    assert "cuda" in gpu["build"]["args"]["BASE_IMAGE"]


def _instructions(dockerfile: str) -> list[tuple[str, str]]:
    joined = re.sub(r"\\\n", " ", dockerfile)
    lines = [line.strip() for line in joined.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
        for line in lines
        if line and not line.startswith("#")
    ]


def test_image_runs_the_documented_command() -> None:
    steps = _instructions((DOCKER / "Dockerfile").read_text())
    cmd = [arg for op, arg in steps if op == "CMD"][-1]
    assert json.loads(cmd) == ["poissonmark", "serve"]
    assert [op for op, _ in steps].count("ENTRYPOINT") == 0
    args = dict(
        shlex.split(arg)[0].split("=", 1) for op, arg in steps if op == "ARG" and "=" in arg
    )
    assert args["BASE_IMAGE"] == "poissonmark-base:bookworm"  # local: docker/build_base.sh
    assert "cpu" in args["TORCH_INDEX_URL"]
    help_text = CliRunner().invoke(cli, ["serve", "--help"])
    assert help_text.exit_code == 0 and "HTTP service" in help_text.output


def test_build_pulls_nothing_and_bakes_no_ca_or_wheel() -> None:
    text = (DOCKER / "Dockerfile").read_text()
    # a `# syntax=` directive makes BuildKit pull the frontend image from a registry
    assert not re.search(r"^#\s*syntax\s*=", text, re.MULTILINE | re.IGNORECASE)
    steps = _instructions(text)
    froms = [arg.split() for op, arg in steps if op == "FROM"]
    # the wheels stage from scratch, the llama.cpp builder and the final stage on the local
    # base image: nothing else to pull
    assert [f[0] for f in froms] == ["scratch", "${BASE_IMAGE}", "${BASE_IMAGE}"]
    assert [f[-1] for f in froms[:2]] == ["wheels", "llama-cpp"] and len(froms[2]) == 1
    copies = [arg for op, arg in steps if op == "COPY"]
    # the wheel reaches only the `wheels` stage, mounted into the pip step; no COPY of the
    # whole context (it holds docker/wheels) or of a CA file
    assert [c for c in copies if "wheels" in c] == ["docker/wheels/ /"]
    assert not any(c.split()[0] == "." or "ssl" in c or ".crt" in c for c in copies)
    pip_steps = [arg for op, arg in steps if op == "RUN" and "pip install" in arg]
    assert pip_steps and all("--mount=type=secret,id=host_ca" in arg for arg in pip_steps)
    build = (DOCKER / "build_image.sh").read_text()
    assert '--secret "id=host_ca,src=$ca"' in build  # a BuildKit secret, not a build-arg
    assert "--build-arg" not in build.replace('--build-arg "BASE_IMAGE=$BASE"', "")


def test_build_context_leaves_local_state_out() -> None:
    ignored = (DOCKER / "Dockerfile.dockerignore").read_text().split()
    assert {".venv", ".git"} <= set(ignored)
    # the torch wheel copied into docker/wheels/ for a build is never committed
    assert (DOCKER / "wheels" / ".gitignore").read_text().split() == ["*", "!.gitignore"]


def test_base_image_checks_the_debian_signatures() -> None:
    """docker/build_base.sh fetches packages over plain http: debootstrap must verify the
    Release file's signature (``--force-check-gpg``: abort without the keyring or gpgv rather
    than go on unverified, which it does by default) and never skip the check."""
    text = (DOCKER / "build_base.sh").read_text()
    command = text[text.index("\ndebootstrap ") : text.index('"$MIRROR"')]
    assert "--force-check-gpg" in command
    assert "--no-check-gpg" not in text and "--no-check-certificate" not in text
    assert "debian-archive-keyring" in text  # installed with debootstrap when missing
