"""A component called from another process, derived from its contract (roll_agent/protocols.py).

    @forwards(Trainer)              # the caller's side: every method of Trainer, sent through
    class RemoteTrainer:            # self._forward(name, args, kwargs) (plain methods) or
        ...                         # await self._forward_async(...) (async methods)

    answer(trainer, Trainer, name, args, kwargs)   # the component's side: call the method,
                                                   # return (result, the protocol's attributes)

The plain attributes a protocol declares (a trainer's `version`) travel back with every
answer, so the caller's copy is as new as its last call. A client on an event loop may send
a plain method that returns None as a notification, not waited for (`RemoteLedger.start`).
A method added to a protocol is forwarded with no edit here or in a runtime. `Host` is the
Ray actor that holds one component.
"""

from __future__ import annotations

import functools
import inspect
import os
from typing import Any, Callable, Protocol


PLAIN = ("int", "float", "bool", "str")  # the attribute types that travel back with answers


@functools.cache
def members(proto: type) -> tuple[dict[str, bool], tuple[str, ...]]:
    """The protocol's methods (name -> whether it is async) and its plain-valued attributes
    (an int, float, bool or str: a trainer's `version`; not a component such as a ledger)."""
    methods, attrs = {}, {}
    for cls in reversed(proto.__mro__):  # a protocol's own members, and those of the protocols it extends
        if getattr(cls, "_is_protocol", False) and cls is not Protocol:
            methods.update({name: inspect.iscoroutinefunction(fn) for name, fn in vars(cls).items()
                            if inspect.isfunction(fn) and not name.startswith("_")})
            attrs.update({name: None for name, kind in vars(cls).get("__annotations__", {}).items()
                          if not name.startswith("_") and str(kind) in PLAIN})
    return methods, tuple(attrs)


def state_of(component: Any, proto: type) -> dict:
    return {name: getattr(component, name) for name in members(proto)[1]}


def _method(component: Any, proto: type, name: str) -> Callable:
    if name not in members(proto)[0]:  # only the contract is callable from elsewhere
        raise AttributeError(f"{proto.__name__} has no method '{name}'")
    return getattr(component, name)


def answer(component: Any, proto: type, name: str, args: tuple, kwargs: dict) -> tuple[Any, dict]:
    """Call one of the protocol's methods on the component: (result, its plain attributes now)."""
    return _method(component, proto, name)(*args, **kwargs), state_of(component, proto)


async def answer_async(component: Any, proto: type, name: str, args: tuple, kwargs: dict) -> tuple[Any, dict]:
    result = _method(component, proto, name)(*args, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result, state_of(component, proto)


def forwards(proto: type) -> Callable[[type], type]:
    """Give the class every method of `proto` it does not define itself, forwarded."""

    def plain(name: str):
        def method(self, *args, **kwargs):
            result, state = self._forward(name, args, kwargs)
            self.__dict__.update(state)
            return result
        return method

    def coroutine(name: str):
        async def method(self, *args, **kwargs):
            result, state = await self._forward_async(name, args, kwargs)
            self.__dict__.update(state)
            return result
        return method

    def decorate(cls: type) -> type:
        for name, is_async in members(proto)[0].items():
            if name not in vars(cls):
                method = coroutine(name) if is_async else plain(name)
                method.__name__ = method.__qualname__ = name
                method.__doc__ = f"{proto.__name__}.{name}, forwarded."
                setattr(cls, name, method)
        return cls

    return decorate


class Host:
    """A Ray actor holding the component `build(*args)`, answering its protocol's calls one at a
    time (a synchronous actor: a weight read never overlaps a training step). `apply(fn, ...)`
    runs `fn(component, ...)` here, for the work beside the contract (a weight broadcast).
    An argument sent as an object reference is read here, from the object store (a batch
    the buffer actor returned reaches the trainer actor without passing through the caller)."""

    def __init__(self, proto: type, build: Callable, *args):
        self.proto = proto
        self.component = build(*args)

    def invoke(self, name: str, args: tuple, kwargs: dict) -> tuple[Any, dict]:
        return answer(self.component, self.proto, name, _read_refs(args), kwargs)

    def state(self) -> dict:
        return state_of(self.component, self.proto)

    def apply(self, fn: Callable, *args) -> Any:
        return fn(self.component, *args)

    def ping(self) -> int:
        return os.getpid()


def _read_refs(args: tuple) -> tuple:
    import ray  # a Host runs only as a Ray actor

    refs = [i for i, a in enumerate(args) if isinstance(a, ray.ObjectRef)]
    if not refs:
        return args
    values = dict(zip(refs, ray.get([args[i] for i in refs])))
    return tuple(values.get(i, a) for i, a in enumerate(args))


class AsyncHost(Host):
    """A Host on an event loop: many calls at once (an engine's or the proxy's requests)."""

    async def invoke(self, name: str, args: tuple, kwargs: dict) -> tuple[Any, dict]:
        return await answer_async(self.component, self.proto, name, args, kwargs)

    async def apply(self, fn: Callable, *args) -> Any:
        result = fn(self.component, *args)
        return await result if inspect.isawaitable(result) else result
