"""The tiny-code pair's data: the Python source of the running interpreter's standard library, split by file into
training and held-out files (a deterministic hash of the path), and read as byte-token rows.

Shared by the pair's training (train/pair.py), the drafters trained on it and the studies that prompt it with
held-out code, so they all agree on the split. Byte tokens: one token per byte, BOS/EOS around each file.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig

import numpy as np

from smcsd.models import ByteTokenizer

TOK = ByteTokenizer()
BOS, EOS, PAD = TOK.bos_id, TOK.eos_id, TOK.pad_id


def is_heldout(relpath: str, percent: int = 5) -> bool:
    """Deterministic split by file: sha1 of the path relative to the stdlib root."""
    return int(hashlib.sha1(relpath.encode()).hexdigest()[:8], 16) % 100 < percent


def stdlib_files(max_bytes: int = 1_000_000) -> list[tuple[str, str]]:
    """(relative path, absolute path) of the interpreter's standard-library .py files, sorted."""
    root = sysconfig.get_paths()["stdlib"]
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__"))
        for f in sorted(filenames):
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                if os.path.getsize(path) <= max_bytes:
                    out.append((os.path.relpath(path, root), path))
    return out


class CodeData:
    """Random windows of the concatenated training files, each row = [BOS] + seq_len bytes."""

    def __init__(self, seq_len: int, seed: int = 0):
        self.seq_len, self.seed = seq_len, seed
        train, held = [], []
        for rel, path in stdlib_files():
            with open(path, "rb") as f:
                data = f.read()
            (held if is_heldout(rel) else train).append(np.frombuffer(data, np.uint8).astype(np.int32))
        self.num_files = (len(train), len(held))
        self.train = self._stream(train)
        self.heldout = self._stream(held)

    @staticmethod
    def _stream(arrays):
        parts = []
        for a in arrays:
            parts += [np.array([BOS], np.int32), a, np.array([EOS], np.int32)]
        return np.concatenate(parts)

    def _windows(self, stream, starts):
        rows = np.empty((len(starts), self.seq_len + 1), np.int32)
        rows[:, 0] = BOS
        for i, s in enumerate(starts):
            rows[i, 1:] = stream[s:s + self.seq_len]
        return rows

    def batch(self, step: int, n: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, step, 0xC0DE])
        return self._windows(self.train, rng.integers(0, len(self.train) - self.seq_len, n))

    def eval_rows(self, n: int = 64) -> np.ndarray:
        """A fixed sample of held-out windows (the same for every run)."""
        rng = np.random.default_rng(1234)
        return self._windows(self.heldout, rng.integers(0, len(self.heldout) - self.seq_len, n))

    def heldout_prompts(self, count: int, prompt_bytes: int = 64, seed: int = 99) -> list[list[int]]:
        """`count` prompts of [BOS] + `prompt_bytes` bytes from the held-out files (token ids, as in training): a
        fixed sample per seed, what the decoded studies start from."""
        starts = np.random.default_rng(seed).integers(0, len(self.heldout) - prompt_bytes, count)
        return [[BOS] + self.heldout[s:s + prompt_bytes].tolist() for s in starts]

    def describe(self) -> dict:
        return {"source": sysconfig.get_paths()["stdlib"], "train_files": self.num_files[0],
                "heldout_files": self.num_files[1], "train_bytes": int(len(self.train)),
                "heldout_bytes": int(len(self.heldout)), "split": "sha1(relpath) % 100 < 5 -> held out"}
