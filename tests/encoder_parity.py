"""What every encoder family's parity test checks against Hugging Face's PyTorch model: random
token rows, a padded batch of them and a packed one (two rows a sequence), each compared with the
torch model's last hidden states within a tolerance."""

from __future__ import annotations

import jax
import numpy as np
import torch

from trip_jax.encoder_registry import build_encoder


def random_rows(lengths, vocab_size: int, seed: int = 0) -> list[np.ndarray]:
    """Rows of random token ids (2 .. vocab_size - 1) of the given lengths."""
    rs = np.random.RandomState(seed)
    return [rs.randint(2, vocab_size, n).astype(np.int32) for n in lengths]


def torch_hidden(model, ids, mask) -> np.ndarray:
    """The torch model's last hidden states of ``ids`` under ``mask``."""
    with torch.no_grad():
        return model(input_ids=torch.tensor(np.asarray(ids), dtype=torch.long),
                     attention_mask=torch.tensor(np.asarray(mask), dtype=torch.long)
                     ).last_hidden_state.numpy()


def assert_padded_rows_match(model, config, params, vocab_size: int, tol: float) -> None:
    """Rows of 12, 9 and 3 tokens padded to 12: ours equal torch's on every real token."""
    ids = np.zeros((3, 12), np.int32)
    mask = np.zeros_like(ids)
    for i, row in enumerate(random_rows([12, 9, 3], vocab_size)):
        ids[i, :len(row)], mask[i, :len(row)] = row, 1
    ours = jax.jit(build_encoder(config).apply)({"params": params}, ids, mask)
    diff = np.abs(np.asarray(ours) - torch_hidden(model, ids, mask)) * mask[..., None]
    assert diff.max() <= tol, diff.max()


def assert_packed_rows_match(model, config, params, vocab_size: int, tol: float) -> None:
    """Rows of 5, 12, 3 and 7 tokens packed two a sequence of 20 (segment ids 1, 2): each row's
    states equal torch's of that row alone."""
    rows = random_rows([5, 12, 3, 7], vocab_size, seed=1)
    # Two sequences of 20 tokens: rows 1+2 (17 tokens, 3 padding), rows 3+4 (10, 10 padding).
    ids, segments = np.zeros((2, 20), np.int32), np.zeros((2, 20), np.int32)
    starts = []
    for n, pair in enumerate(((0, 1), (2, 3))):
        at = 0
        for k, r in enumerate(pair):
            ids[n, at:at + len(rows[r])], segments[n, at:at + len(rows[r])] = rows[r], k + 1
            starts.append((n, at))
            at += len(rows[r])
    hidden = jax.jit(build_encoder(config).apply)(
        {"params": params}, ids, (segments > 0).astype(np.int32), segment_ids=segments)
    for row, (n, at) in zip(rows, starts):
        alone = torch_hidden(model, row[None], np.ones((1, len(row)), np.int32))[0]
        diff = np.abs(np.asarray(hidden[n, at:at + len(row)]) - alone).max()
        assert diff <= tol, diff
