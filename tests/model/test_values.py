from __future__ import annotations

import re
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reconciler.model.values import (
    ID_PATTERN,
    RESOURCE_NAME_PATTERN,
    instance_id,
    instance_ids,
    parse_bytes,
    parse_duration,
    validate_id,
)


class TestBytes:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("512Mi", 512 * 1024 * 1024),
            ("8Gi", 8 * 1024**3),
            ("1Ki", 1024),
            ("17", 17),
            (4096, 4096),
            ("2Ti", 2 * 1024**4),
        ],
    )
    def test_binary_suffixes(self, text: str | int, expected: int) -> None:
        assert parse_bytes(text) == expected

    @pytest.mark.parametrize("bad", ["512MB", "1.5Gi", "-1", -5, "Gi", "", True, 1.0])
    def test_rejects(self, bad: object) -> None:
        with pytest.raises(ValueError):
            parse_bytes(bad)

    @given(st.integers(min_value=0, max_value=10**6), st.sampled_from(["Ki", "Mi", "Gi"]))
    def test_suffix_is_a_power_of_1024(self, n: int, suffix: str) -> None:
        power = {"Ki": 1, "Mi": 2, "Gi": 3}[suffix]
        assert parse_bytes(f"{n}{suffix}") == n * 1024**power


class TestDurations:
    @pytest.mark.parametrize(
        ("text", "seconds"),
        [("30s", 30), ("5m", 300), ("1h30m", 5400), ("200ms", 0.2), (45, 45), ("1h", 3600)],
    )
    def test_forms(self, text: str | int, seconds: float) -> None:
        assert parse_duration(text) == pytest.approx(seconds)

    @pytest.mark.parametrize("bad", ["", "5", "m", "1d", "30 s", -1, "1m1h"])
    def test_rejects(self, bad: object) -> None:
        with pytest.raises(ValueError):
            parse_duration(bad)


class TestIds:
    @pytest.mark.parametrize("good", ["a", "node-1", "com.example.nav", "A_b.c-9"])
    def test_accepts(self, good: str) -> None:
        assert validate_id(good) == good

    @pytest.mark.parametrize(
        "bad", ["", "../../etc", "/etc", "a/b", ".hidden", "a-", "x" * 64, "a b", "ü"]
    )
    def test_rejects_path_tricks(self, bad: str) -> None:
        with pytest.raises(ValueError):
            validate_id(bad)

    def test_instance_id_is_uuid5_of_the_identity(self) -> None:
        # SPEC §4 defines it as uuid5 in the OID namespace of "item:subject:index".
        expected = uuid.uuid5(uuid.NAMESPACE_OID, "com.example.nav:default:1")
        assert instance_id("com.example.nav", "default", 1) == str(expected)

    @given(
        st.from_regex(ID_PATTERN, fullmatch=True),
        st.from_regex(ID_PATTERN, fullmatch=True),
        st.integers(0, 1000),
    )
    def test_instance_ids_are_safe_file_names(self, item: str, subject: str, index: int) -> None:
        iid = instance_id(item, subject, index)
        assert re.fullmatch(r"[0-9a-f-]{36}", iid)
        assert iid != instance_id(item, subject, index + 1)

    @given(st.text(max_size=70), st.text(max_size=70), st.integers(0, 10**6), st.integers(0, 12))
    def test_instance_ids_are_the_uuid5_of_each_index(
        self, item: str, subject: str, start: int, count: int
    ) -> None:
        # computed by string slicing on the SHA-1 digest, for any text (ids are validated
        # elsewhere): the very text of uuid.uuid5, index by index
        want = [
            str(uuid.uuid5(uuid.NAMESPACE_OID, f"{item}:{subject}:{i}"))
            for i in range(start, start + count)
        ]
        assert instance_ids(item, subject, start, start + count) == want
        if count:
            assert instance_id(item, subject, start) == want[0]


class TestResourceNames:
    """SPEC §4: a resource name is an id that may hold one '/' (``example.com/gpu``)."""

    @pytest.mark.parametrize("good", ["gpu0", "example.com/gpu", "a/b", "vendor_x/dev-1"])
    def test_accepts(self, good: str) -> None:
        assert re.fullmatch(RESOURCE_NAME_PATTERN, good)

    @pytest.mark.parametrize(
        "bad", ["", "/gpu", "gpu/", "a/b/c", "../gpu", "a//b", "example.com/../x", "a b"]
    )
    def test_rejects(self, bad: str) -> None:
        assert not re.fullmatch(RESOURCE_NAME_PATTERN, bad)
