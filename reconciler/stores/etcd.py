"""The etcd v3 state store (issue 11, docs/etcd.md), through etcd's own JSON gateway (etcd3gw).

Keys mirror the state directory under a prefix: ``etcd://127.0.0.1:2379/fleet/a`` keeps
``desired/web.yaml`` at ``/fleet/a/desired/web.yaml``, the document's bytes as the value. The
unit's leader key is ``<prefix>/.leader`` (not a document: never exported).

- :meth:`EtcdStore.snapshot`: one range read of the prefix at one revision.
- :meth:`EtcdStore.commit`: one transaction; guards become ``compare`` clauses (the leader
  key's value, a document's ``mod_revision``), so a stale write changes nothing.
- :meth:`EtcdStore.watch`: change events from a revision on; a compacted start revision
  raises :class:`Compacted` (the caller resyncs from a snapshot); a dropped stream just ends.
- :meth:`EtcdStore.campaign`: leader election on a lease kept alive by a thread.

etcd3gw's own watch helper swallows the cancellation etcd sends after a compaction, so the
watch stream is read here, through the client's HTTP session and URL.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import requests
from etcd3gw import exceptions as etcd_exceptions
from etcd3gw.client import Etcd3Client

from reconciler.stores.base import (
    Change,
    Entry,
    Guard,
    LeaderGuard,
    Snapshot,
    StaleWrite,
    StoreError,
    is_unit_path,
)

__all__ = ["Compacted", "EtcdStore", "EtcdURL", "Leadership", "parse_etcd_url"]

log = logging.getLogger("reconciler.etcd")

DEFAULT_PREFIX = "/reconciler"
LEADER_KEY = ".leader"


class Compacted(StoreError):
    """The watch's start revision was compacted away: events were lost, resync."""


def _b64(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode("ascii")


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def _prefix_end(prefix: str) -> bytes:
    raw = bytearray(prefix.encode())
    raw[-1] += 1
    return bytes(raw)


ETCD_MAX_TXN_OPS = 128
ETCD_MAX_REQUEST_BYTES = 1536 * 1024
"""etcd's defaults of ``--max-txn-ops`` and ``--max-request-bytes``."""

_LIMITS = {
    "max-txn-ops": "max_txn_ops",
    "max-request-bytes": "max_request_bytes",
    "timeout": "timeout",
}


@dataclass(frozen=True)
class EtcdURL:
    host: str
    port: int
    prefix: str  # without a trailing slash
    max_txn_ops: int = ETCD_MAX_TXN_OPS
    max_request_bytes: int = ETCD_MAX_REQUEST_BYTES
    timeout: int = 60  # seconds a request may wait for etcd's answer (a large commit's is slow)


def parse_etcd_url(url: str) -> EtcdURL:
    """``etcd://HOST:PORT/PREFIX[?max-txn-ops=N&max-request-bytes=N&timeout=SECONDS]``: the
    server and the unit's prefix, the server's request limits (etcd's defaults unless given),
    by which a large commit is split (:meth:`EtcdStore.txn_limits`), and how long a request
    may wait for its answer (default 60 s)."""
    parts = urlsplit(url)
    if parts.scheme != "etcd" or not parts.hostname:
        raise StoreError(f"{url!r}: expected etcd://HOST:PORT/PREFIX")
    try:
        port = parts.port or 2379
    except ValueError:
        raise StoreError(f"{url!r}: the port is not a number") from None
    prefix = parts.path.rstrip("/") or DEFAULT_PREFIX
    limits: dict[str, int] = {}
    for name, values in parse_qs(parts.query, keep_blank_values=True).items():
        if name not in _LIMITS:
            raise StoreError(f"{url!r}: unknown parameter {name!r} (known: {', '.join(_LIMITS)})")
        try:
            value = int(values[-1])
        except ValueError:
            value = 0
        if value < 1:
            raise StoreError(f"{url!r}: {name} must be a positive integer")
        limits[_LIMITS[name]] = value
    return EtcdURL(parts.hostname, port, prefix, **limits)


def _rev(value: Any) -> int:
    return int(value) if value is not None else 0


@dataclass
class Leadership:
    """This process leads the unit while ``lost`` is unset; a thread refreshes the lease."""

    identity: str
    lease_id: int
    ttl: int
    lost: threading.Event
    _stop: threading.Event
    _thread: threading.Thread | None = None

    def resign(self, store: EtcdStore) -> None:
        """Stop refreshing and revoke the lease (which deletes the leader key at once)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.ttl)
        if not self.lost.is_set():
            try:
                store._post("/kv/lease/revoke", {"ID": self.lease_id})
            except StoreError as e:
                log.warning(
                    "could not revoke the leader lease (it expires in %d s): %s", self.ttl, e
                )
        self.lost.set()


class EtcdStore:
    """A unit under a key prefix of an etcd v3 cluster (see the module docstring)."""

    def __init__(self, url: str) -> None:
        parsed = parse_etcd_url(url)
        self.host, self.port, self.prefix = parsed.host, parsed.port, parsed.prefix
        self._limits = (parsed.max_txn_ops, parsed.max_request_bytes)
        self.timeout = float(parsed.timeout)
        self.client = Etcd3Client(
            host=self.host, port=self.port, timeout=self.timeout, api_path="/v3/"
        )

    @property
    def url(self) -> str:
        return f"etcd://{self.host}:{self.port}{self.prefix}"

    @property
    def txn_limits(self) -> tuple[int, int]:
        """(operations, request bytes) one transaction may hold on this server."""
        return self._limits

    def op_size(self, rel: str, data: bytes) -> int:
        """About what one put adds to a transaction request (base64 key and value, framing)."""
        return 4 * ((len(self.key(rel).encode()) + 2) // 3 + (len(data) + 2) // 3) + 64

    @property
    def leader_key(self) -> str:
        return f"{self.prefix}/{LEADER_KEY}"

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}"

    def _rel(self, key: bytes) -> str | None:
        text = key.decode("utf-8", "replace")
        start = self.prefix + "/"
        if not text.startswith(start):
            return None
        rel = text[len(start) :]
        return rel if is_unit_path(rel) else None

    def _post(self, path: str, payload: Mapping[str, Any]) -> dict[str, Any]:
        try:
            result: dict[str, Any] = self.client.post(self.client.get_url(path), json=payload)
        except etcd_exceptions.Etcd3Exception as e:
            detail = getattr(e, "detail_text", None) or str(e)
            unreachable = _unreachable(detail)
            if unreachable is not None:
                raise StoreError(
                    f"{self.url}: cannot reach etcd at {self.host}:{self.port} ({unreachable}); "
                    "is etcd running there, and is the URL right?"
                ) from None
            raise StoreError(f"{self.url}: {path}: {detail.strip()}{_hint(detail)}") from None
        return result

    # ------------------------------------------------------------ reads and writes

    def _range(self, scope: str | None) -> dict[str, Any]:
        """A range request: the whole unit (None), one document, or a directory (``dir/``)."""
        if scope is None:
            start = self.prefix + "/"
            return {"key": _b64(start), "range_end": _b64(_prefix_end(start))}
        key = self.key(scope)
        if scope.endswith("/"):
            return {"key": _b64(key), "range_end": _b64(_prefix_end(key))}
        return {"key": _b64(key)}

    def snapshot(self, scope: Sequence[str] | None = None, revision: int | None = None) -> Snapshot:
        """The unit's documents at one revision (the newest unless given): all of them, or
        only those ``scope`` names (documents, or directories ending in ``/``), read in one
        transaction."""
        at = {"revision": revision} if revision else {}
        if not scope:
            result = self._post(
                "/kv/range", {**self._range(None), **at, "count_only": scope is not None}
            )
            kvs = result.get("kvs", [])
        else:
            txn = {"success": [{"request_range": {**self._range(s), **at}} for s in scope]}
            result = self._post("/kv/txn", txn)
            kvs = [
                kv
                for r in result.get("responses", [])
                for kv in r.get("response_range", {}).get("kvs", [])
            ]
        entries: dict[str, Entry] = {}
        for kv in kvs:
            rel = self._rel(_unb64(kv["key"]))
            if rel is not None:
                entries[rel] = Entry(_unb64(kv.get("value")), _rev(kv.get("mod_revision")))
        return Snapshot(_rev(result["header"].get("revision")), dict(sorted(entries.items())))

    def _kv(self, key: str) -> dict[str, Any] | None:
        """One key's record (value, revisions), or None when it does not exist."""
        kvs: list[dict[str, Any]] = self._post("/kv/range", {"key": _b64(key)}).get("kvs", [])
        return kvs[0] if kvs else None

    def revision_of(self, rel: str) -> int:
        """The ``mod_revision`` of one document (0 when it does not exist)."""
        kv = self._kv(self.key(rel))
        return _rev(kv.get("mod_revision")) if kv else 0

    def _compare(self, guard: Guard) -> dict[str, Any]:
        if isinstance(guard, LeaderGuard):
            return {
                "key": _b64(self.leader_key),
                "target": "VALUE",
                "result": "EQUAL",
                "value": _b64(guard.identity),
            }
        if guard.mod_revision == 0:
            return {
                "key": _b64(self.key(guard.rel)),
                "target": "CREATE",
                "result": "EQUAL",
                "create_revision": 0,
            }
        return {
            "key": _b64(self.key(guard.rel)),
            "target": "MOD",
            "result": "EQUAL",
            "mod_revision": guard.mod_revision,
        }

    def commit(
        self,
        puts: Mapping[str, bytes],
        deletes: Iterable[str] = (),
        guards: Sequence[Guard] = (),
    ) -> int:
        ops: list[dict[str, Any]] = []
        for rel, data in sorted(puts.items()):
            if not is_unit_path(rel):
                raise StoreError(f"{rel!r} is not a path of a unit's document")
            ops.append({"request_put": {"key": _b64(self.key(rel)), "value": _b64(data)}})
        for rel in sorted(set(deletes)):
            if not is_unit_path(rel):  # e.g. ".leader": never deleted as a document
                raise StoreError(f"{rel!r} is not a path of a unit's document")
            ops.append({"request_delete_range": {"key": _b64(self.key(rel))}})
        if not ops:
            return 0
        txn = {"compare": [self._compare(g) for g in guards], "success": ops, "failure": []}
        result = self._post("/kv/txn", txn)
        if not result.get("succeeded", False):
            raise StaleWrite(
                f"{self.url}: write refused: {self._why_stale(guards)}; nothing was written"
            )
        return _rev(result["header"].get("revision"))

    def _why_stale(self, guards: Sequence[Guard]) -> str:
        reasons: list[str] = []
        for g in guards:
            if isinstance(g, LeaderGuard):
                holder = self.leader()
                if holder != g.identity:
                    reasons.append(
                        f"this controller ({g.identity}) does not lead (leader: {holder or 'none'})"
                    )
            else:
                now = self.revision_of(g.rel)
                if now != g.mod_revision:
                    reasons.append(
                        f"{g.rel} changed in the store since it was read "
                        f"(revision {g.mod_revision}, now {now or 'deleted'})"
                    )
        return "; ".join(reasons) or "a guard failed"

    # ------------------------------------------------------------ watch

    def watch(
        self, start_revision: int, *, idle: float = 1.0, scope: str | None = None
    ) -> Iterator[list[Change]]:
        """Batches of changes to the unit's documents (or only to ``scope``: a document, or a
        directory ending in ``/``) from ``start_revision`` on, in order, until the stream is
        quiet for ``idle`` seconds or drops (the iterator then ends: watch again from the last
        revision seen + 1). Raises :class:`Compacted`."""
        request: dict[str, Any] = {
            "create_request": {**self._range(scope), "start_revision": start_revision}
        }
        try:
            response = self.client.session.post(
                self.client.get_url("/watch"),
                json=request,
                stream=True,
                timeout=(self.timeout, idle),
            )
        except requests.RequestException as e:
            raise StoreError(f"{self.url}: watch: {e}") from None
        try:
            for line in _lines(response):
                result = json.loads(line).get("result", {})
                if _rev(result.get("compact_revision")) > 0 or result.get("canceled"):
                    raise Compacted(
                        f"{self.url}: events from revision {start_revision} were compacted "
                        f"(oldest kept: {result.get('compact_revision', '?')})"
                    )
                batch: list[Change] = []
                for event in result.get("events", []):
                    kv = event["kv"]
                    rel = self._rel(_unb64(kv["key"]))
                    if rel is None:
                        continue
                    deleted = event.get("type") == "DELETE"
                    data = None if deleted else _unb64(kv.get("value"))
                    batch.append(Change(rel, data, _rev(kv.get("mod_revision"))))
                if batch:
                    yield batch
        except (requests.RequestException, ValueError) as e:
            # quiet for ``idle`` seconds (a read timeout) or the stream dropped: both end the
            # iteration; the caller watches again from the last revision it applied
            log.debug("watch stream ended: %s", e)
        finally:
            response.close()

    # ------------------------------------------------------------ leader election

    def leader(self) -> str | None:
        """The identity holding the unit's leader key, if any."""
        kv = self._kv(self.leader_key)
        return _unb64(kv.get("value")).decode() if kv else None

    def try_lead(self, identity: str, ttl: int) -> Leadership | None:
        """Take the leader key if nobody holds it (one transaction); None if another does."""
        grant = self._post("/lease/grant", {"TTL": ttl, "ID": 0})
        lease_id = int(grant["ID"])
        txn = {
            "compare": [
                {
                    "key": _b64(self.leader_key),
                    "target": "CREATE",
                    "result": "EQUAL",
                    "create_revision": 0,
                }
            ],
            "success": [
                {
                    "request_put": {
                        "key": _b64(self.leader_key),
                        "value": _b64(identity),
                        "lease": lease_id,
                    }
                }
            ],
            "failure": [],
        }
        result = self._post("/kv/txn", txn)
        if not result.get("succeeded", False):
            self._post("/kv/lease/revoke", {"ID": lease_id})
            return None
        lost, stop = threading.Event(), threading.Event()
        lead = Leadership(identity, lease_id, ttl, lost, stop)
        lead._thread = threading.Thread(
            target=self._keep_alive, args=(lead,), name="reconciler-lease", daemon=True
        )
        lead._thread.start()
        return lead

    def campaign(self, identity: str, ttl: int, stop: threading.Event) -> Leadership | None:
        """Wait until this process leads the unit (None when ``stop`` is set first). A dead
        leader's key disappears when its lease expires, up to ``ttl`` seconds after its last
        refresh, at etcd's next expiry check (every 0.5 s); it is looked for every 0.25 s (a
        read of one key), so this process leads within about ``ttl`` + 1 s of the death."""
        poll = max(0.1, min(0.25, ttl / 4))
        announced: str | None = None
        while not stop.is_set():
            try:
                holder = self.leader()  # a read: no lease is granted while another leads
                if holder is None:
                    lead = self.try_lead(identity, ttl)
                    if lead is not None:
                        return lead
                elif holder != announced:
                    log.info("standing by: %s leads %s", holder, self.url)
                    announced = holder
            except StoreError as e:
                log.error("campaign: %s", e)
            stop.wait(poll)
        return None

    def _keep_alive(self, lead: Leadership) -> None:
        interval = max(0.1, lead.ttl / 3)
        last_ok = time.monotonic()
        while not lead._stop.wait(interval):
            ttl: int | None
            try:
                result = self._post("/lease/keepalive", {"ID": lead.lease_id})
                ttl = int(result.get("result", {}).get("TTL", -1))
            except StoreError as e:
                log.warning("lease refresh failed: %s", e)
                # the lease may still hold: lost once a whole TTL passed without a refresh
                ttl = 0 if time.monotonic() - last_ok >= lead.ttl else None
            if ttl is None:
                continue
            if ttl <= 0:
                log.error("lost the leader lease of %s", self.url)
                lead.lost.set()
                return
            last_ok = time.monotonic()


def _lines(response: requests.Response) -> Iterator[bytes]:
    """The non-empty lines of a streamed response. (``Response.iter_lines`` reads 512 bytes
    at a time and splits its whole pending buffer again for each: quadratic in the length of
    a line, and a watch response carrying a large commit is one line of many MiB.)"""
    buf = bytearray()
    for chunk in response.iter_content(chunk_size=1 << 16):
        searched = len(buf)
        buf += chunk
        start = 0
        while (end := buf.find(b"\n", searched)) >= 0:
            if end > start:
                yield bytes(buf[start:end])
            start = searched = end + 1
        del buf[:start]
    if buf.strip():
        yield bytes(buf)


_UNREACHABLE = (
    ("Connection refused", "connection refused"),
    ("Name or service not known", "unknown host name"),
    ("Temporary failure in name resolution", "the host name does not resolve"),
    ("No route to host", "no route to the host"),
    ("Network is unreachable", "the network is unreachable"),
    ("timed out", "timed out"),
    ("Read timed out", "timed out"),
    ("Failed to establish a new connection", "no connection"),
)


def _unreachable(detail: str) -> str | None:
    """Why etcd could not be reached, in words, when the client's raw error says so (the
    HTTP library's text: "HTTPConnectionPool(...): Max retries exceeded ... [Errno 111]
    Connection refused"); None for an answer from etcd itself."""
    for raw, words in _UNREACHABLE:
        if raw in detail:
            return words
    return None


def _hint(detail: str) -> str:
    if any(
        text in detail
        for text in ("too many operations", "request is too large", "larger than max")
    ):
        return " (raise etcd's --max-txn-ops / --max-request-bytes: docs/etcd.md)"
    return ""
