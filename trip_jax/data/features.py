"""Features: typed story pairs -> tokenized rows -> Batch arrays (the Batch contract).

``encode_pairs`` tokenizes each distinct (entity, sentence) once, unpadded and never cut silently
(``truncation_report``); ``grid`` lays encoded pairs on the [B, 2, E, S] grid; ``Buckets`` rounds
E and T up so jit sees few shapes. Details: docs/reference.md#encoder-input.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence

import numpy as np

from trip_jax.data import schema
from trip_jax.data.labels import conflict_labels
from trip_jax.data.tokenizers import tokenizer_info
from trip_jax.data.types import Story, StoryPair

logger = logging.getLogger(__name__)

DEFAULT_MAX_SENTENCES = 7
# data.token_types -> whether the tokenizer's token type ids are kept: "segments" (1 for the
# sentence with BERT-style tokenizers) or "zeros" (all 0, as the reference, which passed none).
KEEPS_TYPE_IDS: dict[str, bool] = {"segments": True, "zeros": False}
TOKEN_TYPES: tuple[str, ...] = tuple(KEEPS_TYPE_IDS)


@dataclasses.dataclass(frozen=True, eq=False)
class EncodedStory:
    """One story's rows, tokenized and unpadded, with its labels."""

    num_entities: int
    num_sentences: int
    # Rows in (entity, sentence) order, entity-major; row r has tokens[offsets[r]:offsets[r+1]].
    tokens: np.ndarray          # int32 [total tokens]
    type_ids: np.ndarray        # int32 [total tokens]; zeros where the tokenizer has none
    lengths: np.ndarray         # int32 [E*S]
    states: np.ndarray          # int32 [E, S, 2, 20]
    conflict_label: np.ndarray  # int32 [E, S]

    @property
    def num_rows(self) -> int:
        """Number of encoder rows (entities x sentences)."""
        return self.num_entities * self.num_sentences

    @property
    def max_length(self) -> int:
        """Longest row in tokens (0 for a story without entities)."""
        return int(self.lengths.max(initial=0))


@dataclasses.dataclass(frozen=True, eq=False)
class EncodedPair:
    """A story pair ready for batching; ``pad_id`` is the tokenizer's pad token id."""

    pair_id: str
    stories: tuple[EncodedStory, EncodedStory]
    label: int
    pad_id: int

    @property
    def num_entities(self) -> int:
        """Entities of the larger story (the E this pair needs)."""
        return max(s.num_entities for s in self.stories)

    @property
    def num_rows(self) -> int:
        """Real encoder rows of both stories."""
        return sum(s.num_rows for s in self.stories)

    @property
    def max_length(self) -> int:
        """Longest row of both stories in tokens."""
        return max(s.max_length for s in self.stories)


@dataclasses.dataclass(frozen=True)
class TruncationReport:
    """How many rows a token length ``max_length`` cuts (rows counted once per pair they are in)."""

    max_length: int
    rows: int
    cut_rows: int
    longest: int

    def __str__(self) -> str:
        return (f"max_length={self.max_length} cuts {self.cut_rows} of {self.rows} rows "
                f"({100.0 * self.cut_rows / max(self.rows, 1):.2f}%); longest row "
                f"{self.longest} tokens")


@dataclasses.dataclass(frozen=True)
class Buckets:
    """Sets of padded sizes (``data.buckets``): E from entity_min in steps of entity_step, T in
    multiples of token_multiple."""

    entity_min: int
    entity_step: int
    token_multiple: int

    def __post_init__(self):
        for name in ("entity_min", "entity_step", "token_multiple"):
            if getattr(self, name) < 1:
                raise ValueError(f"Buckets.{name} must be >= 1, got {getattr(self, name)}")

    def entities(self, n: int) -> int:
        """Smallest entity bucket >= n."""
        return max(self.entity_min, _round_up(n, self.entity_step))

    def tokens(self, n: int) -> int:
        """Smallest token bucket >= n."""
        return max(self.token_multiple, _round_up(n, self.token_multiple))

def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def vocabulary_texts(pairs: Iterable[StoryPair]) -> list[str]:
    """Returns every sentence and entity name of ``pairs`` (the texts a word-level tokenizer
    builds its vocabulary from)."""
    texts = []
    for pair in pairs:
        for story in pair.stories:
            texts.extend(story.sentences)
            texts.extend(story.entities)
    return texts


def _check_story(pair: StoryPair, story: Story, max_sentences: int) -> None:
    """Raises a clear error where a story does not fit the feature layout."""
    where = f"pair {pair.pair_id!r}, story {story.story_id!r}"
    if story.num_sentences > max_sentences:
        raise ValueError(f"{where} has {story.num_sentences} sentences, more than "
                         f"max_sentences={max_sentences}; raise max_sentences in the config")
    expected = (story.num_entities, story.num_sentences, 2, schema.NUM_ATTRIBUTES)
    if story.states.shape != expected:
        raise ValueError(f"{where}: states have shape {story.states.shape}, expected {expected}")


def _tokenize(tokenizer, rows: Sequence[tuple[str, str]], uses_type_ids: bool,
              max_length: int | None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Sentence-pair encodes (entity, sentence) rows; truncates only when max_length is given."""
    if not rows:
        return [], []
    encoded = tokenizer(
        [entity for entity, _ in rows], [sentence for _, sentence in rows],
        add_special_tokens=True, padding=False,
        truncation=max_length is not None, max_length=max_length,
        return_attention_mask=False, return_token_type_ids=uses_type_ids)
    ids = [np.asarray(x, dtype=np.int32) for x in encoded["input_ids"]]
    if uses_type_ids:
        types = [np.asarray(x, dtype=np.int32) for x in encoded["token_type_ids"]]
    else:
        types = [np.zeros_like(x) for x in ids]
    return ids, types


def encode_pairs(pairs: Sequence[StoryPair], tokenizer, *,
                 max_sentences: int = DEFAULT_MAX_SENTENCES,
                 max_length: int | None = None,
                 token_types: str = "segments") -> list[EncodedPair]:
    """Tokenizes every (story, entity, sentence) row of ``pairs`` and attaches the labels.

    Each distinct (entity, sentence) text is tokenized once (plausible stories recur across
    pairs). Rows keep their full length unless ``max_length`` is given; then longer rows are cut
    by the tokenizer (special tokens kept) and a warning gives the count. A story with more than
    ``max_sentences`` sentences is an error. ``token_types`` (``TOKEN_TYPES``): "segments" keeps
    the tokenizer's token type ids, "zeros" sets them all to 0 (the reference).
    """
    info = tokenizer_info(tokenizer)
    uses_type_ids = info.uses_token_type_ids and KEEPS_TYPE_IDS[token_types]
    row_ids: dict[tuple[str, str], int] = {}
    uses = []  # unique row id of every row of every story, in order
    for pair in pairs:
        for story in pair.stories:
            _check_story(pair, story, max_sentences)
            for entity in story.entities:
                for sentence in story.sentences:
                    uses.append(row_ids.setdefault((entity, sentence), len(row_ids)))
    rows = list(row_ids)
    ids, types = _tokenize(tokenizer, rows, uses_type_ids, None)
    if max_length is not None:
        lengths = np.asarray([len(x) for x in ids], dtype=np.int64)
        use_lengths = lengths[np.asarray(uses, dtype=np.int64)] if uses else lengths
        report = _report(use_lengths, max_length)
        if report.cut_rows:
            logger.warning("token length: %s; the cut rows lose their sentence's last tokens",
                           report)
            long = np.flatnonzero(lengths > max_length)
            cut_ids, cut_types = _tokenize(tokenizer, [rows[i] for i in long], uses_type_ids,
                                           max_length)
            for i, x, t in zip(long, cut_ids, cut_types):
                ids[i], types[i] = x, t

    encoded, cursor = [], 0
    for pair in pairs:
        stories = []
        for story in pair.stories:
            n = story.num_entities * story.num_sentences
            story_rows = uses[cursor:cursor + n]
            cursor += n
            stories.append(_encoded_story(story, [ids[u] for u in story_rows],
                                          [types[u] for u in story_rows]))
        encoded.append(EncodedPair(pair.pair_id, tuple(stories), pair.label, info.pad_id))
    return encoded


def _encoded_story(story: Story, ids: list[np.ndarray], types: list[np.ndarray]) -> EncodedStory:
    """Packs one story's tokenized rows and labels."""
    empty = np.zeros(0, dtype=np.int32)
    return EncodedStory(
        num_entities=story.num_entities,
        num_sentences=story.num_sentences,
        tokens=np.concatenate(ids) if ids else empty,
        type_ids=np.concatenate(types) if types else empty,
        lengths=np.asarray([len(x) for x in ids], dtype=np.int32),
        states=np.asarray(story.states, dtype=np.int32),
        conflict_label=conflict_labels(story),
    )


def _report(lengths: np.ndarray, max_length: int) -> TruncationReport:
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    return TruncationReport(max_length=max_length, rows=int(lengths.size),
                            cut_rows=int((lengths > max_length).sum()),
                            longest=int(lengths.max(initial=0)))


def truncation_report(encoded_pairs: Sequence[EncodedPair], max_length: int) -> TruncationReport:
    """Says how many rows of (untruncated) ``encoded_pairs`` a token length cuts."""
    lengths = [s.lengths for p in encoded_pairs for s in p.stories]
    return _report(np.concatenate(lengths) if lengths else np.zeros(0, np.int32), max_length)


def max_entities(*encoded_splits: Iterable[EncodedPair]) -> int:
    """Largest entity count of any story in ``encoded_splits``: the E the reference padded every
    story to (``data.entity_padding = "data_max"``; pass every split the run encodes)."""
    return max((p.num_entities for split in encoded_splits for p in split), default=0)


def max_row_length(encoded_pairs: Iterable[EncodedPair]) -> int:
    """Longest row of ``encoded_pairs`` in tokens: the T that cuts nothing."""
    return max((p.max_length for p in encoded_pairs), default=0)


def grid(pairs: Sequence[EncodedPair | None], pair_index: Sequence[int], *, num_entities: int,
         max_sentences: int) -> tuple[dict[str, np.ndarray], "Rows"]:
    """``pairs`` (None: a padding pair) on the [B, 2, E, S] grid: returns the batch contract's
    pair arrays (``PAIR_FIELDS``) and the real rows in (pair, story, entity, sentence) order. A
    story with more than E entities or S sentences is an error, never cut."""
    if len(pair_index) != len(pairs):
        raise ValueError(f"{len(pairs)} pairs but {len(pair_index)} pair indices")
    B, E, S, A = len(pairs), num_entities, max_sentences, schema.NUM_ATTRIBUTES
    row_mask = np.zeros((B, 2, E, S), dtype=bool)
    pre_label = np.zeros((B, 2, E, S, A), dtype=np.int32)
    eff_label = np.zeros((B, 2, E, S, A), dtype=np.int32)
    conflict_label = np.zeros((B, 2, E, S), dtype=np.int32)
    story_label = np.zeros(B, dtype=np.int32)
    pair_mask = np.asarray([p is not None for p in pairs], dtype=bool)
    positions, lengths, tokens, type_ids = [], [], [], []
    for b, pair in enumerate(pairs):
        if pair is None:
            continue
        story_label[b] = pair.label
        for k, story in enumerate(pair.stories):
            e_n, s_n = story.num_entities, story.num_sentences
            if e_n > E or s_n > S:
                raise ValueError(f"pair {pair.pair_id!r} story {k} has {e_n} entities x {s_n} "
                                 f"sentences; the batch holds {E} x {S}")
            row_mask[b, k, :e_n, :s_n] = True
            pre_label[b, k, :e_n, :s_n] = story.states[:, :, 0]
            eff_label[b, k, :e_n, :s_n] = story.states[:, :, 1]
            conflict_label[b, k, :e_n, :s_n] = story.conflict_label
            cells = ((b * 2 + k) * E + np.arange(e_n)[:, None]) * S + np.arange(s_n)[None, :]
            positions.append(cells.ravel())
            lengths.append(story.lengths)
            tokens.append(story.tokens)
            type_ids.append(story.type_ids)
    rows = Rows(
        positions=np.concatenate(positions).astype(np.int32) if positions
        else np.zeros(0, np.int32),
        lengths=np.concatenate(lengths) if lengths else np.zeros(0, np.int32),
        tokens=np.concatenate(tokens) if tokens else np.zeros(0, np.int32),
        type_ids=np.concatenate(type_ids) if type_ids else np.zeros(0, np.int32))
    arrays = {
        "row_mask": row_mask,
        "pre_label": pre_label,
        "eff_label": eff_label,
        "conflict_label": conflict_label,
        "story_label": story_label,
        "pair_mask": pair_mask,
        "pair_index": np.asarray(pair_index, dtype=np.int32),
    }
    return arrays, rows


@dataclasses.dataclass(frozen=True)
class Rows:
    """The real rows of a batch: grid positions, lengths and concatenated tokens."""

    positions: np.ndarray  # int32 [n] flat (B, 2, E, S) index of each row
    lengths: np.ndarray    # int32 [n]
    tokens: np.ndarray     # int32 [sum(lengths)]
    type_ids: np.ndarray   # int32 [sum(lengths)]
