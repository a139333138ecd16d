"""llama.cpp's thread count under other load (``sampler.targets.llamacpp.CoreShare``)."""

from __future__ import annotations

from pathlib import Path

from sampler.targets.cpu_features import CoreShare, procs_running


def test_procs_running_reads_proc_stat(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  1 2 3\nctxt 99\nprocs_running 3\nprocs_blocked 0\n")
    assert procs_running(stat) == 3
    stat.write_text("cpu  1 2 3\n")
    assert procs_running(stat) is None
    assert procs_running(tmp_path / "missing") is None


def test_the_threads_follow_the_cores_others_leave() -> None:
    """Quiet (only the reader runnable): every CPU; two busy processes for a few decodes: one
    thread; quiet again: back to every CPU. One stray reading moves nothing."""
    readings = iter([1] * 5 + [3] + [1] * 5 + [3] * 12 + [1] * 12)
    share = CoreShare(2, read=lambda: next(readings))
    quiet = [share.threads() for _ in range(5)]
    stray = [share.threads() for _ in range(6)]
    busy = [share.threads() for _ in range(12)]
    again = [share.threads() for _ in range(12)]
    assert quiet == [2] * 5 and stray == [2] * 6
    assert busy[-6:] == [1] * 6
    assert again[-6:] == [2] * 6


def test_without_a_reading_or_with_one_cpu_the_count_is_fixed() -> None:
    assert CoreShare(4, read=lambda: None).threads() == 4
    assert CoreShare(1, read=lambda: 9).threads() == 1
    assert CoreShare(4, read=lambda: 40).threads() == 1
