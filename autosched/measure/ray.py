"""Measuring on a Ray cluster: compiles as tasks on any node's CPUs, checks and timings in
actors that each hold one device (`num_gpus=1` for CUDA; CPU actors for the CPU target).

The driver alone records (database, CSV, run log): actors only return measurements. When
an actor dies mid-call (its node went away, someone killed it), a replacement actor is
started in its slot and the call is queued again: a search candidate, a default, a
re-timing round. A compile task lost with its node is queued again too. The record is
written once, when a measurement comes back, so nothing is lost or written twice, and an
environment failure is never recorded as the candidate's: when the cluster keeps failing
the run ends with one error line, every measurement so far kept.

Modules and inputs travel by path: every node must see the run's work folder at the same
path (one host, or a shared file system). Each actor checks that when it starts.

Which cluster: `local` starts a private one of this host, bound to the loopback alone (a
Ray cluster runs whatever code reaches its ports); `HOST:PORT` joins that one; `auto` is
Ray's own lookup (RAY_ADDRESS, else the cluster `ray start` last started on this host).
The run's first lines name the cluster it joined, its nodes and GPUs.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import click
import numpy as np

from autosched import interrupts
from autosched.compile import CompileJob, CompileResult, check_temp_dir, compile_one
from autosched.errors import UserError
from autosched.measure.benchmark_tool import Timing
from autosched.measure.contract import (
    Candidate,
    Done,
    Measurement,
    MeasureSettings,
    MeasureTask,
    PendingBuilds,
    Prepare,
    builds_of,
    runtime_flags,
)
from autosched.measure.local import Bench
from autosched.measure.module_io import RunFailed
from autosched.measure.ray_reaper import start_watchdog
from autosched.measure.worker import ProblemData

WAIT_S = 0.5  # how often the driver looks up from waiting (so that Ctrl-C is prompt)
ATTEMPTS = 3  # a call lost to the cluster (actor died, task lost) is made this often at most
NODES_CHECK_S = 3.0  # how often a wait with nothing ready asks whether any node is alive
KEPT = (
    "every measurement made so far is kept in the tuning database: run the same command "
    "again once the cluster is back"
)


def cluster_failing(what: str, error: Exception) -> UserError:
    """The run's end when the cluster loses the same work ATTEMPTS times: an environment
    failure, which no record may hold as the candidate's."""
    return UserError(
        f"--executor ray: the Ray cluster lost {what} {ATTEMPTS} times "
        f"({str(error).splitlines()[0][:200]}); {KEPT}"
    )


def cluster_gone(what: str) -> UserError:
    """The run's end when no node of the cluster is alive: the work in flight will never
    come back, not even as an error (a `--ray-address local` cluster whose raylet died)."""
    return UserError(f"--executor ray: the Ray cluster lost every node while {what}; {KEPT}")


def any_node_alive(ray) -> bool:
    """Whether the cluster still has a live node; a GCS that no longer answers has none."""
    try:
        return any(node.get("Alive") for node in ray.nodes())
    except Exception:  # noqa: BLE001 - whatever the dead GCS's client raises
        return False


class NodeWatch:
    """Asks the cluster whether any node is alive, at most every NODES_CHECK_S: a waiting
    loop calls `check` each time nothing is ready, and so ends instead of waiting for ever
    on work that a dead cluster lost without an error."""

    def __init__(self, ray):
        self.ray = ray
        self.checked = time.monotonic()

    def check(self, what: str) -> None:
        if time.monotonic() - self.checked < NODES_CHECK_S:
            return
        if not any_node_alive(self.ray):
            raise cluster_gone(what)
        self.checked = time.monotonic()


def get_watched(ray, ref, what: str):
    """`ray.get(ref)`, ending with one error line when the cluster has no live node left
    (plain `ray.get` would wait for ever)."""
    watch = NodeWatch(ray)
    while not ray.wait([ref], timeout=WAIT_S)[0]:
        watch.check(what)
    return ray.get(ref)


def import_ray():
    """Ray, or one clear error when the optional extra is missing."""
    try:
        import ray  # noqa: PLC0415 - an optional extra, imported where it is used
    except ImportError:
        raise UserError(
            "--executor ray needs Ray, an optional extra: pip install '.[ray]'"
        ) from None
    return ray


def _check_reachable(address: str) -> None:
    """A HOST:PORT with nothing listening is one error line at once (Ray itself keeps
    retrying for minutes)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return  # auto, local, ray://...: Ray's own lookup
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except OSError as error:
        raise UserError(
            f"--executor ray: cannot join the Ray cluster at {address} ({error.strerror or error}"
            "); start one with `ray start --head`, or use --ray-address local for a cluster "
            "of this host alone"
        ) from None


LOOPBACK = "127.0.0.1"
WATCHDOGS: list[subprocess.Popen] = []  # kept: each lives as long as the run
# Ray's switch for a cluster of one host (its default on macOS and Windows): read when ray is
# imported, and by the processes the cluster starts.
ONE_HOST_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@contextmanager
def one_host_only(ray) -> Iterator[None]:
    """While a `local` cluster starts: its node address stays the loopback, so every one of
    its servers (GCS, raylet, object manager, agents) listens on 127.0.0.1 alone. Without the
    switch Ray turns `_node_ip_address="127.0.0.1"` into the host's network address, for
    other nodes to join, and its servers listen on every interface."""
    from ray._private import ray_constants  # noqa: PLC0415 - an optional extra, imported where it is used

    saved = os.environ.get(ONE_HOST_SWITCH), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[ONE_HOST_SWITCH] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False  # ray may have been imported before
    try:
        yield
    finally:
        if saved[0] is None:
            os.environ.pop(ONE_HOST_SWITCH, None)
        else:
            os.environ[ONE_HOST_SWITCH] = saved[0]
        ray_constants.ENABLE_RAY_CLUSTER = saved[1]


@contextmanager
def no_ray_sigterm_handler(ray) -> Iterator[None]:
    """While `ray.init` runs: Ray sets no SIGTERM handler of its own (its first ends the
    process with status 15, the next with 1, a half-started cluster left behind)."""
    from ray._private import utils  # noqa: PLC0415 - an optional extra, imported where it is used

    saved = utils.set_sigterm_handler
    utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        utils.set_sigterm_handler = saved


def join_cluster(ray, address: str) -> None:
    """`ray.init`, keeping the run's own signal handlers (Ray's would end a SIGTERM with
    status 15 and a C++ stack dump, the records' clean-up cut short). A signal while Ray
    starts waits for its end (an exception raised inside Ray's start aborted the process),
    then shuts the cluster down: nothing of it is left running. `local` (Ray's own word)
    starts a cluster of this host alone, on the loopback, with no dashboard."""
    options = {"logging_level": "ERROR", "log_to_driver": False}
    try:
        # critical() outermost: its interrupt is raised once the run's handlers are back.
        with interrupts.critical(), interrupts.kept_handlers(), no_ray_sigterm_handler(ray):
            if address == "local":
                WATCHDOGS.append(start_watchdog())  # reaps the cluster if the run is killed
                with one_host_only(ray):
                    ray.init(
                        address="local",
                        _node_ip_address=LOOPBACK,
                        include_dashboard=False,
                        **options,
                    )
            else:
                ray.init(address=address, **options)
    except (ConnectionError, RuntimeError, ValueError) as error:
        ray.shutdown()
        raise UserError(
            f"--executor ray: cannot join the Ray cluster at {address} "
            f"({str(error).splitlines()[0]}); start one with `ray start --head`, or "
            "use --ray-address local for a cluster of this host alone"
        ) from None
    except BaseException:  # an interrupt: the cluster's processes go with the run
        ray.shutdown()
        raise


def describe_cluster(ray, address: str, joined: bool = True) -> str:
    """The line that says which cluster the run joined (`joined`: by `join_cluster`, not
    before the run): its address, nodes and GPUs."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    hosts = sorted({str(n.get("NodeManagerAddress")) for n in nodes})
    resources = ray.cluster_resources()
    gcs = ray.get_runtime_context().gcs_address
    if not joined:
        what = f"the cluster this process was connected to, at {gcs}"
    elif address == "local":
        what = f"a private cluster of this host at {gcs}, on the loopback alone"
    else:
        what = f"the cluster at {gcs} (--ray-address {address})"
    shown = ", ".join(hosts[:4]) + (f" and {len(hosts) - 4} more" if len(hosts) > 4 else "")
    return (
        f"ray: joined {what}: {len(nodes)} node(s) ({shown}), "
        f"{int(resources.get('GPU', 0))} GPU(s), {int(resources.get('CPU', 0))} CPU(s)"
    )


class MeasuringActor:
    """One device of the cluster, as a Ray actor: a `Bench` that lives on its node."""

    def __init__(self, device: str, work_dir: str, flags: tuple[str, ...] = ()):
        if not os.path.isdir(work_dir):
            raise RuntimeError(f"{work_dir} is not visible on this node")
        self.bench = Bench(device, flags)

    def where(self) -> str:
        return f"{socket.gethostname()}:{os.getpid()}"

    def run(self, task: MeasureTask) -> Measurement:
        return self.bench.run(task)

    def time(
        self,
        module,
        data,
        repeat,
        settings,
        repetitions=None,
        benchmark_function=None,
        slow_ms=None,
    ):
        return self.bench.time(
            module, data, repeat, settings, repetitions, benchmark_function, slow_ms
        )

    def reference_outputs(self, module, entry, inputs, folder, timeout):
        return self.bench.reference_outputs(module, entry, inputs, folder, timeout)

    def busy(self) -> float:
        return self.bench.busy_s

    def close(self) -> None:
        self.bench.close()


def _compile(job: CompileJob, timeout: float) -> CompileResult:
    """A compile on whichever node runs the task. A build that failed on a node whose
    temporary folder is full or unusable is that node's fault, not the candidate's: the
    task raises the UserError that says so (`RayExecutor._compiled` ends the run)."""
    result = compile_one(job, timeout)
    if result.status == "compile_error":
        check_temp_dir()
    return result


@dataclass
class RemoteBench:
    """An actor seen from the driver: the `Bench` interface, called remotely. The slot
    outlives its actor: a dead one is replaced in place (`revive`), so whoever holds the
    bench (a re-timing thread, the search's loop) goes on with the new actor."""

    ray: object
    actor: object
    device: str  # the name its records carry: the device and the actor's node
    revive: Callable[[RemoteBench, object, str], None]  # (bench, dead actor, what it was doing)

    def _call(self, method: str, what: str, *args):
        """The actor's `method` waited for. When the actor dies the call is queued again on
        its replacement: a lost actor is no answer (a re-timing round, a default)."""
        for attempt in range(ATTEMPTS):
            actor = self.actor
            try:
                return get_watched(self.ray, getattr(actor, method).remote(*args), what)
            except self.ray.exceptions.RayActorError as error:
                if attempt == ATTEMPTS - 1:
                    raise cluster_failing(f"the measuring actor of {self.device}", error) from None
                self.revive(self, actor, what)

    def time(
        self,
        module: str,
        data: ProblemData,
        repeat: int,
        settings: MeasureSettings,
        repetitions: int | None = None,
        benchmark_function: str | None = None,
        slow_ms: float | None = None,
    ) -> Timing:
        arguments = (module, data, repeat, settings, repetitions, benchmark_function, slow_ms)
        try:
            return self._call("time", f"timing {os.path.basename(module)}", *arguments)
        except self.ray.exceptions.RayError as error:  # the actor's own failure
            return Timing("runtime_error", message=f"actor failed: {error}"[:300])

    def run(self, task: MeasureTask) -> Measurement:
        """One candidate checked and timed on the actor, waited for (`RayExecutor.run`
        hands candidates to actors without waiting, and queues a dead actor's again)."""
        try:
            outcome = self._call("run", "measuring a candidate", task)
        except self.ray.exceptions.RayError as error:  # the actor's own failure
            return Measurement(self.device, "runtime_error", f"actor failed: {error}"[:300])
        outcome.device = self.device  # the slot's name, as its default is keyed
        return outcome

    def reference_outputs(
        self, module: str, entry: object, inputs: list[str], folder: str, timeout: float
    ) -> list[np.ndarray]:
        """The module's outputs computed on the actor's device (the driver may have none
        such); the actor's own RunFailed comes back as itself, any other failure as one."""
        module, folder = os.path.abspath(module), os.path.abspath(folder)
        arguments = (module, entry, inputs, folder, timeout)
        try:
            return self._call("reference_outputs", "computing the dispatch's answer", *arguments)
        except self.ray.exceptions.RayTaskError as error:
            if isinstance(error.cause, RunFailed):
                raise RunFailed(str(error.cause)) from None
            raise RunFailed(f"actor failed: {error.cause}"[:300]) from None
        except self.ray.exceptions.RayError as error:
            raise RunFailed(f"actor failed: {error}"[:300]) from None


class RayExecutor:
    """The executor for `--executor ray`: see the module docstring."""

    def __init__(self, config, target, jobs: int):
        self.ray = ray = import_ray()
        self.config, self.target = config, target
        self.flags = runtime_flags(config)  # checked once, before joining the cluster
        self.started_ray = False
        self.events: list[str] = []  # what the run log should say (actors lost, ...)
        self.lock = threading.Lock()
        if not ray.is_initialized():
            _check_reachable(config.ray_address)
            join_cluster(ray, config.ray_address)
            self.started_ray = True
        self.benches: list[RemoteBench] = []
        try:
            self._start_actors(config)
        except BaseException:  # an interrupt, or no actor: nothing of the run left running
            self.close()
            raise

    def _start_actors(self, config) -> None:
        """The line that names the cluster, then one measuring actor per slot."""
        ray = self.ray
        joined = describe_cluster(ray, config.ray_address, self.started_ray)
        click.echo(joined, err=True)
        self.events.append(joined)
        self.work_dir = os.path.abspath(config.work_dir)
        os.makedirs(self.work_dir, exist_ok=True)
        self.compile_timeout = config.compile_timeout
        self.remote_compile = ray.remote(num_cpus=1, max_retries=3)(_compile)
        self.actor_class = ray.remote(MeasuringActor)
        self.slots = self._device_slots()
        for index, slot in enumerate(self.slots):
            bench = RemoteBench(ray, self._start(slot), f"ray:{slot}#{index}", self._revive)
            self.benches.append(bench)

    def _device_slots(self) -> list[str]:
        """One measuring actor per GPU of the cluster (CUDA), or per listed CPU device
        (`--devices`), else per node."""
        resources = self.ray.cluster_resources()
        if self.target.name == "cuda":
            gpus = int(resources.get("GPU", 0))
            if gpus == 0:
                raise UserError("--executor ray --target cuda: the Ray cluster has no GPU")
            return ["cuda"] * gpus  # each actor sees its own GPU as device 0
        if self.config.devices and self.config.devices != "all":
            return [d.strip() for d in self.config.devices.split(",") if d.strip()]
        nodes = [n for n in self.ray.nodes() if n.get("Alive")]
        return [self.target.device] * max(1, len(nodes))

    def _start(self, device: str):
        """A measuring actor for `device`, once it answers."""
        # Actors reserve no CPU: on a small node, CPU actors holding its slots would leave
        # none for the compile tasks, and the run would wait forever.
        options = {"num_cpus": 0, **({"num_gpus": 1} if self.target.name == "cuda" else {})}
        actor = self.actor_class.options(**options).remote(device, self.work_dir, self.flags)
        try:
            self.ray.get(actor.where.remote(), timeout=300)
        except self.ray.exceptions.RayError as error:
            raise UserError(
                f"--executor ray: a measuring actor for {device} did not start: "
                f"{str(error).splitlines()[-1]} (every node must see {self.work_dir})"
            ) from None
        return actor

    @property
    def primary(self) -> RemoteBench:
        return self.benches[0]

    @property
    def devices(self) -> list[str]:
        return [bench.device for bench in self.benches]

    def time_others(self, module, data, repeat, settings, benchmark_function):
        """The default timed on every actor but the primary, all at once."""
        arguments = (module, data, repeat, settings, None, benchmark_function)
        calls = {
            bench.device: (bench.actor, bench.actor.time.remote(*arguments))
            for bench in self.benches[1:]
        }
        timings = {}
        for bench in self.benches[1:]:
            actor, call = calls[bench.device]
            try:
                timings[bench.device] = get_watched(self.ray, call, "timing the default")
            except self.ray.exceptions.RayActorError:  # timed again on its replacement
                self._revive(bench, actor, "timing the default")
                timings[bench.device] = bench.time(
                    module, data, repeat, settings, None, benchmark_function
                )
            except self.ray.exceptions.RayError as error:
                timings[bench.device] = Timing("runtime_error", message=str(error)[:300])
        return timings

    def run(self, candidates: list[Candidate], prepare: Prepare, done: Done) -> None:
        ray = self.ray
        pending = PendingBuilds()
        pending.add(candidates)
        compiling = {self._submit(job): job for job in builds_of(candidates)}
        lost: Counter = Counter()  # compiles lost to the cluster, by output
        waiting: deque = deque()  # (candidate, builds, task) for the next free actor
        measuring: dict = {}  # object ref -> (bench, its actor, candidate, builds, task)
        idle = list(self.benches)
        watch = NodeWatch(ray)
        while compiling or measuring or waiting:
            while waiting and idle:
                bench = idle.pop(0)
                item = waiting.popleft()
                measuring[bench.actor.run.remote(item[2])] = (bench, bench.actor, *item)
            refs = list(compiling) + list(measuring)
            ready, _ = ray.wait(refs, num_returns=1, timeout=WAIT_S)
            if not ready:
                in_flight = f"{len(compiling)} compile(s) and {len(measuring)} measurement(s)"
                watch.check(f"{in_flight} were in flight")
            for ref in ready:
                if ref in compiling:
                    job = compiling.pop(ref)
                    result = self._compiled(ref, job, lost)
                    if result is None:  # lost with its node or raylet: compiled again
                        compiling[self._submit(job)] = job
                        continue
                    for candidate, builds in pending.finished(result):
                        task = prepare(candidate, builds)
                        if task is None:
                            done(candidate, builds, None)
                        else:
                            waiting.append((candidate, builds, task))
                    continue
                bench, actor, candidate, builds, task = measuring.pop(ref)
                try:
                    outcome = ray.get(ref)
                except ray.exceptions.RayActorError:
                    # The actor died with this candidate: measure it again elsewhere.
                    waiting.appendleft((candidate, builds, task))
                    self._revive(bench, actor, f"measuring {candidate.name}")
                    idle.append(bench)
                    continue
                idle.append(bench)
                outcome.device = bench.device  # the slot's name, as its default is keyed
                done(candidate, builds, outcome)

    def busy(self) -> dict[str, float]:
        """Each actor's busy seconds (an actor replaced after a death starts again at 0)."""
        busy = {}
        for bench in self.benches:
            try:
                busy[bench.device] = self.ray.get(bench.actor.busy.remote(), timeout=30)
            except self.ray.exceptions.RayError:
                continue
        return busy

    def _submit(self, job: CompileJob):
        """The compile as a Ray task, its paths absolute (any node may run it)."""
        absolute = replace(
            job, source=os.path.abspath(job.source), output=os.path.abspath(job.output)
        )
        return self.remote_compile.remote(absolute, self.compile_timeout)

    def _compiled(self, ref, job: CompileJob, lost: Counter) -> CompileResult | None:
        """The compile task's result, named by the driver's job; None when the cluster lost
        the task (its worker, node or raylet died: no failure of the candidate's, so it is
        compiled again), an error once it has lost it ATTEMPTS times."""
        try:
            result = self.ray.get(ref)
        except self.ray.exceptions.RayTaskError as error:  # the compile itself raised
            if isinstance(error.cause, UserError):  # the node's temporary folder: the end
                raise UserError(f"--executor ray, a compile task: {error.cause}") from None
            return CompileResult(job, "compile_error", 0.0, f"Ray task failed: {error}"[:300])
        except self.ray.exceptions.RayError as error:
            lost[job.output] += 1
            if lost[job.output] >= ATTEMPTS:
                what = f"the compile of {os.path.basename(job.output)}"
                raise cluster_failing(what, error) from None
            self.events.append(f"compile of {job.output} lost ({error}): queued again"[:300])
            return None
        return replace(result, job=job)

    def _revive(self, bench: RemoteBench, dead, doing: str) -> None:
        """A new actor in the slot of a dead one, same device and name (so its records and
        its default stay those of the slot). Threads that saw the same actor die (problems
        searched or re-timed at once) start one replacement between them."""
        with self.lock:
            if bench.actor is not dead:
                return
            index = self.benches.index(bench)
            bench.actor = self._start(self.slots[index])
            self.events.append(f"{bench.device} died {doing}: queued again, actor replaced")

    def close(self) -> None:
        for bench in self.benches:
            try:
                self.ray.get(bench.actor.close.remote(), timeout=30)
                self.ray.kill(bench.actor)
            except self.ray.exceptions.RayError:
                pass
        if self.started_ray:
            self.ray.shutdown()
