"""bench/speed_cpu.py without a model: which row an mpfr row is compared with, the per-step
breakdown, the CLI's and HTTP's answers read as runs, and the llama.cpp worker's protocol
(on a stand-in ``llama_cpp`` package)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bench.common import shared_prompts
from bench.speed_cpu import WORKER, Run, _reference, _summary, _wire_run, pypi_missing
from sampler.stats import StepSeconds


@pytest.mark.parametrize(
    ("row", "reference"),
    [
        pytest.param("mpfr/ngram/B4L4", "basic-uwm", id="float32"),
        pytest.param("gguf:mpfr/eagle/B4L4/auto", "gguf:basic-uwm", id="gguf"),
        pytest.param("cli:mpfr", "cli:basic-uwm", id="cli"),
        pytest.param("http:mpfr", "http:basic-uwm", id="http"),
    ],
)
def test_an_mpfr_row_is_compared_with_basic_uwm_reached_the_same_way(
    row: str, reference: str
) -> None:
    assert _reference(row) == reference


def test_the_per_step_breakdown_leaves_the_rest_of_the_decode_seconds_to_python() -> None:
    runs = [
        Run(8, 0.5, [1], steps=4, tree_steps=3, step_seconds=StepSeconds(0.1, 0.2, 0.1)),
        Run(6, 0.3, [2], steps=2, tree_steps=2, step_seconds=StepSeconds(0.05, 0.15, 0.05)),
    ]
    entry = _summary("gguf:mpfr/eagle/B4L4/auto", runs, [Run(8, 1.0, [1]), Run(6, 1.0, [3])])
    ms = entry["step_seconds"]["ms_per_step"]
    assert ms["draft"] == pytest.approx(1000 * 0.15 / 6)
    assert ms["forward"] == pytest.approx(1000 * 0.35 / 6)
    assert ms["walk"] == pytest.approx(1000 * 0.15 / 6)
    assert ms["python"] == pytest.approx(1000 * (0.8 - 0.65) / 6)
    assert (entry["steps"], entry["tree_steps"], entry["identical_to_basic_uwm"]) == (6, 5, 1)


def test_rows_without_the_parts_have_no_breakdown_and_keep_their_wall_time() -> None:
    entry = _summary("llama.cpp-pypi", [Run(15, 0.2, [1], wall=0.3)], None)
    assert "step_seconds" not in entry and "identical_to_basic_uwm" not in entry
    assert entry["wall_seconds"] == pytest.approx(0.3)


def _answer(method: str, choices: list[dict[str, int]], seconds: float | None) -> dict:
    stats = {"emitted_tokens": 16, "target_forward_passes": 10, "tree_choices": choices}
    if seconds is not None:
        stats["seconds"] = seconds
    return {"method": method, "token_ids": [5, 6], "stats": stats}


AUTO = [{"drafts": 4, "lookahead": 0, "steps": 3}, {"drafts": 4, "lookahead": 2, "steps": 7}]
"""Tree auto's choices: 3 one-token steps and 7 tree steps."""


@pytest.mark.parametrize(
    ("answer", "tree_steps"),
    [
        pytest.param(_answer("basic-uwm", [], 0.5), 0, id="basic_uwm"),
        pytest.param(_answer("mpfr", AUTO, 0.5), 7, id="mpfr_auto"),
        pytest.param(_answer("mpfr", [], 0.5), 10, id="mpfr_fixed"),
    ],
)
def test_an_answer_of_the_cli_or_http_is_read_as_a_run(answer: dict, tree_steps: int) -> None:
    run, fallback = _wire_run(answer, wall=2.0)
    assert not fallback
    assert (run.tokens, run.seconds, run.ids, run.steps) == (16, 0.5, [5, 6], 10)
    assert (run.tree_steps, run.wall) == (tree_steps, 2.0)


def test_an_answer_without_decode_seconds_is_timed_by_its_wall_time() -> None:
    run, fallback = _wire_run(_answer("basic-uwm", [], None), wall=2.0)
    assert fallback and run.seconds == 2.0


@pytest.mark.parametrize("n", [0, 1, 2, 3, 20])
def test_shared_prompts_gives_n_prompts_an_odd_ones_extra_one_eli5(n: int) -> None:
    ids = [row["id"] for row in shared_prompts(n)]
    assert len(ids) == n
    assert sum(i.startswith("eli5") for i in ids) == (n + 1) // 2


def test_the_pypi_row_without_its_environment_names_the_script_that_builds_it(
    tmp_path: Path,
) -> None:
    why = pypi_missing(tmp_path / "env" / "bin" / "python")
    assert why is not None and "bench/pypi_llama_cpp.sh" in why


FAKE_LLAMA_CPP = """
__version__ = "0.0.0"


class Llama:
    def __init__(self, model_path, **kwargs):
        from llama_cpp import llama_cpp as raw

        print("llama.cpp chatter on stdout")  # the worker must keep it off its answers
        self.repack = raw.llama_model_default_params().use_extra_bufts
        self.seed = 0

    def set_seed(self, seed):
        self.seed = seed

    def generate(self, ids, **kwargs):
        yield from [self.seed, 7, 8, 2, 9]
"""
FAKE_RAW = """
class Params:
    use_extra_bufts = True


def llama_model_default_params():
    return Params()
"""


def test_the_worker_answers_each_line_with_the_peers_sampling(tmp_path: Path) -> None:
    package = tmp_path / "llama_cpp"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent(FAKE_LLAMA_CPP))
    (package / "llama_cpp.py").write_text(textwrap.dedent(FAKE_RAW))
    asked = [
        {"model": "m.gguf", "threads": 2, "repack": False, "stop": [2]},
        {"ids": [1, 2, 3], "seed": 5, "tokens": 10},  # stops at id 2
        {"ids": [1], "seed": 6, "tokens": 2},  # stops at the token limit
    ]
    done = subprocess.run(
        [sys.executable, str(WORKER)],
        input="".join(json.dumps(a) + "\n" for a in asked),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={"PYTHONPATH": str(tmp_path)},
    )
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert answers[0] == {"version": "0.0.0", "repack": False}
    assert [(a["ids"], a["tokens"]) for a in answers[1:]] == [([5, 7, 8], 2), ([6, 7], 1)]
    assert all(a["seconds"] >= 0 for a in answers[1:])
    assert "chatter" in done.stderr
