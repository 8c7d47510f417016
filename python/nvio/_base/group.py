"""The torch.distributed group helper: steps that name the dead ranks.

A :class:`Group` runs the steps of a multi-rank save or load (``gather``,
``barrier``, ``agree``, ``run``) on a process group, every failure a
CheckpointError naming the file, the step and the ranks that died or did
not come, by number, from what the group's store knows rather than from
the transport's wording: each process beats a heartbeat counter in the
store while it saves or loads, and each rank counts itself in before each
step's collective. A rank that stopped beating before it came, or while the
others were in the collective, is named as dead; one that is alive but not
there when the group's timeout runs out is named as late. Used by
checkpoint's data-parallel saves and loads, nvio.dcp and the DeepSpeed
parallel writers.
"""
from __future__ import annotations

import datetime
import os
import threading
import time

import torch
import torch.distributed as dist

from .plan import CheckpointError

#: how often a process beats its heartbeat in the store (seconds): one small
#: request to rank 0's store per rank per second for the life of the process
#: (1,000 ranks: 1,000 a second), five beats inside STALE_S
BEAT_S = 1.0
#: a heartbeat that has not moved for this long: its process is dead (seconds;
#: at most half the group's timeout)
STALE_S = 5.0


def group_timeout(group):
    """The timeout ``group`` was made with (a timedelta), for the waits
    that name missing ranks; None where torch does not say."""
    try:
        g = group if group is not None else dist.group.WORLD
        return g._get_backend(torch.device("cpu")).options._timeout
    except Exception:   # noqa: BLE001 - a private detail of torch: best effort
        return None


class GroupFailure(RuntimeError):
    """A step of a group save or load failed because ranks died or did not
    come; ``ranks``: their numbers in the group, ``dead``: whether they died
    (their heartbeat stopped) rather than being late."""

    def __init__(self, msg, ranks, dead):
        super().__init__(msg)
        self.ranks = ranks
        self.dead = dead


def _default_store():
    return dist.distributed_c10d._get_default_store()


class _Heartbeat:
    """One per process: a daemon thread adding 1 to ``nvio.beat/<global
    rank>`` in the default store every BEAT_S seconds, from the first group
    step on for the life of the process (a rank waiting for a late one must
    see it beat even between its saves). It stops when the store stops
    answering (the group was destroyed, or the store's host died)."""

    _lock = threading.Lock()
    _stores = {}          # id(store) -> the thread beating there

    @classmethod
    def start(cls, store, rank):
        with cls._lock:
            t = cls._stores.get(id(store))
            if t is not None and t.is_alive():
                return
            store.add(_beat_key(rank), 1)       # seen before the first step
            t = threading.Thread(target=cls._run, args=(store, rank), daemon=True,
                                 name="nvio-heartbeat")
            cls._stores[id(store)] = t
            t.start()

    @staticmethod
    def _run(store, rank):
        key = _beat_key(rank)
        while True:
            time.sleep(BEAT_S)
            try:
                # the group destroyed: let its store go (rank 0's holds the port)
                if not dist.is_initialized() or _default_store() is not store:
                    return
                store.add(key, 1)
            except Exception:   # noqa: BLE001 - the store is gone: nothing to beat for
                return


def _beat_key(global_rank):
    return "nvio.beat/%d" % global_rank


def _store_host_rank():
    """The global rank whose process hosts the default store: rank 0 for
    init_method tcp:// and env:// (it made the TCPStore); None under
    torchrun's agent store, or another store."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
        return None
    return 0


class Group:
    """Collectives on a process group, every failure a CheckpointError that
    names the file, the step and the ranks that died or did not come.

    Each step (``gather``, ``barrier``) first counts this rank in through
    the default store (``nvio.group/<group name>/in/<rank>``, and a count of
    every arrival), then waits there for every rank of the group, watching
    the heartbeats (:class:`_Heartbeat`) of those not yet there: one whose
    heartbeat stopped for STALE_S is dead, and the step fails at once naming
    it; one still beating at the group's timeout is late. Where the
    collective itself fails (a rank died inside it, or between counting in
    and joining), the heartbeats say who died. The same on every surviving
    rank, whatever the transport's error says."""

    def __init__(self, group, path, timeout):
        self.group = group
        self.path = path
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.timeout = timeout if timeout is not None else group_timeout(group)
        if self.timeout is None:
            self.timeout = datetime.timedelta(minutes=30)      # torch's default
        self.committed = False      # rank 0: the new file replaced the old one
        self.stage = None           # "committing": rank 0 may have committed
        g = group if group is not None else dist.group.WORLD
        self._prefix = "nvio.group/%s/" % g.group_name
        self._globals = [dist.get_global_rank(g, r) if group is not None else r
                         for r in range(self.size)]
        self._store = None
        self._n = 0                 # the steps this rank counted in for, on this group
        self._seen = {}             # rank -> (heartbeat, time.monotonic() it was first seen)
        try:
            self._connect()         # beating from here on: a death before the first step shows
        except Exception:           # noqa: BLE001 - said by the first step that needs it
            self._store = None

    def outcome(self):
        """What a failure leaves at the path."""
        if self.committed:
            return "the new checkpoint was committed before this"
        if self.stage == "committing" and self.rank != 0:
            return "rank 0 may have committed the new checkpoint before this"
        return "the previous checkpoint (if any) is unchanged"

    def fail(self, what, e):
        return CheckpointError("nvio.save: %s: %s failed on rank %d: %s; %s"
                               % (self.path, what, self.rank, e, self.outcome()), self.path)

    # -- the store: who came, who is alive ---------------------------------------------

    def _stale_s(self):
        return min(STALE_S, self.timeout.total_seconds() / 2)

    def _connect(self):
        if self._store is None:
            self._store = _default_store()
            _Heartbeat.start(self._store, dist.get_rank())
        return self._store

    def _beats(self, ranks):
        """{rank: True (beating), False (stopped for STALE_S), None (never
        beat, or not watched long enough)} for ranks, from the store."""
        st, now, out = self._store, time.monotonic(), {}
        for r in ranks:
            b = st.add(_beat_key(self._globals[r]), 0)
            last = self._seen.get(r)
            if last is None or last[0] != b:
                self._seen[r] = (b, now)
                out[r] = True if last is not None else None
            elif b == 0:
                out[r] = None
            else:
                out[r] = False if now - last[1] >= self._stale_s() else None
        return out

    def _store_gone(self, what, e):
        host = _store_host_rank()
        if host is not None and host in self._globals and self._globals.index(host) != self.rank:
            r = self._globals.index(host)
            return GroupFailure("Rank %d died: the process group's store, which its process "
                                "hosts, stopped answering during %s (%s)" % (r, what, e),
                                [r], True)
        return GroupFailure("the process group's store stopped answering during %s (%s): the "
                            "process hosting it has died" % (what, e), [], True)

    @staticmethod
    def _dead(when, dead):
        return GroupFailure("%s %s died %s: %s heartbeat in the process group's store stopped"
                            % ("Rank" if len(dead) == 1 else "Ranks", ", ".join(map(str, dead)),
                               when, "its" if len(dead) == 1 else "their"), dead, True)

    def arrive(self, what):
        """Count this rank in for step ``what`` and wait until every rank of
        the group has: GroupFailure naming the ranks that died first, or that
        were still missing at the group's timeout."""
        try:
            st = self._connect()
            n = self._n = st.add(self._prefix + "in/%d" % self.rank, 1)
            want = n * self.size        # every rank counts in once per step
            total = st.add(self._prefix + "all", 1)
            start = time.monotonic()
            nap, watched = 0.0005, start
            while total < want:
                time.sleep(nap)
                nap = min(nap * 2, 0.05)
                total = st.add(self._prefix + "all", 0)
                now = time.monotonic()
                if total >= want or now - watched < BEAT_S:
                    continue
                watched = now
                missing = [r for r in range(self.size)
                           if st.add(self._prefix + "in/%d" % r, 0) < n]
                beats = self._beats(missing)
                dead = [r for r in missing if beats[r] is False]
                if dead:
                    self._settle(dead)
                    raise self._dead("before reaching " + what, dead)
                if missing and now - start >= self.timeout.total_seconds():
                    never = [r for r in missing if st.add(_beat_key(self._globals[r]), 0) == 0]
                    self._settle(missing)
                    raise GroupFailure(
                        "%s %s did not reach %s within the group's timeout of %g s (%s)" % (
                            "Rank" if len(missing) == 1 else "Ranks",
                            ", ".join(map(str, missing)), what,
                            self.timeout.total_seconds(),
                            "never seen in the process group's store" if never == missing
                            else "alive: %s heartbeat runs" % ("its" if len(missing) == 1
                                                                else "their")),
                        missing, False)
        except GroupFailure:
            raise
        except Exception as e:     # noqa: BLE001 - the store's client: DistStoreError, ...
            raise self._store_gone(what, e) from None

    def cause(self, what, e):
        """Why a collective of step ``what`` failed with ``e``: the ranks
        whose heartbeat stopped (watched up to STALE_S), else ``e``."""
        others = [r for r in range(self.size) if r != self.rank]
        try:
            self._connect()
            end = time.monotonic() + self._stale_s() + BEAT_S
            self._seen = {}
            while True:
                beats = self._beats(others)
                dead = [r for r in others if beats[r] is False]
                if all(b is not None for b in beats.values()) or time.monotonic() > end:
                    break
                others = [r for r in others if beats[r] is not True]
                time.sleep(BEAT_S / 2)
        except Exception as e2:    # noqa: BLE001
            return self._store_gone(what, e2)
        self._settle(dead)
        if dead:
            return self._dead("during " + what, dead)
        return e

    def _settle(self, dead):
        """After a failure of step n: count this rank out; the rank whose
        process hosts the store waits (bounded) until every other survivor
        has, so that the store answers until each has named the dead (its
        exit would otherwise look like its own death)."""
        try:
            key = self._prefix + "out/%d" % self._n
            st = self._store
            st.add(key, 1)
            if self._globals[self.rank] != _store_host_rank():
                return
            end = time.monotonic() + 2 * self._stale_s() + 2
            while st.add(key, 0) < self.size - len(dead) and time.monotonic() < end:
                time.sleep(BEAT_S / 4)
        except Exception:   # noqa: BLE001 - best effort: the error is raised anyway
            pass

    def run(self, what, fn, *args, **kwargs):
        """fn(*args, **kwargs), a collective: its failure as self.fail,
        naming the ranks that died."""
        try:
            return fn(*args, **kwargs)
        except RuntimeError as e:
            raise self.fail(what, self.cause(what, e)) from None

    def barrier(self, what):
        """Wait for every rank (through the store only)."""
        try:
            self.arrive(what)
        except GroupFailure as e:
            raise self.fail(what + " (waiting for every rank)", e) from None

    def gather(self, what, obj):
        """Every rank's obj, in rank order."""
        self.barrier(what)
        out = [None] * self.size
        self.run(what, dist.all_gather_object, out, obj, group=self.group)
        return out

    def agree(self, what, err):
        """Raise on every rank if any rank reports an error (a string)."""
        errs = self.gather(what, err)
        bad = [(r, e) for r, e in enumerate(errs) if e]
        if bad:
            r, e = bad[0]
            raise CheckpointError("nvio.save: %s: %s failed on rank %d (of %d failing): %s; the "
                                  "previous checkpoint (if any) is unchanged"
                                  % (self.path, what, r, len(bad), e), self.path)


def barrier(group, timeout, what):
    """Wait for every rank of ``group`` through its store: GroupFailure (a
    RuntimeError) naming the ranks that died or did not come within
    ``timeout`` (a timedelta; None: the group's own)."""
    Group(group, None, timeout).arrive(what)
