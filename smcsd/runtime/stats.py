"""`DecodeStats` and `DecodeResult`. Metric names and definitions follow vLLM's spec-decode metrics.

- num_target_calls: batched target forward passes in the decode loop (the prefill is counted
  separately in num_prefill_calls, as vLLM does). One call serves every row of the batch.
- tokens_per_target_call: per request, tokens produced by decode-loop target calls divided by the
  calls made while that request was live, summed over requests: sum_b (n_b - 1) / sum_b calls_b
  (the first token of each request comes from the prefill). `ar`: exactly 1; `smc`: K+1 per cycle.
- num_drafts: draft blocks proposed (one per live row per cycle); num_draft_tokens: tokens in them (those verified,
  under `sd`'s confidence cut or `flex`'s);
  num_accepted_tokens: draft tokens accepted; acceptance_rate = accepted / drafted;
  mean_acceptance_length = 1 + accepted / num_drafts; accepted_per_position[k] = drafts whose
  k-th token was accepted.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np


@dataclasses.dataclass
class DecodeStats:
    method: str = "ar"
    batch_size: int = 0
    num_generated_tokens: int = 0
    num_prefill_calls: int = 0
    num_target_calls: int = 0
    num_draft_calls: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list = dataclasses.field(default_factory=list)
    acceptance_rate: float = float("nan")
    mean_acceptance_length: float = float("nan")
    tokens_per_target_call: float = float("nan")
    wall_time_s: float = 0.0
    tokens_per_s: float = 0.0
    compile_time_s: float = 0.0
    cache_len: int = 0
    target_calls_per_request: list | None = None  # live target calls of each request (speculative methods)
    # SMC-SD only (how to read them: docs/smc_proposals.md, "Reading an smc run")
    num_particles: int | None = None  # N particles per request
    ess_per_cycle: list | None = None  # [num_cycles][batch]: ESS before the resampling test
    resampled_per_cycle: list | None = None  # [num_cycles][batch] bools
    num_resamples: int | None = None
    log_z: list | None = None  # per request, running log Z-hat
    all_weights_neg_inf: list | None = None  # per request: every particle had weight -inf at some cycle

    def summary(self) -> str:
        """One line for logs and the CLI."""
        parts = [f"{self.method}", f"{self.num_generated_tokens} tok", f"{self.tokens_per_s:.1f} tok/s",
                 f"{self.num_target_calls} target calls", f"{self.tokens_per_target_call:.2f} tok/call"]
        if self.num_drafts:
            parts.append(f"accept {self.acceptance_rate:.2f}")
            parts.append(f"mean accept len {self.mean_acceptance_length:.2f}")
        if self.num_resamples is not None:
            parts.append(f"{self.num_resamples} resamples")
        if self.ess_per_cycle and self.num_particles:
            parts.append(f"ESS/N {self.mean_ess_fraction:.2f}")
            parts.append(f"resample rate {self.resample_rate:.2f}")
        parts.append(f"compile {self.compile_time_s:.1f}s")
        return " | ".join(parts)

    def _per_request(self, values) -> list:
        """Per request, `values` ([cycles][requests]) over the cycles it was live (its first
        target_calls_per_request[b] cycles)."""
        v = np.asarray(values, np.float64)
        calls = self.target_calls_per_request or [len(v)] * (v.shape[1] if v.ndim == 2 else 0)
        return [v[:int(c), b] for b, c in enumerate(calls)]

    def _live_mean(self, values, scale: float = 1.0) -> float:
        vals = np.concatenate(self._per_request(values) or [np.zeros(0)])
        return float(vals.mean() / scale) if len(vals) else float("nan")

    @property
    def ess_fraction_per_request(self) -> list | None:
        """smc: per request, the mean of ESS / N over the cycles it was live (1: the weights stayed even; near
        1/N: one particle carried all the weight, cycle after cycle)."""
        if not self.ess_per_cycle or not self.num_particles:
            return None
        return [float(v.mean() / self.num_particles) if len(v) else float("nan")
                for v in self._per_request(self.ess_per_cycle)]

    @property
    def mean_ess_fraction(self) -> float:
        """smc: mean ESS / N over every request's live cycles (nan for other methods)."""
        if not self.ess_per_cycle or not self.num_particles:
            return float("nan")
        return self._live_mean(self.ess_per_cycle, self.num_particles)

    @property
    def resample_rate(self) -> float:
        """smc: the fraction of live request-cycles that resampled (nan for other methods)."""
        return self._live_mean(self.resampled_per_cycle) if self.resampled_per_cycle else float("nan")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        if self.ess_per_cycle is not None:
            d.update(mean_ess_fraction=self.mean_ess_fraction, resample_rate=self.resample_rate,
                     ess_fraction_per_request=self.ess_fraction_per_request)
        return d


@dataclasses.dataclass
class DecodeResult:
    """`tokens`: per request, the new token ids only (EOS included when emitted), in request order.
    `texts`: decoded `tokens` when the target has a tokenizer, else None. `stats`: `DecodeStats`.
    With `return_particles=True` (smc): `particles[b][i]` token lists and `log_weights[b][i]`."""

    tokens: list
    texts: list | None
    stats: DecodeStats
    particles: list | None = None
    log_weights: Any = None

    def __repr__(self):
        shown = self.texts if self.texts is not None else self.tokens
        return f"DecodeResult({shown!r}, stats={self.stats.summary()!r})"


def finish_stats(stats: DecodeStats, raw: dict, lengths: np.ndarray) -> DecodeStats:
    """Fill the derived rates from raw counters returned by a compiled program."""
    stats.num_generated_tokens = int(lengths.sum())
    for name in ("num_target_calls", "num_draft_calls", "num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        if name in raw:
            setattr(stats, name, int(np.asarray(raw[name]).sum()) if name != "num_target_calls"
                    else int(np.asarray(raw[name])))
    if "accepted_per_position" in raw:
        stats.accepted_per_position = [int(x) for x in np.asarray(raw["accepted_per_position"]).reshape(-1)]
    if stats.num_draft_tokens:
        stats.acceptance_rate = stats.num_accepted_tokens / stats.num_draft_tokens
    if stats.num_drafts:
        stats.mean_acceptance_length = 1.0 + stats.num_accepted_tokens / stats.num_drafts
    if "live_calls" in raw:
        stats.target_calls_per_request = [int(x) for x in np.asarray(raw["live_calls"]).reshape(-1)]
    live_calls = int(np.asarray(raw.get("live_calls", 0)).sum())
    if live_calls:
        stats.tokens_per_target_call = float(np.maximum(lengths - 1, 0).sum()) / live_calls
    if stats.wall_time_s > 0:
        stats.tokens_per_s = stats.num_generated_tokens / stats.wall_time_s
    return stats


def unpack_result(raw, spec, target, compile_s: float = 0.0, wall: float = 0.0) -> DecodeResult:
    """A program's raw output (tokens, lengths, stats; on the host) as the `DecodeResult` `decode` returns, for the
    `StaticSpec` it ran with and its target `LanguageModel` (whose tokenizer decodes the texts)."""
    tokens_arr = np.asarray(raw["tokens"])
    lengths = np.asarray(raw["lengths"])
    tokens = [tokens_arr[b, :lengths[b]].tolist() for b in range(spec.batch)]
    tok = target.tokenizer
    texts = [tok.decode(t) for t in tokens] if tok is not None else None
    stats = DecodeStats(method=spec.method, batch_size=spec.batch, num_prefill_calls=1, wall_time_s=wall,
                        compile_time_s=compile_s, cache_len=spec.cache_len)
    stats = finish_stats(stats, raw.get("stats", {}), lengths)
    for name in ("ess_per_cycle", "resampled_per_cycle", "log_z", "all_weights_neg_inf"):
        if name in raw.get("stats", {}):
            value = np.asarray(raw["stats"][name])
            if name in ("ess_per_cycle", "resampled_per_cycle"):  # fixed-size buffers: keep the cycles run
                value = value[:int(np.asarray(raw["stats"].get("num_target_calls", len(value))))]
            setattr(stats, name, value.tolist())
    if "num_resamples" in raw.get("stats", {}):
        stats.num_resamples = int(np.asarray(raw["stats"]["num_resamples"]).sum())
        stats.num_particles = int(spec.num_particles)
    particles = log_weights = None
    if spec.return_particles and "particles" in raw:
        p_tok, p_len = np.asarray(raw["particles"]), np.asarray(raw["particle_lengths"])
        particles = [[p_tok[b, i, :p_len[b, i]].tolist() for i in range(p_tok.shape[1])] for b in range(spec.batch)]
        log_weights = np.asarray(raw["log_weights"])
    return DecodeResult(tokens=tokens, texts=texts, stats=stats, particles=particles, log_weights=log_weights)
