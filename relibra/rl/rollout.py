"""Rollout: sample responses with a KV cache and record every input token's experts per layer.

The prompts are left-padded to one length and run in one prefill pass; then each step feeds one
sampled token per unfinished sequence. Routers run in RECORD mode, so every token that enters the
model (all prompt tokens and every generated token except the last, which is never fed back) gets
its top-k expert ids per layer recorded. That is exactly the set of input tokens the training
forward will route, so training can replay them one to one (SGLang's `routed_experts` likewise
holds seq_len - 1 entries per sample).

Arrays are laid out for training: sequence b is `sequences[b, :seq_len[b]]` (prompt then response,
right-padded with PAD); input position t (t < seq_len - 1) predicts token t + 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from relibra.errors import ConfigError
from relibra.rl.model import MoEPolicy
from relibra.rl.replay import RouterReplayAction, pop_recorded, set_action
from relibra.rl.tasks import EOS_ID, PAD_ID, decode, encode, reward


@dataclass
class Rollout:
    """Sampled responses of one batch of prompts, with what training needs to replay them.

    prompts: N prompt strings; responses: N response strings (text before EOS); rewards: float [N].
    sequences: int64 [N, T_max] prompt + response tokens, PAD after seq_len.
    prompt_len, seq_len: int64 [N] (seq_len counts the EOS when one was sampled).
    old_logprobs: float32 [N, T_max - 1]; at input position t the rollout's log-probability of
        token t + 1, for the response positions prompt_len - 1 <= t < seq_len - 1; 0 elsewhere.
    routing: int16 [N, T_max - 1, layers, top_k]; experts of input token t for t < seq_len - 1,
        in the router's top-k order; -1 elsewhere.
    """

    prompts: list[str]
    responses: list[str]
    rewards: np.ndarray
    sequences: torch.Tensor
    prompt_len: np.ndarray
    seq_len: np.ndarray
    old_logprobs: torch.Tensor
    routing: np.ndarray

    @property
    def input_mask(self) -> np.ndarray:
        """bool [N, T_max - 1]: input positions that are real tokens (hence routed)."""
        t = np.arange(self.sequences.shape[1] - 1)
        return t[None, :] < (self.seq_len - 1)[:, None]

    @property
    def response_mask(self) -> np.ndarray:
        """bool [N, T_max - 1]: input positions whose next token is a response token (the loss positions)."""
        t = np.arange(self.sequences.shape[1] - 1)
        return self.input_mask & (t[None, :] >= (self.prompt_len - 1)[:, None])


@torch.no_grad()
def generate(model: MoEPolicy, prompts: list[str], max_new_tokens: int, generator: torch.Generator | None = None,
             temperature: float = 1.0, greedy: bool = False, record: bool = True) -> Rollout:
    """Sample (or, with greedy, take the argmax of) up to `max_new_tokens` tokens per prompt.

    Sampling draws from `generator` only, so the same generator state gives the same responses.
    With record=False routing is not recorded and `routing` is all -1.
    """
    if max_new_tokens <= 0:
        raise ConfigError(f"rollout: max_new_tokens must be positive, got {max_new_tokens}")
    if temperature <= 0:
        raise ConfigError(f"rollout: temperature must be positive, got {temperature}")
    cfg = model.cfg
    enc = [encode(p) for p in prompts]
    n = len(enc)
    prompt_len = np.array([len(e) for e in enc], dtype=np.int64)
    width = int(prompt_len.max())
    if width + max_new_tokens - 1 > cfg.max_seq_len:
        raise ConfigError(f"rollout: prompts of {width} tokens plus {max_new_tokens} new tokens exceed the "
                          f"policy's {cfg.max_seq_len} positions")
    t_max = width + max_new_tokens
    routing = np.full((n, t_max - 1, cfg.num_layers, cfg.top_k), -1, dtype=np.int16)
    replays = model.replays
    set_action(replays, RouterReplayAction.RECORD if record else None)

    # Prefill: prompts right-aligned; a pad position may attend only to itself (keeps softmax finite).
    left_pad = width - prompt_len
    tokens = torch.full((n, width), PAD_ID, dtype=torch.long)
    for b, e in enumerate(enc):
        tokens[b, left_pad[b]:] = torch.tensor(e)
    col = np.arange(width)
    valid_np = col[None, :] >= left_pad[:, None]
    key_valid = torch.from_numpy(valid_np)
    positions = torch.from_numpy(np.maximum(col[None, :] - left_pad[:, None], 0))
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    attn = (causal[None] & key_valid[:, None, :]) | torch.eye(width, dtype=torch.bool)[None]
    logits, _, caches = model(tokens, positions, key_valid, attn[:, None])
    if record:
        (ids,) = pop_recorded(replays)  # [prompt tokens, L, K], row-major over valid (b, col)
        rows, cols = np.nonzero(valid_np)
        routing[rows, cols - left_pad[rows]] = ids.numpy()

    next_logits = logits[:, -1]
    done = torch.zeros(n, dtype=torch.bool)
    response = torch.full((n, max_new_tokens), PAD_ID, dtype=torch.long)
    response_logp = torch.zeros(n, max_new_tokens)
    for j in range(max_new_tokens):
        logp_all = torch.log_softmax(next_logits / temperature, dim=-1)
        if greedy:
            tok = logp_all.argmax(dim=-1)
        else:
            tok = torch.multinomial(logp_all.exp(), 1, generator=generator).squeeze(1)
        logp = logp_all.gather(1, tok[:, None]).squeeze(1)
        tok = torch.where(done, PAD_ID, tok)
        response[:, j] = tok
        response_logp[:, j] = torch.where(done, 0.0, logp)
        done = done | (tok == EOS_ID)
        if j == max_new_tokens - 1 or bool(done.all()):
            break
        feed = ~done  # finished sequences get a PAD that is neither routed nor attended to later
        key_valid = torch.cat([key_valid, feed[:, None]], dim=1)
        attn = key_valid.clone()
        attn[:, -1] = True
        positions = torch.from_numpy(prompt_len + j)[:, None]
        logits, _, caches = model(tok[:, None], positions, feed[:, None], attn[:, None, None, :], caches)
        if record:
            (ids,) = pop_recorded(replays)  # [fed tokens, L, K]
            fed = np.nonzero(feed.numpy())[0]
            routing[fed, prompt_len[fed] + j] = ids.numpy()
        next_logits = logits[:, -1]
    set_action(replays, None)

    # Lay the sequences out for training: prompt then response, right-padded.
    is_eos = (response == EOS_ID).numpy()
    has_eos = is_eos.any(axis=1)
    resp_len = np.where(has_eos, is_eos.argmax(axis=1) + 1, (response != PAD_ID).sum(dim=1).numpy())
    seq_len = prompt_len + resp_len
    sequences = torch.full((n, t_max), PAD_ID, dtype=torch.long)
    old_logprobs = torch.zeros(n, t_max - 1)
    for b in range(n):
        p, r = int(prompt_len[b]), int(resp_len[b])
        sequences[b, :p] = torch.tensor(enc[b])
        sequences[b, p:p + r] = response[b, :r]
        old_logprobs[b, p - 1:p - 1 + r] = response_logp[b, :r]
    responses = [decode(response[b, : int(resp_len[b])].tolist()) for b in range(n)]
    rewards = np.array([reward(p, r) for p, r in zip(prompts, responses)], dtype=np.float64)
    out = Rollout(prompts, responses, rewards, sequences, prompt_len, seq_len, old_logprobs, routing)
    if record and (routing[out.input_mask] < 0).any():
        raise AssertionError("rollout left an input token without recorded routing")  # a bug, not bad input
    return out
