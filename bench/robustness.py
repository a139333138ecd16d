"""The robustness card: TPR at 1 % and 0.1 % FPR under each attack, by text length.

Texts (``bench.robustness_generations``, cached): ``ANSWERS`` watermarked SmolLM2-135M-Instruct
answers (256 new tokens, bench key), each cut to its first n tokens, n in ``LENGTHS`` (answers
that reach n), decoded, then attacked (``bench.attacks``; fixed seeds); the emoji-attack
answers; the shipped model's paraphrases. Every text goes through ``detector.detect`` as text
(never token ids), so whatever the detector does to a submitted text applies.

Glossary:
- p: the verdict's p-value (``Detection.verdict_log10_p_value``: the whole text and its best
  window in one test). The detector's p is valid, so flagging at p < α has FPR <= α, and the
  TPR at FPR α is the fraction of attacked answers with p < α, for α in ``ALPHAS``.
- H0 trials: the same attack applied to human text (the 227 passages of
  ``data/human-pydoc.jsonl``, cut to n tokens) and tested under ``H0_KEYS`` bench keys other
  than the generations' key; for model-made rows (paraphrase, emoji) the attacked texts
  themselves under ``H0_KEYS_MODEL`` other keys (a text not made with key k is H0 for k). The
  measured FPR is the fraction of trials with p < α, with its one-sided 95 % Clopper–Pearson
  upper bound; trials on one text under different keys are not independent of each other's
  text, so N counts texts × keys.
- dilution 1:r: the answer at a uniform token offset inside r times its length of human text
  (``bench.attacks.dilute``), with the span search on; ``span`` is the fraction whose
  strongest span is significant at α and lies at least half inside the answer.
- before: the same card from a detector without the canonical reading
  (``bench/results/robustness_before.json``, its commit inside), shown beside this one.

Per key, the H0 p-values of a text come from ``detect_multi`` over every key at once, one
reading at a time, as ``detect`` combines them (``_key_log10_p``); ``CHECKED`` texts of each
cell are checked against ``detect`` itself, so the shortcut cannot drift from it.

Writes ``bench/results/robustness.{json,md,png}`` (``--out`` another JSON; the md and png
beside it). Run from the repository root (``--quick``: few texts and keys, for debugging)::

    python -m bench.robustness [--quick] [--out bench/results/robustness.json]
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from bench import attacks
from bench import robustness_generations as generations
from bench.common import RESULTS
from bench.detector_common import DATA, bench_source, data_home, run_metadata
from detector import Detection, DetectOptions, detect, detect_multi
from keyed import KeyedSource, warm_up

OUT_JSON = RESULTS / "robustness.json"
BEFORE_JSON = RESULTS / "robustness_before.json"
LENGTHS = (32, 64, 128, 256)
ALPHAS = (0.01, 0.001)
H0_KEYS = 100
H0_KEYS_MODEL = 100
COPIES = 3
DILUTIONS = (4, 15, 50)
DILUTION_H0_TEXTS = 45
CHECKED = 3
SEED = 20261206
EDIT_RATES = (0.1, 0.2, 0.3)
WORD_RATE = 0.1
TYPO_RATE = 0.1
LN10 = math.log(10.0)

Apply = Callable[[Sequence[int], str, np.random.Generator], str]


@dataclass(frozen=True)
class Attack:
    """One row of the card: a rewrite of a text (its ids and decoded text, a seeded rng).

    Attributes:
        name: the JSON key. label: the table's words. group: ``"edits"``, ``"characters"``
            or ``"reference"``. random: whether copies differ (``COPIES`` per answer).
        apply: (ids, text, rng) -> the attacked text.
    """

    name: str
    label: str
    group: str
    random: bool
    apply: Apply = field(repr=False)


def text_attacks(tok: Any, pool: np.ndarray, vocabulary: Sequence[str]) -> list[Attack]:
    """Every attack applied to answers and human text alike (``bench.attacks``)."""

    def on_text(rewrite: Callable[[str, np.random.Generator], str]) -> Apply:
        return lambda ids, text, rng: rewrite(text, rng)

    def edits(rate: float) -> Apply:
        return lambda ids, text, rng: tok.decode(attacks.token_edits(ids, rate, pool, rng))

    a = attacks
    rows = [
        Attack("clean", "clean", "reference", False, lambda ids, text, rng: text),
        *(
            Attack(f"token_edits_{round(100 * r)}", f"random token edits {round(100 * r)} %",
                   "edits", True, edits(r))
            for r in EDIT_RATES
        ),
        Attack("typos", f"typos in {round(100 * TYPO_RATE)} % of words (swap, drop)", "edits",
               True, on_text(lambda t, g: a.typos(t, TYPO_RATE, g))),
        Attack("word_deletions", f"word deletions {round(100 * WORD_RATE)} %", "edits", True,
               on_text(lambda t, g: a.delete_words(t, WORD_RATE, g))),
        Attack("word_insertions", f"word insertions {round(100 * WORD_RATE)} %", "edits", True,
               on_text(lambda t, g: a.insert_words(t, WORD_RATE, vocabulary, g))),
        Attack("zero_width_space", "U+200B after every space", "characters", False,
               on_text(lambda t, g: a.after_spaces(t, (a.ZERO_WIDTH_SPACE,), g))),
        Attack("zero_width_other", "U+200C/200D/2060/FEFF after every space", "characters",
               True, on_text(lambda t, g: a.after_spaces(t, a.ZERO_WIDTH_OTHERS, g))),
        Attack("soft_hyphens", "soft hyphen inside every word", "characters", True,
               on_text(a.soft_hyphens)),
        Attack("direction_marks", "direction marks after every space", "characters", True,
               on_text(lambda t, g: a.after_spaces(t, a.DIRECTION_MARKS, g))),
        Attack("variation_selectors", "variation selector inside every word", "characters",
               True, on_text(a.variation_selectors)),
        Attack("tag_characters", "tag character after every space", "characters", True,
               on_text(lambda t, g: a.after_spaces(t, a.TAG_CHARACTERS, g))),
        Attack("no_break_spaces", "U+00A0 for every space", "characters", False,
               on_text(lambda t, g: a.replace_spaces(t, (a.NO_BREAK_SPACE,), g))),
        Attack("other_spaces", "other Unicode spaces (Zs) for spaces", "characters", True,
               on_text(lambda t, g: a.replace_spaces(t, a.OTHER_SPACES, g))),
        Attack("doubled_spaces", "every space doubled", "characters", False,
               on_text(lambda t, g: a.double_spaces(t))),
        Attack("fullwidth_punctuation", "fullwidth punctuation", "characters", False,
               on_text(lambda t, g: a.fullwidth_punctuation(t))),
        Attack("fullwidth_letters", "fullwidth letters and digits", "characters", False,
               on_text(lambda t, g: a.fullwidth_letters(t))),
        Attack("cyrillic_homoglyphs", "Cyrillic homoglyphs for Latin letters", "characters",
               False, on_text(lambda t, g: a.homoglyphs(t, a.CYRILLIC))),
        Attack("greek_homoglyphs", "Greek homoglyphs for Latin letters", "characters", False,
               on_text(lambda t, g: a.homoglyphs(t, a.GREEK))),
        Attack("lowercase", "lower-cased (reference)", "reference", False,
               on_text(lambda t, g: a.lowercase(t))),
    ]  # fmt: skip
    return rows


def rng_for(*parts: int) -> np.random.Generator:
    """The attack's generator for one (attack, length, text, copy): order-independent."""
    return np.random.default_rng([SEED, *parts])


def clopper_pearson_upper(k: int, n: int, confidence: float = 0.95) -> float:
    """One-sided upper confidence bound on a binomial rate after k successes in n trials."""
    if n == 0:
        return 1.0
    if k >= n:
        return 1.0
    return float(stats.beta.ppf(confidence, k + 1, n - k))


def _key_log10_p(tok: Any, sources: dict[str, KeyedSource], text: str) -> np.ndarray:
    """(K,) float64: log10 of ``detect``'s verdict p for ``text`` under each key.

    ``detect`` tests each reading of the text (``detector.readings``) and multiplies the
    smallest p by R, the readings tried; ``detect_multi`` on one reading gives every key's own
    uncorrected p on it (``verdict_log_p_values``). A detector without readings reads the text
    once.
    """
    read_input = getattr(importlib.import_module("detector.detect"), "read_input", None)
    if read_input is None:
        found = detect_multi(tok, sources, text=text, detailed=1)
        assert found.verdict_log_p_values is not None
        return np.asarray(found.verdict_log_p_values) / LN10
    read = read_input(tok, text, None)
    per_reading = []
    for reading in read:
        found = detect_multi(tok, sources, read=(reading,), detailed=1)
        assert found.verdict_log_p_values is not None
        per_reading.append(np.asarray(found.verdict_log_p_values))
    log_p = np.minimum(np.min(per_reading, axis=0) + math.log(len(read)), 0.0)
    return np.asarray(log_p / LN10, dtype=np.float64)


def h0_log10_p(tok: Any, sources: dict[str, KeyedSource], text: str, check: bool) -> np.ndarray:
    """``_key_log10_p``, checked against ``detect`` on the first key when ``check``."""
    values = _key_log10_p(tok, sources, text)
    if check:
        first = next(iter(sources.values()))
        expected = detect(tok, first, text=text).verdict_log10_p_value
        if not math.isclose(values[0], expected, rel_tol=1e-9, abs_tol=1e-9):
            raise AssertionError(f"H0 shortcut {values[0]} != detect's {expected}")
    return values


def reading_of(found: Detection) -> str:
    """The reading that carried the evidence (``"raw"`` for a detector without readings)."""
    report = getattr(found, "reading", None)
    return "raw" if report is None else str(report.name)


def tpr_cell(log10_p: Sequence[float], readings: Sequence[str] = ()) -> dict[str, Any]:
    """TPR at each α of the answers' verdict p-values, their count and median log10 p."""
    values = np.asarray(log10_p, dtype=np.float64)
    cell: dict[str, Any] = {"n": int(values.size)}
    for alpha in ALPHAS:
        cell[f"tpr@{alpha}"] = float(np.mean(values < math.log10(alpha))) if values.size else None
    cell["median_log10_p"] = float(np.median(values)) if values.size else None
    if readings:
        cell["canonical_reading"] = float(np.mean([r == "canonical" for r in readings]))
    return cell


def fpr_cell(log10_p: np.ndarray) -> dict[str, Any]:
    """False positives at each α among H0 trials, with the 95 % Clopper–Pearson bound."""
    values = np.asarray(log10_p, dtype=np.float64).ravel()
    cell: dict[str, Any] = {"n": int(values.size)}
    for alpha in ALPHAS:
        k = int(np.sum(values < math.log10(alpha)))
        cell[f"fp@{alpha}"] = k
        cell[f"fpr@{alpha}"] = k / values.size if values.size else None
        cell[f"bound95@{alpha}"] = clopper_pearson_upper(k, int(values.size))
    return cell


@dataclass(frozen=True)
class Inputs:
    """What every row reads: tokenizer, the generations' key, H0 keys, answers, emoji
    answers, paraphrases, human passages' ids, the token pool and word vocabulary."""

    tok: Any
    source: KeyedSource
    h0_sources: dict[str, KeyedSource]
    h0_sources_model: dict[str, KeyedSource]
    answers: list[dict[str, Any]]
    emoji: list[dict[str, Any]]
    paraphrases: list[dict[str, Any]]
    human: list[list[int]]
    pool: np.ndarray
    vocabulary: list[str]


def attack_rows(inputs: Inputs, rows: Sequence[Attack], lengths: Sequence[int]) -> dict[str, Any]:
    """TPR and H0 FPR of every text attack at every length."""
    tok, out = inputs.tok, {}
    for a_index, attack in enumerate(rows):
        cells: dict[str, Any] = {}
        for n in lengths:
            start = time.perf_counter()
            p, reads = [], []
            for i, answer in enumerate(inputs.answers):
                ids = answer["token_ids"][:n]
                if len(ids) < n:
                    continue
                text = tok.decode(ids)
                for copy in range(COPIES if attack.random else 1):
                    attacked = attack.apply(ids, text, rng_for(a_index, n, i, copy))
                    found = detect(tok, inputs.source, text=attacked)
                    p.append(found.verdict_log10_p_value)
                    reads.append(reading_of(found))
            h0 = []
            texts = [h[:n] for h in inputs.human if len(h) >= n]
            for j, ids in enumerate(texts):
                attacked = attack.apply(ids, tok.decode(ids), rng_for(a_index, n, 10_000 + j))
                h0.append(h0_log10_p(tok, inputs.h0_sources, attacked, j < CHECKED))
            cells[str(n)] = {
                **tpr_cell(p, reads),
                "h0": {**fpr_cell(np.asarray(h0)), "texts": len(texts)},
                "seconds": round(time.perf_counter() - start, 1),
            }
            print(f"{attack.name} n={n}: {_brief(cells[str(n)])}", flush=True)
        out[attack.name] = {"label": attack.label, "group": attack.group, "cells": cells}
    return out


def _brief(cell: dict[str, Any]) -> str:
    tpr = cell.get("tpr@0.01")
    h0 = cell.get("h0", {})
    shown = "-" if tpr is None else f"{tpr:.2f}"
    fp = f"{h0.get('fp@0.01')}/{h0.get('n')}"
    return f"TPR@1% {shown} (n={cell['n']}), H0 {fp} ({cell.get('seconds')} s)"


def dilution_rows(inputs: Inputs, lengths: Sequence[int]) -> dict[str, Any]:
    """The answer inside human text at 1:r: verdict TPR, span found, H0 on the filler alone."""
    tok, out = inputs.tok, {}
    options = DetectOptions(spans=True)
    for ratio in DILUTIONS:
        cells: dict[str, Any] = {}
        for n in lengths:
            start = time.perf_counter()
            p, hits = [], []
            for i, answer in enumerate(inputs.answers):
                ids = answer["token_ids"][:n]
                if len(ids) < n:
                    continue
                rng = rng_for(1000 + ratio, n, i)
                filler = _filler(inputs.human, ratio * n, rng)
                text, lo, hi = attacks.dilute(ids, filler, ratio, tok.decode, rng)
                found = detect(tok, inputs.source, text=text, options=options)
                p.append(found.verdict_log10_p_value)
                hits.append(_span_hits(found, lo, hi))
            h0 = []
            for j in range(DILUTION_H0_TEXTS):
                need = (ratio + 1) * n
                filler = _filler(inputs.human, need, rng_for(2000 + ratio, n, j))[:need]
                check = j < CHECKED
                h0.append(h0_log10_p(tok, inputs.h0_sources_model, tok.decode(filler), check))
            cell = tpr_cell(p)
            for alpha in ALPHAS:
                cell[f"span@{alpha}"] = float(np.mean([h[alpha] for h in hits])) if hits else None
            cells[str(n)] = {
                **cell,
                "h0": {**fpr_cell(np.asarray(h0)), "texts": DILUTION_H0_TEXTS},
                "seconds": round(time.perf_counter() - start, 1),
            }
            print(f"dilution 1:{ratio} n={n}: {_brief(cells[str(n)])}", flush=True)
        out[f"dilution_{ratio}"] = {
            "label": f"copy-paste dilution 1:{ratio}",
            "group": "dilution",
            "cells": cells,
        }
    return out


def _filler(human: list[list[int]], need: int, rng: np.random.Generator) -> list[int]:
    """At least ``need`` ids of human passages in a seeded order (passes over them all again
    if one is not enough), separated by a blank line (ids 198, 198: "\n\n")."""
    filler: list[int] = []
    while len(filler) < need:
        for i in rng.permutation(len(human)).tolist():
            filler += [*human[i], 198, 198]
    return filler


def _span_hits(found: Detection, lo: int, hi: int) -> dict[float, bool]:
    """Per α: the strongest span is significant and at least half of it is in [lo, hi)."""
    spans = found.spans.spans if found.spans is not None else ()
    if not spans:
        return dict.fromkeys(ALPHAS, False)
    best = spans[0]
    inside = max(0, min(best.end, hi) - max(best.start, lo)) / max(best.end - best.start, 1)
    return {a: best.corrected_log10_p_value < math.log10(a) and inside >= 0.5 for a in ALPHAS}


def model_rows(inputs: Inputs, lengths: Sequence[int]) -> dict[str, Any]:
    """The paraphrase and emoji-attack rows; H0: the attacked texts under other keys."""
    tok, out = inputs.tok, {}
    para: dict[str, Any] = {}
    for n in lengths:
        texts = [r["text"] for r in inputs.paraphrases if r["source_tokens"] == n]
        if texts:
            para[str(n)] = _model_cell(inputs, texts)
            print(f"paraphrase n={n}: {_brief(para[str(n)])}", flush=True)
    out["paraphrase_shipped"] = {
        "label": "paraphrase (shipped model, no key)",
        "group": "model",
        "cells": para,
        "mean_tokens": {
            n: float(np.mean([len(r["token_ids"]) for r in inputs.paraphrases
                              if str(r["source_tokens"]) == n]))
            for n in para
        },
    }  # fmt: skip
    kept: dict[str, Any] = {}
    stripped: dict[str, Any] = {}
    for n in lengths:
        cut = [tok.decode(r["token_ids"][:n]) for r in inputs.emoji if len(r["token_ids"]) >= n]
        if not cut:
            continue
        kept[str(n)] = _model_cell(inputs, cut, h0=False)
        stripped[str(n)] = _model_cell(inputs, [attacks.strip_emoji(t) for t in cut])
        print(f"emoji n={n}: kept {_brief(kept[str(n)])}; deleted {_brief(stripped[str(n)])}")
    compliance = [attacks.emoji_per_word(r["text"]) for r in inputs.emoji] or [0.0]
    out["emoji_kept"] = {
        "label": "emoji-attack answer, emojis kept",
        "group": "model",
        "cells": kept,
        "emoji_per_word_gap": {
            "mean": float(np.mean(compliance)),
            "median": float(np.median(compliance)),
            "answers_at_least_half": float(np.mean([c >= 0.5 for c in compliance])),
        },
    }
    out["emoji_deleted"] = {
        "label": "emoji attack (emojis deleted)",
        "group": "model",
        "cells": stripped,
    }
    return out


def _model_cell(inputs: Inputs, texts: Sequence[str], h0: bool = True) -> dict[str, Any]:
    start = time.perf_counter()
    found = [detect(inputs.tok, inputs.source, text=t) for t in texts]
    cell = tpr_cell([f.verdict_log10_p_value for f in found], [reading_of(f) for f in found])
    cell["mean_scored"] = float(np.mean([f.num_scored for f in found]))
    if h0:
        values = [
            h0_log10_p(inputs.tok, inputs.h0_sources_model, t, j < CHECKED)
            for j, t in enumerate(texts)
        ]
        cell["h0"] = {**fpr_cell(np.asarray(values)), "texts": len(texts)}
    cell["seconds"] = round(time.perf_counter() - start, 1)
    return cell


def load_inputs(quick: bool) -> Inputs:
    """Tokenizer, keys, the cached generations (made where missing) and the human text."""
    from sampler.models import DEFAULT_MODEL, load_tokenizer

    warm_up()  # the compiled PRF kernels from the first call (the same bits as NumPy)
    tok = load_tokenizer(DEFAULT_MODEL, data_home())
    rows = generations.ensure(tok)
    with (DATA / "human-pydoc.jsonl").open(encoding="utf-8") as f:
        passages = [json.loads(line)["text"] for line in f]
    human = [list(tok(t, add_special_tokens=False)["input_ids"]) for t in passages]
    keys, keys_model = (4, 8) if quick else (H0_KEYS, H0_KEYS_MODEL)
    answers = [r for r in rows if r["kind"] == "answer"]
    emoji = [r for r in rows if r["kind"] == "emoji"]
    paraphrases = [r for r in rows if r["kind"] == "paraphrase"]
    if quick:
        answers, emoji, human = answers[:6], emoji[:4], human[:30]
        kept = {a["prompt_id"] for a in answers}
        paraphrases = [p for p in paraphrases if p["prompt_id"] in kept]
    return Inputs(
        tok=tok,
        source=bench_source(),
        h0_sources={f"h0-{k}": bench_source(f"robustness-h0-{k}") for k in range(keys)},
        h0_sources_model={
            f"h0m-{k}": bench_source(f"robustness-h0m-{k}") for k in range(keys_model)
        },
        answers=answers,
        emoji=emoji,
        paraphrases=paraphrases,
        human=human,
        pool=np.concatenate([np.asarray(h, dtype=np.int64) for h in human]),
        vocabulary=sorted({w for t in passages for w in t.split() if w.isalpha()}),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few texts and keys (debugging)")
    parser.add_argument("--out", type=Path, default=OUT_JSON)
    parser.add_argument("--only", nargs="*", default=None, help="attack names (debugging)")
    parser.add_argument(
        "--detector-commit",
        default=None,
        help="the commit of the detector imported, when it is not this checkout's (a before run)",
    )
    args = parser.parse_args()
    start = time.perf_counter()
    meta = run_metadata()  # the commit whose detector this process imports, taken now
    inputs = load_inputs(args.quick)
    rows = text_attacks(inputs.tok, inputs.pool, inputs.vocabulary)
    if args.only:
        rows = [r for r in rows if r.name in args.only]
    results: dict[str, Any] = {}
    results |= attack_rows(inputs, rows, LENGTHS)
    if not args.only:
        results |= dilution_rows(inputs, LENGTHS)
        results |= model_rows(inputs, LENGTHS)
    import detector

    if run_metadata()["commit"] != meta["commit"]:
        meta["commit_at_end"] = run_metadata()["commit"]  # the tree moved during the run
    out: dict[str, Any] = {
        **meta,
        "command": " ".join(["python -m bench.robustness", *sys.argv[1:]]),
        "detector": {
            "commit": args.detector_commit or meta["commit"],
            "file": str(Path(detector.__file__).parent),
            "canonical_reading": _has_readings(),
        },
        "machine_load": "2 CPU cores shared with other work",
        "setup": {
            "lengths": list(LENGTHS),
            "alphas": list(ALPHAS),
            "answers": len(inputs.answers),
            "emoji_answers": len(inputs.emoji),
            "paraphrases": len(inputs.paraphrases),
            "human_passages": len(inputs.human),
            "h0_keys": len(inputs.h0_sources),
            "h0_keys_model_rows": len(inputs.h0_sources_model),
            "copies_of_random_attacks": COPIES,
            "seed": SEED,
            "generations": str(generations.CACHE.relative_to(RESULTS.parents[1])),
            "generation": {
                "method": "basic-uwm",
                "temperature": 1.0,
                "top_k": 50,
                "max_new_tokens": generations.MAX_NEW_TOKENS,
                "paraphrase_method": "ar",
                "paraphrase_temperature": generations.PARAPHRASE_TEMPERATURE,
                "paraphrase_instruction": generations.PARAPHRASE_INSTRUCTION,
                "emoji_instruction": generations.EMOJI_INSTRUCTION,
            },
        },
        "rows": results,
        "seconds": round(time.perf_counter() - start, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    from bench.robustness_report import BEFORE_JSON, write_report

    if args.out.resolve() != BEFORE_JSON.resolve():  # the before run is shown in the card's
        write_report(args.out)
    print(f"wrote {args.out} in {out['seconds']} s")


def _has_readings() -> bool:
    return hasattr(importlib.import_module("detector.detect"), "read_input")


if __name__ == "__main__":
    main()
