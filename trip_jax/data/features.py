"""Features: typed story pairs -> tokenized rows -> Batch arrays (the Batch contract).

One encoder row per (story, entity, sentence): the tokenizer's sentence-pair encoding with the
entity first and the sentence second (docs/reference.md, "Encoder input"). ``encode_pairs``
tokenizes every distinct (entity, sentence) text once and keeps each row's tokens unpadded, so the
token length T is chosen later, per batch, from the data. Rows are never cut silently:
``truncation_report`` says how many rows a given T cuts, and ``encode_pairs(max_length=...)`` logs a
warning with that count.

``build_batch`` lays a list of encoded pairs out in one of three layouts of the same arrays:
- packed: only real rows are encoder rows, in (pair, story, entity, sentence) order; R is the real
  row count rounded up to a bucket and ``row_index`` places each row in the flat (B, 2, E, S) grid;
- dense (the reference's): every pair padded to E x S rows per story, R = B*2*E*S;
- packed_tokens: the real rows concatenated into N sequences of P tokens (``pack_rows``: first
  fit, longest row first), each row a segment of its own (``segment_ids``; the encoder attends
  within a segment and restarts positions there); ``row_start`` points at each row's first token
  and ``track_index`` lists the (story, entity) tracks that hold real rows. Sizes (N, R, K) come
  from the caller (``trip_jax.data.batching`` picks them from a few shape classes).
``Buckets`` rounds E, T and R up to small sets of values so that jit sees few shapes; S is fixed
(``max_sentences``).

With ``short_seq_len`` the packed rows are split into two encoder groups: rows of at most that
many tokens go to the ``short_*`` arrays, padded only to ``short_seq_len``, the others to the
main arrays, padded to T. The encoder output of a row does not depend on its padding, so this
saves encoder tokens without changing results (beyond float rounding).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence

import numpy as np

from trip_jax import schema
from trip_jax.data.labels import conflict_labels
from trip_jax.data.tokenizers import tokenizer_info
from trip_jax.data.types import Story, StoryPair

logger = logging.getLogger(__name__)

DEFAULT_MAX_SENTENCES = 7
LAYOUTS: tuple[str, ...] = ("packed", "dense", "packed_tokens")
# "segments": the tokenizer's token type ids (1 for the sentence with BERT-style tokenizers);
# "zeros": all 0, as the reference, which passed no token type ids to the encoder.
TOKEN_TYPES: tuple[str, ...] = ("segments", "zeros")


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
    """Sets of padded sizes: E from entity_min in steps of entity_step, T in multiples of
    token_multiple, R from row_min upwards with rows_per_octave evenly spaced values per
    doubling (16, 20, 24, 28, 32, 40, ... by default: at most 25% padding rows)."""

    entity_min: int = 8
    entity_step: int = 4
    token_multiple: int = 8
    row_min: int = 16
    rows_per_octave: int = 4

    def __post_init__(self):
        for name in ("entity_min", "entity_step", "token_multiple", "row_min", "rows_per_octave"):
            if getattr(self, name) < 1:
                raise ValueError(f"Buckets.{name} must be >= 1, got {getattr(self, name)}")
        if self.row_min % self.rows_per_octave:
            raise ValueError(f"Buckets.row_min ({self.row_min}) must be a multiple of "
                             f"rows_per_octave ({self.rows_per_octave})")

    def entities(self, n: int) -> int:
        """Smallest entity bucket >= n."""
        return max(self.entity_min, _round_up(n, self.entity_step))

    def tokens(self, n: int) -> int:
        """Smallest token bucket >= n."""
        return max(self.token_multiple, _round_up(n, self.token_multiple))

    def rows(self, n: int) -> int:
        """Smallest row bucket >= n."""
        if n <= self.row_min:
            return self.row_min
        base = self.row_min
        while base * 2 < n:
            base *= 2
        step = base // self.rows_per_octave
        return base + _round_up(n - base, step)


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
    if token_types not in TOKEN_TYPES:
        raise ValueError(f"unknown token_types {token_types!r}; expected one of {TOKEN_TYPES}")
    info = tokenizer_info(tokenizer)
    uses_type_ids = info.uses_token_type_ids and token_types == "segments"
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


def build_batch(pairs: Sequence[EncodedPair | None], pair_index: Sequence[int], *,
                layout: str, num_entities: int, seq_len: int, pad_id: int,
                max_sentences: int = DEFAULT_MAX_SENTENCES,
                num_rows: int | None = None, short_seq_len: int | None = None,
                num_short_rows: int | None = None, num_sequences: int | None = None,
                num_tracks: int | None = None, dedup_rows: bool = False,
                shards: int = 1) -> dict[str, np.ndarray]:
    """Lays ``pairs`` out as one Batch dict (see the Batch contract); None marks a padding pair.

    ``num_entities`` (E), ``seq_len`` (T) and, for the packed layout, ``num_rows`` (R; default:
    exactly the real rows) are the padded sizes; a pair or row that does not fit is an error,
    never cut. Padding rows hold pad tokens with attention_mask[:, 0] = 1. ``short_seq_len``
    (packed only) moves rows of at most that many tokens to the ``short_*`` group of
    ``num_short_rows`` rows (default: exactly those rows); ``num_rows`` then counts the others.
    packed_tokens: ``seq_len`` is the packed sequence length P, ``num_sequences`` (N),
    ``num_rows`` (R) and ``num_tracks`` (K) the padded counts (default: exactly what the rows
    need); a row longer than P is an error. ``dedup_rows``: rows with the same tokens (the
    sentences the two stories of a pair share, stories recurring across pairs) are packed once
    and their rows share that encoding (``row_start``). ``shards`` (packed_tokens): the batch is
    built as that many equal pieces of B / shards pairs, one per device of the batch axis, each
    packing only its own pairs' rows into its own N / shards sequences (and R / shards rows,
    K / shards tracks), so the arrays do not depend on how the devices are spread over processes
    and no device reads another's sequences.
    """
    if layout == "packed_tokens" and shards > 1:
        return _sharded_packed_tokens(pairs, pair_index, shards, num_entities=num_entities,
                                      seq_len=seq_len, pad_id=pad_id,
                                      max_sentences=max_sentences, num_rows=num_rows,
                                      num_sequences=num_sequences, num_tracks=num_tracks,
                                      dedup_rows=dedup_rows)
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; expected one of {LAYOUTS}")
    if len(pair_index) != len(pairs):
        raise ValueError(f"{len(pairs)} pairs but {len(pair_index)} pair indices")
    if short_seq_len and layout != "packed":
        raise ValueError("short_seq_len splits the rows of the packed layout only")
    B, E, S, T, A = len(pairs), num_entities, max_sentences, seq_len, schema.NUM_ATTRIBUTES
    slots = B * 2 * E * S
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
            grid = ((b * 2 + k) * E + np.arange(e_n)[:, None]) * S + np.arange(s_n)[None, :]
            positions.append(grid.ravel())
            lengths.append(story.lengths)
            tokens.append(story.tokens)
            type_ids.append(story.type_ids)
    rows = _Rows(
        positions=np.concatenate(positions).astype(np.int32) if positions
        else np.zeros(0, np.int32),
        lengths=np.concatenate(lengths) if lengths else np.zeros(0, np.int32),
        tokens=np.concatenate(tokens) if tokens else np.zeros(0, np.int32),
        type_ids=np.concatenate(type_ids) if type_ids else np.zeros(0, np.int32))
    if layout != "packed_tokens" and rows.lengths.size and rows.lengths.max() > T:
        raise ValueError(f"a row has {rows.lengths.max()} tokens but seq_len is {T}; pick a larger "
                         "seq_len or encode with max_length to truncate (with a report)")

    batch = {}
    if layout == "packed_tokens":
        batch.update(_packed_token_arrays(rows, T, pad_id, num_sequences, num_rows, slots,
                                          dedup_rows))
        batch["track_index"] = track_index(row_mask, num_tracks)
    elif layout == "dense":
        batch.update(_row_arrays(rows, np.arange(rows.lengths.size), rows.positions,
                                 np.arange(slots, dtype=np.int32), slots, T, pad_id))
    else:
        short = (rows.lengths <= short_seq_len if short_seq_len
                 else np.zeros(rows.lengths.size, bool))
        groups = [("", np.flatnonzero(~short), num_rows, T)]
        if short_seq_len:
            groups.append(("short_", np.flatnonzero(short), num_short_rows, short_seq_len))
        for prefix, members, R, width in groups:
            R = members.size if R is None else R
            if members.size > R:
                raise ValueError(f"{members.size} real {prefix}rows do not fit {R} rows")
            row_index = np.full(R, slots, dtype=np.int32)
            row_index[:members.size] = rows.positions[members]
            arrays = _row_arrays(rows, members, np.arange(members.size), row_index, R, width,
                                 pad_id)
            batch.update({prefix + key: value for key, value in arrays.items()})
    batch.update({
        "row_mask": row_mask,
        "pre_label": pre_label,
        "eff_label": eff_label,
        "conflict_label": conflict_label,
        "story_label": story_label,
        "pair_mask": pair_mask,
        "pair_index": np.asarray(pair_index, dtype=np.int32),
    })
    return batch


def pack_rows(lengths: np.ndarray, pack_length: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Packs rows of ``lengths`` tokens into sequences of ``pack_length`` tokens.

    First fit, longest row first (ties in row order): deterministic, and every sequence but the
    last opened is more than ``pack_length - longest row`` full. Returns (sequence of each row,
    token offset of each row in it, number of sequences). A row longer than ``pack_length`` is
    an error.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size and lengths.max() > pack_length:
        raise ValueError(f"a row has {lengths.max()} tokens but the pack length is {pack_length}; "
                         "raise data.pack_length or cut rows with data.max_length (with a report)")
    sequence = np.zeros(lengths.size, np.int32)
    offset = np.zeros(lengths.size, np.int32)
    free = np.zeros(lengths.size, np.int64)  # room left in each opened sequence
    opened = 0
    for row in np.argsort(-lengths, kind="stable"):
        fits = np.flatnonzero(free[:opened] >= lengths[row])
        if fits.size:
            target = fits[0]
        else:
            target, opened = opened, opened + 1
            free[target] = pack_length
        sequence[row] = target
        offset[row] = pack_length - free[target]
        free[target] -= lengths[row]
    return sequence, offset, opened


def _sharded_packed_tokens(pairs: Sequence[EncodedPair | None], pair_index: Sequence[int],
                           shards: int, *, num_rows: int | None, num_sequences: int | None,
                           num_tracks: int | None, **common) -> dict[str, np.ndarray]:
    """``build_batch`` of packed_tokens in ``shards`` pieces (see there), concatenated."""
    B = len(pairs)
    if num_rows is None or num_sequences is None or num_tracks is None:
        raise ValueError("a packed_tokens batch in shards needs num_rows, num_sequences and "
                         "num_tracks (every shard the same size)")
    sizes = {"pairs": B, "num_rows": num_rows, "num_sequences": num_sequences,
             "num_tracks": num_tracks}
    for name, size in sizes.items():
        if size % shards:
            raise ValueError(f"{name}={size} does not split into {shards} shards")
    per = B // shards
    pieces = [build_batch(pairs[i * per:(i + 1) * per], pair_index[i * per:(i + 1) * per],
                          layout="packed_tokens",
                          num_rows=num_rows // shards, num_sequences=num_sequences // shards,
                          num_tracks=num_tracks // shards, **common)
              for i in range(shards)]
    cells, tracks = pieces[0]["row_mask"].size, pieces[0]["row_mask"].size // common[
        "max_sentences"]
    starts = pieces[0]["input_ids"].size
    batch = {key: np.concatenate([piece[key] for piece in pieces])
             for key in pieces[0] if key not in ("row_start", "row_index", "track_index")}
    # Indices of each piece move by the pieces before it; padding entries point past the end.
    for key, step, end in (("row_start", starts, None), ("row_index", cells, shards * cells),
                           ("track_index", tracks, shards * tracks)):
        moved = []
        for i, piece in enumerate(pieces):
            value = piece[key].astype(np.int64)
            if end is None:
                moved.append(value + i * step)
            else:
                moved.append(np.where(value < step, value + i * step, end))
        batch[key] = np.concatenate(moved).astype(np.int32)
    return batch


def row_keys(lengths: np.ndarray, tokens: np.ndarray, type_ids: np.ndarray) -> list[bytes]:
    """One key per row (its token ids and type ids): equal keys, equal encoder inputs."""
    ends = np.cumsum(lengths)
    return [tokens[end - n:end].tobytes() + type_ids[end - n:end].tobytes()
            for n, end in zip(lengths, ends)]


def unique_rows(keys: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """(index of the first row of each distinct key, distinct-row number of every row)."""
    numbers: dict[bytes, int] = {}
    inverse = np.asarray([numbers.setdefault(k, len(numbers)) for k in keys], dtype=np.int64)
    # Numbers are given in order of first appearance, so np.unique's first indices line up.
    return np.unique(inverse, return_index=True)[1].astype(np.int64), inverse


def _packed_token_arrays(rows: "_Rows", pack_length: int, pad_id: int, num_sequences: int | None,
                         num_rows: int | None, slots: int, dedup_rows: bool
                         ) -> dict[str, np.ndarray]:
    """Encoder arrays of the packed_tokens layout (module docstring) for the real ``rows``;
    with ``dedup_rows`` rows of equal tokens are packed once and share one ``row_start``."""
    n = rows.lengths.size
    if dedup_rows:
        first, inverse = unique_rows(row_keys(rows.lengths, rows.tokens, rows.type_ids))
    else:
        first, inverse = np.arange(n), np.arange(n)
    lengths = rows.lengths[first]
    sequence, offset, used = pack_rows(lengths, pack_length)
    N = used if num_sequences is None else num_sequences
    R = n if num_rows is None else num_rows
    if used > N or n > R:
        raise ValueError(f"{n} real rows packed into {used} sequences do not fit {R} rows in "
                         f"{N} sequences")
    input_ids = np.full(N * pack_length, pad_id, dtype=np.int32)
    token_type_ids = np.zeros(N * pack_length, dtype=np.int32)
    segment_ids = np.zeros(N * pack_length, dtype=np.int32)
    starts = (sequence * pack_length + offset).astype(np.int32)  # of the packed rows
    row_start = np.zeros(R, dtype=np.int32)
    row_start[:n] = starts[inverse]
    if first.size:
        # Segment k of a sequence is the k-th row placed in it (rows are placed left to right).
        u = first.size
        order = np.lexsort((offset, sequence))
        segment = np.empty(u, np.int32)
        firsts = np.r_[True, sequence[order][1:] != sequence[order][:-1]]
        counter = np.arange(u) - np.maximum.accumulate(np.where(firsts, np.arange(u), 0))
        segment[order] = counter + 1
        within = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        source = np.repeat((np.cumsum(rows.lengths) - rows.lengths)[first], lengths) + within
        target = np.repeat(starts, lengths) + within
        input_ids[target] = rows.tokens[source]
        token_type_ids[target] = rows.type_ids[source]
        segment_ids[target] = np.repeat(segment, lengths)
    row_index = np.full(R, slots, dtype=np.int32)
    row_index[:n] = rows.positions
    shape = (N, pack_length)
    return {"input_ids": input_ids.reshape(shape),
            "attention_mask": (segment_ids > 0).astype(np.int32).reshape(shape),
            "token_type_ids": token_type_ids.reshape(shape),
            "segment_ids": segment_ids.reshape(shape),
            "row_start": row_start, "row_index": row_index}


def pair_demand(pair: EncodedPair, dedup_rows: bool = False) -> tuple[int, int, int]:
    """(real rows, real tokens, real tracks) of one pair: what it adds to a packed_tokens batch
    (``dedup_rows``: tokens of its distinct rows only)."""
    tracks = sum(s.num_entities for s in pair.stories if s.num_sentences)
    lengths = pair_row_lengths(pair, dedup_rows)
    return pair.num_rows, int(lengths.sum()), tracks


def pair_row_keys(pair: EncodedPair) -> list[bytes]:
    """``row_keys`` of every row of both stories of ``pair``, in row order."""
    return [key for s in pair.stories for key in row_keys(s.lengths, s.tokens, s.type_ids)]


def pair_row_lengths(pair: EncodedPair, dedup_rows: bool = False) -> np.ndarray:
    """Token lengths of the rows of ``pair`` (``dedup_rows``: of its distinct rows)."""
    lengths = np.concatenate([s.lengths for s in pair.stories])
    if dedup_rows:
        lengths = lengths[unique_rows(pair_row_keys(pair))[0]]
    return lengths


@dataclasses.dataclass(frozen=True)
class _Rows:
    """The real rows of a batch: grid positions, lengths and concatenated tokens."""

    positions: np.ndarray  # int32 [N] flat (B, 2, E, S) index of each row
    lengths: np.ndarray    # int32 [N]
    tokens: np.ndarray     # int32 [sum(lengths)]
    type_ids: np.ndarray   # int32 [sum(lengths)]


def _row_arrays(rows: _Rows, members: np.ndarray, row_of: np.ndarray, row_index: np.ndarray,
                num_rows: int, seq_len: int, pad_id: int) -> dict[str, np.ndarray]:
    """Encoder arrays of ``num_rows`` x ``seq_len`` holding real row ``members[i]`` at row
    ``row_of[i]``; other rows hold pad tokens."""
    input_ids = np.full((num_rows, seq_len), pad_id, dtype=np.int32)
    attention_mask = np.zeros((num_rows, seq_len), dtype=np.int32)
    token_type_ids = np.zeros((num_rows, seq_len), dtype=np.int32)
    lengths = rows.lengths[members]
    if lengths.size:
        # Scatter the ragged rows in one go: token t of member i goes to (row_of[i], t).
        starts = (np.cumsum(rows.lengths) - rows.lengths)[members]
        within = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        source = np.repeat(starts, lengths) + within
        target = np.repeat(row_of, lengths)
        input_ids[target, within] = rows.tokens[source]
        attention_mask[target, within] = 1
        token_type_ids[target, within] = rows.type_ids[source]
    # Padding rows attend to their first (pad) token so that no row is fully masked.
    attention_mask[:, 0] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask,
            "token_type_ids": token_type_ids, "row_index": row_index.astype(np.int32)}


def track_index(row_mask: np.ndarray, num_tracks: int | None = None) -> np.ndarray:
    """Flat (B, 2, E) indices of the (story, entity) tracks that hold at least one real row.

    ``row_mask`` bool [B, 2, E, S]. Returns int32 [K], ascending, padded with B*2*E (one past
    the last track) up to ``num_tracks`` entries (default: exactly the real tracks); more real
    tracks than ``num_tracks`` is an error. The model's ``cells="real"`` runs the conflict
    detector on these tracks only.
    """
    row_mask = np.asarray(row_mask, bool)
    real = row_mask.reshape(-1, row_mask.shape[-1]).any(axis=-1)
    tracks = np.flatnonzero(real).astype(np.int32)
    num_tracks = tracks.size if num_tracks is None else num_tracks
    if tracks.size > num_tracks:
        raise ValueError(f"{tracks.size} real tracks do not fit {num_tracks} track entries")
    index = np.full(num_tracks, real.size, dtype=np.int32)
    index[:tracks.size] = tracks
    return index
