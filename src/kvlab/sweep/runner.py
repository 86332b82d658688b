"""Running points: on local worker processes (the default) or on a Ray cluster, stored as they arrive.

    points ─▶ drop the stored ones ─▶ pool.submit (LocalPool: a persistent process pool · RayPool: Ray tasks)
                                          │ one concurrent.futures.Future per point
                                          ▼
                              as each completes: Store.add (committed) ─▶ progress

Only this process writes the store; workers return plain data (kvlab.sweep.point.compute). A point already in
the store is never submitted again, so a sweep that was killed resumes where it stopped.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any

from kvlab.errors import KvlabError
from kvlab.sweep import stop
from kvlab.sweep.point import Resolved, compute
from kvlab.sweep.store import Store

# (num_done, num_running, num_failed, num_total, total_final) after each change: the total is every point asked for
# so far, final for a sweep's one grid, not for a search that asks for more round after round (Runner.in_rounds)
ProgressCallback = Callable[[int, int, int, int, bool], None]
# How long the wait for finished points lasts at most. It is held (kvlab.sweep.stop): a Stopped raised inside it
# could leave the futures' locks taken (concurrent.futures.wait takes them one by one), and the pool's thread,
# failing those futures as the workers are killed, would wait for them forever.
WAIT_S = 0.1


def _init_worker(niceness: int = 0) -> None:
    # Ctrl-C reaches the whole process group, and a service manager's SIGTERM may too: the main process handles
    # both (stops the pool, keeps what is stored); a worker must neither die with a traceback of its own nor
    # die first, its point then stored as failed. (It was started with both blocked: kvlab.sweep.stop.blocked.)
    for signum in stop.SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, stop.SIGNALS)
    # A sweep killed outright (kill -9, out of memory) cannot stop its workers, and a worker waiting for its
    # next point would wait forever (it holds both ends of the pool's queue): it leaves when its parent does.
    import threading

    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    if niceness:
        os.nice(niceness)


def _exit_with_parent(parent_pid: int) -> None:
    import time

    while os.getppid() == parent_pid:
        time.sleep(0.5)
    os._exit(1)


def _warm() -> int:
    import time

    import kvlab.sim  # noqa: F401  (the import a first point would pay)

    time.sleep(0.2)  # long enough that each warm-up task lands on its own worker
    return os.getpid()


class LocalPool:
    """A persistent pool of worker processes (spawned: no state inherited from this process, whose DuckDB
    connection holds threads and a file lock), each at ``niceness`` below this process's priority (os.nice)."""

    def __init__(self, num_workers: int, niceness: int = 0):
        if num_workers < 1:
            raise KvlabError(f"--workers must be at least 1, got {num_workers}")
        self.num_workers = num_workers
        self.niceness = niceness
        self.executor = self._new_executor()

    def _new_executor(self):
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        return ProcessPoolExecutor(self.num_workers, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_init_worker, initargs=(self.niceness,))

    def warm_up(self) -> None:
        """Start every worker and import the simulator in it (a benchmark times the sweep, not the start-up)."""
        for future in [self.executor.submit(_warm) for _ in range(self.num_workers)]:
            future.result()

    def submit(self, point: dict[str, Any]) -> Future:
        from concurrent.futures.process import BrokenProcessPool

        with stop.blocked():  # (the executor starts its workers inside submit)
            try:
                return self.executor.submit(compute, point)
            except BrokenProcessPool:  # a worker died (its points were stored as failed): a fresh pool goes on
                self.executor = self._new_executor()
                return self.executor.submit(compute, point)

    def close(self, *, cancel: bool = False) -> None:
        """Wait for the running points, or (``cancel``) kill the workers; either way every worker is joined and
        the executor shut down, so its semaphores are released (killed with them held, the resource tracker
        warns of leaked semaphores)."""
        processes = list(getattr(self.executor, "_processes", {}).values())  # the workers this pool started
        if cancel:
            for process in processes:
                if process.is_alive():
                    process.kill()  # (they ignore SIGTERM)
            for process in processes:
                process.join(timeout=5)
            # A worker killed halfway through writing its result leaves the executor's thread waiting for the
            # rest of the message: with this process's end of the pipe closed too, it reads EOF and stops.
            writer = getattr(getattr(self.executor, "_result_queue", None), "_writer", None)
            if writer is not None:
                writer.close()
        self.executor.shutdown(wait=True, cancel_futures=cancel)


class RayPool:
    """Points as Ray tasks: on a local Ray instance on loopback (``address=None``) or on an existing cluster."""

    def __init__(self, num_workers: int, address: str | None = None):
        ray = import_ray()
        self.ray = ray
        if address is not None:
            address = resolve_ray_address(address)
            host = check_reachable(address)
            # A driver on the head's own loopback address must say so, or Ray looks for a raylet at its LAN IP.
            local = {"_node_ip_address": "127.0.0.1"} if host in ("127.0.0.1", "localhost") else {}
            ray.init(address=address, logging_level="ERROR", log_to_driver=False, **local)
        else:
            # The local instance's processes (GCS, raylet, workers) are started in this process group: a SIGTERM
            # to the group (a service manager's, the test's) would reach them too, and a raylet that dies first
            # ends this process with exit code 1 before its handler can stop the sweep. Started with SIGINT and
            # SIGTERM blocked, they inherit the mask and leave the signal to this process, which shuts them down.
            # A signal that came meanwhile waits; kvlab's handlers are put back (ray.init installs its own) before
            # it is delivered.
            with stop.blocked():
                ray.init(address="local", num_cpus=num_workers, include_dashboard=False,
                         _node_ip_address="127.0.0.1", logging_level="ERROR", log_to_driver=False)
                stop.reclaim()
        self.num_workers = int(ray.cluster_resources().get("CPU", num_workers))
        self.task = ray.remote(num_cpus=1, max_retries=0)(compute)

    def warm_up(self) -> None:
        self.ray.get([self.ray.remote(num_cpus=1)(_warm).remote() for _ in range(self.num_workers)])

    def submit(self, point: dict[str, Any]) -> Future:
        return self.task.remote(point).future()

    def close(self, *, cancel: bool = False) -> None:
        self.ray.shutdown()


def import_ray():
    try:
        import ray
    except ImportError:
        raise KvlabError("--ray needs Ray, which is not installed: pip install ray (or kvlab with its extra "
                         "named ray)") from None
    return ray


def resolve_ray_address(address: str) -> str:
    if address == "auto":
        address = os.environ.get("RAY_ADDRESS", "")
        if not address:
            raise KvlabError("--ray-address auto reads RAY_ADDRESS, which is not set: give the cluster's "
                             "HOST:PORT (the one `ray start --head` printed)")
    return address


def check_reachable(address: str, timeout_s: float = 3.0) -> str:
    """A clear error now rather than Ray's retries for a minute: is anything listening at HOST:PORT?"""
    import socket

    hostport = address.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    if not host or not (port.isascii() and port.isdigit()):
        raise KvlabError(f"--ray-address {address!r}: expected HOST:PORT (or ray://HOST:PORT, or auto)")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        raise KvlabError(f"cannot reach a Ray cluster at {address}: {exc.strerror or exc} (is it running? "
                         f"`ray start --head` prints its address)") from None
    return host


def make_pool(num_workers: int, *, ray: bool = False, ray_address: str | None = None):
    if ray or ray_address is not None:
        return RayPool(num_workers, ray_address)
    return LocalPool(num_workers)


class Runner:
    """Computes the points a store does not hold yet, on a pool, and stores each result as it arrives."""

    def __init__(self, store: Store, pool, version: str, *, retry_failed: bool = False,
                 progress: ProgressCallback | None = None):
        self.store = store
        self.pool = pool
        self.version = version
        self.retry_failed = retry_failed
        self.progress = progress
        self.num_computed = 0
        self.num_failed = 0
        self.num_done_before = self.num_total_before = 0  # earlier calls' points (a capacity search's rounds)
        # Every point asked for so far, so that the progress and the totals count each point once however often a
        # caller asks for it again (fig12 asks for its searches' probes once more: trial 58, finding 7).
        self.asked: set[str] = set()
        # A caller that asks for points round after round (a capacity search: how many rounds is known only as they
        # go) says so before its first: the progress' total is then the points asked so far, labelled as such.
        self.in_rounds = False

    def run(self, points: list[Resolved] | list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Every point's stored row (computing the missing ones), in the order of ``points`` (resolved, or as
        options: resolved here)."""
        from kvlab.sweep.point import resolve_point

        points = [p if isinstance(p, Resolved) else resolve_point(p, self.version) for p in points]
        keys = [p.key for p in points]
        stored = self.store.stored_keys(include_failed=not self.retry_failed)
        todo = {p.key: p for p in points if p.key not in stored}
        new = {k for k in keys if k not in self.asked} | set(todo)  # (a failed point retried is asked again)
        self.asked.update(keys)
        total = len(new)
        futures = {self.pool.submit(point.options): point for point in todo.values()}
        done = total - len(futures)
        self._report(done, len(futures), total)
        pending = set(futures)
        while pending:
            with stop.held():  # (a signal is raised as the wait ends, at most WAIT_S later)
                finished, pending = wait(pending, timeout=WAIT_S, return_when=FIRST_COMPLETED)
            for future in finished:
                point = futures[future]
                self.num_computed += 1  # (first: a signal noted during the add stops the run as the add ends)
                self.store.add(point.key, point.row, self._outcome(future), self.version)
                done += 1
            self._report(done, len(pending), total)
        self.num_done_before += total
        self.num_total_before += total
        return self.store.rows(keys)

    def _outcome(self, future: Future) -> dict[str, Any]:
        try:
            outcome = future.result()
        except Exception as exc:  # noqa: BLE001  (the worker died: killed, out of memory; the point failed)
            return {"summary": None, "error": f"worker failed: {type(exc).__name__}: {exc}", "elapsed_s": None,
                    "cpu_s": None, "worker": None}
        if outcome["kvlab_version"] != self.version:
            outcome = {**outcome, "summary": None, "error": f"the worker runs kvlab {outcome['kvlab_version']}, "
                       f"this sweep kvlab {self.version}: install the same version on every node"}
        if outcome["error"] is not None:
            self.num_failed += 1
        return outcome

    def _report(self, done: int, running: int, total: int) -> None:
        if self.progress is not None:
            final = not self.in_rounds and not self.num_total_before  # (a second call: more were asked for)
            self.progress(self.num_done_before + done, min(running, self.pool.num_workers), self.num_failed,
                          self.num_total_before + total, final)
