"""Run code in a new interpreter: what a fresh process imports is part of the architecture."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def fresh_python(code: str) -> str:
    """What ``code`` prints (stdout, stripped) in a new interpreter at the repository root.

    Raises:
        subprocess.CalledProcessError: the code failed (its stderr is on the exception).
    """
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return out.stdout.strip()


def cli_on_a_terminal(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """``poissonmark *args`` in a new process whose stderr is a terminal (a pseudo-terminal,
    160 columns) and whose stdout is a pipe: (exit status, stdout, what the terminal showed).

    Variables that would force or forbid terminal output (``FORCE_COLOR``, ``NO_COLOR``,
    ``TTY_COMPATIBLE``, ``TTY_INTERACTIVE``) are left out of the child's environment.
    """
    import os

    base = os.environ if env is None else env
    forced = ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS")
    child = {k: v for k, v in base.items() if k not in forced}
    child |= {"TERM": "xterm-256color", "COLUMNS": "160"}
    controller, terminal = os.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "service.cli", *args],
        cwd=ROOT,
        env=child,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=terminal,
    )
    os.close(terminal)
    shown = bytearray()
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    assert process.stdout is not None
    stdout = process.stdout.read()
    process.wait(timeout=600)
    os.close(controller)
    return process.returncode, stdout.decode(), shown.decode(errors="replace")
