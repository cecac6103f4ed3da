"""Random encoded story pairs for the batching and packing tests.

``encoded_pairs(seed, count, entities=(lo, hi), sentences=(lo, hi), words=(lo, hi))``: ``count``
pairs (labels alternate 0, 1; the implausible story conflicts at its last sentence), each story
of random sizes drawn from the half-open ranges, encoded with a word-level tokenizer of their
words. The same arguments give the same pairs.
"""

import numpy as np

from trip_jax.data.features import encode_pairs, vocabulary_texts
from trip_jax.data.tokenizers import load_tokenizer
from trip_jax.data.types import Story, StoryPair, empty_states

WORDS = ("ann", "took", "the", "cup", "and", "put", "it", "in", "sink", "quickly", "very")


def _story(rng, story_id, plausible, entities, sentences, words):
    num_entities, num_sentences = int(rng.integers(*entities)), int(rng.integers(*sentences))
    texts = tuple(" ".join(rng.choice(WORDS, int(rng.integers(*words)))) + "."
                  for _ in range(num_sentences))
    states = empty_states(num_entities, num_sentences)
    states[rng.random(states.shape) < 0.05] = 1
    conflict = () if plausible else ((num_sentences - 3, num_sentences - 1),)
    return Story(story_id, texts, tuple(f"thing{e}" for e in range(num_entities)), states,
                 plausible, conflict)


def encoded_pairs(seed, count, *, entities, sentences, words):
    """The module docstring's pairs, encoded (``features.encode_pairs``)."""
    rng = np.random.default_rng(seed)
    pairs = []
    for i in range(count):
        label = i % 2
        pairs.append(StoryPair(f"p{i}", tuple(
            _story(rng, f"{i}-{k}", k == label, entities, sentences, words) for k in range(2)),
            label))
    return encode_pairs(pairs, load_tokenizer("word_level:bert", texts=vocabulary_texts(pairs)))
