"""What a checkpoint holds besides model and optimizer tensors, and tensor-tree helpers.

Per rank: RNG states (python, numpy, torch CPU, every CUDA device), the sampler's epoch and
position, the LR scheduler, the AMP GradScaler and user extras. Everything here is converted to
types `torch.load(weights_only=True)` accepts, so loading a checkpoint never runs pickled code.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import torch

try:
    import numpy as np
except ImportError:  # numpy is optional for torch; its RNG is simply not part of the state then
    np = None  # type: ignore[assignment]

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # torch built without distributed
    DTensor = None  # type: ignore[assignment,misc]

Path = tuple[Any, ...]
TENSOR_REF = "__kubeckpt_tensor__"


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor (FSDP2, tensor parallel); any other tensor as it is."""
    if DTensor is not None and isinstance(t, DTensor):
        return t.to_local()
    return t


# --- tensor trees ---------------------------------------------------------------------------


def detached(t: torch.Tensor) -> torch.Tensor:
    """`t` without autograd history; detach() only where there is some (a state dict's tensors
    have none, and detach() costs a new tensor object per tensor on every save)."""
    return t.detach() if t.requires_grad else t


def iter_tensors(tree: Any, path: Path = ()) -> Iterator[tuple[Path, torch.Tensor]]:
    """(path, tensor) for every tensor in nested dicts/lists/tuples, in a stable order.

    Collected by plain recursion, then iterated: nested generators cost one resumption per
    level for every tensor, and this walk runs several times in the save call."""
    found: list[tuple[Path, torch.Tensor]] = []

    def walk(node: Any, at: Path) -> None:
        if isinstance(node, torch.Tensor):
            found.append((at, node))
        elif isinstance(node, dict):
            for key, value in node.items():
                walk(value, (*at, key))
        elif isinstance(node, (list, tuple)):
            for i, value in enumerate(node):
                walk(value, (*at, i))

    walk(tree, path)
    return iter(found)


def map_tensors(tree: Any, fn: Callable[[Path, torch.Tensor], Any], path: Path = ()) -> Any:
    """A copy of the tree's containers with every tensor replaced by fn(path, tensor)."""
    if isinstance(tree, torch.Tensor):
        return fn(path, tree)
    if isinstance(tree, dict):
        return {k: map_tensors(v, fn, (*path, k)) for k, v in tree.items()}
    if isinstance(tree, list):
        return [map_tensors(v, fn, (*path, i)) for i, v in enumerate(tree)]
    if isinstance(tree, tuple):
        return tuple(map_tensors(v, fn, (*path, i)) for i, v in enumerate(tree))
    return tree


def skeleton(tree: Any) -> tuple[Any, list[torch.Tensor]]:
    """The tree with tensors replaced by numbered references, and the tensors in that order."""
    tensors: list[torch.Tensor] = []

    def ref(_path: Path, t: torch.Tensor) -> dict[str, int]:
        tensors.append(t)
        return {TENSOR_REF: len(tensors) - 1}

    return map_tensors(tree, ref), tensors


def fill_skeleton(tree: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(tree, dict):
        if len(tree) == 1 and TENSOR_REF in tree:
            return tensors[tree[TENSOR_REF]]
        return {k: fill_skeleton(v, tensors) for k, v in tree.items()}
    if isinstance(tree, list):
        return [fill_skeleton(v, tensors) for v in tree]
    if isinstance(tree, tuple):
        return tuple(fill_skeleton(v, tensors) for v in tree)
    return tree


def cpu_copy(tree: Any) -> Any:
    """A deep copy with every tensor cloned to CPU (for small state taken synchronously)."""
    return map_tensors(tree, lambda _p, t: t.detach().to("cpu", copy=True))


# --- RNG --------------------------------------------------------------------------------------


def capture_rng() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "torch": torch.get_rng_state(),
    }
    if np is not None:
        kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
        state["numpy"] = {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def apply_rng(state: dict[str, Any]) -> None:
    python = state.get("python")
    if python is not None:
        version, internal, gauss = python
        random.setstate((version, tuple(internal), gauss))
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    numpy_state = state.get("numpy")
    if numpy_state is not None and np is not None:
        np.random.set_state(
            (
                numpy_state["kind"],
                numpy_state["keys"].numpy().astype(np.uint32),
                numpy_state["pos"],
                numpy_state["has_gauss"],
                numpy_state["cached_gaussian"],
            )
        )
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        # A restart may see fewer devices (one per rank is the norm): restore those that exist.
        count = torch.cuda.device_count()
        torch.cuda.set_rng_state_all(list(cuda)[:count])


# --- stateful objects ---------------------------------------------------------------------------


def object_state(obj: Any) -> Any:
    """state_dict() of a stateful object, get_state() of a torch.Generator."""
    if isinstance(obj, torch.Generator):
        return {"generator_state": obj.get_state()}
    if hasattr(obj, "state_dict"):
        return obj.state_dict()
    raise TypeError(
        f"checkpoint extra of type {type(obj).__name__} has no state_dict()/load_state_dict()"
    )


def load_object_state(obj: Any, state: Any) -> None:
    if isinstance(obj, torch.Generator):
        obj.set_state(state["generator_state"])
    else:
        obj.load_state_dict(state)
