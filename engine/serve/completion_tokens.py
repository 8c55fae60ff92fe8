"""The tokens of the OpenAI-compatible API (:mod:`isan.engine.serve.completions`): the model's symbols
as token ids 0..V-1 and V for ``<|endoftext|>`` (:class:`Tokens`), and a request's ``prompt`` read
into :class:`Prompt` values, checked against the served model's limits (:func:`read_prompts`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from isan.engine.serve.completion_schemas import EOT
from isan.engine.serve.errors import RequestError


# ---- tokens -------------------------------------------------------------------------------------
class Tokens:
    """The model's symbols as OpenAI tokens (ids 0..V-1 and V for ``<|endoftext|>``)."""

    def __init__(self, alphabet):
        self.alphabet = alphabet
        self.kind = getattr(alphabet, "kind", "chars")
        self.V = len(alphabet)
        if self.kind == "bytes":
            self.strs = [chr(b) if b < 128 else f"bytes:\\x{b:02x}" for b in range(256)]
        elif self.kind == "chars":
            self.strs = list(alphabet.symbols)
        else:
            self.strs = [alphabet.decode(np.array([i])) for i in range(self.V)]
        self.strs.append(EOT)
        # token strings as dictionary keys must be distinct (top_logprobs)
        if len(set(self.strs)) != len(self.strs):
            seen: dict[str, int] = {}
            for i, s in enumerate(self.strs):
                if s in seen:
                    self.strs[i] = f"{s}#{i}"
                seen[s] = i

    def decode(self, ids) -> str:
        """The text of token ids (``<|endoftext|>`` for V)."""
        out, run = [], []
        for i in ids:
            if int(i) == self.V:
                if run:
                    out.append(self.alphabet.decode(np.asarray(run)))
                    run = []
                out.append(EOT)
            else:
                run.append(int(i))
        if run:
            out.append(self.alphabet.decode(np.asarray(run)))
        return "".join(out)

    def offsets(self, ids: np.ndarray) -> np.ndarray:
        """The offset in ``decode(ids)`` where each token's text starts."""
        ids = np.asarray(ids, dtype=np.int64)
        if len(ids) == 0:
            return np.zeros(0, dtype=np.int64)
        if self.kind == "chars" and not (ids == self.V).any():
            return np.arange(len(ids), dtype=np.int64)
        out = np.empty(len(ids), dtype=np.int64)
        pos = 0
        if self.kind == "bytes":  # a byte belongs to the character its lead byte starts
            for k, i in enumerate(ids):
                if i == self.V:
                    out[k] = pos
                    pos += len(EOT)
                else:
                    lead = (int(i) & 0xC0) != 0x80
                    out[k] = pos if lead or k == 0 else out[k - 1]
                    pos += 1 if lead else 0
            return out
        for k, i in enumerate(ids):
            out[k] = pos
            pos += len(EOT) if i == self.V else len(self.alphabet.decode(np.array([int(i)])))
        return out


@dataclass
class Prompt:
    """One prompt: its text (as echoed), its token ids (a leading ``<|endoftext|>`` stripped into ``bos``)."""

    text: str | None = None  # a string prompt (read by the normaliser)
    ids: np.ndarray | None = None  # token ids to score (no EOT)
    bos: bool = False


def exact_int(v) -> int | None:
    """``v`` as an int when it is an int or an integral float (not a bool), else None."""
    if type(v) is int:
        return v
    if type(v) is float and v.is_integer():
        return int(v)
    return None


def read_prompts(prompt, V: int, max_chars: int, max_prompts: int) -> list[Prompt]:
    """The prompts of a request's ``prompt`` (checked: 400 for a bad form, 413 over a limit, 422 for
    ``<|endoftext|>`` after the start)."""
    form = (f'"prompt" must be a string, a list of strings, a list of token ids (integers 0..{V}) or a list of such '
            "lists")

    def ids_of(x, where: str) -> Prompt:
        if not x:
            raise RequestError(400, f'{where} is an empty list; give at least one token id', {"param": "prompt"})
        vals = [exact_int(v) for v in x]
        if any(v is None for v in vals):
            raise RequestError(400, form, {"param": "prompt"})
        if len(vals) > max_chars:
            raise RequestError(413, f"{where} has {len(vals):,} tokens; the limit is {max_chars:,} (split it)",
                               {"param": "prompt"})
        if any(not 0 <= v <= V for v in vals):
            raise RequestError(400, f"{where} has a token id outside 0..{V}; use ids of GET /tokenizer_info's "
                                    "vocabulary (POST /tokenize)", {"param": "prompt"})
        bos = vals[0] == V
        rest = np.asarray(vals[1:] if bos else vals, dtype=np.int32)
        if (rest == V).any():
            k = int(np.argmax(rest == V)) + (1 if bos else 0)
            raise RequestError(422, f"{where}: {EOT} (token id {V}) at position {k}; it stands for the initial state "
                                    "and must only start a prompt: split the prompt there", {"param": "prompt"})
        return Prompt(ids=rest, bos=bos)

    if isinstance(prompt, str):
        if len(prompt) > max_chars:
            raise RequestError(413, f'"prompt" has {len(prompt):,} characters; the limit is {max_chars:,} (split it)',
                               {"param": "prompt"})
        return [Prompt(text=prompt)]
    if not isinstance(prompt, list) or not prompt:
        raise RequestError(400, form if not isinstance(prompt, list) else '"prompt" is an empty list; give a text',
                           {"param": "prompt"})
    if all(isinstance(p, str) for p in prompt) or all(isinstance(p, list) for p in prompt):
        if len(prompt) > max_prompts:
            raise RequestError(413, f'"prompt" has {len(prompt):,} prompts; the limit is {max_prompts:,} a request '
                                    "(--max-batch-texts): send several requests", {"param": "prompt"})
        if isinstance(prompt[0], str):
            total = sum(len(p) for p in prompt)
            if total > max_chars:
                raise RequestError(413, f'the prompts have {total:,} characters in all; the limit is {max_chars:,} a '
                                        "request (--max-chars): send several requests", {"param": "prompt"})
            return [Prompt(text=p) for p in prompt]
        out = [ids_of(p, f"prompt[{i}]") for i, p in enumerate(prompt)]
        total = sum(len(p.ids) for p in out)
        if total > max_chars:
            raise RequestError(413, f"the prompts have {total:,} tokens in all; the limit is {max_chars:,} a request "
                                    "(--max-chars): send several requests", {"param": "prompt"})
        return out
    return [ids_of(prompt, '"prompt"')]
