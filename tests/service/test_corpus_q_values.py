"""Corpus mode's Benjamini–Hochberg q-values (item 6; ``corpus.add_q_values``).

The q-values are checked against a hand BH written here from its definition (q_(i) =
min_{j >= i} min(1, p_(j)·m/j) over the m detection rows sorted by p), float for float; the
pass keeps every other byte of the file, skips error rows, is recomputed when run again, and a
resumed (interrupted) corpus run ends with the same file as an uninterrupted one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from detector import DetectOptions
from keyed import KeyedSource
from service.cli import app
from service.jobs.corpus import add_q_values, detect_corpus, done_ids, row_p_value
from tests.detector.helpers import fixed_secret, keyed_race_ids

SECRET = fixed_secret("corpus-q-values")


def hand_bh(ps: list[float]) -> list[float]:
    """Benjamini & Hochberg's adjusted p-values, from the definition (O(m²))."""
    m = len(ps)
    order = sorted(range(m), key=lambda i: ps[i])
    scaled = [ps[i] * (m / (rank + 1)) for rank, i in enumerate(order)]
    q = [0.0] * m
    for rank, i in enumerate(order):
        q[i] = min(1.0, min(scaled[rank:]))
    return q


def detection_row(row_id: str, p: float) -> dict:  # type: ignore[type-arg]
    return {"id": row_id, "verdict": "x", "p_value": p, "scores": {"aaronson": {"p_value": 0.5}}}


def read_rows(path: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_q_values_match_a_hand_bh_and_keep_the_rest(tmp_path: Path) -> None:
    # ties, a zero (an underflowed p), a one, and p-values that BH's step-up pulls down
    ps = [0.04, 1e-300, 0.5, 0.011, 0.04, 1.0, 0.0, 0.2, 0.013, 0.5, 0.9, 0.012]
    rows: list[dict] = []  # type: ignore[type-arg]
    for i, p in enumerate(ps):
        rows.append(detection_row(f"d{i}", p))
        if i % 4 == 1:  # error rows are in the file but not in m
            rows.append({"id": f"e{i}", "error": "token_ids: 1 outside the vocabulary"})
    rows.append({"id": None, "line": 40, "error": "not JSON (Expecting value)"})
    out = tmp_path / "out.jsonl"
    out.write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8"
    )

    counts = add_q_values(out, alpha=0.05)

    expected = hand_bh(ps)
    got = read_rows(out)
    assert [r["id"] for r in got] == [r["id"] for r in rows]
    detected = [r for r in got if "p_value" in r]
    assert [r["q_value"] for r in detected] == expected  # float for float
    assert all("q_value" not in r for r in got if "error" in r)
    assert [{k: v for k, v in r.items() if k != "q_value"} for r in got] == rows
    assert counts.documents == len(ps)
    assert counts.discoveries == sum(q <= 0.05 for q in expected)
    # step-up: 0.011 (rank 3), 0.012 (4), 0.013 (5) share q = 0.013·12/5 = 0.0312 < 0.011·12/3
    assert {detected[i]["q_value"] for i in (3, 11, 8)} == {0.013 * (12 / 5)}
    before = out.read_bytes()
    add_q_values(out, alpha=0.05)  # again: recomputed from the p-values, same bytes
    assert out.read_bytes() == before


def test_q_values_refuse_a_file_that_is_not_an_output(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text(json.dumps(detection_row("a", 0.1)) + "\n[1, 2]\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 2 is not a JSON object"):
        add_q_values(out)
    assert "q_value" not in out.read_text(encoding="utf-8")  # untouched
    with pytest.raises(ValueError, match="alpha"):
        add_q_values(out, alpha=1.0)


@pytest.fixture(scope="module")
def human_passages(data_files: Path) -> list[str]:
    with (data_files / "human-pydoc.jsonl").open(encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f][:6]


def write_corpus(path: Path, human_passages: list[str]) -> None:
    lines = []
    for i in range(6):
        marked = keyed_race_ids(SECRET, num_new=12 + 6 * i, seed=100 + i)
        lines.append(json.dumps({"id": f"w{i}", "token_ids": marked}))
        lines.append(json.dumps({"id": f"h{i}", "text": human_passages[i][:400]}))
    lines.insert(5, "not json")
    lines.insert(8, json.dumps({"id": "bad", "token_ids": [1, -5]}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def run(real_tokenizer, corpus: Path, out: Path) -> None:  # type: ignore[no-untyped-def]
    options = DetectOptions(alpha=0.01, key_id="pmk_0123456789abcdef")
    detect_corpus(real_tokenizer, KeyedSource(SECRET), corpus, out, options, tokens=False)
    add_q_values(out, options.alpha)


def test_corpus_q_values_survive_resume(real_tokenizer, human_passages, tmp_path) -> None:  # type: ignore[no-untyped-def]
    corpus, whole, resumed = tmp_path / "in.jsonl", tmp_path / "whole.jsonl", tmp_path / "r.jsonl"
    write_corpus(corpus, human_passages)
    run(real_tokenizer, corpus, whole)
    rows = read_rows(whole)
    ps = [p for p in map(row_p_value, rows) if p is not None]
    assert len(ps) == 12 and len(rows) == 14
    assert [r["q_value"] for r in rows if "q_value" in r] == hand_bh(ps)
    assert min(ps) < 1e-3 < max(ps)  # strong and null documents both present

    # an interrupted run: five whole lines (no q-values yet) and a torn sixth
    text = whole.read_text(encoding="utf-8").splitlines(keepends=True)
    stripped = [
        json.dumps({k: v for k, v in json.loads(line).items() if k != "q_value"})
        for line in text[:5]
    ]
    resumed.write_text("".join(s + "\n" for s in stripped) + text[5][:30], encoding="utf-8")
    run(real_tokenizer, corpus, resumed)
    assert read_rows(resumed) == rows  # same rows, same order, q-values of the whole corpus


def test_resume_finds_ids_of_rows_holding_unicode_line_separators(tmp_path: Path) -> None:
    # json.dumps(ensure_ascii=False) writes U+2028 / U+0085 raw; they end no line of the file
    out = tmp_path / "out.jsonl"
    rows = [{"id": "a", "tokens": [{"text": "x\u2028y\u0085z"}]}, {"id": "b"}]
    out.write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows) + '{"id": "c', "utf-8"
    )
    assert done_ids(out) == {"a", "b"}
    assert out.read_text(encoding="utf-8").endswith('{"id": "b"}\n')  # the torn line is cut


def test_cli_q_values_and_engine_options_are_checked(tmp_path: Path) -> None:
    corpus = tmp_path / "in.jsonl"
    corpus.write_text('{"id": "a", "text": "x"}\n', encoding="utf-8")
    runner = CliRunner()
    cases = [
        (["--jsonl", str(corpus), "--q-values"], "--q-values needs --output"),
        (["--jsonl", str(corpus), "--engine", "spark"], "--engine: expected one of local, ray"),
        (["--jsonl", str(corpus), "--address", "auto"], "--address goes with --engine ray"),
        (["--text", "x", "--q-values"], "go with --jsonl"),
    ]
    for args, message in cases:
        result = runner.invoke(app, ["detect", "--key", "pmk_0123456789abcdef", *args])
        assert result.exit_code == 2, (args, result.output)
        assert message in " ".join(result.output.split()), (args, result.output)
