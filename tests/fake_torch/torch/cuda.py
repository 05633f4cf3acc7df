"""Mimics torch.cuda's lazy initialisation (torch 2.13): `_lazy_call` queues callables that run
when CUDA is first initialised; `set_per_process_memory_fraction` initialises lazily."""
import threading

_initialized = False
_tls = threading.local()
_queued_calls = []
fractions = {}
initialised_ever = False


def is_initialized():
    return _initialized


def _lazy_call(callable, **kwargs):
    if is_initialized():
        callable()
    else:
        _queued_calls.append(callable)


def _lazy_init():
    global _initialized, initialised_ever
    if is_initialized() or hasattr(_tls, "is_initializing"):
        return
    initialised_ever = True
    _tls.is_initializing = True
    try:
        for call in _queued_calls:
            call()
    finally:
        del _tls.is_initializing
    _initialized = True


def init():
    _lazy_init()


def device_count():
    return 2


def set_per_process_memory_fraction(fraction, device=None):
    _lazy_init()
    fractions[device] = fraction
