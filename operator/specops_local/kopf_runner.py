"""Run a Kopf operator inside the test's own event loop, and stop it quickly and cleanly.

``kopf.run()`` owns its loop, and ``kopf.operator()`` cancels every task created
after it started when it exits, which includes pytest-asyncio's and the emulated
server's tasks and deadlocks the teardown. Here the operator's tasks are told
apart with a task factory that marks every task created from the operator's own
context (contextvars are inherited by child tasks), and ``kopf.run_tasks`` is
told to ignore all the others.

``run_kopf`` runs one standalone operator; ``Replica`` runs one of several leader-elected
replicas (as `specops run --leader-election` does), so tests can run two and kill the leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import signal
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Collection, Coroutine, Iterator
from typing import Any

import kopf

from specops.adapters.kube import KubeClient, load_connection_settings
from specops.adapters.leader import DEFAULT_TIMINGS, LeaseElector, LeaseTimings, lead


class _OperatorTasks:
    """The tasks one operator created, directly or through its own tasks."""

    def __init__(self) -> None:
        self.tasks: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()


# Which operator (if any) the current context belongs to; child tasks inherit it.
_operator: contextvars.ContextVar[_OperatorTasks | None] = contextvars.ContextVar("operator", default=None)


class _MarkingTaskFactory:
    """One task factory per loop, shared by all operators running in it (they may overlap)."""

    _installed: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _MarkingTaskFactory] = (
        weakref.WeakKeyDictionary()
    )

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.previous = loop.get_task_factory()
        self.users = 0

    @classmethod
    @contextlib.contextmanager
    def installed(cls, loop: asyncio.AbstractEventLoop) -> Iterator[None]:
        factory = cls._installed.get(loop)
        if factory is None:
            factory = cls._installed[loop] = cls(loop)
            loop.set_task_factory(factory)  # type: ignore[arg-type]
        factory.users += 1
        try:
            yield
        finally:
            factory.users -= 1
            if not factory.users:
                loop.set_task_factory(factory.previous)
                del cls._installed[loop]

    def __call__(
        self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kwargs: Any
    ) -> asyncio.Future[Any]:
        if self.previous is not None:
            task = self.previous(loop, coro, **kwargs)
        else:
            task = asyncio.Task(coro, loop=loop, **kwargs)
        context: contextvars.Context | None = kwargs.get("context")
        owner = context.get(_operator) if context is not None else _operator.get()
        if owner is not None and isinstance(task, asyncio.Task):
            owner.tasks.add(task)
        return task


class _NotOperatorTasks(Collection["asyncio.Task[Any]"]):
    """What ``kopf.run_tasks(ignored=...)`` must leave alone: every task the operator did not create."""

    def __init__(self, operator_tasks: _OperatorTasks) -> None:
        self._operator_tasks = operator_tasks

    def __contains__(self, task: object) -> bool:
        return task not in self._operator_tasks.tasks

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        return iter([task for task in asyncio.all_tasks() if task not in self._operator_tasks.tasks])

    def __len__(self) -> int:
        return len(list(iter(self)))


def fast_settings(settings: kopf.OperatorSettings) -> None:
    """Short timeouts and backoffs so that tests neither wait nor hang on retries."""
    settings.process.ultimate_exiting_timeout = None  # never SIGKILL the test process
    settings.watching.server_timeout = 60
    settings.watching.connect_timeout = 5
    settings.watching.reconnect_backoff = 0.05
    settings.networking.request_timeout = 15
    settings.networking.error_backoffs = (0.1, 0.2, 0.5, 1.0)
    settings.posting.default_backoffs = (0.1, 0.2, 0.5)
    settings.queueing.idle_timeout = 1.0
    settings.queueing.exit_timeout = 0.5
    settings.queueing.error_delays = (0.1, 0.2, 0.5, 1.0)
    settings.background.instant_exit_timeout = 0.5
    settings.background.cancellation_polling = 0.2
    settings.execution.default_backoff = 0.5


@dataclasses.dataclass(frozen=True)
class OperatorRun:
    """A running operator: its settings and memo, for assertions."""

    settings: kopf.OperatorSettings
    memo: Any
    task: asyncio.Task[None]


@contextlib.asynccontextmanager
async def run_kopf(
    registry: kopf.OperatorRegistry,
    *,
    namespaces: list[str] | None = None,
    memo: Any = None,
    settings_hook: Callable[[kopf.OperatorSettings], None] | None = None,
    startup_timeout_s: float = 10.0,
    stop_timeout_s: float = 10.0,
) -> AsyncIterator[OperatorRun]:
    """Run the registry's handlers (standalone, no peering) until the block exits.

    Clusterwide unless ``namespaces`` is given. The login comes from the registry's own
    ``@kopf.on.login`` handler. The block is entered once the startup handlers succeeded.
    """
    loop = asyncio.get_running_loop()
    settings = kopf.OperatorSettings()
    fast_settings(settings)
    if settings_hook is not None:
        settings_hook(settings)
    memo = memo if memo is not None else kopf.Memo()
    stop_flag = asyncio.Event()
    ready_flag = asyncio.Event()
    operator_tasks = _OperatorTasks()

    async def operate() -> None:
        tasks = await kopf.spawn_tasks(
            registry=registry,
            settings=settings,
            memo=memo,
            standalone=True,
            clusterwide=not namespaces,
            namespaces=namespaces or (),
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )
        await kopf.run_tasks(tasks, ignored=_NotOperatorTasks(operator_tasks))

    context = contextvars.copy_context()
    context.run(_operator.set, operator_tasks)
    with _MarkingTaskFactory.installed(loop):
        task = loop.create_task(operate(), name="kopf operator under test", context=context)
        try:
            await _wait_until_ready(task, ready_flag, startup_timeout_s)
            yield OperatorRun(settings=settings, memo=memo, task=task)
        finally:
            try:
                stop_flag.set()
                await asyncio.wait_for(task, timeout=stop_timeout_s)  # re-raises the operator's own failure
            finally:
                _forget_signal_handlers(loop)


async def _wait_until_ready(task: asyncio.Task[None], ready_flag: asyncio.Event, timeout_s: float) -> None:
    ready = asyncio.ensure_future(ready_flag.wait())
    try:
        await asyncio.wait({task, ready}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        ready.cancel()
    if task.done():
        task.result()  # the operator failed to start: raise its error here
        raise RuntimeError("the operator exited before it was ready")
    if not ready_flag.is_set():
        raise TimeoutError(f"the operator was not ready within {timeout_s} s")


def _forget_signal_handlers(loop: asyncio.AbstractEventLoop) -> None:
    """Kopf installs SIGINT/SIGTERM handlers on the loop; give Ctrl+C back to pytest."""
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signum)


class Replica:
    """One replica of a leader-elected operator, as one pod of the Deployment would run it.

    It follows until it holds the Lease, then runs the registry's handlers (standalone) for
    as long as it keeps the Lease. ``stop()`` is a graceful stop (the Lease is released);
    ``crash()`` is a killed pod: Kopf stops at once and the Lease stays held until it expires.
    """

    def __init__(
        self,
        registry: kopf.OperatorRegistry,
        *,
        identity: str,
        lease_namespace: str = "default",
        timings: LeaseTimings = DEFAULT_TIMINGS,
        settings_hook: Callable[[kopf.OperatorSettings], None] | None = None,
    ) -> None:
        self.registry = registry
        self.identity = identity
        self.lease_namespace = lease_namespace
        self.timings = timings
        self.settings_hook = settings_hook
        self.ready = asyncio.Event()
        self.elector: LeaseElector | None = None
        self._kube: KubeClient | None = None
        self._task: asyncio.Task[None] | None = None
        self._tasks = _OperatorTasks()
        self._factory: contextlib.ExitStack | None = None
        self._stop_flag = asyncio.Event()

    @property
    def is_leader(self) -> bool:
        return self.elector is not None and self.elector.is_leader and self.ready.is_set()

    @property
    def done(self) -> bool:
        return self._task is not None and self._task.done()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._kube = KubeClient(load_connection_settings())
        self.elector = LeaseElector(
            self._kube, namespace=self.lease_namespace, identity=self.identity, timings=self.timings
        )
        settings = kopf.OperatorSettings()
        fast_settings(settings)
        if self.settings_hook is not None:
            self.settings_hook(settings)
        tasks = self._tasks
        elector = self.elector

        async def operate(stop_flag: asyncio.Event) -> None:
            # Only what Kopf creates from here on is the operator's (not lead()'s Lease keeper).
            _operator.set(tasks)
            spawned = await kopf.spawn_tasks(
                registry=self.registry,
                settings=settings,
                memo=kopf.Memo(),
                standalone=True,
                clusterwide=True,
                stop_flag=stop_flag,
                ready_flag=self.ready,
            )
            await kopf.run_tasks(spawned, ignored=_NotOperatorTasks(tasks))

        self._factory = contextlib.ExitStack()
        self._factory.enter_context(_MarkingTaskFactory.installed(loop))
        self._task = loop.create_task(
            lead(elector, operate, stop_flag=self._stop_flag, stop_grace_s=2.0),
            name=f"replica {self.identity}",
            context=contextvars.copy_context(),
        )

    async def wait_leading(self, timeout_s: float) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not self.is_leader:
            if self._task is not None and self._task.done():
                self._task.result()
                raise RuntimeError(f"replica {self.identity} exited before it led")
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"replica {self.identity} did not lead within {timeout_s} s")
            await asyncio.sleep(0.05)

    async def crash(self) -> None:
        """Stop as a killed pod would: no more writes of the Lease, Kopf's tasks cancelled."""
        assert self.elector is not None
        self.elector.abandon()
        await self._finish(cancel=True)

    async def stop(self, timeout_s: float = 10.0) -> None:
        """A graceful stop (SIGTERM): Kopf stops, then the Lease is released."""
        await self._finish(cancel=False, timeout_s=timeout_s)

    async def _finish(self, *, cancel: bool, timeout_s: float = 10.0) -> None:
        try:
            if self._task is not None and not self._task.done():
                if cancel or not self.ready.is_set():
                    self._task.cancel()  # a follower has nothing to hand over
                else:
                    self._stop_flag.set()  # Kopf stops, then lead() releases the Lease
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait_for(self._task, timeout=timeout_s)
        finally:
            if self._kube is not None:
                await self._kube.close()
                self._kube = None
            if self._factory is not None:
                self._factory.close()
                self._factory = None
            _forget_signal_handlers(asyncio.get_running_loop())
