"""kubeckpt's zero-code hook. Python's `site` imports it at start-up as `sitecustomize`, because the
webhook put its directory first on PYTHONPATH (the install copies this file to
`<root>/kubeckpt-hook/sitecustomize.py`).

What it does:
- Always: runs the next `sitecustomize` on sys.path after its own directory, once, as if this one
  were not there (the image's or the user's own; `usercustomize` is left to `site`).
- Only when CHECKPOINT_ENABLED is true: puts a finder first on sys.meta_path that waits for
  `transformers.trainer` to be imported. When it is, `Trainer.__init__` is wrapped so that every
  Trainer (subclasses included, once each) ends its construction with
  `trainer_runtime.hf.kubeckpt_trainer(self)`: the callback, output_dir at CHECKPOINT_URI and
  auto-resume. The finder then takes itself off sys.meta_path.

- After a just-in-time stop of an attached Trainer: the process ends with 143 where the
  Trainer's training loop returns (`kubeckpt_trainer(..., exit_on_stop=True)`,
  trainer_runtime/stop/process_end.py), so that the script's code after `train()`, which assumes
  training finished (a "final" save_model, a DONE marker), never runs on the partial model, and
  the job controller restarts the job rather than take the preempted pod for a success. An atexit
  handler registered here, before the script runs, runs last of all and gives the same exit code
  to a process that got past that point anyway (`train()` raised after the stop).

It imports only the standard library and never torch or transformers: a script that does not
import transformers runs exactly as without it. Any failure inside the hook prints one warning to
stderr and leaves the program running as it would without kubeckpt. Written in syntax that old
Pythons still parse, so that on one older than the runtime needs it can say why it stays off.
"""

import os
import sys

_MIN_PYTHON = (3, 11)
_TARGET = "transformers.trainer"
_MARK = "_kubeckpt_zerocode"
_warned = []
_attached = []  # the callbacks attached to Trainers


def _warn(message):
    if _warned:
        return
    _warned.append(message)
    try:
        sys.stderr.write(f"kubeckpt: zero-code instrumentation: {message}\n")
        sys.stderr.flush()
    except Exception:
        pass


def _enabled():
    return os.environ.get("CHECKPOINT_ENABLED", "").strip().lower() in ("true", "1", "yes")


def _attach(trainer):
    try:
        from trainer_runtime.hf import kubeckpt_trainer

        kubeckpt_trainer(trainer, exit_on_stop=True)
        callback = getattr(trainer, "kubeckpt", None)
        if callback is not None:
            _attached.append(callback)
    except Exception as e:
        _warn(f"not attached to {type(trainer).__name__}, training without it: {e!r}")


def _patch(module):
    """Wrap `Trainer.__init__` in the freshly imported transformers.trainer."""
    try:
        cls = getattr(module, "Trainer", None)
        if cls is None:
            _warn(f"{_TARGET} has no Trainer; nothing attached")
            return
        init = cls.__init__
        if getattr(init, _MARK, False):
            return

        import functools  # loaded by transformers already

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            init(self, *args, **kwargs)
            # Subclasses reach this through super().__init__ exactly once; a script that also
            # adopted kubeckpt explicitly does so after construction and finds it attached.
            if getattr(self, "kubeckpt", None) is None:
                _attach(self)

        setattr(__init__, _MARK, True)
        cls.__init__ = __init__
    except Exception as e:
        _warn(f"cannot patch {_TARGET}.Trainer: {e!r}")


class _PatchingLoader:
    """Runs the real loader, gives the module its real loader back, then patches it."""

    def __init__(self, loader, finder):
        self._loader = loader
        self._finder = finder

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self._loader
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self._loader
        self._loader.exec_module(module)
        _patch(module)
        self._finder.remove()


class _TrainerFinder:
    """A meta-path finder that only answers for transformers.trainer, by asking the others."""

    def __init__(self):
        self._busy = False
        setattr(self, _MARK, True)

    def find_spec(self, name, path=None, target=None):
        if name != _TARGET or self._busy:
            return None
        self._busy = True
        try:
            spec = None
            for finder in list(sys.meta_path):
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
        except Exception as e:
            _warn(f"cannot look up {_TARGET}: {e!r}")
            return None
        finally:
            self._busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _PatchingLoader(spec.loader, self)
        return spec

    def invalidate_caches(self):
        pass

    def remove(self):
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass


def _exit_status():
    """The last atexit handler: 143 after a just-in-time stop, whatever the script returned."""
    codes = [getattr(callback, "exit_code", 0) for callback in _attached]
    code = next((c for c in codes if c), 0)
    if not code:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


def _install():
    if sys.version_info < _MIN_PYTHON:
        want = ".".join(map(str, _MIN_PYTHON))
        _warn(f"needs Python {want} or newer, this is {sys.version.split()[0]}; off")
        return
    if any(getattr(f, _MARK, False) for f in sys.meta_path):
        return  # a second copy of the hook on the path
    import atexit

    atexit.register(_exit_status)  # before anything of the script's: it runs last
    module = sys.modules.get(_TARGET)
    if module is not None:  # imported before us (a site .pth file): patch it now
        _patch(module)
        return
    sys.meta_path.insert(0, _TrainerFinder())


def _chain():
    """Run the next sitecustomize after our directory on sys.path, as `site` would have."""
    here = os.path.dirname(os.path.realpath(__file__))
    rest = None
    for i, entry in enumerate(sys.path):
        if os.path.realpath(entry or os.curdir) == here:
            rest = sys.path[i + 1 :]
            break
    if rest is None:
        return
    from importlib.machinery import PathFinder

    spec = PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or spec.origin is None:
        return
    if os.path.realpath(spec.origin) == os.path.realpath(__file__):
        return
    import importlib.util

    ours = sys.modules.get("sitecustomize")
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        # `site` reports it as it would have; our module stays the registered one.
        if ours is not None:
            sys.modules["sitecustomize"] = ours
        raise
    # On success the chained module stays registered as `sitecustomize`, as without us.


if _enabled():
    try:
        _install()
    except Exception as e:
        _warn(f"not installed: {e!r}")
_chain()
