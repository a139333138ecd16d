"""``poissonmark detect --jsonl --engine ray`` on a real two-node Ray cluster.

The cluster is two ``ray start`` nodes on this machine (``tests/service/ray_cluster.py``: one
CPU each, so the two detector actors run one per node). The reference is the local engine's
output for the same corpus, key and options, q-values included; every Ray run must end with
that file byte for byte:

- with a detector actor on the worker node killed (SIGKILL) mid-run: Ray restarts it and
  retries its batches, and the output has every line once;
- with the worker node's whole process tree SIGKILLed mid-run (a cluster of its own, whose
  head has a CPU for the actor to restart on);
- resuming an interrupted output (whole lines, then a torn one): it completes the file, as the
  local engine does (the reference, with the cut part's id-less invalid lines written again).

The corpus mixes human text, invalid lines, blank lines, a CRLF line end and texts holding
U+2028 and U+0085 (line breaks to ``str.splitlines``, not to a text file: the reader must cut
lines where ``open()`` does). Marked ``ray`` (minutes): ``bash scripts/test_ray.sh``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.service.ray_cluster import LocalRayCluster

pytestmark = pytest.mark.ray
pytest.importorskip("ray", reason="the ray extra is not installed: bash scripts/test_ray.sh")

DOCS = 6000
"""Documents in the corpus: detection is fast (~0.25 M scored tokens/s a worker), so it takes
thousands for a run that is still going seconds after the first lines are written."""


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalRayCluster]:
    cluster = LocalRayCluster()
    try:
        cluster.start_head(num_cpus=1)
        cluster.add_worker(num_cpus=1)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, data_dir: Path, cluster: LocalRayCluster):  # type: ignore[no-untyped-def]
    home = tmp_path_factory.mktemp("home")
    (data_dir / "models").mkdir(parents=True, exist_ok=True)
    (home / "models").symlink_to(data_dir / "models", target_is_directory=True)
    env = {k: v for k, v in cluster.env.items() if k not in ("REDIS_URL", "POISSONMARK_REDIS_URL")}
    env = {k: v for k, v in env.items() if k != "POISSONMARK_KEK"}
    env["POISSONMARK_HOME"] = str(home)
    return env


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


@pytest.fixture(scope="module")
def key_id(env: dict[str, str]) -> str:
    created = cli(env, "keys", "create", "--json")
    assert created.returncode == 0, created.stderr
    return str(json.loads(created.stdout)["key_id"])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, data_files: Path) -> Path:
    with (data_files / "human-pydoc.jsonl").open(encoding="utf-8") as f:
        passages = [json.loads(line)["text"] for line in f]
    lines = []
    for i in range(DOCS):
        text = passages[i % len(passages)]
        part = text[(len(text) * (i // len(passages))) // 40 :]
        lines.append(json.dumps({"id": f"d{i}", "text": part}, ensure_ascii=False))
    lines[3] = json.dumps({"id": "ls", "text": "one\u2028two\u0085three " * 20}, ensure_ascii=False)
    lines[10] += "\r"  # a CRLF line end
    for at, bad in ((7, "not json"), (50, "[1, 2]"), (200, '{"id": "x"}'), (300, "")):
        lines.insert(at, bad)
    lines.insert(100, json.dumps({"id": "bad-ids", "token_ids": [1, -5]}))
    path = tmp_path_factory.mktemp("corpus") / "in.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8", newline="")
    return path


def detect_args(key_id: str, corpus: Path, out: Path) -> list[str]:
    return ["detect", "--key", key_id, "--jsonl", str(corpus), "--output", str(out), "--no-tokens"]


@pytest.fixture(scope="module")
def reference(env: dict[str, str], key_id: str, corpus: Path, tmp_path_factory) -> bytes:  # type: ignore[no-untyped-def]
    out = tmp_path_factory.mktemp("reference") / "local.jsonl"
    done = cli(env, *detect_args(key_id, corpus, out), "--q-values")
    assert done.returncode == 0, done.stderr
    text = out.read_text(encoding="utf-8")  # not splitlines(): U+2028 is in a line
    rows = [json.loads(line) for line in text.removesuffix("\n").split("\n")]
    assert len(rows) == DOCS + 4  # the blank line gives nothing
    assert sum("q_value" in r for r in rows) == DOCS
    ls = next(r for r in rows if r["id"] == "ls")  # its line holds raw U+2028 and U+0085
    assert ls["num_tokens"] > 20  # one document, not three
    return out.read_bytes()


def ray_args(cluster: LocalRayCluster) -> list[str]:
    return ["--engine", "ray", "--address", cluster.address, "--workers", "2", "--q-values"]


def lines_in(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def wait_for_lines(path: Path, count: int, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 600
    while lines_in(path) < count:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the Ray run wrote too little in 10 minutes"
        time.sleep(0.2)


def test_ray_matches_local_with_an_actor_killed(  # type: ignore[no-untyped-def]
    cluster, env, key_id, corpus, reference, tmp_path
) -> None:
    out = tmp_path / "ray.jsonl"
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "service.cli",
            *detect_args(key_id, corpus, out),
            *ray_args(cluster),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_lines(out, DOCS // 5, run)
        worker_node = cluster.nodes[1]
        actors = cluster.actor_processes(worker_node, "CorpusDetector")
        assert len(actors) == 1, "expected one detector actor on the worker node"
        written = lines_in(out)
        actors[0].send_signal(signal.SIGKILL)
        assert written < DOCS and run.poll() is None, "killed too late: the run was done"
        _stdout, stderr = run.communicate(timeout=900)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, stderr
    assert out.read_bytes() == reference
    summary = " ".join(stderr.split())
    assert f"{DOCS} detected" in summary and "4 errors, 0 skipped" in summary, summary


def test_ray_resumes_an_interrupted_output(  # type: ignore[no-untyped-def]
    cluster, env, key_id, corpus, reference, tmp_path
) -> None:
    """An output cut after 1,234 whole lines (before its q-value pass) and a torn line, as an
    interrupted run leaves it; the Ray engine completes it."""
    ref = reference.decode("utf-8").removesuffix("\n").split("\n")
    cut = 1234
    written = []
    for line in ref[:cut]:
        row = json.loads(line)
        row.pop("q_value", None)
        written.append(json.dumps(row, ensure_ascii=False))
    out = tmp_path / "ray.jsonl"
    out.write_text("\n".join(written) + '\n{"id": "d1234", "key_', encoding="utf-8")

    again = cli(env, *detect_args(key_id, corpus, out), *ray_args(cluster))

    assert again.returncode == 0, again.stderr
    # ids already written are skipped; invalid lines with no id (nothing to know them by) are
    # written again, in input order, as the local engine does; the q-values are the corpus's
    idless = [line for line in ref[:cut] if line.startswith('{"id": null')]
    assert len(idless) == 2
    expected = [*ref[:cut], *idless, *ref[cut:]]
    assert out.read_text(encoding="utf-8").removesuffix("\n").split("\n") == expected
    summary = " ".join(again.stderr.split())
    assert f"{cut - len(idless)} skipped" in summary, summary


def test_ray_matches_local_with_the_worker_node_killed(  # type: ignore[no-untyped-def]
    env, key_id, corpus, reference, tmp_path
) -> None:
    """A cluster of its own: the head has a spare CPU, so the actor of the dead node can
    restart there; the worker node's whole process tree (raylet, its actors) is SIGKILLed."""
    cluster = LocalRayCluster({"RAY_AUTH_TOKEN": env["RAY_AUTH_TOKEN"]})
    try:
        cluster.start_head(num_cpus=2)
        worker_node = cluster.add_worker(num_cpus=1)
        out = tmp_path / "ray.jsonl"
        args = [sys.executable, "-m", "service.cli", *detect_args(key_id, corpus, out)]
        run = subprocess.Popen(
            [*args, *ray_args(cluster)], env=env, text=True, stderr=subprocess.PIPE
        )
        try:
            wait_for_lines(out, DOCS // 5, run)
            assert len(cluster.actor_processes(worker_node, "CorpusDetector")) == 1
            written = lines_in(out)
            for proc in cluster.processes(worker_node):
                proc.send_signal(signal.SIGKILL)
            assert written < DOCS and run.poll() is None, "killed too late: the run was done"
            _, stderr = run.communicate(timeout=900)
        finally:
            if run.poll() is None:
                run.kill()
        assert run.returncode == 0, stderr
        assert out.read_bytes() == reference
    finally:
        cluster.stop()
