"""`AsyncEngine`: one background thread steps an `LLMEngine`; asyncio handlers talk to it.

Threads and ownership:
- The engine thread is the only code that calls the engine (`add_request`, `abort_request`,
  `step`, `stats`, `num_free_blocks`). It keeps stepping while requests arrive (continuous
  batching) and sleeps on an event when the engine is idle.
- Handlers (event-loop thread) hand work over through a thread-safe inbox; outputs come back
  through one `asyncio.Queue` per HTTP request (`RequestGroup`), fed with
  `loop.call_soon_threadsafe`.
- The waiting count (admitted HTTP requests that have not yet received any output) lives on the
  event-loop thread; `--max-queue N` rejects a request when N are already waiting.

An HTTP request with `n` choices becomes `n` engine requests `"{id}-{i}"` (`n=1` each), so every
choice streams independently and the prompt's KV blocks are shared through prefix caching.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

logger = logging.getLogger("kvpack.serve")

DISCONNECTED = object()  # queue sentinel: the client went away

# id(engine) -> the AsyncEngine whose thread steps it: two threads must never step one engine.
_OWNERS: dict[int, "AsyncEngine"] = {}
_OWNERS_LOCK = threading.Lock()


class QueueFullError(Exception):
    """More than --max-queue requests are waiting: answer 503 at once."""


class ShuttingDownError(Exception):
    """The server is draining (SIGTERM): answer 503."""


@dataclass
class RequestGroup:
    """The engine requests behind one HTTP request. Items on `queue` are
    `(kind, index, payload)` with kind "out" (a RequestOutput is waiting in `latest[index]`),
    "error" (payload: the exception) or "abort" (the server aborted it), or DISCONNECTED.

    Outputs are cumulative, so only the newest one per choice is kept (`latest`, under `lock`)
    and one "out" notification is queued while it is unread: a slow client costs one pending
    output per choice, not one per step."""

    group_id: str
    sub_ids: list[str]
    prompts: list[Any]
    params: list[Any]
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    unfinished: set[int] = field(default_factory=set)
    waiting: bool = True
    latest: dict[int, Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


class AsyncEngine:
    """Runs `engine.step()` in one daemon thread; see the module docstring."""

    def __init__(self, engine: Any, *, max_queue: int | None = None, idle_wait_s: float = 0.05):
        self.engine = engine
        self.max_queue = max_queue
        self.idle_wait_s = idle_wait_s
        self.num_waiting = 0  # event-loop thread only
        self.num_active = 0  # HTTP requests admitted and not yet done (event-loop thread only)
        self.draining = False
        self.dead = False  # the engine thread died: /health and new requests answer 503
        self.snapshot: dict[str, Any] = {}  # latest engine stats, swapped whole by the engine thread
        self.step_errors = 0
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._live: dict[str, tuple[RequestGroup, int]] = {}  # engine thread only
        self._thread: threading.Thread | None = None

    # --- event-loop side ------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            with _OWNERS_LOCK:
                owner = _OWNERS.get(id(self.engine))
                if owner is not None and owner is not self:
                    raise RuntimeError("this engine is already driven by another AsyncEngine")
                _OWNERS[id(self.engine)] = self
            self._refresh_snapshot()
            self._thread = threading.Thread(target=self._run, name="kvpack-engine", daemon=True)
            self._thread.start()

    def submit(self, group_id: str, prompts: list[Any], params: list[Any]) -> RequestGroup:
        """Admit one HTTP request (`len(prompts)` engine requests). Raises QueueFullError or
        ShuttingDownError instead of queueing when the server cannot take it."""
        if self.draining or self._stop.is_set():
            raise ShuttingDownError("the server is shutting down")
        if self.dead:
            raise ShuttingDownError("the engine thread died; see the server log")
        if self.max_queue is not None and self.num_waiting >= self.max_queue:
            raise QueueFullError(
                f"the server is overloaded: {self.num_waiting} requests already waiting "
                f"(--max-queue {self.max_queue}); retry later")
        group = RequestGroup(group_id, [f"{group_id}-{i}" for i in range(len(prompts))],
                             prompts, params, asyncio.get_running_loop())
        group.unfinished = set(range(len(prompts)))
        self.num_waiting += 1
        self.num_active += 1
        self._inbox.put(("add", group))
        self._wake.set()
        return group

    async def results(self, group: RequestGroup) -> AsyncIterator[tuple[str, int, Any]]:
        """Yield `(kind, index, payload)` until every engine request of the group finished.
        Leaving early (client gone, cancellation, error) aborts what is still running."""
        try:
            while group.unfinished:
                item = await group.queue.get()
                if item is DISCONNECTED:
                    return
                self._mark_started(group)
                kind, index, payload = item
                if kind == "out":
                    with group.lock:
                        payload = group.latest.pop(index, None)
                    if payload is None:
                        continue
                if kind != "out" or payload.finished:
                    group.unfinished.discard(index)
                yield kind, index, payload
        finally:
            self._mark_started(group)
            self.num_active -= 1
            if group.unfinished:
                self.abort(group)

    def abort(self, group: RequestGroup) -> None:
        ids = [group.sub_ids[i] for i in sorted(group.unfinished)]
        group.unfinished.clear()
        self._inbox.put(("abort", ids))
        self._wake.set()

    def abort_all(self) -> None:
        """Abort every request in the engine; their handlers see ("abort", i, None)."""
        self._inbox.put(("abort_all", None))
        self._wake.set()

    def shutdown(self, timeout_s: float = 10.0) -> None:
        self.draining = True
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        with _OWNERS_LOCK:
            if _OWNERS.get(id(self.engine)) is self:
                del _OWNERS[id(self.engine)]

    def _mark_started(self, group: RequestGroup) -> None:
        if group.waiting:
            group.waiting = False
            self.num_waiting -= 1

    # --- engine thread ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # the driver itself broke: fail everything, refuse new work
            logger.exception("the engine thread died")
            self.dead = True
            self._abort_everything(error=RuntimeError(f"the engine thread died: {e!r}"))

    def _loop(self) -> None:
        while True:
            self._wake.clear()
            did_work = self._drain_inbox()
            if self._stop.is_set():
                self._abort_everything()
                self._refresh_snapshot()
                logger.info("engine stopped: %d of %d KV blocks free",
                            self.snapshot.get("num_free_blocks", -1),
                            self.snapshot.get("num_blocks", self.snapshot.get("num_total_blocks", -1)))
                return
            if not self.engine.has_unfinished_requests():
                if did_work:
                    self._refresh_snapshot()
                self._wake.wait(self.idle_wait_s)
                continue
            try:
                outputs = self.engine.step()
            except Exception as e:  # a bug in the engine: fail the requests, keep serving
                self.step_errors += 1
                logger.exception("engine step failed; aborting %d requests", len(self._live))
                self._abort_everything(error=e)
                outputs = []
            for out in outputs:
                entry = self._live.get(out.request_id)
                if entry is None:
                    continue  # aborted meanwhile
                group, index = entry
                if out.finished:
                    del self._live[out.request_id]
                with group.lock:
                    notify = index not in group.latest
                    group.latest[index] = out
                if notify:
                    self._deliver(group, ("out", index, None))
            self._refresh_snapshot()

    def _drain_inbox(self) -> bool:
        did = False
        while True:
            try:
                kind, payload = self._inbox.get_nowait()
            except queue.Empty:
                return did
            did = True
            if kind == "add":
                self._add(payload)
            elif kind == "abort":
                for rid in payload:
                    if self._live.pop(rid, None) is not None:
                        self._abort_one(rid)
            elif kind == "abort_all":
                self._abort_everything()

    def _add(self, group: RequestGroup) -> None:
        for index, (rid, prompt, params) in enumerate(zip(group.sub_ids, group.prompts, group.params)):
            try:
                self.engine.add_request(rid, prompt, params)
            except Exception as e:  # bad input the handler did not catch: this request only
                self._deliver(group, ("error", index, e))
                continue
            self._live[rid] = (group, index)

    def _abort_everything(self, error: Exception | None = None) -> None:
        for rid, (group, index) in list(self._live.items()):
            self._abort_one(rid)
            self._deliver(group, ("error", index, error) if error else ("abort", index, None))
        self._live.clear()

    def _abort_one(self, rid: str) -> None:
        try:
            self.engine.abort_request(rid)
        except Exception:
            logger.exception("abort_request(%s) failed", rid)

    def _deliver(self, group: RequestGroup, item: tuple) -> None:
        try:
            group.loop.call_soon_threadsafe(group.queue.put_nowait, item)
        except RuntimeError:  # the event loop is closed: nobody is listening
            pass

    def _refresh_snapshot(self) -> None:
        try:
            stats = dict(self.engine.stats())
            stats["num_free_blocks"] = int(self.engine.num_free_blocks)
        except Exception:
            logger.exception("engine.stats() failed")
            return
        stats["time"] = time.time()
        self.snapshot = stats
