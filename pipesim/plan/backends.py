"""Where a sweep's configurations are evaluated: local processes, or a Dask cluster.

A backend takes the sweep's chunks (lists of ``(index, point)``) and yields each chunk's
results as it completes; :func:`pipesim.plan.sweep.evaluate_points` owns everything
else (order, chunking, progress, the deadline, what a stop returns). Two backends:

- :class:`ProcessPool`: ``concurrent.futures.ProcessPoolExecutor`` on this machine
  (fork from a single-threaded process, else forkserver); a worker that dies fails the
  sweep at once with a clear error.
- :class:`DaskCluster`: a Dask distributed scheduler (``tcp://HOST:8786``) or a
  ``distributed.LocalCluster`` started here (``local``). The sweep context goes to every
  worker once (a worker plugin, which workers that join later get too); the scheduler
  re-runs the chunks of a worker that dies (``distributed.scheduler.allowed-failures``
  times), and a chunk that keeps killing its workers comes back as :class:`LostChunk`.
  Needs the ``dask`` extra (``pip install 'pipesim[dask]'``), imported only here and only
  when asked for.

Every backend stops at once on :meth:`close` (deadline, Ctrl-C, error): pending work is
cancelled and nothing keeps running (the pool's processes are terminated; a Dask
worker's running chunk stops before its next configuration, and a LocalCluster is shut
down).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import multiprocessing
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures import TimeoutError as FuturesTimeout
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pipesim.errors import PlanError

if TYPE_CHECKING:
    from pipesim.plan.point import Evaluation, Point, SweepContext

__all__ = [
    "Backend",
    "DaskCluster",
    "LostChunk",
    "ProcessPool",
    "open_backend",
]

Chunk = list[tuple[int, "Point"]]
ChunkResults = list[tuple[int, "Evaluation"]]
EvaluateChunk = Callable[[Chunk, "SweepContext"], ChunkResults]
"""Evaluates a chunk of points under a context, in whatever process it runs in; a
module-level function, so that it pickles by reference."""

CONNECT_TIMEOUT_S = 30.0
"""The longest a backend waits to start (a LocalCluster), reach a scheduler or see a
worker, within the sweep's own deadline."""
STOP_TIMEOUT_S = 5.0
"""The longest each step of stopping a Dask sweep (cancel the tasks, take the sweep's
plugin off the workers, disconnect, shut a LocalCluster down) waits."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LostChunk:
    """A chunk whose workers died every time it ran: its points were not evaluated."""

    chunk: Chunk
    why: str


class Backend(Protocol):
    """What a sweep needs from the processes that evaluate its points."""

    @property
    def workers(self) -> int:
        """Processes evaluating at once (to size the chunks)."""

    def results(
        self, chunks: list[Chunk], *, deadline: float
    ) -> Iterator[ChunkResults | LostChunk]:
        """Each chunk's results as it completes, in any order; TimeoutError once
        ``time.monotonic()`` passes ``deadline``; PlanError when the workers are lost."""

    def close(self) -> None:
        """Stop now, leaving nothing running (idempotent)."""


def open_backend(
    context: SweepContext,
    *,
    evaluate: EvaluateChunk,
    workers: int,
    cluster: str | None,
    deadline: float,
) -> Backend:
    """A process pool of ``workers`` processes (``cluster`` None), a LocalCluster of
    ``workers`` processes (``cluster="local"``) or the Dask scheduler at ``cluster``."""
    if cluster is None:
        return ProcessPool(context, evaluate=evaluate, workers=workers)
    return DaskCluster(
        context, evaluate=evaluate, address=cluster, workers=workers, deadline=deadline
    )


# -- a process pool on this machine --------------------------------------------------------
_POOL_CONTEXT: SweepContext | None = None  # a pool worker's context, set by its initializer


def _pool_init(context: SweepContext) -> None:
    global _POOL_CONTEXT
    # Ctrl-C on a terminal reaches the whole process group: the parent stops the
    # workers itself, so they must not die with a traceback of their own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _POOL_CONTEXT = context


def _pool_task(evaluate: EvaluateChunk, chunk: Chunk) -> ChunkResults:
    assert _POOL_CONTEXT is not None, "worker started without a sweep context"
    return evaluate(chunk, _POOL_CONTEXT)


class ProcessPool:
    """``workers`` processes on this machine, each holding the sweep context."""

    def __init__(self, context: SweepContext, *, evaluate: EvaluateChunk, workers: int) -> None:
        self._evaluate = evaluate
        self._workers = workers
        # concurrent.futures, not multiprocessing.Pool: when a worker dies (killed, out
        # of memory) the executor fails every pending future at once, where a Pool would
        # silently wait for the lost chunk until the deadline.
        self._executor = ProcessPoolExecutor(
            max_workers=workers,
            mp_context=multiprocessing.get_context(_start_method()),
            initializer=_pool_init,
            initargs=(context,),
        )

    @property
    def workers(self) -> int:
        return self._workers

    def results(self, chunks: list[Chunk], *, deadline: float) -> Iterator[ChunkResults]:
        futures = [self._executor.submit(_pool_task, self._evaluate, chunk) for chunk in chunks]
        done = 0
        try:
            for future in as_completed(futures, timeout=max(deadline - time.monotonic(), 0)):
                chunk_results = future.result()
                done += len(chunk_results)
                yield chunk_results
        except FuturesTimeout:  # an alias of TimeoutError from Python 3.11
            raise TimeoutError from None
        except BrokenProcessPool:
            raise PlanError(
                f"a sweep worker process died (killed, or out of memory?) after {done} "
                f"configurations; rerun with --workers 1 to evaluate in this process and "
                "see the cause"
            ) from None

    def close(self) -> None:
        """Stop every worker now: ``shutdown`` alone lets running chunks finish."""
        executor = self._executor
        # The executor keeps its processes in a private dict; there is no public way to
        # kill a running task (cpython issue 84009), so reach for it, defensively.
        processes = list((getattr(executor, "_processes", None) or {}).values())
        # shutdown() drops the executor's reference to its manager thread: take it first
        manager = getattr(executor, "_executor_manager_thread", None)
        for process in processes:
            if process.is_alive():
                process.terminate()
        executor.shutdown(wait=False, cancel_futures=True)
        limit = time.monotonic() + 1.0
        for process in processes:
            process.join(max(limit - time.monotonic(), 0))
            if process.is_alive():
                process.kill()
                process.join(0.5)
        # Its manager thread outlives shutdown(wait=False) by a moment; while it runs, a
        # next sweep in this process would see two threads and start its pool by
        # forkserver instead of fork (slower, and its workers are not this process's
        # children, so RUSAGE_CHILDREN misses their CPU). Wait for it, briefly.
        if isinstance(manager, threading.Thread):
            manager.join(max(limit - time.monotonic(), 0.5))


def _start_method() -> str:
    """``fork`` (workers start at once) from a single-threaded process; otherwise
    (a Jupyter kernel runs threads, and forking them can deadlock a child)
    ``forkserver``, or ``spawn`` where neither exists."""
    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and threading.active_count() == 1:
        return "fork"
    return "forkserver" if "forkserver" in methods else "spawn"


# -- a Dask distributed cluster ----------------------------------------------------------
# On a Dask worker: per sweep its context, held by the sweep's worker plugin, and the
# sweeps whose plugin is gone (stopped, or done).
_CONTEXTS: dict[str, SweepContext] = {}
_STOPPED: set[str] = set()
_EVALUATING = threading.Lock()  # a worker with several threads runs one chunk at a time


def _dask_task(chunk: Chunk, *, evaluate: EvaluateChunk, sweep: str) -> ChunkResults:
    """A chunk on a Dask worker, stopping between points once its sweep is stopped
    (Dask cannot interrupt a running task: cancelling only forgets its result)."""
    out: ChunkResults = []
    # The sweep's caches are per process (pipesim.plan.evaluation, stage_costs), not
    # per thread.
    with _EVALUATING:
        for item in chunk:
            if sweep in _STOPPED:
                break
            out.extend(evaluate([item], _CONTEXTS[sweep]))
    return out


def _hold_context(sweep: str, context: SweepContext) -> None:
    _CONTEXTS[sweep] = context


def _drop_context(sweep: str) -> None:
    _STOPPED.add(sweep)
    _CONTEXTS.pop(sweep, None)


def _plugins(distributed: Any) -> tuple[type[Any], type[Any]]:
    """The worker plugins of a sweep, defined here, where distributed is imported (a
    plugin reaches every worker, those that join or restart later too):
    ``HoldContext(sweep, context)`` gives each worker the sweep's context once (scattered
    data would be lost with the last worker holding it), and its removal stops the
    sweep's running chunks; ``IgnoreInterrupts()`` makes a LocalCluster's workers ignore
    SIGINT, as this process stops them (its ``setup`` runs in the worker's event loop, in
    its main thread)."""

    class HoldContext(distributed.WorkerPlugin):  # type: ignore[misc]
        def __init__(self, sweep: str, context: SweepContext) -> None:
            self.sweep = sweep
            self.context = context

        def setup(self, worker: Any) -> None:
            _hold_context(self.sweep, self.context)

        def teardown(self, worker: Any) -> None:
            _drop_context(self.sweep)

    class IgnoreInterrupts(distributed.WorkerPlugin):  # type: ignore[misc]
        def setup(self, worker: Any) -> None:
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    return HoldContext, IgnoreInterrupts


@functools.cache
def _pipesim_digest() -> str:
    """A digest of this pipesim's code and data (its modules and preset files)."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.blake2b(digest_size=8)
    for path in sorted([*root.rglob("*.py"), *root.glob("data/*.json")]):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _import_distributed() -> Any:
    try:
        import distributed
    except ImportError:
        raise PlanError("--cluster needs Dask distributed: pip install 'pipesim[dask]'") from None
    return distributed


class DaskCluster:
    """The workers of a Dask scheduler at ``address``, or of a LocalCluster of
    ``workers`` single-threaded processes started here (``address="local"``)."""

    def __init__(
        self,
        context: SweepContext,
        *,
        evaluate: EvaluateChunk,
        address: str,
        workers: int,
        deadline: float,
    ) -> None:
        distributed = self._distributed = _import_distributed()
        self._evaluate = evaluate
        self._sweep = f"pipesim-{uuid.uuid4().hex[:12]}"
        self._cluster: Any = None
        self._client: Any = None
        self._futures: list[Any] = []
        self._registered = False
        # Past the sweep's own deadline, a slow start is the sweep's timeout (the caller
        # returns or reports it as such); within it, a start that takes longer than
        # CONNECT_TIMEOUT_S is this backend's error.
        left_s = deadline - time.monotonic()
        wait_s = max(min(CONNECT_TIMEOUT_S, left_s), 0.1)
        late: type[Exception] = TimeoutError if left_s < CONNECT_TIMEOUT_S else PlanError
        try:
            if address == "local":
                self._cluster = _local_cluster(distributed, workers, wait_s, late)
                address = self._cluster.scheduler_address
            self._client = _connect(distributed, address, wait_s)
            hold_context, ignore_interrupts = _plugins(distributed)
            if self._cluster is not None:
                _within(
                    wait_s, self._client.register_plugin, ignore_interrupts(), name="pipesim-sigint"
                )
            self._workers = _cluster_workers(self._client, address, wait_s, late)
            self._registered = True  # from here on, close() takes it off again
            try:
                _within(
                    wait_s,
                    self._client.register_plugin,
                    hold_context(self._sweep, context),
                    name=self._sweep,
                )
            except TimeoutError as exc:
                raise late(
                    f"the Dask workers at {address} did not take the sweep's context in time "
                    f"({exc})"
                ) from None
        except BaseException:
            self.close()
            raise

    @property
    def workers(self) -> int:
        return self._workers

    def results(
        self, chunks: list[Chunk], *, deadline: float
    ) -> Iterator[ChunkResults | LostChunk]:
        distributed = self._distributed
        client = self._client
        keys = [f"{self._sweep}-{k}" for k in range(len(chunks))]
        # submitted cheapest first: the scheduler runs them in that order
        self._futures = futures = client.map(
            _dask_task,
            chunks,
            evaluate=self._evaluate,
            sweep=self._sweep,
            key=keys,
            pure=False,
        )
        by_key = dict(zip(keys, chunks, strict=True))
        remaining = max(deadline - time.monotonic(), 0)
        try:
            for future in distributed.as_completed(futures, timeout=remaining, loop=client.loop):
                if future.status == "error":
                    error = future.exception()
                    if isinstance(error, distributed.scheduler.KilledWorker):
                        yield LostChunk(
                            chunk=by_key[future.key],
                            why=f"its workers died each time it ran (killed, or out of "
                            f"memory?): {error}",
                        )
                        continue
                    raise error
                yield future.result()
        except distributed.TimeoutError:
            raise TimeoutError from None

    def close(self) -> None:
        """Cancel every task, take the sweep's plugin off the workers (its running chunks
        stop before their next point), disconnect, and shut down a LocalCluster: each step
        within STOP_TIMEOUT_S."""
        client, self._client = self._client, None
        cluster, self._cluster = self._cluster, None
        if client is not None:
            futures, self._futures = self._futures, []
            if any(not f.done() for f in futures):
                _quietly(client.cancel, futures, force=True)
            if self._registered:
                _quietly(client.unregister_worker_plugin, self._sweep)
            _quietly(client.close, timeout=STOP_TIMEOUT_S)
        if cluster is not None:
            _stop_cluster(cluster)


def _within(seconds: float, step: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``step(*args, **kwargs)``'s result or error, in a thread given ``seconds`` (not every
    Dask call has a timeout of its own); TimeoutError past them."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append((True, step(*args, **kwargs)))
        except Exception as exc:  # handed to the caller
            outcome.append((False, exc))

    thread = threading.Thread(target=run, name="pipesim-dask-call", daemon=True)
    thread.start()
    thread.join(seconds)
    if not outcome:
        raise TimeoutError(f"{getattr(step, '__name__', step)} took more than {seconds:.3g} s")
    done, value = outcome[0]
    if not done:
        raise value
    return value


def _quietly(step: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """One step of stopping, given STOP_TIMEOUT_S: a scheduler gone or slow is no reason
    not to do the rest."""
    with contextlib.suppress(Exception):  # stopping is best effort by nature
        _within(STOP_TIMEOUT_S, step, *args, **kwargs)


def _stop_cluster(cluster: Any) -> None:
    """Shut a LocalCluster down within STOP_TIMEOUT_S, once (see :func:`_cluster_class`)."""
    _quietly(cluster.close, timeout=STOP_TIMEOUT_S)


def _cluster_class(distributed: Any) -> Any:
    """LocalCluster, except that distributed's atexit hook (``deploy/spec.py``
    ``close_clusters``, the one reader of ``shutdown_on_close``) leaves it alone: the sweep
    closes its cluster itself, within STOP_TIMEOUT_S, and a second close at exit would
    wait another 10 s and, on a cluster whose nannies a Ctrl-C already stopped (or one
    interrupted while it started), print a traceback of its own (an UnboundLocalError in
    ``utils.sync``). The worker processes are daemonic children, which multiprocessing
    terminates at exit."""
    never = property(lambda self: False, lambda self, value: None)
    return type("SweepCluster", (distributed.LocalCluster,), {"shutdown_on_close": never})


def _local_cluster(distributed: Any, workers: int, wait_s: float, late: type[Exception]) -> Any:
    """A LocalCluster of ``workers`` single-threaded processes, started within ``wait_s``
    (in a thread, so that a start that hangs cannot hang the sweep), else ``late``."""
    import logging

    started: list[Any] = []
    failed: list[BaseException] = []
    abandoned = threading.Event()
    handover = threading.Lock()

    def start() -> None:
        try:
            cluster = _cluster_class(distributed)(
                n_workers=workers,
                threads_per_worker=1,  # the sweep is pure Python: one thread per process
                processes=True,
                dashboard_address=None,
                # its HTTP server (health checks) on a free local port, not on 8787,
                # which another cluster may hold (Dask then warns on stderr)
                scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
                silence_logs=logging.ERROR,
            )
        except BaseException as exc:  # reported by the caller
            failed.append(exc)
            return
        with handover:
            if not abandoned.is_set():
                started.append(cluster)
                return
        _stop_cluster(cluster)  # too late: the sweep gave up on it

    thread = threading.Thread(target=start, name="pipesim-local-cluster", daemon=True)
    # Ctrl-C reaches the whole process group, the cluster's workers too: this process
    # stops them, they must not die with tracebacks of their own. A process started while
    # SIGINT is ignored ignores it from its first instruction (Python keeps an ignored
    # SIGINT ignored), so SIGINT is ignored here until the workers' processes exist (a
    # Ctrl-C in those tenths of a second is lost); IgnoreInterrupts covers workers
    # restarted later.
    restore = _ignore_interrupts_here()
    children = len(multiprocessing.active_children())
    limit = time.monotonic() + wait_s
    try:
        thread.start()
        while thread.is_alive() and time.monotonic() < limit:
            thread.join(min(0.02, max(limit - time.monotonic(), 0)))
            if len(multiprocessing.active_children()) >= children + workers:
                restore()
    finally:
        restore()
        with handover:
            if not started:
                abandoned.set()
    if not started and not failed:
        raise late(
            f"a Dask LocalCluster of {workers} workers did not start within {wait_s:.3g} s; "
            "run without --cluster, or start a scheduler and workers yourself (`dask "
            "scheduler`, `dask worker tcp://HOST:8786`) and pass --cluster tcp://HOST:8786"
        )
    if failed:
        raise PlanError(f"a Dask LocalCluster of {workers} workers failed to start: {failed[0]}")
    return started[0]


def _ignore_interrupts_here() -> Callable[[], None]:
    """Ignore SIGINT in this process (from the main thread only, where Python takes
    signals); the returned function restores its handler (once)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = [signal.signal(signal.SIGINT, signal.SIG_IGN)]

    def restore() -> None:
        if previous:
            signal.signal(signal.SIGINT, previous.pop())

    return restore


def _connect(distributed: Any, address: str, wait_s: float) -> Any:
    _check_address(address)
    try:
        return distributed.Client(address, timeout=wait_s, set_as_default=False)
    except (OSError, ValueError, TypeError, TimeoutError) as exc:
        raise PlanError(
            f"cannot reach a Dask scheduler at --cluster {address!r} within {wait_s:.2g} s "
            f"({exc}); start one with `dask scheduler` (it prints its address, "
            "tcp://HOST:8786) and workers with `dask worker tcp://HOST:8786`, or use "
            "--cluster local"
        ) from None


def _check_address(address: str) -> None:
    """Refuse an address Dask cannot parse before a Client is made of it: a Client whose
    constructor fails on it still tries to close at exit, waits twice its timeout and
    prints a traceback."""
    from distributed.comm.addressing import parse_address, parse_host_port
    from distributed.comm.registry import get_backend

    try:
        scheme, location = parse_address(address)
        get_backend(scheme)
        if scheme in ("tcp", "tls"):
            parse_host_port(location)
    except ValueError as exc:
        raise PlanError(
            f"--cluster {address!r} is not a Dask scheduler address ({exc}); give the one "
            "`dask scheduler` prints (tcp://HOST:8786), or local"
        ) from None


def _cluster_workers(client: Any, address: str, wait_s: float, late: type[Exception]) -> int:
    """The worker processes of the cluster (at least one within ``wait_s``, else
    ``late``), each able to import this pipesim."""
    try:
        client.wait_for_workers(1, timeout=wait_s)
    except (TimeoutError, OSError) as exc:
        raise late(
            f"the Dask scheduler at {address} has no workers ({exc}); start some with "
            f"`dask worker {address} --nthreads 1`"
        ) from None
    # Tasks name pipesim's functions, which the scheduler and the workers import: a
    # different pipesim there would fail to load them, or price points differently.
    ours = _pipesim_digest()
    try:
        theirs = {"scheduler": client.run_on_scheduler(_pipesim_digest, callback_timeout=wait_s)}
    except Exception as exc:  # the scheduler could not load the function: no such pipesim
        theirs = {"scheduler": f"{type(exc).__name__}: {exc}"}
    versions = client.run(_pipesim_digest, on_error="return", callback_timeout=wait_s)
    theirs.update(versions)
    wrong = {where: str(digest) for where, digest in theirs.items() if digest != ours}
    if wrong:
        raise PlanError(
            f"the Dask cluster at {address} runs another pipesim than this one (source "
            f"digest {ours}): {wrong}; install this same pipesim where the scheduler and "
            "every worker run (pip install 'pipesim[dask]' from the same source)"
        )
    return len(versions)
