"""Executors a sweep runs on. The sweep itself depends only on
:class:`concurrent.futures.Executor`; this module makes one.

* ``local`` (default): a process pool of ``workers`` processes; ``workers=1``
  runs the points one by one in this process (no pool, nothing to pickle).
* ``dask``: a Dask distributed client. With ``scheduler`` it connects to a
  running scheduler (``tcp://host:8786``), e.g. one started on a SLURM cluster
  by dask-jobqueue (see docs/STUDIES.md); without it, it starts an in-process
  ``LocalCluster`` (threads, dashboard off). The executor is
  ``client.get_executor()``.

When a worker process of a local pool dies (SIGKILL, the OOM killer, a crash in
native code), the pool is broken for good (``BrokenProcessPool``); the sweep
asks :func:`fresh_executor` for a new one and goes on (see
:mod:`cosim.sweep.runner`).

Ctrl-C: pool workers ignore SIGINT (the terminal sends it to the whole process
group), so that only the sweep's own process sees it; the sweep then cancels
the queued points and terminates the workers running points
(:func:`cancel_executor`) instead of waiting for them.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any

from cosim.errors import CosimInputError

__all__ = ["EXECUTORS", "InlineExecutor", "cancel_executor", "exit_text", "fresh_executor", "make_executor",
           "worker_exitcode"]

EXECUTORS = ("local", "dask")


class InlineExecutor(Executor):
    """Runs each submitted call at once in the calling thread (a one-worker 'pool')."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:  # type: ignore[override]
        fut: Future = Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except Exception as exc:  # KeyboardInterrupt / SystemExit propagate: the sweep stops
            fut.set_exception(exc)
        return fut


def ignore_sigint() -> None:
    """Process-pool worker initializer: ignore SIGINT (Ctrl-C), which the sweep's process handles for the pool."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def cancel_executor(ex: Executor, grace: float = 1.0) -> None:
    """Stop ``ex`` now: cancel the calls not started and stop the running ones, without waiting for them.

    A ``ProcessPoolExecutor``'s worker processes are terminated (SIGTERM, then SIGKILL after ``grace`` seconds)
    and reaped, so that none writes anything after this returns, and its manager thread is joined (up to
    ``max(grace, 1)`` seconds more); other executors are shut down with their pending calls cancelled (a Dask executor cancels its
    futures; threads cannot be stopped). Safe to call twice.
    """
    procs = list((getattr(ex, "_processes", None) or {}).values()) if isinstance(ex, ProcessPoolExecutor) else []
    manager = getattr(ex, "_executor_manager_thread", None)  # shutdown() forgets it
    try:
        ex.shutdown(wait=False, cancel_futures=True)
    except TypeError:  # an Executor whose shutdown() predates cancel_futures (Dask's ClientExecutor)
        ex.shutdown(wait=False)
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    deadline = time.monotonic() + grace
    for proc in procs:
        proc.join(max(deadline - time.monotonic(), 0.0))
        if proc.is_alive():
            proc.kill()
            proc.join()
    # The pool's manager thread closes its wake-up pipe when it sees the workers gone; left running, it can do so
    # while the interpreter's exit hook (concurrent.futures.process._python_exit) writes to that pipe, which
    # prints "Exception ignored ... OSError: [Errno 9] Bad file descriptor" (a race in CPython 3.11's _ThreadWakeup,
    # which has no lock). Its end, once its workers are reaped, is prompt.
    if procs and manager is not None:
        manager.join(max(grace, 1.0))


def fresh_executor(ex: Executor, workers: int | None = None) -> Executor | None:
    """A new executor like ``ex``, which broke because a worker process died (``BrokenExecutor``), with
    ``workers`` workers (default: as many as ``ex``); None when this cannot be made.

    An executor with a ``fresh(workers)`` method makes its own; a ``ProcessPoolExecutor`` gets a new one with its
    start method, initializer and (default) worker count. The caller shuts it down.
    """
    make = getattr(ex, "fresh", None)
    if callable(make):
        return make(workers)
    if isinstance(ex, ProcessPoolExecutor):
        return ProcessPoolExecutor(workers or getattr(ex, "_max_workers", None) or default_workers(),
                                   mp_context=getattr(ex, "_mp_context", None),
                                   initializer=getattr(ex, "_initializer", None),
                                   initargs=getattr(ex, "_initargs", ()))
    return None


def worker_exitcode(ex: Executor, pid: int | None, timeout: float = 5.0) -> int | None:
    """Exit code of the worker process ``pid`` of a broken process pool ``ex`` (``-N``: killed by signal N), or
    None when it cannot be known (not a CPython ``ProcessPoolExecutor``, an unknown pid, still running)."""
    procs = getattr(ex, "_processes", None)  # CPython's ProcessPoolExecutor: pid -> multiprocessing.Process
    proc = procs.get(pid) if isinstance(procs, dict) and pid is not None else None
    if proc is None:
        return None
    deadline = time.monotonic() + timeout
    while True:
        try:
            code = proc.exitcode
        except (OSError, ValueError):  # pragma: no cover - already closed
            return None
        if code is not None or time.monotonic() > deadline:
            return code
        time.sleep(0.01)


def exit_text(code: int | None) -> str:
    """``killed by signal SIGKILL`` / ``exit code 3`` / ``""`` (unknown) for a process exit code."""
    if code is None:
        return ""
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def default_workers() -> int:
    """Worker count when none is given: the CPUs this process may use."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # pragma: no cover - not Linux
        return max(os.cpu_count() or 1, 1)


@contextmanager
def make_executor(kind: str = "local", workers: int | None = None, scheduler: str | None = None) -> Iterator[Executor]:
    """Yield a ``concurrent.futures.Executor`` of ``kind`` (see the module doc); closes it on exit."""
    if kind not in EXECUTORS:
        raise CosimInputError(f"unknown executor {kind!r}; known: {', '.join(EXECUTORS)}")
    if workers is not None and workers < 1:
        raise CosimInputError(f"--workers must be >= 1, got {workers}")
    if kind == "local":
        if scheduler:
            raise CosimInputError("--scheduler needs --executor dask")
        n = workers or default_workers()
        if n == 1:
            yield InlineExecutor()
            return
        ex = ProcessPoolExecutor(max_workers=n, initializer=ignore_sigint)
        try:
            yield ex
        except BaseException:  # Ctrl-C, or an error: do not wait for the points still running
            cancel_executor(ex)
            raise
        ex.shutdown(wait=True)
        return
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:  # pragma: no cover - dask is a dependency
        raise CosimInputError("--executor dask needs dask[distributed]: pip install 'dask[distributed]'") from None
    if scheduler:
        try:
            client = Client(scheduler, timeout="20s")
        except OSError as exc:
            raise CosimInputError(f"--scheduler {scheduler}: cannot connect ({exc})") from None
        try:
            yield client.get_executor()
        finally:
            client.close()
        return
    cluster = LocalCluster(n_workers=1, threads_per_worker=workers or default_workers(), processes=False,
                           dashboard_address=None)
    client = Client(cluster)
    try:
        yield client.get_executor()
    finally:
        client.close()
        cluster.close()
