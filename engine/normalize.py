"""Text normalisation: named, versioned steps that a model's manifest declares.

A model sees text only through its alphabet. The text8 models were trained on Matt Mahoney's
text8, which his ``wikifil.pl`` produced from Wikipedia; real text (capitals, digits,
punctuation, newlines) has to go through the same mapping before such a model can score it.
Every engine call (``score``, ``score_batch``, ``advance``, ``sample``'s prompt,
``attribute``) takes ``normalize``:

* ``"auto"`` (the default): the normaliser the bundle's manifest declares
  (``"normalizer": {"name": "text8", "version": 1}``); a bundle without the field declares
  ``"none"``;
* ``"none"``: raw text, each character must be a symbol of the alphabet (or be handled by
  ``unknown="skip"|"replace"``);
* a name (``"text8"``, the newest version) or a name and version (``"text8-v1"``).

Normalisers (:data:`NORMALIZERS`):

``none`` version 1
    The identity.

``text8`` version 1: the character mapping of wikifil.pl (M. Mahoney, 2006), which made text8
    ``wikifil.pl`` strips Wikipedia markup, then pads the text with spaces, lower-cases A-Z
    (``tr/A-Z/a-z/``), spells digits out (``s/0/ zero /g`` ... ``s/9/ nine /g``) and turns every
    other character into a space with runs of spaces squeezed to one (``tr/a-z/ /cs``). On
    plain text (no markup) text8-v1 does exactly the last three steps:

    - ``A``-``Z`` become ``a``-``z`` (ASCII only, as ``tr`` does; not Python's ``str.lower``,
      which would map the Kelvin sign to ``k``);
    - each digit becomes its word with a space on each side: ``"1984"`` -> ``" one nine eight four "``;
    - every other character becomes a space: punctuation, tabs, newlines, and letters outside
      ``a``-``z``, **accented letters included** (``"café"`` -> ``"caf "``, ``"Ελλάδα"`` -> ``" "``).
      wikifil.pl works on bytes and maps every byte outside a-z to a space, so a non-ASCII
      letter never reached text8 as a letter; folding ``é`` to ``e`` would score text the model
      never saw in that form;
    - runs of spaces are squeezed to one space.

    It does not add the padding spaces at the ends (the text is scored as it starts and ends).
    Squeezing depends on the character before the text: a streamed text carries it in its
    :class:`~isan.engine.State` (``last_symbol``), so scoring in chunks gives the same bits as
    scoring the whole text.

What a call changed is reported (:class:`Prepared.report`, ``ScoreResult.normalization``):
``chars_read`` (input characters), ``chars_scored``, ``changed`` (input characters replaced by
something else: lower-cased, spelled out, turned into a space), ``dropped`` (input characters that
left nothing: squeezed spaces), and from the unknown-character policy ``skipped`` and
``replaced``, plus ``most_changed`` and ``most_dropped``: the five most frequent changed input
characters and the five most frequent dropped ones, each ``{"char", "count"}`` (empty for the
``none`` normaliser), so ``"a  b"`` reports ``changed`` 0, ``dropped`` 1, ``most_changed`` ``[]``
and ``most_dropped`` ``[{"char": " ", "count": 1}]``. A byte-order mark (U+FEFF) that starts a text (not a streamed continuation) is
dropped and counted in ``dropped``, whatever the normaliser. ``Prepared.offsets`` maps every scored character back to the offset of the input
character it came from (a spelled-out digit's characters all map to the digit).

Example:
    >>> p = prepare("The cat sat on the mat.\\n", Alphabet.text8(), get_normalizer("text8"))
    >>> p.text
    'the cat sat on the mat '
    >>> p.report["changed"], p.report["dropped"]
    (2, 1)
    >>> p.report["most_changed"], p.report["most_dropped"]
    ([{'char': '.', 'count': 1}, {'char': 'T', 'count': 1}], [{'char': '\\n', 'count': 1}])
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError, dataclass, field
from typing import Sequence

import numpy as np

from isan.alphabet import UNKNOWN_POLICIES, Alphabet
from isan.errors import AlphabetError, BundleFormatError, IsanError

#: the normaliser of a bundle whose manifest declares none
DEFAULT_DECLARED = {"name": "none", "version": 1}

_TEXT8_BYTES = b" abcdefghijklmnopqrstuvwxyz"

#: a byte-order mark (U+FEFF) at the start of a text is dropped (and counted as dropped) by every
#: normaliser, ``none`` included: it marks the file's encoding, it is not text
BOM = "\ufeff"

DIGIT_WORDS = (" zero ", " one ", " two ", " three ", " four ", " five ", " six ", " seven ", " eight ", " nine ")


class NormalizerError(IsanError, ValueError):
    """An unknown normaliser name or version, or one that does not fit the model's alphabet."""


@dataclass(frozen=True)
class Normalizer:
    """A named, versioned mapping of raw text to a model's symbols.

    Attributes:
        name, version: as declared in a manifest (``{"name": "text8", "version": 1}``).
        output_symbols: the characters it can produce (None: any character, the identity).
    """

    name: str
    version: int
    description: str
    output_symbols: frozenset | None = field(default=None, repr=False)

    @property
    def id(self) -> str:
        """``"text8-v1"``: name and version, as reports print it."""
        return f"{self.name}-v{self.version}"

    def to_manifest(self) -> dict:
        return {"name": self.name, "version": self.version}

    def apply(self, text: str, context: str = "") -> tuple[str, np.ndarray, np.ndarray | None, np.ndarray | None]:
        """Normalise ``text``.

        Args:
            text: the raw text.
            context: the last normalised character before ``text`` ("" at the start of a text).
        Returns:
            (normalised text; offsets int64 (len(normalised),): the input offset each output
            character came from; changed bool (len(text),): input characters replaced by
            something else; dropped bool (len(text),): input characters that left nothing;
            changed and dropped are None when nothing changed).
        """
        return text, np.arange(len(text), dtype=np.int64), None, None


def _byte_table(f) -> bytes:
    """A 256-byte table for ``bytes.translate``: byte b -> ``f(b)``."""
    return bytes(f(b) for b in range(256))


def _is_text8(b: int) -> bool:
    return 97 <= b <= 122 or b == 32


#: text8-v1 on one byte: A-Z lower-cased, a-z and space kept, digits kept (spelled out next), every other
#: byte a space
_TEXT8_MAP = _byte_table(lambda b: b + 32 if 65 <= b <= 90 else b if _is_text8(b) or 48 <= b <= 57 else 32)
#: 1 for an input byte that text8-v1 changes unless it is dropped: all but a-z and space
_TEXT8_CHANGES = _byte_table(lambda b: 0 if _is_text8(b) else 1)
#: a digit stays (its word's bytes are 1 then 0s, next), every other byte is 1: output bytes, 1 where an
#: input byte's output starts
_TEXT8_STARTS = _byte_table(lambda b: b if 48 <= b <= 57 else 1)
_NOT_DIGITS = bytes(b for b in range(256) if not 48 <= b <= 57)
_DIGIT_WORDS_B = tuple(w.encode("ascii") for w in DIGIT_WORDS)
_DIGIT_STARTS = tuple(b"\x01" + bytes(len(w) - 1) for w in DIGIT_WORDS)
#: the sort key of :func:`_most_changed`: the most frequent first, ties by code point
_ASCII = np.arange(128, dtype=np.int64)
_BY_COUNT = np.int64(-128)
_WORD_LEN = np.array([len(w) for w in DIGIT_WORDS], dtype=np.int64)
_WORD_TABLE = np.array([[ord(c) for c in w.ljust(7)] for w in DIGIT_WORDS], dtype=np.uint32)


def text8_v1_reference(text: str, context: str = "") -> tuple[str, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """text8-v1 (see the module docstring) on UTF-32 code points with numpy: the reference twin of
    ``TEXT8_V1.apply``, which must return exactly the same.

    Args:
        text: the raw text (lone surrogates allowed).
        context: the last normalised character before ``text`` ("" at the start of a text).
    Returns:
        (normalised text; offsets int64 (len(normalised),); changed bool (len(text),); dropped bool
        (len(text),); changed and dropped are None for a text that is text8 already).
    """
    n = len(text)
    if n == 0:
        return "", np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool), np.zeros(0, dtype=bool)
    if text.isascii():  # text that is already text8 (a-z and single spaces) passes unchanged, fast
        raw = text.encode("ascii")
        if (not raw.translate(None, _TEXT8_BYTES) and b"  " not in raw
                and not (context == " " and raw.startswith(b" "))):
            return text, np.arange(n, dtype=np.int64), None, None
    cp = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")
    lower = (cp >= 97) & (cp <= 122)
    upper = (cp >= 65) & (cp <= 90)
    digit = (cp >= 48) & (cp <= 57)
    mapped = np.where(lower, cp, np.where(upper, cp + 32, 32)).astype(np.uint32)
    if digit.any():
        lens = np.where(digit, _WORD_LEN[np.where(digit, cp - 48, 0)], 1)
        src = np.repeat(np.arange(n, dtype=np.int64), lens)
        starts = np.cumsum(lens) - lens
        pos = np.arange(len(src), dtype=np.int64) - starts[src]
        out = mapped[src]
        sel = digit[src]
        out[sel] = _WORD_TABLE[cp[src[sel]] - 48, pos[sel]]
    else:
        src = np.arange(n, dtype=np.int64)
        out = mapped
    space = out == 32
    prev = np.empty_like(space)
    prev[0] = context == " "
    prev[1:] = space[:-1]
    keep = ~(space & prev)
    if not keep.all():
        out, src = out[keep], src[keep]
    dropped = np.bincount(src, minlength=n) == 0
    changed = ~(lower | (cp == 32)) & ~dropped
    return out.astype(np.uint8).tobytes().decode("ascii"), src, changed, dropped


class _Text8V1(Normalizer):
    """wikifil.pl's character mapping (see the module docstring), on bytes: every character beyond
    ASCII is one ``?`` (``str.encode("ascii", "replace")``), which maps to a space and counts as
    changed exactly as the character would, so a text is a few passes of ``bytes.translate`` and
    numpy over one byte a character (:func:`text8_v1_reference` is the twin on code points)."""

    def apply(self, text: str, context: str = "") -> tuple[str, np.ndarray, np.ndarray | None, np.ndarray | None]:
        n = len(text)
        if n == 0:
            return "", np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool), np.zeros(0, dtype=bool)
        raw = text.encode("ascii", "replace")  # one byte a character
        squeeze_first = context == " "
        others = raw.translate(None, _TEXT8_BYTES)  # the bytes that are not a-z or space
        if not others and b"  " not in raw and not (squeeze_first and raw[0] == 32):
            return text, np.arange(n, dtype=np.int64), None, None  # text8 already
        mapped = raw.translate(_TEXT8_MAP)
        digits = others.translate(None, _NOT_DIGITS)
        src = None
        if digits:  # spelled out; src: the input offset of each output byte (a word's all the digit's)
            starts = raw.translate(_TEXT8_STARTS)  # 1 where an input byte's output starts
            for d in set(digits):
                mapped = mapped.replace(bytes((d,)), _DIGIT_WORDS_B[d - 48])
                starts = starts.replace(bytes((d,)), _DIGIT_STARTS[d - 48])
            src = np.cumsum(np.frombuffer(b"\x00" + starts[1:], dtype=np.uint8), dtype=np.int64)  # from 0
        flag = np.frombuffer(raw.translate(_TEXT8_CHANGES), dtype=bool)
        if b"  " not in mapped and not (squeeze_first and mapped[0] == 32):  # nothing squeezed
            offsets = src if src is not None else np.arange(n, dtype=np.int64)
            return mapped.decode("ascii"), offsets, flag.copy(), np.zeros(n, dtype=bool)
        out = np.frombuffer(mapped, dtype=np.uint8)
        space = out == 32
        keep = ~space
        keep[1:] |= keep[:-1]  # a space stays after a non-space
        if not squeeze_first:
            keep[0] = True
        if src is None:
            offsets = keep.nonzero()[0].astype(np.int64, copy=False)
            kept = keep
        else:
            offsets = src[keep]
            kept = np.zeros(n, dtype=bool)
            kept[offsets] = True
        return out[keep].tobytes().decode("ascii"), offsets, flag & kept, ~kept


NONE = Normalizer("none", 1, "the identity: raw text")
TEXT8_V1 = _Text8V1("text8", 1, "Mahoney's wikifil.pl mapping (text8): A-Z lower-cased, digits spelled out as words, "
                    "every other character (accented letters included) a space, runs of spaces squeezed",
                    frozenset(" abcdefghijklmnopqrstuvwxyz"))

#: every normaliser by name and version
NORMALIZERS: dict[str, dict[int, Normalizer]] = {"none": {1: NONE}, "text8": {1: TEXT8_V1}}


def choices() -> list[str]:
    """Accepted values of ``normalize``: auto, the names, and the name-vN ids."""
    out = ["auto"]
    for name, versions in NORMALIZERS.items():
        out.append(name)
        out.extend(n.id for n in versions.values())
    return out


def get_normalizer(name: str, version: int | None = None) -> Normalizer:
    """A registered normaliser (the newest version when ``version`` is None).

    ``name`` may also be an id such as ``"text8-v1"``.

    Raises:
        NormalizerError: unknown name or version.
    """
    if not isinstance(name, str):
        raise NormalizerError(f"a normaliser name must be a string; got {name!r}")
    if version is None and "-v" in name:
        base, _, v = name.rpartition("-v")
        if base in NORMALIZERS and v.isdigit():
            name, version = base, int(v)
    versions = NORMALIZERS.get(name)
    if versions is None:
        raise NormalizerError(f"unknown normaliser {name!r}; choose one of {', '.join(choices())}")
    if version is None:
        return versions[max(versions)]
    if version not in versions:
        raise NormalizerError(f"normaliser {name!r} has no version {version!r} in this isan (it has "
                              f"{', '.join(map(str, sorted(versions)))}); upgrade isan to read this model")
    return versions[version]


def from_manifest(manifest: dict, where: str = "manifest.json") -> Normalizer:
    """The normaliser a manifest declares (``"none"`` when it declares none).

    Raises:
        BundleFormatError: a malformed declaration, an unknown normaliser, or one whose output
            does not fit the manifest's alphabet.
    """
    decl = manifest.get("normalizer", DEFAULT_DECLARED)
    if (not isinstance(decl, dict) or set(decl) != {"name", "version"} or not isinstance(decl["name"], str)
            or type(decl["version"]) is not int):
        raise BundleFormatError(f"{where}: 'normalizer' must be {{\"name\": str, \"version\": int}}; got {decl!r}. "
                                "Re-run `isan export`")
    try:
        norm = get_normalizer(decl["name"], decl["version"])
    except NormalizerError as e:
        raise BundleFormatError(f"{where}: {e} (a newer isan may have written this model: upgrade isan, or re-run "
                                "`isan export`)") from None
    alphabet = manifest.get("alphabet")
    if norm.output_symbols is not None and isinstance(alphabet, list):
        missing = sorted(norm.output_symbols - set(a for a in alphabet if isinstance(a, str)))
        if missing:
            raise BundleFormatError(f"{where}: the normaliser {norm.id} produces {''.join(missing)!r}, which the "
                                    "model's alphabet lacks; re-run `isan export`")
    return norm


def resolve(normalize: str | Normalizer | None, declared: Normalizer) -> Normalizer:
    """The normaliser a call uses: ``"auto"``/None -> ``declared``; ``"none"``; a name or id.

    Raises:
        NormalizerError: an unknown value.
    """
    if isinstance(normalize, Normalizer):
        return normalize
    if normalize is None or normalize == "auto":
        return declared
    return get_normalizer(normalize)


class Prepared:
    """Text made ready for a model: ids, where each came from, and what changed. Immutable.

    Attributes:
        ids: int64 (n,) symbol ids to score.
        offsets: int64 (n,) offset in the input text of the character each id came from (made on
            first access when not given: ``arange(n)``, ids given as ids).
        text: the scored text (``alphabet.decode(ids)``), decoded on first access and kept when it
            was not given (a text given, ``""`` included, is returned as given).
        report: ``{"normalizer", "chars_read", "chars_scored", "changed", "dropped",
            "skipped", "replaced", "most_changed", "most_dropped"}`` (see the module docstring).

    Args:
        ids, offsets, text, report: as above; ``offsets`` None: ``arange(n)``; ``text`` None: decoded
            from ``ids`` by ``alphabet`` when it is read.
        alphabet: the alphabet of ``ids`` (needed when ``text`` is None).

    Raises:
        TypeError: ``text`` and ``alphabet`` both None.
        dataclasses.FrozenInstanceError (an AttributeError): setting or deleting an attribute.
    """

    __slots__ = ("ids", "report", "_offsets", "_text", "_alphabet")

    def __init__(self, ids: np.ndarray, offsets: np.ndarray | None, text: str | None, report: dict, alphabet=None):
        if text is None and alphabet is None:
            raise TypeError("Prepared needs its text, or the alphabet that decodes its ids")
        for name, value in (("ids", ids), ("_offsets", offsets), ("report", report), ("_text", text),
                            ("_alphabet", alphabet)):
            object.__setattr__(self, name, value)

    def __setattr__(self, name, value):
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name):
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __reduce__(self):
        return Prepared, (self.ids, self._offsets, self._text, self.report, self._alphabet)

    def __repr__(self) -> str:
        return f"Prepared(ids={self.ids!r}, offsets={self.offsets!r}, text={self.text!r}, report={self.report!r})"

    @property
    def offsets(self) -> np.ndarray:
        if self._offsets is None:
            object.__setattr__(self, "_offsets", np.arange(len(self.ids), dtype=np.int64))
        return self._offsets

    @property
    def text(self) -> str:
        if self._text is None:
            object.__setattr__(self, "_text", self._alphabet.decode(self.ids))
        return self._text

    @property
    def last_symbol(self) -> str:
        """The last character of ``text`` ("" when empty); of a character alphabet's ids without
        decoding the others."""
        if self._text is None and self._alphabet.kind == "chars":
            return self._alphabet.symbols[int(self.ids[-1])] if len(self.ids) else ""
        return self.text[-1] if self.text else ""


def _report(norm_id: str, chars_read: int, chars_scored: int, changed: int = 0, dropped: int = 0, skipped: int = 0,
            replaced: int = 0, most_changed: list | None = None, most_dropped: list | None = None) -> dict:
    return {"normalizer": norm_id, "chars_read": int(chars_read), "chars_scored": int(chars_scored),
            "changed": int(changed), "dropped": int(dropped), "skipped": int(skipped), "replaced": int(replaced),
            "most_changed": most_changed or [], "most_dropped": most_dropped or []}


def _what_changed(text: str, changed: np.ndarray | None, dropped: np.ndarray | None,
                  normalizer: Normalizer) -> dict:
    """The report's ``changed``, ``dropped``, ``most_changed`` and ``most_dropped`` from the
    normaliser's masks (None: it changed nothing)."""
    if changed is None:
        return {"changed": 0, "dropped": 0}
    out = {"changed": int(np.count_nonzero(changed)), "dropped": int(np.count_nonzero(dropped))}
    if normalizer is not NONE:
        raw = np.frombuffer(text.encode("ascii", "replace"), dtype=np.uint8)  # beyond ASCII: '?'
        out["most_changed"] = _most_changed(text, raw, changed) if out["changed"] else []
        out["most_dropped"] = _most_changed(text, raw, dropped) if out["dropped"] else []
    return out


def _most_changed(text: str, raw: np.ndarray, mask: np.ndarray, top: int = 5) -> list[dict]:
    """The ``top`` most frequent characters of ``text`` where ``mask`` is set, with their counts
    (the most frequent first, ties by code point). ``raw``: ``text`` encoded to ASCII with each
    character beyond it a ``?``, uint8 (len(text),)."""
    counts = np.bincount(raw[mask], minlength=128)
    if counts[63] and not text.isascii():  # '?': a question mark, or a character beyond ASCII
        return _most_changed_unicode(text, raw, mask, counts, top)
    first = np.argsort(_BY_COUNT * counts + _ASCII, kind="stable")[:top].tolist()  # zero counts sort last
    return [{"char": chr(c), "count": k} for c, k in zip(first, counts[first].tolist()) if k]


def _most_changed_unicode(text: str, raw: np.ndarray, mask: np.ndarray, counts: np.ndarray, top: int) -> list[dict]:
    """:func:`_most_changed` of a text beyond ASCII, from the counts of its ASCII bytes (``?``
    included, which counts the characters beyond ASCII too)."""
    found = {c: k for c, k in enumerate(counts.tolist()) if k and c != 63}
    where = (mask & (raw == 63)).nonzero()[0]
    if len(where) > 1024:
        cp = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")[where]
        vals, n = np.unique(cp, return_counts=True)
        found.update(zip(vals.tolist(), n.tolist()))
    else:
        for ch in map(text.__getitem__, where.tolist()):
            found[ord(ch)] = found.get(ord(ch), 0) + 1
    order = sorted((-k, c) for c, k in found.items())[:top]
    return [{"char": chr(c), "count": -k} for k, c in order]


def prepare(text: str | Sequence[int] | np.ndarray, alphabet: Alphabet, normalizer: Normalizer = NONE,
            unknown: str = "error", replacement: str | None = None, context: str = "") -> Prepared:
    """The one way every engine goes from input to symbol ids: normalise, then apply the unknown policy.

    Args:
        text: raw text, or a sequence of ids (validated, never normalised).
        alphabet: the model's alphabet.
        normalizer: from :func:`resolve`.
        unknown: characters still outside the alphabet after normalisation: ``"error"``,
            ``"skip"`` or ``"replace"`` (with ``replacement``).
        context: the last scored symbol before ``text`` (``State.last_symbol``), so that
            chunked text normalises as the whole would.
    Returns:
        :class:`Prepared`.
    Raises:
        AlphabetError: a character outside the alphabet with ``unknown="error"`` (its input
            offset is in the message and in ``.offset``), a bad policy or replacement.
    """
    if unknown not in UNKNOWN_POLICIES:
        raise AlphabetError(f"unknown={unknown!r}; choose one of {', '.join(UNKNOWN_POLICIES)}")
    if not isinstance(text, str):
        ids = alphabet.as_ids(text)  # each id its own offset: made if asked, as the text is
        return Prepared(ids, None, None, _report("ids", len(ids), len(ids)), alphabet)
    if text.startswith(BOM) and not context:  # a byte-order mark starts a file; it is not text
        norm_text, offsets, changed, dropped = normalizer.apply(text[1:], context)
        offsets = offsets + 1
        n = len(text) - 1
        changed = np.concatenate([[False], changed if changed is not None else np.zeros(n, bool)])
        dropped = np.concatenate([[True], dropped if dropped is not None else np.zeros(n, bool)])
    else:
        norm_text, offsets, changed, dropped = normalizer.apply(text, context)
    if alphabet.kind != "chars":
        return _prepare_tokens(text, norm_text, offsets, changed, dropped, alphabet, normalizer, unknown, replacement)
    raw = alphabet.raw_ids(norm_text)
    skipped = replaced = 0
    if len(raw) and raw.min() < 0:
        bad = raw < 0
        if unknown == "error":
            j = int(np.argmax(bad))
            ch, off = norm_text[j], int(offsets[j])
            hint = ("pass unknown='skip' or unknown='replace' (CLI: --unknown skip|replace --replacement ' ')"
                    if normalizer is NONE else f"the {normalizer.id} normaliser left it; pass unknown='skip' or 'replace'")
            raise AlphabetError(
                f"character {ch!r} (U+{ord(ch):04X}) at offset {off} is not in the model's alphabet "
                f"{alphabet.describe()}; clean the text, or {hint}", char=ch, offset=off)
        if unknown == "skip":
            skipped = int(bad.sum())
            raw, offsets = raw[~bad], offsets[~bad]
        else:
            if replacement is None:
                raise AlphabetError("unknown='replace' needs a replacement symbol (CLI: --replacement)")
            rid = alphabet.id(replacement)
            replaced = int(bad.sum())
            raw = raw.copy()
            raw[bad] = rid
        norm_text = None  # decoded if asked
    report = _report(normalizer.id, len(text), len(raw), skipped=skipped, replaced=replaced,
                     **_what_changed(text, changed, dropped, normalizer))
    return Prepared(raw.astype(np.int64, copy=False), offsets.astype(np.int64, copy=False), norm_text, report,
                    alphabet)


def _prepare_tokens(text: str, norm_text: str, offsets: np.ndarray, changed, dropped, alphabet, normalizer: Normalizer,
                    unknown: str, replacement: str | None) -> Prepared:
    """:func:`prepare` for token alphabets (:mod:`isan.tokens`): pairs apply the unknown policy to
    their base characters and then pair them; bytes never meet an unknown; words apply it to whole
    words. ``offsets`` of a token: the input offset of its first character."""
    skipped = replaced = 0
    if alphabet.kind == "pairs":
        base = prepare(norm_text, alphabet.base, NONE, unknown, replacement)
        skipped, replaced = base.report["skipped"], base.report["replaced"]
        chars = base.ids
        ids = alphabet._pairs(chars)
        offs = offsets[base.offsets[0::2]] if len(chars) else np.zeros(0, dtype=np.int64)
    elif alphabet.kind == "bytes":
        ids, char_of = alphabet.tokenize(norm_text)
        offs = offsets[char_of] if len(ids) else np.zeros(0, dtype=np.int64)
    else:  # words
        words, starts = alphabet._split(norm_text)
        raw = np.array([alphabet._index.get(w, -1) for w in words], dtype=np.int64)
        starts = np.asarray(starts, dtype=np.int64)
        bad = raw < 0
        if bad.any():
            if unknown == "error":
                j = int(np.argmax(bad))
                off = int(offsets[starts[j]])
                raise AlphabetError(f"word {words[j]!r} at offset {off} is not in the model's vocabulary "
                                    f"{alphabet.describe()}; pass unknown='skip' or unknown='replace'",
                                    char=words[j], offset=off)
            if unknown == "skip":
                skipped = int(bad.sum())
                raw, starts = raw[~bad], starts[~bad]
            else:
                rep = replacement if replacement is not None else alphabet.unk
                if rep is None:
                    raise AlphabetError("unknown='replace' needs a replacement word (CLI: --replacement)")
                replaced = int(bad.sum())
                raw = raw.copy()
                raw[bad] = alphabet.id(rep)
        ids = raw
        offs = offsets[starts] if len(ids) else np.zeros(0, dtype=np.int64)
    scored = alphabet.decode(ids)
    report = _report(normalizer.id, len(text), len(scored), skipped=skipped, replaced=replaced,
                     **_what_changed(text, changed, dropped, normalizer))
    report["tokens"] = int(len(ids))
    report["unit"] = alphabet.unit
    return Prepared(np.asarray(ids, dtype=np.int64), np.asarray(offs, dtype=np.int64), scored, report)
