"""llama.cpp's thread count under other load (``sampler.targets.llamacpp.CoreShare``)."""

from __future__ import annotations

from pathlib import Path

from sampler.targets import cpu_features
from sampler.targets.cpu_features import CoreShare, procs_running


def test_procs_running_reads_the_running_count_of_loadavg(tmp_path: Path) -> None:
    """The running count of ``running/total``, read again at each call (the descriptor stays
    open); a file without it or no file: None."""
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("0.50 0.40 0.30 3/162 12757\n")
    assert procs_running(loadavg) == 3
    kept = cpu_features._OPEN[loadavg]
    loadavg.write_text("0.50 0.40 0.30 1/161 12758\n")  # the same inode, read again
    assert procs_running(loadavg) == 1 and cpu_features._OPEN[loadavg] == kept
    loadavg.write_text("0.50\n")
    assert procs_running(loadavg) is None
    assert procs_running(tmp_path / "missing") is None
    assert isinstance(procs_running(), int)  # this machine's own file


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
