"""``poissonmark detect --jsonl`` (service/jobs/corpus.py, the detect command's corpus mode): one
JSON result per input line in input order, error lines, resume, and worker processes.

In-process tests call the public corpus runner with a tokenizer and a keyed source (no key
store); the last test runs the real command as a subprocess on the embedded Redis."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from detector import DetectOptions, detect
from keyed import KeyedSource
from service.jobs.corpus import CorpusCounts, detect_corpus, done_ids
from service.jobs.detect_response import detection_json
from tests.detector.helpers import fixed_secret, keyed_race_ids

SECRET = fixed_secret("cli-jsonl")


def write_corpus(path: Path, human_passages: list[str]) -> list[str]:
    marked = keyed_race_ids(SECRET, num_new=60, seed=41)
    lines = [
        json.dumps({"id": "h0", "text": human_passages[0]}),
        json.dumps({"id": 7, "token_ids": marked}),
        "this is not json",
        json.dumps({"id": "no-input"}),
        "",
        json.dumps({"id": "bad-ids", "token_ids": [1, -5]}),
        json.dumps({"id": "h1", "text": human_passages[1]}),
        json.dumps(["not", "an", "object"]),
        json.dumps({"id": "h2", "text": human_passages[2], "token_ids": None}),
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return lines


def read_jsonl(path: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def run_helper(real_tokenizer, corpus: Path, out: Path, workers: int = 1) -> CorpusCounts:  # type: ignore[no-untyped-def]
    options = DetectOptions(alpha=0.01, key_id="pmk_0123456789abcdef", scores=["u"], spans=True)
    return detect_corpus(
        real_tokenizer, KeyedSource(SECRET), corpus, out, options, workers=workers, tokens=False
    )


def test_jsonl_one_result_per_line_in_order(real_tokenizer, human_passages, tmp_path) -> None:  # type: ignore[no-untyped-def]
    corpus, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_corpus(corpus, human_passages)
    counts = run_helper(real_tokenizer, corpus, out)
    rows = read_jsonl(out)
    assert [r.get("id") for r in rows] == ["h0", "7", None, "no-input", "bad-ids", "h1", None, "h2"]
    assert counts == CorpusCounts(detected=4, watermarked=1, errors=4, skipped=0)
    by_id = {r["id"]: r for r in rows if r.get("id")}
    assert by_id["7"]["verdict"] == "watermarked" and by_id["h0"]["verdict"] != "watermarked"
    assert rows[2] == {"id": None, "line": 3, "error": rows[2]["error"]}
    assert "not JSON" in rows[2]["error"] and "text or token_ids" in by_id["no-input"]["error"]
    assert "token_ids[1]" in by_id["bad-ids"]["error"]
    assert by_id["h0"]["tokens"] is None  # --no-tokens, as POST /v1/detect without evidence
    assert set(by_id["h0"]["scores"]) == {"aaronson", "u"} and by_id["h0"]["spans"] is not None
    # Each result is the library's detection of that line, in the service's one-key shape.
    found = detect(
        real_tokenizer,
        KeyedSource(SECRET),
        text=human_passages[1],
        options=DetectOptions(key_id="pmk_0123456789abcdef", scores=("u",), spans=True),
    )
    assert by_id["h1"] == {"id": "h1", **detection_json(found, tokens=False)}


def test_jsonl_resumes_after_an_interruption(real_tokenizer, human_passages, tmp_path) -> None:  # type: ignore[no-untyped-def]
    corpus, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_corpus(corpus, human_passages)
    run_helper(real_tokenizer, corpus, out)
    complete = out.read_text(encoding="utf-8").splitlines(keepends=True)
    # An interrupted run: two complete lines and half of the third.
    out.write_text("".join(complete[:2]) + complete[5][:40], encoding="utf-8")
    assert done_ids(out) == {"h0", "7"}  # the torn line is cut off
    assert out.read_text(encoding="utf-8") == "".join(complete[:2])
    counts = run_helper(real_tokenizer, corpus, out)
    assert counts.skipped == 2 and counts.detected == 2
    assert sorted(json.dumps(r, sort_keys=True) for r in read_jsonl(out)) == sorted(
        json.dumps(json.loads(line), sort_keys=True) for line in complete
    )


@pytest.mark.slow  # spawns two workers (imports torch twice); detect_many's own test covers it
def test_jsonl_with_workers_matches_serial(real_tokenizer, human_passages, tmp_path) -> None:  # type: ignore[no-untyped-def]
    corpus = tmp_path / "in.jsonl"
    write_corpus(corpus, human_passages)
    run_helper(real_tokenizer, corpus, tmp_path / "serial.jsonl")
    run_helper(real_tokenizer, corpus, tmp_path / "parallel.jsonl", workers=2)
    assert read_jsonl(tmp_path / "parallel.jsonl") == read_jsonl(tmp_path / "serial.jsonl")


@pytest.mark.slow  # four CLI subprocesses, an embedded Redis and two workers: ~1 min
@pytest.mark.realmodel
def test_cli_jsonl_subprocess(tmp_path, data_dir, human_passages) -> None:  # type: ignore[no-untyped-def]
    # The real command on the embedded Redis: keys create, then detect --jsonl twice (the
    # second run resumes and adds nothing); secrets never appear in any output.
    home = tmp_path / "home"
    home.mkdir()
    (data_dir / "models").mkdir(parents=True, exist_ok=True)
    (home / "models").symlink_to(data_dir / "models", target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "POISSONMARK_KEK")}
    env["POISSONMARK_HOME"] = str(home)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "service.cli", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )

    created = cli("keys", "create", "--json")
    assert created.returncode == 0, created.stderr
    key_id = json.loads(created.stdout)["key_id"]
    corpus, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_corpus(corpus, human_passages)
    first = cli(
        "detect",
        "--key",
        key_id,
        "--jsonl",
        str(corpus),
        "--output",
        str(out),
        "--workers",
        "2",
        "--score",
        "lattimore",
    )
    assert first.returncode == 0, first.stderr
    assert "4 detected" in first.stderr and "Traceback" not in first.stderr
    rows = read_jsonl(out)
    assert len(rows) == 8 and all(r.get("key_id", key_id) == key_id for r in rows)
    again = cli("detect", "--key", key_id, "--jsonl", str(corpus), "--output", str(out))
    assert again.returncode == 0 and "6 skipped" in again.stderr, again.stderr
    assert len(read_jsonl(out)) == 8 + 2  # only the two id-less error lines come again
    conflict = cli("detect", "--key", key_id, "--jsonl", str(corpus), "--text", "x")
    assert conflict.returncode == 2 and "--jsonl" in conflict.stderr
    for output in (created.stdout, first.stdout, first.stderr, out.read_text()):
        assert "secret" not in output.lower()
