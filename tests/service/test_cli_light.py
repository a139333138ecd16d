"""The one-shot CLI commands stay light and read input exactly.

- ``import service.cli`` (every command's start-up), and the ``keys``, ``tokens`` and ``detect``
  commands run to the end, load no torch (fresh interpreter, ``sys.modules``); the detector
  needs the tokenizer alone, the same class and ids as ``AutoTokenizer``'s. Their wall time is
  measured in ``bench/cli_detect_time.py``, never here.
- ``detect --file`` reads the file's bytes as they are (CRLF stays): offsets index the file and
  the result equals stdin's for the same bytes.
- ``keys create --tenant``, ``keys list`` with the HTTP fields (revoked keys included, with
  their state), ``tokens list`` with a header row.
- every command's ``--help`` speaks to its user: no measurements or benchmark files, no
  reStructuredText quoting, and the speed settings say they never change the text.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from service.cli import app
from tests.fresh import ROOT, fresh_python

TORCH_LOADED = "print(any(m == 'torch' or m.startswith('torch.') for m in sys.modules))"
TRANSFORMERS_LOADED = "print(any(m.split('.')[0] == 'transformers' for m in sys.modules))"


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


def test_import_service_cli_loads_no_torch() -> None:
    imports = "import service.cli, sampler.methods, sampler.targets.model_files"
    code = f"import sys\n{imports}\n{TORCH_LOADED}"
    assert fresh_python(code) == "False"


@pytest.mark.realmodel
def test_keys_tokens_and_detect_run_without_torch(home: Path) -> None:
    """keys create/list, tokens create/list and detect, in one fresh interpreter."""
    code = f"""
import contextlib, io, json, sys
from service.cli import app

def run(*args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        app(list(args), standalone_mode=False)
    return out.getvalue()

key = json.loads(run("keys", "create", "--json"))["key_id"]
run("keys", "list")
run("tokens", "create", "--name", "t")
run("tokens", "list")
found = json.loads(run("detect", "--key", key, "--text", "Some text to test.", "--json"))
assert found["best_key_id"] == key, found
{TORCH_LOADED}
"""
    env = {**os.environ, "POISSONMARK_HOME": str(home)}
    out = subprocess.run(
        [sys.executable, "-c", code + TRANSFORMERS_LOADED],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-2:] == ["False", "False"]  # no torch, no transformers


@pytest.mark.realmodel
def test_tokenizer_is_autotokenizers(data_dir: Path) -> None:
    """``load_tokenizer`` without torch gives AutoTokenizer's class, ids, offsets and specials."""
    from transformers import AutoTokenizer

    from sampler.targets.model_files import (
        DEFAULT_MODEL,
        load_tokenizer,
        materialise,
        model_tokenizer_fingerprint,
        tokenizer_fingerprint,
    )

    light = load_tokenizer(DEFAULT_MODEL, data_dir)
    auto = AutoTokenizer.from_pretrained(str(materialise(DEFAULT_MODEL, data_dir)))
    assert type(light) is type(auto)
    assert light.all_special_ids == auto.all_special_ids and len(light) == len(auto)
    assert light.chat_template == auto.chat_template
    for text in ["Hello, world!", "a\r\nb\n\n  c\t<|im_end|>", "naïve café — 東京", ""]:
        a = auto(text, add_special_tokens=False, return_offsets_mapping=True)
        b = light(text, add_special_tokens=False, return_offsets_mapping=True)
        assert a["input_ids"] == b["input_ids"] and a["offset_mapping"] == b["offset_mapping"]
    fingerprint = tokenizer_fingerprint(auto)
    assert tokenizer_fingerprint(light) == fingerprint
    assert model_tokenizer_fingerprint(light, DEFAULT_MODEL, data_dir) == fingerprint  # cached
    assert model_tokenizer_fingerprint(light, DEFAULT_MODEL, data_dir) == fingerprint  # read


TEXTS = ["Hello, world!", "a\r\nb\n\n  c\t<|im_end|>", "naïve café — 東京 🎉🇫🇷", "",
         "<|im_start|>user\nhi<|im_end|>", "  leading and trailing  ", "x" * 300]  # fmt: skip


@pytest.mark.realmodel
def test_detection_tokenizer_equals_autotokenizer(data_dir: Path) -> None:
    """The ``tokenizers``-only ``TokenizerFile`` the CLI detects with gives AutoTokenizer's ids,
    offsets (special tokens added or not), decodings, special ids, length and fingerprint."""
    from transformers import AutoTokenizer

    from sampler.targets.model_files import (
        DEFAULT_MODEL,
        TokenizerFile,
        load_detection_tokenizer,
        materialise,
        tokenizer_fingerprint,
    )

    light = load_detection_tokenizer(DEFAULT_MODEL, data_dir)
    auto = AutoTokenizer.from_pretrained(str(materialise(DEFAULT_MODEL, data_dir)))
    assert isinstance(light, TokenizerFile)
    assert light.all_special_ids == auto.all_special_ids and len(light) == len(auto)
    for text in TEXTS:
        for special in (False, True):
            a = auto(text, add_special_tokens=special, return_offsets_mapping=True)
            b = light(text, add_special_tokens=special, return_offsets_mapping=True)
            assert list(a["input_ids"]) == b["input_ids"], text
            assert [tuple(o) for o in a["offset_mapping"]] == b["offset_mapping"], text
        ids = auto(text, add_special_tokens=False)["input_ids"] + [1, 2, 0, 5, 49151]
        for skip in (False, True):
            kwargs = {"skip_special_tokens": skip, "clean_up_tokenization_spaces": False}
            assert light.decode(ids, **kwargs) == auto.decode(ids, **kwargs)
    assert tokenizer_fingerprint(light) == tokenizer_fingerprint(auto)
    assert light.get_vocab() == auto.get_vocab()
    with pytest.raises(ValueError, match="clean_up"):
        light.decode([5], clean_up_tokenization_spaces=True)


@pytest.mark.realmodel
def test_detection_tokenizer_falls_back_on_unknown_config(data_dir: Path, tmp_path: Path) -> None:
    """A ``tokenizer_config.json`` entry ``TokenizerFile`` does not know (it could change
    encoding) sends the directory to transformers' class."""
    import shutil

    from sampler.targets.model_files import (
        DEFAULT_MODEL,
        TokenizerFile,
        load_detection_tokenizer,
        materialise,
    )

    source = materialise(DEFAULT_MODEL, data_dir)
    copy = tmp_path / "model"
    copy.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, copy / name)
    assert isinstance(load_detection_tokenizer(str(copy), tmp_path), TokenizerFile)
    config = json.loads((copy / "tokenizer_config.json").read_text())
    (copy / "tokenizer_config.json").write_text(json.dumps({**config, "add_bos_token": True}))
    assert not isinstance(load_detection_tokenizer(str(copy), tmp_path), TokenizerFile)


@pytest.mark.realmodel
@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("special_tokens_map.json", {"additional_special_tokens": ["<repo_name>", "<file_sep>"]}),
        ("added_tokens.json", {"<not-in-vocab>": 49152}),
    ],
)
def test_detection_tokenizer_falls_back_on_transformers_only_files(
    data_dir: Path, tmp_path: Path, name: str, content: dict[str, object]
) -> None:
    """transformers also reads ``special_tokens_map.json`` (more special ids: the detector
    skips them) and ``added_tokens.json`` (more tokens: other ids; the fingerprint, vocab and
    merges only, does not see them); a directory holding either goes to transformers, so the
    CLI detects with the server's ids and special ids."""
    import shutil

    from transformers import AutoTokenizer

    from sampler.targets.model_files import DEFAULT_MODEL, load_detection_tokenizer, materialise

    source = materialise(DEFAULT_MODEL, data_dir)
    copy = tmp_path / "model"
    copy.mkdir()
    for file in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / file, copy / file)
    (copy / name).write_text(json.dumps(content))
    light = load_detection_tokenizer(str(copy), tmp_path)
    auto = AutoTokenizer.from_pretrained(str(copy))
    text = "a <repo_name> b <not-in-vocab> c"
    assert light(text, add_special_tokens=False)["input_ids"] == list(
        auto(text, add_special_tokens=False)["input_ids"]
    )
    assert light.all_special_ids == auto.all_special_ids and len(light) == len(auto)


@pytest.mark.realmodel
def test_detect_file_keeps_crlf_and_equals_stdin(home: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    key = json.loads(runner.invoke(app, ["keys", "create", "--json"]).stdout)["key_id"]
    raw = "First line of the text.\r\nSecond line, café.\r\n\r\nThird line here.\r\n".encode()
    path = tmp_path / "crlf.txt"
    path.write_bytes(raw)
    by_file = runner.invoke(app, ["detect", "--key", key, "--file", str(path), "--json"])
    assert by_file.exit_code == 0, by_file.output
    by_stdin = runner.invoke(app, ["detect", "--key", key, "--json"], input=raw)
    assert by_stdin.exit_code == 0, by_stdin.output
    file_result, stdin_result = json.loads(by_file.stdout), json.loads(by_stdin.stdout)
    assert file_result["log10_p_value"] == stdin_result["log10_p_value"]
    assert file_result["results"][0]["tokens"] == stdin_result["results"][0]["tokens"]
    text = raw.decode()
    tokens = file_result["results"][0]["tokens"]
    assert "".join(t["text"] for t in tokens) == text  # nothing rewritten
    assert all(text[t["start"] : t["end"]] == t["text"] for t in tokens)  # offsets index it
    assert tokens[-1]["end"] == len(text) and any("\r" in t["text"] for t in tokens)
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9".encode("latin-1"))
    refused = runner.invoke(app, ["detect", "--key", key, "--file", str(bad)])
    assert refused.exit_code == 2 and "not UTF-8" in " ".join(refused.output.split())


@pytest.mark.realmodel
def test_keys_create_tenant_and_lists_match_http(home: Path) -> None:
    from service.schemas.keys import KeyOut

    runner = CliRunner()
    made = json.loads(runner.invoke(app, ["keys", "create", "--tenant", "acme", "--json"]).stdout)
    assert made["tenant"] == "acme"
    other = json.loads(runner.invoke(app, ["keys", "create", "--json"]).stdout)["key_id"]
    assert runner.invoke(app, ["keys", "revoke", other]).exit_code == 0
    listed = json.loads(runner.invoke(app, ["keys", "list", "--json"]).stdout)["keys"]
    assert {k["key_id"]: k["revoked"] for k in listed} == {made["key_id"]: False, other: True}
    assert all(set(k) == set(KeyOut.model_fields) | {"tenant"} for k in listed)
    acme = json.loads(runner.invoke(app, ["keys", "list", "--tenant", "acme", "--json"]).stdout)
    assert [k["key_id"] for k in acme["keys"]] == [made["key_id"]]
    active = json.loads(runner.invoke(app, ["keys", "list", "--active", "--json"]).stdout)
    assert [k["key_id"] for k in active["keys"]] == [made["key_id"]]
    table = runner.invoke(app, ["keys", "list"]).stdout.splitlines()
    assert table[0].split()[:6] == ["KEY", "TENANT", "MODEL", "M", "MASKING", "STATE"]
    assert any(other in line and "revoked" in line for line in table[1:])
    runner.invoke(app, ["tokens", "create", "--name", "ci"])
    tokens = runner.invoke(app, ["tokens", "list"]).stdout.splitlines()
    assert tokens[0].split()[:3] == ["TOKEN", "ID", "TENANT"] and len(tokens) == 2


COMMANDS = [
    ["generate"],
    ["detect"],
    ["distill"],
    ["serve"],
    ["keys", "create"],
    ["keys", "list"],
    ["keys", "revoke"],
    ["keys", "reseal"],
    ["keys", "delete"],
    ["tokens", "create"],
    ["tokens", "list"],
    ["tokens", "revoke"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_help_carries_no_measurements(command: list[str]) -> None:
    shown = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.output.replace("│", " ").split())
    for figure in ("measured", "bench/", "tok/s", " ms ", "µs", "``", "results/"):
        assert figure not in text, (figure, text)


def help_summary(output: str) -> list[list[str]]:
    """The paragraphs of a command's help above its panels, each as its lines (stripped)."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("Usage:")) + 1
    end = next(i for i, line in enumerate(lines) if line.startswith("╭"))
    paragraphs: list[list[str]] = [[]]
    for line in lines[start:end]:
        if line.strip():
            paragraphs[-1].append(line.strip())
        elif paragraphs[-1]:
            paragraphs.append([])
    return [p for p in paragraphs if p]


def test_detect_help_flows_as_paragraphs() -> None:
    """Each paragraph of ``detect --help`` breaks a line only where the next word would not fit
    in the 200 columns (rich's margin of one column each side), never where the docstring did."""
    shown = CliRunner().invoke(app, ["detect", "--help"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    paragraphs = help_summary(shown.output)
    assert len(paragraphs) == 2 and paragraphs[1][0].startswith("Exit status:"), paragraphs
    for paragraph in paragraphs:
        assert paragraph[-1].endswith("."), paragraph
        for line, following in itertools.pairwise(paragraph):
            assert len(line) + 1 + len(following.split()[0]) > 200 - 2, (line, following)


def test_command_lists_flow_as_paragraphs() -> None:
    """A command's summary in its group's list wraps at the terminal's width only: at 200
    columns no row of it is as short as a docstring's line (at most 100 characters)."""
    for group in ([], ["keys"]):
        shown = CliRunner().invoke(app, [*group, "--help"], env={"COLUMNS": "200"})
        assert shown.exit_code == 0, shown.output
        rows = [line.strip("│ ") for line in shown.output.splitlines() if line.startswith("│")]
        for row, following in itertools.pairwise(rows):
            starts_a_command = re.match(r"[a-z]+ {2,}\S", following) is not None
            if not starts_a_command and not following.startswith("-"):  # row wraps on
                assert len(row) > 120, (row, following)


def test_generate_help_says_the_speed_settings_keep_the_text() -> None:
    shown = CliRunner().invoke(app, ["generate", "--help"], env={"COLUMNS": "200"})
    text = " ".join(shown.output.replace("│", " ").split())
    for option in ("Drafts B:", "Lookahead L:"):
        start = text.index(option)
        assert "never the text" in text[start : start + 200], text[start : start + 200]
    assert "the same text either way" in text
