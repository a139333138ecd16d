"""The live API against its own OpenAPI document, fuzzed by schemathesis (issue 17).

Every check schemathesis has (``--checks all``) over every phase (examples, coverage, fuzzing,
stateful): a schema-valid request must not be refused as invalid (the document may not be
looser than the server), a schema-invalid one must be refused (nor stricter), responses must
match their documented status, media type, headers and schema, undeclared methods get 405 with
an ``Allow`` header. The run is bounded so the suite stays fast: a fixed seed, deterministic
generation, a few examples per operation, a time budget, one worker. The server is the real
app on a loopback port (tiny model, embedded Redis) with small generation limits, which its
served document states, so a generation stays short.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.service.conftest import Service

MAX_EXAMPLES = 12
MAX_TIME_S = 40


def test_the_api_conforms_to_its_openapi_document(
    live: Callable[..., Service], tmp_path: Path
) -> None:
    service = live(
        max_new_tokens=8,
        max_batch=4,
        max_prompt_chars=1000,  # <= 4 tokens a character: under max_prompt_tokens (4096)
        max_keys_per_detect=10_000,  # the run creates keys; a tenant's count is state
        detect_rate_limit=1_000_000,
    )
    report = tmp_path / "report.ndjson"
    command = [
        str(Path(sys.executable).parent / "st"),
        "run",
        f"{service.client.base_url}/openapi.json",
        "--checks=all",
        f"--max-examples={MAX_EXAMPLES}",
        "--generation-deterministic",
        f"--max-time={MAX_TIME_S}",
        "--workers=1",
        "--no-color",
        "--request-timeout=30",
        f"--header=Authorization: {service.admin['Authorization']}",
        "--report=ndjson",
        f"--report-ndjson-path={report}",
    ]
    start = time.monotonic()
    run = subprocess.run(
        command, capture_output=True, text=True, timeout=MAX_TIME_S + 120, cwd=tmp_path
    )
    seconds = time.monotonic() - start
    assert run.returncode == 0, f"{run.stdout[-20000:]}\n{run.stderr[-4000:]}"
    events = [json.loads(line) for line in report.read_text().splitlines()]
    assert events, "schemathesis wrote no report"
    print(f"schemathesis: {seconds:.1f} s")
