"""A Ctrl-C that lands in one of tiermem's finalizers (a saved tensor's, a parameter view's
release) is handed on to the main thread instead of dropped.

Python raises a pending KeyboardInterrupt at the next instruction it runs, which is often a
finalizer's first one: autograd frees saved tensors all through backward, and each frees its
tiermem copy in a finalizer. An exception in a finalizer cannot propagate; Python passes it to
sys.unraisablehook, whose default prints "Exception ignored in ..." and goes on, so a third of
an outside client's Ctrl-Cs did nothing (and twice two in a row). The hook installed here, in
front of whatever hook was there, re-delivers such a KeyboardInterrupt to the main thread
(_thread.interrupt_main, as if the signal came again, from a timer thread 10 ms
later: the hook itself cannot raise it) and hands everything else on unchanged.
What the finalizer left undone is finished as before (the releases count their calls; a saved
tensor's copy is freed with its runtime)."""

import _thread
import sys
import threading

_previous = None


def _ours(obj):
    module = getattr(obj, "__module__", None) or getattr(type(obj), "__module__", "")
    return isinstance(module, str) and module.startswith("tiermem.")


def _hook(unraisable):
    if (unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt)
            and _ours(unraisable.object)
            and threading.current_thread() is threading.main_thread()):
        # Not from here: the interrupt would be raised at the hook's next instruction, inside
        # the hook (and dropped with it). A timer thread sets it once the hook has returned.
        timer = threading.Timer(0.01, _thread.interrupt_main)
        timer.daemon = True
        timer.start()
        return
    (_previous or sys.__unraisablehook__)(unraisable)


def install():
    """Puts the hook in front of sys.unraisablehook (once: a hook set later by the program runs
    instead, as it chose)."""
    global _previous
    if sys.unraisablehook is not _hook:
        _previous = sys.unraisablehook
        sys.unraisablehook = _hook
