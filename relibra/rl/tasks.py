"""Verifiable synthetic tasks from four domains, a character tokenizer, and their reward functions.

Every prompt names its own answer, so a reward is computed from (prompt, response) alone:

| domain     | prompt      | a correct response            | stands in for             |
|------------|-------------|-------------------------------|---------------------------|
| arithmetic | `47+38=`    | `85`                          | math reasoning            |
| sorting    | `s4193=`    | `1349`                        | code / algorithmic        |
| copying    | `rkqtz=`    | `ztqk` (the letters reversed) | retrieval / copying       |
| format     | `f3u=`      | `[QXA]` (any 3 upper letters) | instruction following     |

Responses end with an end-of-sequence token; the string a verifier sees is what came before it.
Rewards lie in [0, 1]: 1.0 for a fully correct response, otherwise partial credit of at most 0.5
(see each verifier), so a correct answer always beats a near miss.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from relibra.errors import ConfigError

DOMAINS: tuple[str, ...] = ("arithmetic", "sorting", "copying", "format")

# ---- tokenizer -----------------------------------------------------------------------------------
PAD_ID = 0  # never routed, never in a loss
EOS_ID = 1  # ends every response
_CHARS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ+=[]"
VOCAB_SIZE = 2 + len(_CHARS)
_CHAR_TO_ID = {c: i + 2 for i, c in enumerate(_CHARS)}
_DIGITS = "0123456789"
_LOWER = "abcdefghijklmnopqrstuvwxyz"
_UPPER = _LOWER.upper()
_FORMAT_CLASSES = {"d": _DIGITS, "l": _LOWER, "u": _UPPER}

MAX_PROMPT_CHARS = 7  # "s12345=" or "rabcde="
MAX_RESPONSE_CHARS = 6  # "[ABCD]"


def encode(text: str) -> list[int]:
    """Token ids of `text`; a ConfigError names the first character outside the vocabulary."""
    try:
        return [_CHAR_TO_ID[c] for c in text]
    except KeyError as exc:
        raise ConfigError(f"character {exc.args[0]!r} is not in the RL tokenizer's vocabulary") from None


def decode(ids) -> str:
    """Text of token ids, stopping at the first EOS; PAD ids are skipped."""
    out = []
    for i in ids:
        i = int(i)
        if i == EOS_ID:
            break
        if i >= 2:
            out.append(_CHARS[i - 2])
    return "".join(out)


# ---- tasks ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Task:
    """One prompt with one correct response (the supervised warm-up's target; RL only uses the verifier)."""

    domain: str
    prompt: str
    reference: str


def domain_of(prompt: str) -> str:
    """The domain a prompt belongs to, read from its first character."""
    if prompt[:1] == "s":
        return "sorting"
    if prompt[:1] == "r":
        return "copying"
    if prompt[:1] == "f":
        return "format"
    if prompt[:1].isdigit():
        return "arithmetic"
    raise ConfigError(f"prompt {prompt!r} belongs to no RL task domain")


def _make_task(domain: str, rng: np.random.Generator) -> Task:
    if domain == "arithmetic":
        a, b = (int(x) for x in rng.integers(0, 100, size=2))
        return Task(domain, f"{a}+{b}=", str(a + b))
    if domain == "sorting":
        digits = "".join(rng.choice(list(_DIGITS), size=int(rng.integers(3, 6))))
        return Task(domain, f"s{digits}=", "".join(sorted(digits)))
    if domain == "copying":
        letters = "".join(rng.choice(list(_LOWER), size=int(rng.integers(3, 6))))
        return Task(domain, f"r{letters}=", letters[::-1])
    if domain == "format":
        n = int(rng.integers(1, 5))
        cls = str(rng.choice(list(_FORMAT_CLASSES)))
        body = "".join(rng.choice(list(_FORMAT_CLASSES[cls]), size=n))
        return Task(domain, f"f{n}{cls}=", f"[{body}]")
    raise ConfigError(f"unknown RL task domain {domain!r}; known: {', '.join(DOMAINS)}")


def check_domains(domains) -> tuple[str, ...]:
    """Validated, de-duplicated domain names in the given order."""
    out = tuple(dict.fromkeys(domains))
    if not out:
        raise ConfigError("at least one RL task domain is needed")
    for d in out:
        if d not in DOMAINS:
            raise ConfigError(f"unknown RL task domain {d!r}; known: {', '.join(DOMAINS)}")
    return out


def sample_tasks(rng: np.random.Generator, n: int, domains=DOMAINS) -> list[Task]:
    """`n` tasks, each from a domain drawn uniformly from `domains`."""
    domains = check_domains(domains)
    picks = rng.integers(0, len(domains), size=n)
    return [_make_task(domains[int(i)], rng) for i in picks]


# ---- verifiers -----------------------------------------------------------------------------------
def _positional_credit(response: str, answer: str) -> float:
    """Half a point times the share of positions that match, over the longer of the two strings."""
    if not answer and not response:
        return 1.0
    hits = sum(a == b for a, b in zip(response, answer))
    return 0.5 * hits / max(len(response), len(answer))


def _exact_or_partial(response: str, answer: str) -> float:
    return 1.0 if response == answer else _positional_credit(response, answer)


def reward_arithmetic(prompt: str, response: str) -> float:
    """`a+b=`: 1.0 for the exact decimal sum, else positional partial credit (<= 0.5)."""
    a, b = prompt[:-1].split("+")
    return _exact_or_partial(response, str(int(a) + int(b)))


def reward_sorting(prompt: str, response: str) -> float:
    """`s<digits>=`: 1.0 for the digits in ascending order, else positional partial credit."""
    return _exact_or_partial(response, "".join(sorted(prompt[1:-1])))


def reward_copying(prompt: str, response: str) -> float:
    """`r<letters>=`: 1.0 for the letters reversed, else positional partial credit."""
    return _exact_or_partial(response, prompt[1:-1][::-1])


def reward_format(prompt: str, response: str) -> float:
    """`f<n><class>=`: any `[` + n characters of the class (d digit, l lower, u upper) + `]`.

    1.0 when all four checks pass (opens with `[`, closes with `]`, n characters inside, all of
    the class); otherwise 0.5 x (checks passed) / 4.
    """
    n, cls = int(prompt[1]), prompt[2]
    inner = response[1:-1] if len(response) >= 2 else ""
    checks = [response.startswith("["), len(response) >= 2 and response.endswith("]"), len(inner) == n,
              len(inner) > 0 and all(c in _FORMAT_CLASSES[cls] for c in inner)]
    return 1.0 if all(checks) else 0.5 * sum(checks) / len(checks)


_VERIFIERS = {"arithmetic": reward_arithmetic, "sorting": reward_sorting, "copying": reward_copying,
              "format": reward_format}


def reward(prompt: str, response: str) -> float:
    """Verified reward in [0, 1] of `response` (text before EOS) to `prompt`."""
    return float(_VERIFIERS[domain_of(prompt)](prompt, response))
