"""Tests of scoring another system's predictions (trip_jax/score.py, scoring/prediction_formats.py):
the three formats on hand-made pairs, their agreement, every kind of bad input, the authors'
three-pair sample, and a committed run's predictions file reproducing the run's figures."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
import sys
import warnings

import numpy as np
import pytest

from trip_jax import score
from trip_jax.data import schema
from trip_jax.evaluation import metrics
from trip_jax.scoring import prediction_formats as formats
from trip_jax.scoring import prediction_matching as matching
from trip_jax.data import readers, record_checks

REPO = pathlib.Path(__file__).resolve().parents[1]
# The README's headline runs (configs/minilm.py, seeds 22-26), each with its per-pair answers.
HEADLINE_RUNS = sorted((REPO / "results" / "minilm").glob("seed*"))
AUTHORS_SAMPLE = "authors_predictions.sample.json"


@pytest.fixture(scope="module")
def test_pairs(data_dir):
    """The test split of the shared data (351 pairs)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", record_checks.TripDataWarning)
        return readers.load_split(data_dir, "test")


def _gold_states(pair, k, sentences=None):
    """Story k's nontrivial gold effects at i and preconditions at j (or at ``sentences``)."""
    story = pair.stories[k]
    i, j = sentences or story.conflict
    default = schema.default_values_array()
    out = []
    for side, s, x in (("effect", i, 1), ("precondition", j, 0)):
        for e, entity in enumerate(story.entities):
            for a in np.flatnonzero((story.states[e, s, x] != 0)
                                    & (story.states[e, s, x] != default)):
                out.append((entity, s, side, schema.ATTRIBUTES[a], int(story.states[e, s, x, a])))
    return out


def _wrong_label(attribute, label):
    """Another nontrivial label of ``attribute``."""
    default = schema.DEFAULT_VALUES[schema.ATTRIBUTE_INDEX[attribute]]
    n = len(schema.label_names(attribute))
    return next(x for x in range(1, n) if x not in (label, default))


@pytest.fixture(scope="module")
def cases(test_pairs):
    """Five hand-made predictions on test pairs whose gold conflict has nontrivial states:
    perfect, wrong story, wrong pair, wrong state, extra states. Each is (pair, story_pred,
    conflict, states of the story predicted implausible, expected outcome)."""
    usable = [p for p in test_pairs if p.implausible.conflict and _gold_states(p, 1 - p.label)
              and p.implausible.conflict[0] > 0]
    perfect, wrong_story, wrong_pair, wrong_state, extra = usable[:5]

    def states(pair):
        return _gold_states(pair, 1 - pair.label)

    i, j = wrong_pair.implausible.conflict
    bad = list(states(wrong_state))
    entity, s, side, attribute, label = bad[0]
    bad[0] = (entity, s, side, attribute, _wrong_label(attribute, label))
    story = extra.implausible
    others = [s for s in range(story.num_sentences) if s not in story.conflict]
    stated = {(e, s, side, a) for e, s, side, a, _ in states(extra)}
    default_true = next(a for a in ("exist", "functional", "moveable", "conscious")
                        if (story.entities[0], story.conflict[0], "effect", a) not in stated)
    # Wrong states away from the conflict and a default value at it: neither counts.
    extra_states = states(extra) + [
        (story.entities[0], others[0], "effect", "power", 1),
        (story.entities[0], others[-1], "precondition", "open", 2),
        (story.entities[0], story.conflict[0], "effect", default_true, 2)]
    return [
        (perfect, perfect.label, perfect.implausible.conflict, states(perfect), "verifiable"),
        (wrong_story, 1 - wrong_story.label, wrong_story.implausible.conflict, [], "wrong"),
        (wrong_pair, wrong_pair.label, (i - 1, j), states(wrong_pair), "correct"),
        (wrong_state, wrong_state.label, wrong_state.implausible.conflict, bad, "consistent"),
        (extra, extra.label, extra.implausible.conflict, extra_states, "verifiable"),
    ]


def _minimal(cases, array_states=True):
    lines = []
    for pair, story_pred, conflict, states, _ in cases:
        entries = [[e, s, side, a, schema.label_name(a, v)] if array_states else
                   {"entity": e, "sentence": s, "side": side, "attribute": a, "value": v}
                   for e, s, side, a, v in states]
        lines.append({"pair_id": matching.canonical_id(pair.pair_id), "plausible_story": story_pred,
                      "conflict": list(conflict), "states": entries})
    return "\n".join(json.dumps(line) for line in lines) + "\n"


def _authors_states(states, side):
    out = {}
    for e, s, sd, a, v in states:
        if sd == side:
            out.setdefault(e, {}).setdefault(str(s), {})[a] = v
    return out


def _authors(cases, valid=None):
    elements = []
    for x, (pair, story_pred, conflict, states, expected) in enumerate(cases):
        k = 1 - pair.label
        gold = matching.nontrivial_gold(pair, k)
        gold_states = [(e, s, side, a, v) for (side, e, s, a), v in gold.items()]
        elements.append({
            "example_id": matching.canonical_id(pair.pair_id),
            "story0": "\n".join(pair.stories[0].sentences),
            "story1": "\n".join(pair.stories[1].sentences),
            "story_label": pair.label, "story_pred": story_pred,
            "conflict_label": list(pair.implausible.conflict), "conflict_pred": list(conflict),
            "preconditions_label": _authors_states(gold_states, "precondition"),
            "effects_label": _authors_states(gold_states, "effect"),
            "preconditions_pred": _authors_states(states, "precondition"),
            "effects_pred": _authors_states(states, "effect"),
            "valid_explanation": expected == "verifiable" if valid is None else valid[x]})
    return json.dumps(elements)


def _trip_jax(cases):
    lines = []
    for pair, story_pred, conflict, states, expected in cases:
        lines.append({
            "pair_id": pair.pair_id, "label": pair.label, "predicted_story": story_pred,
            "predicted_conflict": list(conflict), "gold_conflict": list(pair.implausible.conflict),
            "correct": expected != "wrong", "verifiable": expected == "verifiable",
            "explanation": {"plausible_story": story_pred, "implausible_story": 1 - story_pred,
                            "states": [{"entity": e, "sentence": s, "side": side,
                                        "attribute": a, "label": v,
                                        "value": schema.label_name(a, v)}
                                       for e, s, side, a, v in states]}})
    return "\n".join(json.dumps(line) for line in lines) + "\n"


def _pairs_of(cases):
    return [case[0] for case in cases]


EXPECTED = {"verifiable": (True, True, True), "consistent": (True, True, False),
            "correct": (True, False, False), "wrong": (False, False, False)}


@pytest.mark.parametrize("writer", [_minimal, _authors, _trip_jax])
def test_each_format_scores_hand_made_pairs(cases, writer):
    result = score.score_predictions(writer(cases), _pairs_of(cases))
    for record, case in zip(result.records, cases, strict=True):
        got = tuple(record[key] for key in ("correct", "consistent", "verifiable"))
        assert got == EXPECTED[case[4]], (case[4], record)
    assert result.scores["num_pairs"] == 5
    assert result.scores["accuracy"] == pytest.approx(4 / 5)
    assert result.scores["consistency"] == pytest.approx(3 / 5)
    assert result.scores["verifiability"] == pytest.approx(2 / 5)
    assert result.metadata["disagreements"] == []
    # Sentence-level files cannot give the F1s: not applicable, never estimated.
    assert np.isnan(result.scores["precondition_f1"]) and np.isnan(result.scores["conflict_f1"])


def test_the_three_formats_of_the_same_predictions_give_the_same_scores(cases):
    pairs = _pairs_of(cases)
    results = [score.score_predictions(text, pairs) for text in
               (_minimal(cases), _minimal(cases, array_states=False), _authors(cases),
                _trip_jax(cases))]
    keys = [k for k in results[0].scores if k in metrics.TIER_METRICS or k in (
        "failure_modes", "tier_losses", "state_contribution", "num_pairs")]
    first = json.dumps({k: results[0].scores[k] for k in keys})
    outcomes = [[{k: v for k, v in r.items() if k in ("correct", "consistent", "verifiable",
                 "conflict_correct", "states_correct", "predicted_conflict")}
                 for r in result.records] for result in results]
    for result, outcome in zip(results[1:], outcomes[1:], strict=True):
        assert json.dumps({k: result.scores[k] for k in keys}) == first
        assert outcome == outcomes[0]
    assert [r["prediction"] for r in results[0].records] == [
        r["prediction"] for r in results[1].records]


def test_records_explain_the_stated_pair(cases):
    result = score.score_predictions(_minimal(cases), _pairs_of(cases))
    explanation = result.records[0]["explanation"]
    assert explanation["conflict"]["detected"]
    assert explanation["text"].startswith(f"Story {cases[0][1] + 1} is plausible.")
    assert sorted((s["entity"], s["sentence"], s["side"], s["attribute"], s["label"])
                  for s in explanation["states"]) == sorted(cases[0][3])
    # The wrong-pair case names (i - 1, j): its explanation is of that pair.
    wrong_pair = result.records[2]["explanation"]["conflict"]
    assert (wrong_pair["evidence"], wrong_pair["breakpoint"]) == tuple(cases[2][2])


def test_matching_by_text_swaps_story_order(cases):
    pair, story_pred, conflict, states, _ = cases[0]
    line = {"stories": [list(pair.stories[1].sentences), list(pair.stories[0].sentences)],
            "plausible_story": 1 - story_pred, "conflict": list(conflict),
            "states": [list(s) for s in states]}
    result = score.score_predictions(json.dumps(line), [pair])
    assert result.records[0]["verifiable"]
    assert result.metadata["matching"] == {"by_id": 0, "by_text": 1, "stories_swapped": 1}


def test_ids_match_across_forms(test_pairs):
    index = matching.PairIndex(test_pairs)
    (n,) = index.find_id("257-C0")
    assert test_pairs[n].pair_id == "257-C0-257-C0"
    assert index.find_id("257-C0-257-C0") == {n}
    assert matching.canonical_id("257-C0-257-C0") == "257-C0"
    assert matching.canonical_id("test_0") == "test_0"


def _problems(text, pairs, **kwargs):
    with pytest.raises(score.ScoreError) as err:
        score.score_predictions(text, pairs, **kwargs)
    return [str(p) for p in err.value.problems]


def test_every_kind_of_bad_input_is_reported_with_line_and_field(test_pairs):
    pairs = test_pairs[:10]

    def line(n, *states, drop=None, **fields):
        pair = pairs[n]
        record = {"pair_id": matching.canonical_id(pair.pair_id), "plausible_story": pair.label,
                  "conflict": list(pair.implausible.conflict), "states": list(states), **fields}
        return json.dumps({k: v for k, v in record.items() if k != drop})

    def entity(n):
        return pairs[n].implausible.entities[0]

    bad_lines = [
        "{not json",
        line(0, pair_id="9999-C7"),
        line(1, [entity(1), 0, "effect", "colour", "red"]),
        line(2, ["nobody", 0, "effect", "power", "powered"]),
        line(3, [entity(3), 0, "effect", "power", "glowing"]),
        line(4, [entity(4), 99, "effect", "power", "powered"]),
        line(5, conflict=[0, 42]),
        line(6),
        line(6),
        line(7, [entity(7), 0, "after", "power", "powered"]),
        line(8, drop="plausible_story"),
        line(9, [entity(9), 0, "effect", "power", 1], [entity(9), 0, "effect", "power", 2]),
        line(9, [entity(9), 0, "effect", "power", 3], pair_id=pairs[9].pair_id),
    ]
    problems = _problems("\n".join(bad_lines) + "\n", pairs)
    expected = [
        "line 1: field '-': not valid JSON",
        "line 2: field 'pair_id': unknown pair id '9999-C7'",
        "line 3: field 'states[0][3]': unknown attribute 'colour'",
        "line 4: field 'states[0]': unknown entity 'nobody' in story",
        "line 5: field 'states[0][4]': unknown value word 'glowing' for power",
        "line 6: field 'states[0]': sentence index 99 out of range",
        "line 7: field 'conflict': sentence index 42 out of range",
        f"line 9: field 'pair_id': duplicate: pair '{pairs[6].pair_id}' was already given at "
        "line 8",
        "line 10: field 'states[0][2]': unknown side 'after'",
        "line 11: field 'plausible_story': missing",
        "line 12: field 'states[1]': effect of power",
        "line 13: field 'states[0][4]': label 3 out of range for power (0..2)",
        "file: field '-': 5 of the 10 pairs of the split are missing",  # 5 entries unreadable
    ]
    assert len(problems) == len(expected)
    for problem, start in zip(problems, expected, strict=True):  # in the file's order
        assert problem.startswith(start), (start, problems)


def test_missing_pairs_are_an_error_unless_counted_wrong(cases):
    pairs = _pairs_of(cases)
    text = "\n".join(_minimal(cases).splitlines()[:3]) + "\n"
    (problem,) = _problems(text, pairs)
    assert "2 of the 5 pairs of the split are missing" in problem
    assert "--missing=wrong" in problem
    result = score.score_predictions(text, pairs, missing="wrong")
    assert result.scores["num_pairs"] == 5
    assert [r.get("missing", False) for r in result.records] == [False] * 3 + [True] * 2
    assert not any(r["correct"] for r in result.records[3:])
    assert result.metadata["missing_pairs"] == [p.pair_id for p in pairs[3:]]
    assert any("counted as wrong" in note for note in result.metadata["notes"])


def test_authors_format_errors_name_the_element_and_field(cases):
    elements = json.loads(_authors(cases))
    elements[1]["effects_pred"] = {"ghost": {"0": {"power": 2}}}
    elements[2]["preconditions_pred"] = {"x": {"zero": {"power": 2}}}
    elements[3]["story_pred"] = 2
    problems = _problems(json.dumps(elements), _pairs_of(cases))
    assert any(p.startswith("element [1]: field \"effects_pred['ghost']['0']['power']\": "
                            "unknown entity 'ghost'") for p in problems), problems
    assert any(p.startswith("element [2]: field \"preconditions_pred['x']['zero']\"")
               for p in problems), problems
    assert any(p.startswith("element [3]: field 'story_pred': expected 0 or 1") for p in problems)
    assert _problems(" \n", _pairs_of(cases)) == ["file: field '-': the file is empty"]
    assert _problems("{}\n", _pairs_of(cases))[0].startswith(
        "line 1: field '-': cannot tell the format")
    anonymous = {k: v for k, v in elements[0].items() if k not in ("example_id", "story0",
                                                                    "story1")}
    (problem,) = _problems(json.dumps([anonymous]), _pairs_of(cases)[:1], missing="wrong")
    assert problem.startswith("element [0]: field 'pair_id': missing: the entry gives neither")


def test_file_gold_and_flags_that_differ_are_reported(cases):
    elements = json.loads(_authors(cases))
    elements[0]["conflict_label"] = [0, 1]
    elements[0]["valid_explanation"] = False  # scored verifiable
    first_gold = next(iter(elements[1]["effects_label"].values()))
    first_gold.setdefault("0", {})["power"] = 1
    elements[2]["story_label"] = 1 - elements[2]["story_label"]
    elements[2]["story_pred"] = 1 - elements[2]["story_pred"]
    result = score.score_predictions(json.dumps(elements), _pairs_of(cases))
    fields = {(d["where"], d["field"].split("[")[0]) for d in result.metadata["disagreements"]}
    assert ("element [0]", "conflict_label") in fields
    assert ("element [0]", "valid_explanation") in fields
    assert ("element [1]", "effects_label") in fields
    assert ("element [2]", "story_label") in fields
    assert any("disagreements" in n and "valid_explanation: 1" in n
               for n in result.metadata["notes"])


def test_authors_sample_is_read_correctly(data_dir, test_pairs):
    with open(os.path.join(data_dir, AUTHORS_SAMPLE), encoding="utf-8") as f:
        text = f.read()
    assert formats.detect_format(text) == "authors"
    entries, problems = formats.read_predictions(text, "authors")
    assert problems == [] and [e.pair_id for e in entries] == ["257-C0", "257-C1", "655-C0"]
    assert entries[0].conflict == (1, 2, 3, 4) and entries[2].conflict == (2, 3)
    result = score.score_predictions(text, test_pairs, missing="wrong")
    by_id = {r["file_pair_id"]: r for r in result.records if r["file_pair_id"]}
    assert sorted(by_id) == ["257-C0", "257-C1", "655-C0"]
    flags = {e.pair_id: e.flags["valid_explanation"] for e in entries}
    assert {k: r["verifiable"] for k, r in by_id.items()} == flags
    assert by_id["655-C0"]["pair_id"] == "655-C0-655-C0"
    assert by_id["655-C0"]["gold_conflict"] == [2, 3]
    # The file's gold story, conflict and states agree with the data's everywhere.
    assert result.metadata["disagreements"] == []
    assert result.metadata["matching"]["by_id"] == 3


@pytest.mark.parametrize("run", HEADLINE_RUNS, ids=lambda p: p.name)
def test_a_runs_predictions_file_reproduces_its_tiers(test_pairs, run):
    text = (run / "reports" / "test.predictions.jsonl").read_text()
    reported = json.loads((run / "reports" / "test.json").read_text())["metrics"]
    result = score.score_predictions(text, test_pairs)
    for key in (*metrics.TIER_METRICS, "num_pairs", "tier_losses"):
        assert result.scores[key] == reported[key], key
    # The file's own flags (correct, consistent, verifiable, conflict_correct) agree pair by pair.
    assert result.metadata["disagreements"] == []


def _run(*args):
    return subprocess.run([sys.executable, "-m", "trip_jax.score", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def _data_file(cases, data_dir, path):
    """The CGLI lines of the cases' pairs, as a small TRIP file."""
    ids = {story.story_id for pair in _pairs_of(cases) for story in pair.stories}
    with open(os.path.join(data_dir, "test.cgli.jsonl"), encoding="utf-8") as f:
        lines = [line for line in f if json.loads(line)["para_id"] in ids]
    path.write_text("".join(lines))
    return path


def test_command_writes_the_report_set_and_prints_one_line(cases, data_dir, tmp_path):
    path = tmp_path / "preds.jsonl"
    path.write_text(_minimal(cases))
    out = tmp_path / "out"
    data = _data_file(cases, data_dir, tmp_path / "five.cgli.jsonl")
    result = _run(f"--predictions={path}", f"--out={out}", f"--data_file={data}",
                  "--split=five")
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.splitlines()
    assert line == "five: 5 pairs, accuracy / consistency / verifiability 80.0 / 60.0 / 40.0 %"
    names = sorted(p.name for p in out.iterdir())
    assert names == ["five.attributes.png", "five.failure_modes.png", "five.html", "five.json",
                     "five.md", "five.predictions.jsonl"]
    report = json.loads((out / "five.json").read_text())
    assert report["format"] == "minimal" and report["metrics"]["precondition_f1"] is None
    assert report["data_files"] == {data.name: hashlib.sha256(data.read_bytes()).hexdigest()}
    markdown = (out / "five.md").read_text()
    assert "not applicable: decodings" in markdown and "random baseline (10 seeds)" in markdown
    assert len((out / "five.predictions.jsonl").read_text().splitlines()) == 5
    # No five_curated.har.jsonl beside the data file: the report says so.
    assert report["by_marker"] == {"marker": "five_curated.har.jsonl", "found": False}
    assert "Marker not found" in markdown
    # With it (the first pair), the tiers of both halves.
    first = readers.read_pairs(str(data))[0]
    (tmp_path / "five_curated.har.jsonl").write_text(json.dumps(
        {"stories": [{"sentences": list(s.sentences)} for s in first.stories]}) + "\n")
    assert _run(f"--predictions={path}", f"--out={out}", f"--data_file={data}",
                "--split=five").returncode == 0
    halves = json.loads((out / "five.json").read_text())["by_marker"]
    assert (halves["curated"]["num_pairs"], halves["implicit"]["num_pairs"]) == (1, 4)


def test_command_reports_bad_input_one_line_each_with_exit_2(cases, data_dir, tmp_path):
    lines = _minimal(cases).splitlines()
    path = tmp_path / "preds.jsonl"
    path.write_text("\n".join([lines[0], "[1, 2]", lines[0]]) + "\n")
    data = _data_file(cases, data_dir, tmp_path / "five.cgli.jsonl")
    result = _run(f"--predictions={path}", f"--out={tmp_path / 'out'}", f"--data_file={data}",
                  "--missing=wrong")
    assert result.returncode == 2
    errors = result.stderr.strip().splitlines()
    assert errors == [f"error: {path}: line 2: field '-': expected a JSON object, got list",
                      f"error: {path}: line 3: field 'pair_id': duplicate: pair "
                      f"'{cases[0][0].pair_id}' was already given at line 1"]
    assert not (tmp_path / "out").exists()
    bad_flag = _run(f"--predictions={path}", "--out=x", "--format=csv")
    assert bad_flag.returncode == 2 and len(bad_flag.stderr.strip().splitlines()) == 1
