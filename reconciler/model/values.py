"""Scalar value types shared by every document: ids, byte quantities, durations, percentages.

Each is an ``Annotated`` type, so pydantic validates it and ``reconciler schema`` describes it.
The parsing functions are plain and pure, usable outside pydantic (the CLI parses ``--debounce``
with :func:`parse_duration`).
"""

from __future__ import annotations

import hashlib
import importlib
import re
import uuid
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, Strict, WithJsonSchema

__all__ = [
    "ID_PATTERN",
    "INT64_MAX",
    "INT64_MIN",
    "MAX_BYTES",
    "MAX_DURATION",
    "RESOURCE_NAME_PATTERN",
    "Bool",
    "Bytes",
    "Duration",
    "Id",
    "Int",
    "Label",
    "NonNegInt",
    "Percent",
    "PosBytes",
    "PosInt",
    "ResourceName",
    "SemVer",
    "Str",
    "instance_id",
    "instance_ids",
    "parse_bytes",
    "parse_duration",
    "validate_id",
]

ID_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$"
_ID_PART = r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?"
RESOURCE_NAME_PATTERN = rf"^{_ID_PART}(/{_ID_PART})?$"
LABEL_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._/=:-]{0,251}[A-Za-z0-9])?$"
SEMVER_PATTERN = (
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)

_ID_RE = re.compile(ID_PATTERN)

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
"""Every integer field lies within 64 bits (signed): what every JSON consumer and the OCI
runtime's fields hold, and what orjson encodes."""
MAX_BYTES = 2**60
"""The largest byte quantity, ``1024Pi`` (one exbibyte): far above any machine, and still
eight times below ``INT64_MAX``, so a sum of a few such amounts stays in 64 bits."""
MAX_DURATION = 10 * 365 * 24 * 3600
"""The longest duration, ten years (87600h) in seconds."""


def _no_nul(value: str) -> str:
    """No string of a document holds NUL: no path, argument or environment entry can (the
    kernel cuts a C string there, runc refuses it when the container starts)."""
    if "\0" in value:
        raise ValueError("a NUL character (\\0) is not allowed in a string")
    return value


Int = Annotated[int, Strict(), Field(ge=INT64_MIN, le=INT64_MAX)]
Str = Annotated[str, Strict(), AfterValidator(_no_nul)]
Bool = Annotated[bool, Strict()]
NonNegInt = Annotated[int, Strict(), Field(ge=0, le=INT64_MAX)]
PosInt = Annotated[int, Strict(), Field(ge=1, le=INT64_MAX)]
Percent = Annotated[int, Strict(), Field(ge=0, le=100)]
Id = Annotated[str, Strict(), Field(pattern=ID_PATTERN)]
ResourceName = Annotated[str, Strict(), Field(pattern=RESOURCE_NAME_PATTERN)]
Label = Annotated[str, Strict(), Field(pattern=LABEL_PATTERN)]
SemVer = Annotated[str, Strict(), Field(pattern=SEMVER_PATTERN)]


def validate_id(value: str, what: str = "id") -> str:
    """Raise ValueError unless ``value`` is a safe id (SPEC §4); used before any path work."""
    if not _ID_RE.match(value):
        raise ValueError(f"invalid {what} {value!r}: must match {ID_PATTERN}")
    return value


_BYTE_SUFFIXES = {
    "": 1,
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": 1024**3,
    "Ti": 1024**4,
    "Pi": 1024**5,
}
_BYTES_RE = re.compile(r"^\s*([0-9]+)\s*(Ki|Mi|Gi|Ti|Pi)?\s*$")


def _shown(value: str, limit: int = 40) -> str:
    """``value``'s repr, cut short: an error message never carries a 5,000-digit input."""
    return repr(value) if len(value) <= limit else repr(value[:limit]) + "..."


def _digits(text: str, limit: int) -> int:
    """``int(text)`` of a string of decimal digits, or ``limit + 1`` when it is longer than
    ``limit``'s digits (never the interpreter's 4300-digit conversion error)."""
    text = text.lstrip("0") or "0"
    return limit + 1 if len(text) > len(str(limit)) else int(text)


def parse_bytes(value: object) -> int:
    """``512Mi`` → 536870912; an integer is taken as bytes. Decimal suffixes are refused.
    At most :data:`MAX_BYTES` (``1024Pi``)."""
    if isinstance(value, bool):
        raise ValueError("a byte quantity must be an integer or a string like 512Mi")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a byte quantity cannot be negative")
        amount = value
    elif isinstance(value, str):
        m = _BYTES_RE.match(value)
        if not m:
            raise ValueError(
                f"invalid byte quantity {_shown(value)}: use an integer or a binary suffix "
                "(Ki, Mi, Gi, Ti, Pi), e.g. 512Mi"
            )
        amount = _digits(m.group(1), MAX_BYTES) * _BYTE_SUFFIXES[m.group(2) or ""]
    else:
        raise ValueError("a byte quantity must be an integer or a string like 512Mi")
    if amount > MAX_BYTES:
        raise ValueError(f"a byte quantity is at most 1024Pi ({MAX_BYTES} bytes)")
    return amount


_DURATION_RE = re.compile(r"^(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+)s)?(?:(\d+)ms)?$")


def parse_duration(value: object) -> float:
    """``1h30m`` → 5400.0 seconds; ``30s``, ``5m``, ``200ms``; an integer is seconds.
    At most :data:`MAX_DURATION` (ten years)."""
    if isinstance(value, bool):
        raise ValueError("a duration must be an integer of seconds or a string like 30s")
    if isinstance(value, int | float):
        if not value >= 0 or value == float("inf"):
            raise ValueError("a duration must be a finite number of seconds >= 0")
        seconds = float(value) if value <= MAX_DURATION else float(MAX_DURATION + 1)
    elif isinstance(value, str):
        text = value.strip()
        m = _DURATION_RE.match(text)
        if not (text and m and any(m.groups())):
            raise ValueError(f"invalid duration {_shown(value)}: use e.g. 30s, 5m, 1h30m, 200ms")
        h, mi, s, ms = (_digits(g, MAX_DURATION * 1000) if g else 0 for g in m.groups())
        total_ms = ((h * 60 + mi) * 60 + s) * 1000 + ms
        seconds = total_ms / 1000 if total_ms <= MAX_DURATION * 1000 else MAX_DURATION + 1.0
    else:
        raise ValueError("a duration must be an integer of seconds or a string like 30s")
    if seconds > MAX_DURATION:
        raise ValueError(f"a duration is at most 87600h (ten years, {MAX_DURATION} seconds)")
    return seconds


_BYTES_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "integer", "minimum": 0, "maximum": MAX_BYTES},
        {"type": "string", "pattern": r"^\s*[0-9]+\s*(Ki|Mi|Gi|Ti|Pi)?\s*$"},
    ],
    "description": "bytes: an integer or a string with a binary suffix (512Mi, 8Gi); "
    "at most 1024Pi",
}
_DURATION_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "integer", "minimum": 0, "maximum": MAX_DURATION},
        {"type": "string", "pattern": r"^(\d+h)?(\d+m)?(\d+s)?(\d+ms)?$"},
    ],
    "description": "a duration: integer seconds or a string like 30s, 5m, 1h30m; at most 87600h",
}

Bytes = Annotated[int, BeforeValidator(parse_bytes), WithJsonSchema(_BYTES_SCHEMA)]


def _positive(value: int) -> int:
    if value < 1:
        raise ValueError("must be at least 1 byte")
    return value


_POS_BYTES_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "integer", "minimum": 1, "maximum": MAX_BYTES},
        {"type": "string", "pattern": r"^\s*[0-9]+\s*(Ki|Mi|Gi|Ti|Pi)?\s*$"},
    ],
    "description": "bytes, at least 1: an integer or a string with a binary suffix (64Mi); "
    "at most 1024Pi",
}
PosBytes = Annotated[
    int, BeforeValidator(parse_bytes), AfterValidator(_positive), WithJsonSchema(_POS_BYTES_SCHEMA)
]
Duration = Annotated[float, BeforeValidator(parse_duration), WithJsonSchema(_DURATION_SCHEMA)]


def _check_access(value: str) -> str:
    if not value or any(c not in "rwm" for c in value) or len(set(value)) != len(value):
        raise ValueError(f"invalid access mode {value!r}: use letters from 'rwm', each once")
    return value


AccessMode = Annotated[
    str,
    Strict(),
    AfterValidator(_check_access),
    WithJsonSchema({"type": "string", "pattern": "^(?!.*(.).*\\1)[rwm]{1,3}$"}),
]


_OID = uuid.NAMESPACE_OID.bytes

_sha1: Callable[[bytes], Any]
try:  # CPython's own SHA-1, which hashlib falls back to without OpenSSL: for a name this short
    # it hashes in 60% of the time OpenSSL's does (whose per-hash setup dominates)
    _sha1 = importlib.import_module("_sha1").sha1
except ImportError:  # a Python without it
    _sha1 = hashlib.sha1

# The hex digit that starts the fourth group of a uuid5: the digest's digit with its top two
# bits set to the RFC 4122 variant (binary 10xx), i.e. 8, 9, a or b.
_VARIANT_DIGIT = {d: "89ab"[int(d, 16) & 3] for d in "0123456789abcdef"}


def instance_id(item_id: str, subject_id: str, index: int) -> str:
    """SPEC §4: uuid5 in the OID namespace of ``"<itemId>:<subjectId>:<index>"``.

    The same value as ``str(uuid.uuid5(uuid.NAMESPACE_OID, name))``, computed without building a
    ``uuid.UUID`` (tests compare the two); see :func:`instance_ids` (this is its one-name
    case without a list: a fleet of one-instance services names each instance alone).
    """
    h = _sha1(_OID + f"{item_id}:{subject_id}:{index}".encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-5{h[13:16]}-{_VARIANT_DIGIT[h[16]]}{h[17:20]}-{h[20:32]}"


def instance_ids(item_id: str, subject_id: str, start: int, stop: int) -> list[str]:
    """:func:`instance_id` of every index in ``range(start, stop)``, in that order.

    A uuid5 is the first 32 digits of the SHA-1 hex digest of its name, in groups of 8-4-4-4-12,
    with the version (the 13th digit) set to 5 and the variant (the 17th digit's top two bits)
    to binary 10: done here by string slicing and a table of 16 digits, the names sharing their
    ``namespace + item:subject:`` prefix, encoded once: about 2 us a name, a sixth of
    ``uuid.uuid5`` (a balance names every desired instance).
    """
    sha1, variant = _sha1, _VARIANT_DIGIT
    prefix = _OID + f"{item_id}:{subject_id}:".encode()
    return [
        f"{h[:8]}-{h[8:12]}-5{h[13:16]}-{variant[h[16]]}{h[17:20]}-{h[20:32]}"
        for index in range(start, stop)
        for h in [sha1(prefix + b"%d" % index).hexdigest()]
    ]
