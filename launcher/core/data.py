"""Token data: a built-in synthetic stream or a local text file, sharded across data-parallel ranks.

Sample `i` of the global stream is a fixed function of (source, seed, i), so a step's global batch is samples
`[step*global_batch, (step+1)*global_batch)` whatever the layout; data-parallel rank r takes its contiguous
slice of it. The position (`samples_seen`) is saved in checkpoints, so a resumed run continues the same
stream.
"""

from __future__ import annotations

from pathlib import Path

import torch


class ByteTokenizer:
    """UTF-8 bytes as tokens 0..255 (needs vocab >= 256)."""

    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))


class HFTokenizer:
    """A local Hugging Face `tokenizer.json` through the `tokenizers` package (no download)."""

    def __init__(self, path: str) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise RuntimeError(
                "tokenizer given but the 'tokenizers' package is not installed "
                "(pip install tokenizers), or drop tokenizer to use bytes"
            ) from None
        self._tok = Tokenizer.from_file(path)
        self.vocab_size = self._tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids


class TokenSource:
    """Sample `i` (seq_len + 1 tokens: inputs and shifted labels) of a deterministic stream."""

    def __init__(
        self, source: str, vocab: int, seq_len: int, seed: int, tokenizer: str | None = None
    ) -> None:
        self.vocab, self.seq_len, self.seed = vocab, seq_len, seed
        self.tokens: torch.Tensor | None = None
        if source != "synthetic":
            path = Path(source)
            if not path.is_file():
                raise FileNotFoundError(f"data file not found: {path}")
            tok = HFTokenizer(tokenizer) if tokenizer else ByteTokenizer()
            if tok.vocab_size > vocab:
                raise ValueError(f"tokenizer has {tok.vocab_size} tokens but the model's vocab is {vocab}")
            self.tokens = torch.tensor(tok.encode(path.read_text(errors="replace")), dtype=torch.long)
            if len(self.tokens) < seq_len + 2:
                raise ValueError(
                    f"{path} has {len(self.tokens)} tokens, fewer than seq_len+2 ({seq_len + 2})"
                )

    def sample(self, index: int) -> torch.Tensor:
        n = self.seq_len + 1
        if self.tokens is not None:
            span = len(self.tokens) - n
            start = (index * self.seq_len) % (span + 1)
            return self.tokens[start : start + n]
        # Synthetic: learnable arithmetic sequences with noise, fixed by (seed, index).
        gen = torch.Generator().manual_seed(self.seed * 7_919 + index + 1)
        start, stride = torch.randint(0, self.vocab, (2,), generator=gen).tolist()
        seq = (start + (stride % 7 + 1) * torch.arange(n)) % self.vocab
        noise = torch.rand(n, generator=gen) < 0.1
        return torch.where(noise, torch.randint(0, self.vocab, (n,), generator=gen), seq)


class ShardedLoader:
    """Per-step local batches for one data-parallel rank, with a resumable position."""

    def __init__(self, source: TokenSource, global_batch: int, dp_rank: int, dp_size: int) -> None:
        self.source = source
        self.global_batch = global_batch
        self.local_batch = global_batch // dp_size
        self.dp_rank = dp_rank
        self.samples_seen = 0

    def next_batch(self) -> torch.Tensor:
        """(local_batch, seq_len + 1) tokens of the next global step."""
        first = self.samples_seen + self.dp_rank * self.local_batch
        batch = torch.stack([self.source.sample(first + i) for i in range(self.local_batch)])
        self.samples_seen += self.global_batch
        return batch

    def state_dict(self) -> dict[str, int]:
        return {"samples_seen": self.samples_seen}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.samples_seen = int(state["samples_seen"])
