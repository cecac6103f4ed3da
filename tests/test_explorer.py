"""The explorer page (trip_jax/evaluation/explorer.py) in a real browser: Debian's Chromium,
driven by Playwright, opens the page of a tiny run's ``--mode=evaluate``, of ``trip_jax.score`` on
a committed run's predictions file and of ``--mode=predict``, and reads back what it shows.

Also: the states that decide verifiability (``explain.deciding_states``), which the cards show,
agree with the metric's verdict and with the data's gold states.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest

from trip_jax.data import input_pipeline, readers, record_checks, schema
from trip_jax.evaluation import ensemble, explorer, predict

REPO = pathlib.Path(__file__).resolve().parents[1]
RUN_REPORTS = REPO / "results" / "minilm" / "seed22" / "reports"
RUN_PREDICTIONS = RUN_REPORTS / "test.predictions.jsonl"
CHROMIUM = "/usr/bin/chromium"

pytestmark = pytest.mark.usefixtures("compilation_cache")


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium (Debian's package) under Playwright."""
    from playwright.sync_api import sync_playwright

    path = shutil.which("chromium") or CHROMIUM
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=path, args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture
def open_page(browser):
    """``open_page(path, fragment="")``: the page loaded from disk; ``errors`` lists every console
    error and uncaught exception after it loaded."""
    pages = []

    def load(path, fragment=""):
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.errors = []
        page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: page.errors.append(str(e)))
        page.goto(pathlib.Path(path).as_uri() + fragment)
        page.wait_for_selector("#count:not(:empty)")
        pages.append(page)
        return page

    yield load
    for page in pages:
        page.close()


def count_of(page) -> tuple[int, int]:
    """(shown, total) from the count line 'N of M pairs shown'."""
    words = page.locator("#count").text_content().split()
    return int(words[0]), int(words[2])


def select(page, name: str, value: str) -> int:
    """Sets filter ``name`` and returns the shown count."""
    page.select_option(f"#f-{name}", value)
    return count_of(page)[0]


def card_view(page, pair_id: str) -> dict:
    """What the card of ``pair_id`` shows: each story's sentences, the gold- and
    predicted-marked sentences (story, index), the state grid's rows and the outcome."""
    card = page.locator(f"article[id='pair-{pair_id}']")
    card.wait_for()
    return card.evaluate("""card => ({
      stories: [...card.querySelectorAll('.story ol')].map(ol =>
        [...ol.children].map(li => li.firstChild.textContent)),
      gold: [...card.querySelectorAll('.story')].flatMap((story, k) =>
        [...story.querySelectorAll('li')].map((li, s) => li.classList.contains('g') ? [k, s] : null)
        .filter(x => x)),
      predicted: [...card.querySelectorAll('.story')].flatMap((story, k) =>
        [...story.querySelectorAll('li')].map((li, s) => li.classList.contains('p') ? [k, s] : null)
        .filter(x => x)),
      states: [...card.querySelectorAll('table.states tr')].slice(1).map(tr =>
        [...[...tr.children].map(td => td.textContent), tr.className]),
      outcome: (card.querySelector('.badge') || {}).textContent,
      target: card.classList.contains('target'),
    })""")


def expected_rows(record) -> list[list[str]]:
    """The grid rows a card should show for a record's ``deciding_states``."""
    marks = {"wrong": "✗ wrong", "right": "✓", "missed": "not predicted (not counted)"}
    rows = []
    for s in record["deciding_states"]:
        mark = explorer.state_mark(s)
        rows.append([s["entity"], s["attribute"], f"{s['side']}, sentence {s['sentence'] + 1}",
                     s["gold_value"], s["predicted_value"], marks[mark], mark])
    return rows


def check_card(page, record, pair):
    """The card of ``record`` shows its pair's sentences, the gold conflict in the gold
    implausible story, the predicted set in the story predicted implausible and its states."""
    view = card_view(page, record["pair_id"])
    assert view["stories"] == [list(s.sentences) for s in pair.stories]
    k, k_pred = 1 - record["label"], 1 - record["predicted_story"]
    assert view["gold"] == [[k, s] for s in record["gold_conflict"]]
    assert view["predicted"] == [[k_pred, s] for s in record["predicted_conflict"]
                                 if s < pair.stories[k_pred].num_sentences]
    assert view["states"] == expected_rows(record)
    assert view["outcome"] == explorer.outcome(record)
    return view


def matching_search(cards, words):
    """The cards a search for ``words`` should show (every word in the id, sentences or
    explanation, case-insensitive)."""
    def text(c):
        return " ".join([c["id"], *(s for story in c["s"] for s in story), c.get("ex", "")]).lower()
    return [c for c in cards if all(w in text(c) for w in words)]


# ------------------------------------------------------------------------------------------
# --mode=evaluate on the tiny run.

@pytest.fixture(scope="module")
def evaluated(trained_workdir, tiny_config):
    """The tiny run's selected checkpoint scored on test: (result, records, pairs)."""
    config = tiny_config()
    result = ensemble.evaluate_members(config, trained_workdir, "selected", "test")
    records = [json.loads(line) for line in
               result["paths"]["predictions"].read_text().splitlines()]
    splits = input_pipeline.load_splits(config.data)
    pairs = {p.pair_id: p for p in input_pipeline.split_pairs(splits, "test")}
    return result, records, pairs


def test_evaluate_writes_the_page_beside_the_reports(evaluated, trained_workdir):
    result, records, _ = evaluated
    page = result["paths"]["explorer"]
    assert page.name == f"test.selected-{result['members'][0]['checkpoint_step']}.html"
    assert page.parent == trained_workdir / "eval"
    html = page.read_text()
    # Self-contained: both plots inline, nothing fetched.
    assert html.count("data:image/png;base64,") == 2
    assert "http://" not in html and "https://" not in html and "<link" not in html
    # Training's final test reports have their page too.
    assert (trained_workdir / "reports" / "test.html").is_file()


def test_deciding_states_agree_with_the_metric_and_the_data(evaluated):
    _, records, pairs = evaluated
    default = schema.default_values_array()
    for record in records:
        states = record["deciding_states"]
        if len(record["gold_conflict"]) != 2:
            assert states == [] and not record["states_correct"]
            continue
        counted = [s for s in states if s["counted"]]
        assert record["states_correct"] == (bool(counted) and not any(s["wrong"] for s in states))
        story = pairs[record["pair_id"]].stories[1 - record["label"]]
        i, j = record["gold_conflict"]
        for s in states:
            e = story.entities.index(s["entity"])
            x, at = (1, i) if s["side"] == "effect" else (0, j)
            assert s["sentence"] == at
            assert s["gold"] == story.states[e, at, x, schema.ATTRIBUTE_INDEX[s["attribute"]]]
        # Every nontrivial gold state there is listed.
        for side, x, at in (("effect", 1, i), ("precondition", 0, j)):
            gold = {(story.entities[e], schema.ATTRIBUTES[a])
                    for e in range(story.num_entities)
                    for a in np.flatnonzero((story.states[e, at, x] != 0)
                                            & (story.states[e, at, x] != default))}
            assert gold <= {(s["entity"], s["attribute"]) for s in states if s["side"] == side}


def test_evaluate_page_in_a_browser(evaluated, open_page):
    result, records, pairs = evaluated
    page = open_page(result["paths"]["explorer"])
    assert count_of(page) == (len(records), len(records))
    assert page.locator("article.card").count() == len(records)
    # Outcome and failure-mode filters show the expected cards.
    for name in explorer.OUTCOMES:
        expected = sum(explorer.outcome(r) == name for r in records)
        assert select(page, "outcome", name) == expected == page.locator("article.card").count()
    select(page, "outcome", "")
    for x, mode in enumerate(explorer.FAILURE_MODES):
        expected = sum((r["correct"], r["conflict_correct"], r["states_correct"]) == mode
                       for r in records)
        assert select(page, "mode", str(x)) == expected
    select(page, "mode", "")
    # Every card shows its pair's sentences, conflicts and states.
    for record in records:
        check_card(page, record, pairs[record["pair_id"]])
    # The attribute filter: pairs whose grid has a state of it.
    attribute = next(s["attribute"] for r in records for s in r["deciding_states"])
    expected = sum(any(s["attribute"] == attribute for s in r["deciding_states"])
                   for r in records)
    assert select(page, "attribute", attribute) == expected
    assert page.errors == []


# ------------------------------------------------------------------------------------------
# trip_jax.score on a committed run's predictions file (351 test pairs).

@pytest.fixture(scope="module")
def scored(tmp_path_factory, data_dir):
    """``python -m trip_jax.score`` on the committed run's predictions: (out dir, records,
    pairs, report)."""
    out = tmp_path_factory.mktemp("scored")
    result = subprocess.run([sys.executable, "-m", "trip_jax.score",
                             f"--predictions={RUN_PREDICTIONS}", f"--out={out}",
                             f"--data_dir={data_dir}"], cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (out / "test.predictions.jsonl").read_text()
               .splitlines()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", record_checks.TripDataWarning)
        pairs = {p.pair_id: p for p in readers.load_split(data_dir, "test")}
    return out, records, pairs, json.loads((out / "test.json").read_text())


def test_score_page_in_a_browser(scored, open_page):
    out, records, pairs, report = scored
    page = open_page(out / "test.html")
    assert count_of(page) == (351, 351)
    # Cards are rendered lazily: a first chunk, more on scrolling.
    assert 0 < page.locator("article.card").count() < 351
    # Filters agree with the report.
    metrics = report["metrics"]
    assert select(page, "outcome", "verifiable") == round(metrics["verifiability"] * 351)
    assert select(page, "outcome", "wrong story") == round((1 - metrics["accuracy"]) * 351)
    select(page, "outcome", "")
    halves = report["by_marker"]
    assert select(page, "marker", "curated") == halves["curated"]["num_pairs"]
    assert select(page, "marker", "implicit") == halves["implicit"]["num_pairs"]
    select(page, "marker", "")
    # Wrong states only: the pairs with a wrong nontrivial state at the gold conflict.
    page.check("#f-wrong")
    assert count_of(page)[0] == sum(any(s["wrong"] for s in r["deciding_states"])
                                    for r in records)
    attribute = "location"
    select(page, "attribute", attribute)
    assert count_of(page)[0] == sum(any(s["wrong"] and s["attribute"] == attribute
                                        for s in r["deciding_states"]) for r in records) > 0
    select(page, "attribute", "")
    page.uncheck("#f-wrong")
    # Text search over the sentences.
    cards = explorer.pair_cards(records, list(pairs.values()))
    page.fill("#f-search", "radio Tom")
    assert count_of(page)[0] == len(matching_search(cards, ["radio", "tom"])) > 0
    page.fill("#f-search", "")
    assert count_of(page) == (351, 351)
    # A card with a wrong state shows it marked.
    wrong = next(r for r in records if r["consistent"] and not r["verifiable"]
                 and any(s["wrong"] for s in r["deciding_states"]))
    linked = open_page(out / "test.html", f"#pair-{wrong['pair_id']}")
    view = check_card(linked, wrong, pairs[wrong["pair_id"]])
    assert any(row[-1] == "wrong" for row in view["states"])
    assert page.errors == [] and linked.errors == []


def test_a_link_opens_a_card_beyond_the_first_chunk_and_past_the_filters(scored, open_page):
    out, records, pairs, _ = scored
    record = records[300]
    page = open_page(out / "test.html", f"#pair-{record['pair_id']}")
    view = check_card(page, record, pairs[record["pair_id"]])
    assert view["target"]
    # Following a link while a filter hides the pair clears the filters.
    other = next(r for r in records[200:] if not r["correct"])
    select(page, "outcome", "verifiable")
    page.evaluate(f"location.hash = '#pair-{other['pair_id']}'")
    assert card_view(page, other["pair_id"])["target"]
    assert count_of(page) == (351, 351)
    assert page.errors == []


# ------------------------------------------------------------------------------------------
# --mode=predict: predictions only.

def test_predict_page_shows_the_predictions(trained_workdir, tiny_config, tmp_path, open_page):
    lines = [{"id": "phone", "stories": [
        ["Tom charged the phone.", "Tom went to work.", "Tom called Ann with the phone."],
        ["Tom charged the phone.", "Tom dropped the phone in the lake.",
         "Tom called Ann with the phone."]], "entities": [["phone", "Tom"], ["phone", "Tom"]]},
        "not json"]
    source = tmp_path / "stories.jsonl"
    source.write_text("".join((json.dumps(x) if isinstance(x, dict) else x) + "\n"
                              for x in lines))
    result = predict.predict_file(tiny_config(), str(trained_workdir), str(source),
                                  str(tmp_path / "answers.jsonl"))
    (answer,) = result["answers"]
    page = open_page(tmp_path / "answers.html")
    assert count_of(page) == (2, 2)
    assert page.locator("#f-outcome").count() == 0  # no gold, no outcome filter
    view = card_view(page, "phone")
    assert view["stories"] == [list(s) for s in answer["stories"]]
    k = answer["implausible_story"]
    assert view["gold"] == []
    assert view["predicted"] == [[k, answer["conflict"]["evidence"]],
                                 [k, answer["conflict"]["breakpoint"]]]
    assert view["states"] == [[s["entity"], s["attribute"],
                               f"{s['side']}, sentence {s['sentence'] + 1}", s["value"], ""]
                              for s in answer["states"]]
    assert "not valid JSON" in page.locator("article[id='pair-line-2']").text_content()
    assert page.errors == []
