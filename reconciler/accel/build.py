"""The OCI build memo: what a long-running caller (``watch``) carries from one build of every
config to the next, so that an edit rebuilds only the configs whose inputs or host answers
changed. It gives what :func:`reconciler.oci.builder.build_all` (the reference) gives, from
the same single build (:func:`~reconciler.oci.builder.build_job`); the tests compare."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import compress, repeat
from operator import attrgetter, is_, not_
from typing import Any

from reconciler.oci.builder import (
    Asked,
    BuildResult,
    BuiltConfig,
    ConfigJob,
    DeviceLookup,
    DevicePolicy,
    GroupLookup,
    RunLookups,
    build_job,
    same_placement_inputs,
    same_service_inputs,
)

__all__ = ["BuildMemo"]

_DEFAULT_POLICY = DevicePolicy()


def _same(a: object, b: object) -> bool:
    return a is b or a == b


@dataclass(frozen=True, slots=True)
class _Memoized:
    job: ConfigJob
    policy: DevicePolicy
    asked: tuple[Asked, ...]  # every host lookup the build made, in order, with its answer
    outcome: BuiltConfig | str  # str: the one-line OciError message

    def holds_for(
        self,
        job: ConfigJob,
        policy: DevicePolicy,
        lookups: RunLookups,
        checked: dict[int, bool] | None = None,
    ) -> bool:
        """The build would give the same outcome now: every input equal and every host lookup
        it made answered the same way in this call (the build is a pure function of these).

        The job given back by :meth:`BuildMemo.job` is recognized by identity. ``checked``:
        per ``id`` of an ``asked`` tuple, whether its answers hold in this call, so that builds
        sharing one tuple (:class:`BuildMemo` interns them) are checked once per call; the
        caller keeps every tuple it holds ids of alive for as long as ``checked``."""
        old = self.job
        if old is not job and not (
            same_placement_inputs(old.placement, job.placement)
            and old.rootfs == job.rootfs
            and old.uid == job.uid
            and old.gid == job.gid
            and old.hosts_path == job.hosts_path
            and old.network == job.network
            and same_service_inputs(old.service, job.service)
            and _same(old.node, job.node)
        ):
            return False
        if not _same(self.policy, policy):
            return False
        asked = self.asked
        if not asked:
            return True
        if checked is None:
            return all(lookups.answer(a) == a[2] for a in asked)
        holds = checked.get(id(asked))
        if holds is None:
            holds = checked[id(asked)] = all(lookups.answer(a) == a[2] for a in asked)
        return holds


class BuildMemo:
    """What the last call of this memo's :meth:`build_all` built, per instance id, with the
    exact inputs and host answers each build used. The next call reuses a build only when its
    job (service, placement (the fields the build reads: :func:`same_placement_inputs`), node,
    rootfs, uid, gid, hosts path) and policy are equal and every
    group and device lookup it made gives the same answer in that call; anything else is built
    again. A memo is tied to one pair of lookups (given other lookups, it starts empty).

    Cost of a reused build: a caller that passes back the job :meth:`job` returns (when its
    inputs are the same objects) costs an identity check, and the host answers a build used
    are checked once per call for all the builds that asked the same questions (equal ``asked``
    tuples are interned: one object per distinct sequence of questions and answers)."""

    def __init__(self) -> None:
        self._entries: dict[str, _Memoized] = {}
        self._lookups: tuple[GroupLookup, DeviceLookup] | None = None
        self._interned: dict[tuple[Asked, ...], tuple[Asked, ...]] = {}
        self._asking: set[str] = set()  # the entries whose build asked the host something
        self.reused = 0  # in the last call: builds taken from the memo
        self.built = 0  # in the last call: builds run

    def build_all(
        self,
        jobs: Iterable[ConfigJob],
        *,
        groups: GroupLookup,
        devices: DeviceLookup,
        policy: DevicePolicy = _DEFAULT_POLICY,
        removed: Iterable[str] | None = None,
    ) -> BuildResult:
        """:func:`build_all`, reusing the builds of the last call whose inputs and host answers
        are unchanged. ``removed``: the jobs are only some of the caller's, and these ids are
        no longer built; this memo's entries of the other ids stay as they are (see
        :meth:`_build`)."""
        return self._build(jobs, groups, devices, policy, removed)

    def __len__(self) -> int:
        return len(self._entries)

    def jobs(self, instance_ids: list[str]) -> list[ConfigJob | None]:
        """:meth:`job` of each id (one C-level pass)."""
        return list(map(_JOB, map(self._entries.get, instance_ids, repeat(_ABSENT))))

    def asking(self) -> set[str]:
        """The ids whose last build asked the host something (a group, a device): a caller
        that passes back only some jobs (``build_all(..., removed=...)``) must pass these,
        whose answers are checked again on each call."""
        return set(self._asking)

    def job(self, instance_id: str) -> ConfigJob | None:
        """The job this instance's config was built from in the last call, if any. A caller
        whose inputs for the instance are the very objects (and values) of that job can pass
        it back instead of a new, equal job: :func:`build_all` recognizes it by identity."""
        entry = self._entries.get(instance_id)
        return None if entry is None else entry.job

    def _build(
        self,
        jobs: Iterable[ConfigJob],
        groups: GroupLookup,
        devices: DeviceLookup,
        policy: DevicePolicy,
        removed: Iterable[str] | None,
    ) -> BuildResult:
        """:func:`~reconciler.oci.builder.build_all` (every job built; one instance's failure
        never stops the others), reusing the builds of the previous call whose inputs and host
        answers are unchanged, and keeping this call's.

        ``removed``: the jobs are only some of the caller's, and these ids are no longer
        built; the memo's entries of the other ids stay as they are (the caller knows each
        one's job is the very one of its entry, and that it asked the host nothing: see
        :meth:`asking`). The result holds the given jobs only."""
        todo = list(jobs)
        lookups = RunLookups(groups, devices, todo)
        previous: dict[str, _Memoized] = {}
        interned: dict[tuple[Asked, ...], tuple[Asked, ...]] = {}
        same_lookups = self._lookups is not None and (
            self._lookups[0] is groups and self._lookups[1] is devices
        )
        if same_lookups:
            previous, interned = self._entries, self._interned
        if removed is not None and not same_lookups:
            raise ValueError("a call with some jobs only needs the memo of the same lookups")
        # per id() of an asked tuple of `previous` (alive until the end of the call): it holds now
        checked: dict[int, bool] = {}
        iids = list(map(_instance_id_of, todo))
        olds: list[Any] = list(map(previous.get, iids, repeat(_ABSENT)))
        # a build whose job is the very object of the last call's, under the same policy, that
        # asked the host nothing, is taken as is: found by C-level passes, not a loop body each
        same = list(
            map(
                all,
                zip(
                    map(is_, map(_JOB, olds), todo),
                    map(is_, map(_POLICY, olds), repeat(policy)),
                    map(not_, map(_ASKED, olds)),
                    strict=True,
                ),
            )
        )
        entries: dict[str, _Memoized] = dict(zip(iids, olds, strict=True))
        reused = same.count(True)
        for k in compress(range(len(todo)), map(not_, same)):
            job, iid, entry = todo[k], iids[k], olds[k]
            if entry is not _ABSENT and entry.holds_for(job, policy, lookups, checked):
                reused += 1
                if entry.job is not job:  # an equal input: the next call finds it by identity
                    entry = _Memoized(job, policy, entry.asked, entry.outcome)
            else:
                outcome = build_job(job, lookups, policy)
                asked = tuple(lookups.asked)
                if asked:
                    asked = interned.setdefault(asked, asked)
                entry = _Memoized(job, policy, asked, outcome)
            entries[iid] = entry
        outcomes = list(map(_OUTCOME, entries.values()))
        built: dict[str, BuiltConfig] = dict(zip(entries, outcomes, strict=True))
        errors: dict[str, str] = {}
        if any(map(isinstance, outcomes, repeat(str))):
            errors = {iid: out for iid, out in built.items() if isinstance(out, str)}
            built = {iid: out for iid, out in built.items() if not isinstance(out, str)}
        asking = set(compress(entries, map(_ASKED, entries.values())))
        if removed is not None:  # the other ids' entries, as they were (same lookups: above)
            kept = dict(previous)
            gone = set(removed)
            for iid in gone:
                kept.pop(iid, None)
            asking |= self._asking - gone - entries.keys()
            kept.update(entries)
            entries = kept
        if len(interned) > 2 * len(entries) + 64:  # drop the tuples no build uses any more
            interned = {e.asked: e.asked for e in entries.values() if e.asked}
        self._entries = entries
        self._asking = asking
        self._lookups = (groups, devices)
        self._interned = interned
        self.reused = reused
        self.built = len(entries) - reused
        return BuildResult(built, errors)


_instance_id_of = attrgetter("placement.instance_id")
_JOB = attrgetter("job")
_POLICY = attrgetter("policy")
_ASKED = attrgetter("asked")
_OUTCOME = attrgetter("outcome")


class _Absent:
    """Stands for "no build last call" in :meth:`BuildMemo.build_all`'s C-level passes."""

    job = None
    policy = None
    asked = (None,)  # not empty: never taken as is


_ABSENT = _Absent()
