"""The slug helper's two promises, as properties: any string gives a valid Kubernetes name,
and distinct strings give distinct names (``functions/kubernetes/objects/names.py``)."""

from __future__ import annotations

import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from functions.kubernetes.objects.names import MAX_LABEL, is_dns1035, is_label, name, slug, team_of
from functions.kubernetes.objects.workspace import workspace_names

DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
# Strings that look like names: the cases that matter most for collisions.
namelike = st.text(alphabet="abcXYZ019-_.--", max_size=80)
anything = st.text(max_size=200) | namelike


@settings(max_examples=500)
@given(anything)
@example("")
@example("-")
@example("--")
@example("a" * 64)
@example("ML-A--My Notebook")
@example("\ud800")  # a lone surrogate: not even encodable as UTF-8 by default
def test_any_string_gives_a_dns1123_label(text: str) -> None:
    result = slug(text)
    assert DNS1123_LABEL.fullmatch(result), result
    assert len(result) <= MAX_LABEL


@settings(max_examples=500)
@given(anything, anything)
@example("ml-a--nb", "ml-a-nb")
@example("A", "a")
@example("a_b", "a-b")
@example("x" * 70, "x" * 71)
@example("ab--0123456789", "ab")  # a valid label that looks like a hashed slug
def test_distinct_strings_give_distinct_slugs(a: str, b: str) -> None:
    if a != b:
        assert slug(a) != slug(b)


@settings(max_examples=300)
@given(anything, st.integers(min_value=19, max_value=MAX_LABEL))
def test_max_length_is_honoured(text: str, max_length: int) -> None:
    assert len(slug(text, max_length=max_length)) <= max_length
    assert is_label(slug(text, max_length=max_length))


@settings(max_examples=300)
@given(anything, anything)
def test_prefixed_names_are_dns1035_and_distinct(a: str, b: str) -> None:
    for prefix in ("ws-", "home-", "token-", "snap-", "stasis-"):
        assert is_dns1035(name(prefix, a)), name(prefix, a)
        if a != b:
            assert name(prefix, a) != name(prefix, b)


@given(anything)
def test_objects_of_one_workspace_never_share_a_name_across_kinds(text: str) -> None:
    names = workspace_names("ml-a", text)
    assert len({names.pod, names.pvc, names.secret}) == 3
    assert names.label == slug(text)


@pytest.mark.parametrize(("text", "expected"), [
    ("ml-a", "ml-a"),  # already a label: kept, readable
    ("nb1", "nb1"),
])
def test_valid_labels_stay_readable(text: str, expected: str) -> None:
    assert slug(text) == expected


def test_other_strings_keep_a_readable_prefix_and_a_hash() -> None:
    assert re.fullmatch(r"ml-a-my-notebook--[a-z2-7]{16}", slug("ML-A--My Notebook"))
    assert slug("") == "x--" + slug("").split("--")[1]
    long = slug("a" * 100)
    assert long.startswith("a" * 40) and len(long) == MAX_LABEL


@pytest.mark.parametrize("prefix", ["", "ws", "1ws-", "Ws-", "w--"])
def test_bad_prefixes_are_refused(prefix: str) -> None:
    with pytest.raises(ValueError):
        name(prefix, "x")


def test_workspace_ids_give_their_team() -> None:
    assert team_of("ml-a--nb") == "ml-a"
    with pytest.raises(ValueError):
        team_of("no-separator")


# Two workspace ids that share the readable part a name keeps, and whose SHA-256 agree in
# their first 40 bits (found by a birthday search of about a million hashes: seconds on a
# laptop). With the old 10 hex digits every object of the one was named as the other's.
_SEARCHED = ("ml-a--experiment-with-a-rather-long-descriptive-name-2e3ee",
             "ml-a--experiment-with-a-rather-long-descriptive-name-1cc9c1")


def test_long_ids_sharing_the_readable_part_and_40_hash_bits_get_distinct_names() -> None:
    a, b = _SEARCHED
    for prefix in ("ws-", "home-", "token-"):
        left, right = name(prefix, a), name(prefix, b)
        assert left.split("--")[0] == right.split("--")[0]  # the same readable part
        assert left != right
        assert len(left) <= MAX_LABEL and len(right) <= MAX_LABEL
    names_a, names_b = workspace_names("ml-a", a), workspace_names("ml-a", b)
    assert {names_a.pod, names_a.pvc, names_a.secret, names_a.label}.isdisjoint(
        {names_b.pod, names_b.pvc, names_b.secret, names_b.label})


def test_the_hash_carries_at_least_64_bits() -> None:
    digest = slug("ml-a--" + "x" * 80).rpartition("--")[2]
    assert re.fullmatch(r"[a-z2-7]+", digest)
    assert len(digest) * 5 >= 64  # base32: 5 bits a character
