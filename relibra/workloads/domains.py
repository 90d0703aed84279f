"""The sequences of one RL step: prompt groups drawn from the task domains with log-normal lengths, and each
prompt's mixture of its domain's topics."""

from __future__ import annotations

import numpy as np

from relibra.errors import ConfigError
from relibra.workloads.config import DOMAINS, WORKLOADS, WorkloadConfig


def domain_mix(workload: str, cfg: WorkloadConfig) -> tuple[np.ndarray, np.ndarray]:
    """The domains a workload draws from and their shares: (indices into DOMAINS int [d], weights float64 [d]
    summing to 1). `mixed` draws from every domain of non-zero mixed_domain_weights."""
    if workload not in WORKLOADS:
        raise ConfigError(f"unknown workload {workload!r}; known: {', '.join(WORKLOADS)}")
    if workload != "mixed":
        return np.array([DOMAINS.index(workload)]), np.array([1.0])
    weights = np.asarray(cfg.mixed_domain_weights, dtype=np.float64)
    return np.arange(len(DOMAINS))[weights > 0], weights[weights > 0] / weights.sum()


def draw_sequences(rng: np.random.Generator, domains: np.ndarray, weights: np.ndarray, min_tokens: int,
                    cfg: WorkloadConfig, min_sequences: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Draw prompt groups (one prompt, `responses_per_prompt` responses) until they hold `min_tokens`
    tokens and at least `min_sequences` sequences.

    domains: indices into DOMAINS the workload draws from, with `weights`. Returns, per sequence in
    batch order (a group's responses are adjacent, as RL frameworks lay out a rollout batch):
    (prompt group index, domain index, length in tokens = prompt + response), int64 [n] each, and
    int8 [n] how each length was cut: 1 = drawn above the maximum sequence (length_scale x
    max_sequence_tokens) and cut to it, as an RL rollout is truncated at its cap; -1 = drawn below 2
    tokens (a prompt and a response token) and raised to 2; 0 = as drawn.
    """
    prof = [cfg.profile(DOMAINS[i]) for i in domains]
    g = cfg.responses_per_prompt
    scale = cfg.length_scale
    mean_len = scale * sum(w * (p.prompt_tokens_median + p.response_tokens_median) for w, p in zip(weights, prof))
    doms, lens, cuts, total = [], [], [], 0
    count = 0
    while total < min_tokens or count < min_sequences:
        n = max(int((min_tokens - total) / (max(mean_len, 2.0) * g) * 1.2),
                -(-(min_sequences - count) // g), 0) + 1  # prompts
        which = rng.choice(len(domains), size=n, p=weights)
        pm, ps, rm, rs = (np.array([getattr(p, f) for p in prof])[which] for f in
                          ("prompt_tokens_median", "prompt_tokens_sigma", "response_tokens_median", "response_tokens_sigma"))
        prompt = scale * pm * np.exp(ps * rng.standard_normal(n))
        response = scale * rm[:, None] * np.exp(rs[:, None] * rng.standard_normal((n, g)))
        cap = max(2, int(round(scale * cfg.max_sequence_tokens)))
        drawn = np.rint(prompt[:, None] + response)
        cut = np.where(drawn > cap, 1, np.where(drawn < 2, -1, 0)).astype(np.int8)
        length = np.where(cut > 0, cap, np.where(cut < 0, 2, drawn)).astype(np.int64)
        doms.append(np.repeat(domains[which], g))
        lens.append(length.ravel())
        cuts.append(cut.ravel())
        total += int(length.sum())
        count += length.size
    seq_domain, seq_len = np.concatenate(doms), np.concatenate(lens)
    return np.arange(len(seq_len)) // g, seq_domain, seq_len, np.concatenate(cuts)


def topic_weights(rng: np.random.Generator, domain: np.ndarray, freq: np.ndarray, cfg: WorkloadConfig) -> np.ndarray:
    """Topic mixture of each prompt: float64 [n, domains * topics], non-zero only in its domain."""
    d, t = freq.shape
    alpha = cfg.topic_concentration * t * freq[domain]  # [n, t]: Dirichlet via normalized gammas
    gam = rng.standard_gamma(alpha)
    g_sum = gam.sum(axis=1, keepdims=True)
    # A row of all-zero gammas (possible at tiny alpha) falls back to the topic frequencies.
    gam = np.where(g_sum > 0, gam / np.where(g_sum > 0, g_sum, 1.0), freq[domain])
    out = np.zeros((len(domain), d * t))
    np.put_along_axis(out, domain[:, None] * t + np.arange(t)[None], gam, axis=1)
    return out


def mean_sequence_tokens(cfg: WorkloadConfig, workload: str) -> float:
    """Expected tokens of one sequence of a workload (log-normal means of prompt and response, before the cap)."""
    names = DOMAINS if workload == "mixed" else (workload,)
    w = np.asarray(cfg.mixed_domain_weights, dtype=np.float64) if workload == "mixed" else np.array([1.0])
    w = w / w.sum()
    profiles = [cfg.profile(d) for d in names]
    means = [p.prompt_tokens_median * np.exp(p.prompt_tokens_sigma ** 2 / 2)
             + p.response_tokens_median * np.exp(p.response_tokens_sigma ** 2 / 2) for p in profiles]
    return float(cfg.length_scale * np.dot(w, means))
