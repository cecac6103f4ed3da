"""How the explorer page copes with many times the test split, in headless Chromium.

``python -m benchmarks.explorer_page --out FILE`` repeats a predictions file's records
``--copies`` times, writes the explorer page and times loading, filtering, searching and
rendering every card inside the page. Details: docs/explorer.md#speed.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import tempfile
import time
import warnings


from trip_jax import score
from trip_jax.data import readers, record_checks
from trip_jax.evaluation import explorer

REPO = pathlib.Path(__file__).resolve().parents[1]
PREDICTIONS = REPO / "results" / "minilm" / "seed22" / "reports" / "test.predictions.jsonl"

# Timed inside the page: a filter change, a search keystroke, then every card rendered.
MEASURE = """() => {
  const time = (f) => { const t = performance.now(); f(); return performance.now() - t; };
  const outcome = document.getElementById('f-outcome');
  const search = document.getElementById('f-search');
  const filter_ms = time(() => { outcome.value = 'verifiable';
                                 outcome.dispatchEvent(new Event('change')); });
  outcome.value = ''; outcome.dispatchEvent(new Event('change'));
  const search_ms = time(() => { search.value = 'radio';
                                 search.dispatchEvent(new Event('input')); });
  search.value = ''; search.dispatchEvent(new Event('input'));
  return {filter_ms, search_ms};
}"""

# Scrolls to the bottom, a frame at a time, until every card is rendered.
SCROLL_TO_END = """async () => {
  const more = document.getElementById('more');
  const t = performance.now();
  while (!more.hidden) {
    window.scrollTo(0, document.body.scrollHeight);
    await new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));
  }
  return performance.now() - t;
}"""


def copies_of(records, pairs, copies):
    """``records`` and ``pairs`` repeated ``copies`` times, the copies' pair ids suffixed."""
    import dataclasses

    out_records, out_pairs = [], []
    for c in range(copies):
        suffix = "" if c == 0 else f"~{c}"
        out_records += [{**r, "pair_id": r["pair_id"] + suffix} for r in records]
        out_pairs += [dataclasses.replace(p, pair_id=p.pair_id + suffix) for p in pairs]
    return out_records, out_pairs


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--predictions", default=str(PREDICTIONS))
    parser.add_argument("--data_dir", default=None, help="TRIP data (default $TRIP_DATA_DIR)")
    parser.add_argument("--copies", type=int, default=10)
    parser.add_argument("--out", default=None, help="JSON file for the results")
    args = parser.parse_args(argv)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", record_checks.TripDataWarning)
        pairs = readers.load_split(readers.default_data_dir(args.data_dir), "test")
    scored = score.score_predictions(pathlib.Path(args.predictions).read_text(), pairs)
    records, all_pairs = copies_of(scored.records, pairs, args.copies)

    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "page.html"
        started = time.perf_counter()
        explorer.write_page(path, "benchmark", records, pairs=all_pairs,
                            metrics=scored.scores, metadata=scored.metadata)
        write_s = time.perf_counter() - started
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=shutil.which("chromium") or "/usr/bin/chromium",
                args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(path.as_uri())
            page.wait_for_selector("article.card")
            first_cards_ms = page.evaluate("performance.now()")
            result = page.evaluate(MEASURE)
            all_cards_ms = page.evaluate(SCROLL_TO_END)
            cards = page.locator("article.card").count()
            browser.close()
        result = {"pairs": len(records), "page_bytes": os.path.getsize(path),
                  "write_s": round(write_s, 2), "first_cards_ms": round(first_cards_ms),
                  "filter_ms": round(result["filter_ms"], 1),
                  "search_ms": round(result["search_ms"], 1),
                  "scroll_to_end_ms": round(all_cards_ms), "cards_rendered": cards,
                  "load_average_1min": round(os.getloadavg()[0], 2), "cpus": os.cpu_count()}
    print(json.dumps(result, indent=2))
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
