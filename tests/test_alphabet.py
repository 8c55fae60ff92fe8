import numpy as np
import pytest

from isan.alphabet import Alphabet
from isan.errors import AlphabetError


def test_text8_alphabet_roundtrip():
    a = Alphabet.text8()
    assert len(a) == 27
    ids = a.encode("the cat")
    assert ids.dtype == np.int64 and a.decode(ids) == "the cat"


def test_unknown_error_names_char_and_offset():
    with pytest.raises(AlphabetError) as e:
        Alphabet.text8().encode("the Cat")
    assert e.value.char == "C" and e.value.offset == 4
    assert "'C'" in str(e.value) and "offset 4" in str(e.value)


def test_unknown_skip_and_replace():
    a = Alphabet.text8()
    assert a.decode(a.encode("a,b.C", unknown="skip")) == "ab"
    assert a.decode(a.encode("a,b", unknown="replace", replacement=" ")) == "a b"
    with pytest.raises(AlphabetError):
        a.encode("a,b", unknown="replace")  # no replacement given
    with pytest.raises(AlphabetError):
        a.encode("a,b", unknown="replace", replacement="!")  # replacement outside the alphabet
    with pytest.raises(AlphabetError):
        a.encode("ab", unknown="ignore")


def test_non_latin_text_and_general_alphabet():
    a = Alphabet(tuple("αβ γ"))
    assert a.decode(a.encode("αβ γα")) == "αβ γα"
    with pytest.raises(AlphabetError) as e:
        Alphabet.text8().encode("ab—c")
    assert e.value.offset == 2


def test_bad_alphabets():
    with pytest.raises(AlphabetError):
        Alphabet(("a", "a"))
    with pytest.raises(AlphabetError):
        Alphabet(("ab",))


def test_as_ids_validates_id_sequences():
    a = Alphabet.text8()
    np.testing.assert_array_equal(a.as_ids("ab"), a.as_ids([1, 2]))
    for bad in ([27], [-1], [[1, 2]]):
        with pytest.raises(AlphabetError, match="ids must be"):
            a.as_ids(bad)
