"""``poissonmark detect``'s exit status and tenant: ``--exit-status`` exits by the verdict as
grep does (0 watermarked, 1 not, 2 an error), and a detection without ``--key`` says which
tenant's keys it tested and how to test another's (a text watermarked under tenant ``acme`` is
``not_detected`` among tenant ``default``'s keys, and the output must say where it looked).

The watermarked ids come from the model-free keyed race (``tests/detector/helpers.py``) under
the secret of a key the CLI created; fixed seeds.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from detector.canonical import readings
from service.cli import app
from service.cli.common import key_store
from service.settings import Settings
from tests.detector.helpers import fixed_secret, keyed_race_ids
from tests.fresh import cli_on_a_terminal
from tests.service.conftest import free_port


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data_dir: Path) -> Path:
    """A fresh data dir (its own embedded Redis) sharing the converted model."""
    for name in ("REDIS_URL", "POISSONMARK_REDIS_URL", "POISSONMARK_KEK"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    (data_dir / "models").mkdir(parents=True, exist_ok=True)
    (home / "models").symlink_to(data_dir / "models", target_is_directory=True)
    monkeypatch.setenv("POISSONMARK_HOME", str(home))
    return home


def invoke(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def create_key(*args: str) -> str:
    made = invoke("keys", "create", "--json", *args)
    assert made.exit_code == 0, made.output
    return str(json.loads(made.stdout)["key_id"])


def marked_ids(key_id: str, seed: int) -> str:
    """60 keyed-race ids under the key's secret, as ``--token-ids`` takes them."""
    with key_store(Settings()) as store:
        secret = store.get(key_id).secret
    return json.dumps(keyed_race_ids(secret, 60, seed=seed))


def test_exit_status_follows_the_verdict_with_the_flag(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = create_key()
    marked = marked_ids(key, seed=3)
    # the same race under another secret: unrelated to the key (fixed seed: not a false positive)
    other = json.dumps(keyed_race_ids(fixed_secret("another key"), 60, seed=3))
    found = invoke("detect", "--key", key, "--token-ids", marked, "--exit-status")
    assert found.exit_code == 0, found.output
    assert "verdict: watermarked" in found.stdout
    missed = invoke("detect", "--key", key, "--token-ids", other, "--exit-status")
    assert missed.exit_code == 1, missed.output
    assert "verdict: not_detected" in missed.stdout
    short = invoke("detect", "--key", key, "--token-ids", marked[:30] + "]", "--exit-status")
    assert short.exit_code == 1 and "insufficient_evidence" in short.stdout, short.output
    as_json = invoke("detect", "--key", key, "--token-ids", other, "--exit-status", "--json")
    assert as_json.exit_code == 1 and json.loads(as_json.stdout)["verdict"] == "not_detected"
    # without the flag a printed verdict exits 0, whatever it is (scripts that relied on it)
    assert invoke("detect", "--key", key, "--token-ids", other).exit_code == 0
    # errors exit 2 under the flag: bad input, and the environment (1 without the flag)
    bad = invoke("detect", "--key", key, "--token-ids", "[1, 2", "--exit-status")
    assert bad.exit_code == 2 and "--token-ids" in bad.output
    corpus = invoke("detect", "--key", key, "--jsonl", str(home / "c.jsonl"), "--exit-status")
    assert corpus.exit_code == 2 and "--exit-status goes without --jsonl" in corpus.output
    monkeypatch.setenv("REDIS_URL", f"redis://127.0.0.1:{free_port()}/0")  # nobody listens
    down = invoke("detect", "--key", key, "--token-ids", marked, "--exit-status")
    assert down.exit_code == 2 and "key store unavailable" in down.output, down.output
    assert invoke("detect", "--key", key, "--token-ids", marked).exit_code == 1


def test_detect_help_documents_the_exit_status(home: Path) -> None:
    shown = " ".join(invoke("detect", "--help").output.split())
    assert "With --exit-status: 0 for watermarked, 1 for not watermarked, 2 for an error" in shown


def test_detect_help_shows_the_ray_extra_in_brackets(home: Path) -> None:
    # typer reads help as rich markup, where an unescaped [ray] is a style tag and vanishes
    shown = " ".join(invoke("detect", "--help").output.replace("│", " ").split())
    assert "pip install 'poissonmark[ray]'" in shown


def write_corpus(home: Path, key: str) -> Path:
    """Two documents: human text too short to score (no token has the 4 tokens of context a
    label needs, so it is never flagged, whatever the random key) and 60 ids the key
    watermarked."""
    corpus = home / "corpus.jsonl"
    rows = [
        {"id": "human", "text": "Noted, thanks"},  # 4 tokens: none has 4 tokens before it
        {"id": "marked", "token_ids": json.loads(marked_ids(key, seed=5))},
    ]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return corpus


SUMMARY = "2 detected, 1 watermarked, 0 errors, 0 skipped (already in output)"


def test_corpus_writes_only_its_counts_to_a_pipe(home: Path) -> None:
    """stderr not a terminal (CliRunner's is a buffer, as a pipe or a CI log is): no
    progress bar, its frames or its final state, only the counts."""
    key = create_key()
    corpus, output = write_corpus(home, key), home / "out.jsonl"
    done = invoke("detect", "--key", key, "--jsonl", str(corpus), "--output", str(output))
    assert done.exit_code == 0, done.output
    assert done.stderr.splitlines() == [SUMMARY]
    assert done.stdout == ""
    assert [json.loads(line)["id"] for line in output.read_text().splitlines()] == [
        "human",
        "marked",
    ]


def test_corpus_shows_documents_rate_and_time_left_on_a_terminal(home: Path) -> None:
    key = create_key()
    corpus, output = write_corpus(home, key), home / "out.jsonl"
    status, stdout, shown = cli_on_a_terminal(
        "detect", "--key", key, "--jsonl", str(corpus), "--output", str(output)
    )
    assert status == 0, shown
    assert stdout == ""
    assert "detecting" in shown and "2/2" in shown, shown
    assert "docs/s" in shown and "ETA" in shown, shown
    assert SUMMARY in shown


def test_key_less_detect_names_the_tenant_it_tested(home: Path) -> None:
    acme = create_key("--tenant", "acme")
    create_key()  # a key of tenant default, unrelated to the text
    ids = marked_ids(acme, seed=4)
    plain = invoke("detect", "--token-ids", ids)
    assert plain.exit_code == 0, plain.output
    assert "verdict (corrected): not_detected" in plain.stdout
    told = " ".join(plain.stdout.split())
    assert "tenant 'default'" in told and "--tenant chooses the tenant" in told
    as_json = invoke("detect", "--token-ids", ids, "--json")
    assert json.loads(as_json.stdout)["verdict"] == "not_detected"  # stdout: the API's shape
    assert "tested 1 key of tenant 'default'" in as_json.stderr
    chosen = invoke("detect", "--token-ids", ids, "--tenant", "acme", "--json", "--exit-status")
    assert chosen.exit_code == 0, chosen.output
    assert json.loads(chosen.stdout)["best_key_id"] == acme
    assert "tenant 'acme'" in chosen.stderr
    nobody = invoke("detect", "--token-ids", ids, "--tenant", "nobody")
    assert nobody.exit_code == 2
    told = " ".join(nobody.output.split())
    assert "tenant 'nobody' has no key" in told and "--tenant" in told and "--key" in told


def test_errors_and_piped_output_read_plainly(home: Path) -> None:
    """A missing file is named as the shell names it (no exception class), a malformed key id
    is called malformed (and not echoed), and output into a pipe keeps one fact per line (no
    wrapping at 80 columns)."""
    key = create_key()
    absent = home / "absent.txt"
    missing = invoke("detect", "--key", key, "--file", str(absent))
    assert missing.exit_code == 1, missing.output
    assert f"{absent}: No such file or directory" in missing.output
    assert "Error" not in missing.output
    pasted = "pmk_doesnotexist00"
    malformed = invoke("generate", "--key", pasted, "--prompt", "x")
    assert malformed.exit_code == 2, malformed.output
    assert "malformed key id" in malformed.output and "unknown" not in malformed.output
    assert pasted not in malformed.output
    found = invoke("detect", "--key", key, "--token-ids", marked_ids(key, seed=3))
    assert found.exit_code == 0, found.output
    line = next(x for x in found.stdout.splitlines() if x.startswith("p-value:"))
    assert len(line) > 80 and re.search(r"scored tokens: \d+ of \d+$", line), found.stdout


@pytest.mark.realmodel
def test_detect_says_what_the_canonical_reading_changed(home: Path) -> None:
    """A generated answer with a zero-width space after every space and Cyrillic а for Latin a:
    found, and the output says which reading carried it and what it changed."""
    key = create_key()
    made = invoke(
        "generate", "--key", key, "--prompt", "Why is the sky blue?", "--max-new-tokens", "96",
        "--nonce", "3", "--json",
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    text = json.loads(made.stdout)["text"]
    attacked = text.replace(" ", " \u200b").replace("a", "\u0430")
    shown = invoke("detect", "--key", key, "--text", attacked)
    assert shown.exit_code == 0, shown.output
    assert "verdict: watermarked" in shown.stdout
    assert f"{text.count(' ')} invisible characters removed" in shown.stdout
    assert f"{text.count('a')} Cyrillic letters read as Latin" in shown.stdout
    assert "corrected for the 2 readings tried" in shown.stdout
    as_json = invoke("detect", "--key", key, "--text", attacked, "--json")
    reading = json.loads(as_json.stdout)["reading"]
    assert reading["name"] == "canonical" and reading["readings_tried"] == 2
    assert reading["changes"]["invisible"] == text.count(" ")
    clean = json.loads(invoke("detect", "--key", key, "--text", text, "--json").stdout)
    assert clean["verdict"] == "watermarked"
    assert clean["reading"]["readings_tried"] == len(readings(text))
