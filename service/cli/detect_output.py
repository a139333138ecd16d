"""``poissonmark detect``'s output for people: the verdict, its p-values, what the text could
have shown, the tests beside the verdict, and the text with its scored tokens on green."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rich.text import Text

from service.cli.common import out

if TYPE_CHECKING:
    from detector import Detection, MultiKeyDetection
    from service.schemas.detect_result import DetectResponse

_COLOURS = {
    "watermarked": "bold green",
    "not_detected": "bold",
    "insufficient_evidence": "bold yellow",
}


def tenant_line(found: MultiKeyDetection, tenant: str) -> str:
    """Which tenant a key-less detection tested, and how to test another."""
    plural = "s" if found.num_keys != 1 else ""
    return (
        f"tested {found.num_keys} key{plural} of tenant {tenant!r}, the keys of other tenants "
        "not (--tenant chooses the tenant)"
    )


def show_multi_key(found: MultiKeyDetection, tenant: str) -> None:
    """The corrected verdict over the tenant's keys, then the best key's own result."""
    plural = "s" if found.num_keys != 1 else ""
    out.print(
        f"tested {found.num_keys} key{plural} of tenant {tenant}; best key "
        f"[bold]{found.best_key_id}[/]; p-value corrected for {found.num_keys} key{plural}"
        + (f" and {found.num_readings} readings" if found.num_readings > 1 else "")
        + ": "
        f"{found.p_value:.3g} (log10 p {found.log10_p_value:.2f})",
        highlight=False,
    )
    out.print(f"verdict (corrected): [bold]{found.verdict.value}[/]")
    if found.verdict.value != "watermarked":
        out.print(Text(tenant_line(found, tenant), style="dim"), highlight=False)
    span = found.span_log10_p_value
    out.print(
        f"[dim]whole text, corrected for the keys: log10 p {found.whole_text_log10_p_value:.2f}"
        + ("" if span is None else f"; best span of any key, corrected: log10 p {span:.2f}")
        + "[/]",
        highlight=False,
    )
    _show_power(found.verdict.value, found.min_detectable_mean_score, found.reference_mean_score)
    out.print("[dim]best key's own result:[/]")
    show(found.best, num_keys=found.num_keys)


def _show_power(verdict: str, mu: float | None, reference: float) -> None:
    """What the text could show: the minimum detectable mean score at its length."""
    if mu is None:
        out.print("[yellow]nothing could be scored: too short to tell[/]")
    elif verdict == "insufficient_evidence":
        out.print(
            f"[yellow]too short to tell: it would have been detected if its mean per-token "
            f"score were >= {mu:.2f} (a typical watermarked text: {reference:.2f})[/]",
            highlight=False,
        )
    else:
        out.print(
            f"[dim]minimum detectable mean score at this length: {mu:.2f} "
            f"(typical watermarked: {reference:.2f})[/]",
            highlight=False,
        )


def reading_line(result: Detection) -> str | None:
    """What reading the text needed, in words (None when it was read as submitted and nothing
    in it is rewritten): a sign of tampering."""
    reading = result.reading
    if reading is None or not reading.changes.total:
        return None
    which = "its canonical reading" if reading.name == "canonical" else "the text as submitted"
    tried = (
        f"; p-values corrected for the {reading.readings_tried} readings tried"
        if reading.readings_tried > 1
        else ""
    )
    return f"read as {which}: {'; '.join(reading.changes.describe())}{tried}"


def _show_reading(result: Detection) -> None:
    line = reading_line(result)
    if line is not None:
        out.print(Text(line, style="yellow"), highlight=False)


def show(result: Detection, num_keys: int = 1) -> None:
    """Verdict, p-values, skips, spans, then the text with scored tokens on green; with
    ``num_keys`` > 1 the spans' and the re-aligned test's p also corrected for the keys."""
    a = result.scores["aaronson"]
    out.print(f"verdict: [{_COLOURS[result.verdict.value]}]{result.verdict.value}[/]")
    log10_p = result.verdict_log10_p_value
    out.print(
        f"p-value: {10.0**log10_p:.3g}   log10 p: {log10_p:.2f} (whole text and spans)   "
        f"scored tokens: {result.num_scored} of {result.num_tokens}",
        highlight=False,
    )
    out.print(
        f"whole text: log10 p {a.log10_p_value:.2f}   Aaronson score: {a.score:.1f}",
        highlight=False,
    )
    _show_reading(result)
    if num_keys == 1:
        _show_power(
            result.verdict.value, result.min_detectable_mean_score, result.reference_mean_score
        )
    if result.realigned is not None:
        # with several keys, corrected for them (the best key's own re-aligned p is selected)
        realigned = min(0.0, result.realigned.log10_p_value + math.log10(num_keys))
        also = f", corrected for {num_keys} keys" if num_keys > 1 else ""
        out.print(
            f"edit-tolerant (re-aligned) test: log10 p {realigned:.2f} "
            f"over {result.realigned.num_scored} positions{also}",
            highlight=False,
        )
    for name, p in result.scores.items():
        if name != "aaronson":
            out.print(
                f"[dim]{name}: log10 p {p.log10_p_value:.2f} ({p.method})[/]", highlight=False
            )
    skipped = ", ".join(f"{k} {v}" for k, v in result.skipped.items() if v)
    if skipped:
        out.print(f"[dim]skipped: {skipped}[/]")
    if result.spans is not None:
        keys = math.log10(num_keys)
        also = f" and {num_keys} keys" if num_keys > 1 else ""
        for span in result.spans.spans:
            corrected = min(0.0, span.corrected_log10_p_value + keys)
            out.print(
                f"span chars {span.start}-{span.end} ({span.num_scored} scored tokens): "
                f"log10 p {span.p_value.log10_p_value:.2f}, corrected for "
                f"{result.spans.windows_scanned} windows{also} {corrected:.2f}",
                highlight=False,
            )
    shown = Text()
    for t in result.tokens:
        if t.status == "scored" and t.score is not None:
            # per-token Aaronson term: mean 1 under H0; brighter = more evidence
            strength = min(t.score / 4.0, 1.0)
            shown.append(t.text, style=f"on rgb(0,{int(60 + 140 * strength)},0)")
        else:
            shown.append(t.text, style="dim")
    out.print(shown)
    out.print("[dim](scored tokens on green, brighter = stronger evidence; dim = skipped)[/]")


def show_model_tests(response: DetectResponse) -> None:
    """One line per test that read the model (the best detailed key's, its p corrected for
    the keys tested): entropy-weighted, likelihood-ratio, edit-filtered."""
    best, keys = response.results[0], response.num_keys
    if best.entropy_weighted is not None:
        test = best.entropy_weighted
        out.print(
            f"entropy-weighted test: log10 p {response.entropy_weighted_log10_p_value:.2f} "
            f"({test.method}), {test.num_weighted} of {test.num_scored} scored positions "
            f"weighted, corrected for {keys} key(s)",
            highlight=False,
        )
    if best.likelihood_ratio is not None:
        ratio = best.likelihood_ratio
        law = "after the prompt" if ratio.conditioned_on_prompt else "without the prompt"
        out.print(
            f"likelihood-ratio test: log10 p {response.likelihood_ratio_log10_p_value:.2f} "
            f"({ratio.method}), {ratio.num_weighted} of {ratio.num_scored} scored positions "
            f"weighted, law {law}, corrected for {keys} key(s)",
            highlight=False,
        )
    if best.edit_filtered is not None:
        kept = best.edit_filtered
        out.print(
            f"edit-filtered test: log10 p {response.edit_filtered_log10_p_value:.2f} "
            f"({kept.method}), {kept.num_weighted} of {kept.num_scored} scored positions kept, "
            f"corrected for {keys} key(s)",
            highlight=False,
        )
