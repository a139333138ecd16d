"""A GGUF file as the model, without the model: names, identity, the header check, the tokenizer
rule (``sampler.targets.gguf_files``, ``sampler.targets.model_files.locate``).

Small GGUF files are written here with the ``gguf`` package (a three-token vocabulary, one
tensor); the real model's files are ``tests/e2e/test_gguf_model.py``'s."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from sampler.targets import gguf_files
from sampler.targets.gguf_files import GgufFileError
from sampler.targets.model_files import (
    DEFAULT_MODEL,
    ModelNotFound,
    check_model,
    locate,
    model_name,
    tokenizer_dir,
)
from service.settings import model_name as settings_model_name

TOKENS = ["<s>", "hello", "world"]


def write_gguf(path: Path, tokens: list[str] = TOKENS) -> Path:
    """A GGUF with a name, a vocabulary and one 4x4 float32 tensor."""
    writer = GGUFWriter(str(path), "llama")
    writer.add_name("Tiny Test")
    writer.add_token_list(tokens)
    writer.add_tensor("token_embd.weight", np.arange(16, dtype=np.float32).reshape(4, 4))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_tokenizer(directory: Path, tokens: list[str]) -> None:
    """``tokenizer.json`` (a word-level vocabulary in ``tokens``' order) and a config."""
    vocab = {token: i for i, token in enumerate(tokens)}
    Tokenizer(WordLevel(vocab, unk_token=tokens[0])).save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"bos_token": tokens[0]}))


def test_a_gguf_path_is_located_and_named_by_its_file_name(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "Tiny-Test.Q8_0.gguf")
    files = check_model(str(path), tmp_path / "data")
    assert files.gguf == path
    assert files.identity["source"] == str(path.resolve())
    assert files.directory.parent == tmp_path / "data" / "models" / "gguf"
    assert files.directory.name.startswith("Tiny-Test.Q8_0-")
    assert model_name(str(path), tmp_path / "data") == "Tiny-Test.Q8_0.gguf"
    assert model_name(str(path), tmp_path) == settings_model_name(str(path))  # what keys record
    assert model_name(DEFAULT_MODEL, tmp_path / "data") == DEFAULT_MODEL
    hf = tmp_path / "My-Model"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    assert model_name(str(hf) + "/", tmp_path / "data") == "My-Model"


def test_the_copy_is_current_until_the_file_changes(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf")
    files = locate(str(path), tmp_path)
    files.directory.mkdir(parents=True)
    (files.directory / gguf_files.MARKER).write_text(json.dumps(files.identity))
    assert gguf_files.is_current(files.directory, locate(str(path), tmp_path).identity)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    again = locate(str(path), tmp_path)
    assert again.directory == files.directory  # keyed by the path: rewritten in place
    assert not gguf_files.is_current(files.directory, again.identity)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"just some text, not a model\n", "not a GGUF file"),
        (b"GGUF", "not a GGUF file"),
        (b"GGUF\x09\x00\x00\x00" + bytes(64), "GGUF version 9"),
    ],
)
def test_a_file_that_is_no_gguf_is_one_line(tmp_path: Path, content: bytes, reason: str) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(GgufFileError, match=reason) as caught:
        locate(str(path), tmp_path)
    assert "\n" not in str(caught.value) and str(path) in str(caught.value)
    assert isinstance(caught.value, ValueError)  # the CLI's exit 2


def test_a_cut_gguf_is_one_line(tmp_path: Path) -> None:
    whole = write_gguf(tmp_path / "whole.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[:60])  # inside the metadata
    locate(str(cut), tmp_path)  # the header alone looks right
    with pytest.raises(GgufFileError, match="not a readable GGUF file") as caught:
        check_model(str(cut), tmp_path)
    assert "\n" not in str(caught.value)


def test_an_unknown_name_or_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFound, match="no such GGUF file"):
        locate(str(tmp_path / "missing.gguf"), tmp_path)
    with pytest.raises(ModelNotFound, match="unknown model 'no-such-alias'"):
        locate("no-such-alias", tmp_path)


def test_a_tokenizer_beside_the_file_overrides_it(tmp_path: Path) -> None:
    """Both files beside it: that directory (a link's own directory); one alone: the file's."""
    repo = tmp_path / "repo"
    repo.mkdir()
    path = write_gguf(repo / "m.gguf")
    write_tokenizer(repo, TOKENS)
    assert tokenizer_dir(str(path), tmp_path / "data") == repo
    gguf_files.check_tokenizer_matches(repo, path)
    linked = tmp_path / "snapshot"
    linked.mkdir()
    (linked / "m.gguf").symlink_to(path)
    assert gguf_files.tokenizer_beside(linked / "m.gguf") is None
    (repo / "tokenizer_config.json").unlink()
    assert gguf_files.tokenizer_beside(path) is None


def test_a_tokenizer_beside_the_file_must_name_its_tokens(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf")
    write_tokenizer(tmp_path, ["<s>", "hello", "there"])
    with pytest.raises(GgufFileError, match="names id 2 'there'"):
        gguf_files.check_tokenizer_matches(tmp_path, path)
    write_tokenizer(tmp_path, TOKENS[:2])
    with pytest.raises(GgufFileError, match="has 2 tokens"):
        gguf_files.check_tokenizer_matches(tmp_path, path)
