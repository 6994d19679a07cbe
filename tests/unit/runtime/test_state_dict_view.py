"""StateDictView: the same state dicts as DCP's get_state_dict, from the live objects, with DCP
asked again whenever the module tree or the optimizers' parameters change."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.checkpoint.state_dict import (
    _patch_model_state_dict,
    get_model_state_dict,
    get_state_dict,
)

from trainer_runtime.torch.state_dict_view import StateDictView


def assert_same(ours: Any, dcps: Any, path: str = "") -> None:
    """Same keys in the same order, the same tensors (storage and values), the same values."""
    if isinstance(dcps, torch.Tensor):
        assert isinstance(ours, torch.Tensor), path
        assert ours.data_ptr() == dcps.data_ptr(), f"{path}: another tensor"
        assert torch.equal(ours, dcps), path
    elif isinstance(dcps, dict):
        assert isinstance(ours, dict), path
        assert list(ours) == list(dcps), f"{path}: keys {list(ours)} != {list(dcps)}"
        for key in dcps:
            assert_same(ours[key], dcps[key], f"{path}/{key}")
    elif isinstance(dcps, list | tuple):
        assert type(ours) is type(dcps) and len(ours) == len(dcps), path
        for i, (a, b) in enumerate(zip(ours, dcps, strict=True)):
            assert_same(a, b, f"{path}/{i}")
    else:
        assert ours == dcps, f"{path}: {ours!r} != {dcps!r}"


def train_step(model: nn.Module, optimizers: list[torch.optim.Optimizer]) -> None:
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.randn_like(p)
    for opt in optimizers:
        opt.step()


def check(view: StateDictView, model: nn.Module, optimizers: list[torch.optim.Optimizer]) -> None:
    ours = view.get()
    if optimizers:
        assert_same(ours, get_state_dict(model, optimizers))
    else:
        assert_same(ours[0], get_model_state_dict(model))
        assert ours[1] == {}


def test_after_the_first_call_dcp_is_not_asked_and_the_state_is_live() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    train_step(model, [opt])
    view = StateDictView(model, [opt])
    check(view, model, [opt])
    assert view.learnt == 1
    for lr in (5e-4, 1e-5):
        train_step(model, [opt])
        opt.param_groups[0]["lr"] = lr  # a scheduler's work: never cached
        check(view, model, [opt])
        assert view.get()[1]["param_groups"][0]["lr"] == lr
    with torch.no_grad():  # same Parameter, new storage: the new one is what comes back
        model[0].weight.data = torch.zeros(8, 8)
    check(view, model, [opt])
    assert view.get()[0]["0.weight"].data_ptr() == model[0].weight.data_ptr()
    assert view.learnt == 1


def test_a_changed_model_or_optimizer_goes_back_to_dcp() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    opt = torch.optim.AdamW(model.parameters())
    train_step(model, [opt])
    view = StateDictView(model, [opt])
    check(view, model, [opt])
    # A new layer and its parameter group (progressive growing, unfreezing).
    model.append(nn.Linear(4, 3))
    opt.add_param_group({"params": list(model[2].parameters()), "lr": 0.1})
    train_step(model, [opt])
    check(view, model, [opt])
    assert view.learnt == 2
    # A reassigned Parameter the optimizer does not hold: DCP's own error, every time.
    model[0].weight = nn.Parameter(torch.ones(4, 4))
    for _ in range(2):
        with pytest.raises(KeyError):
            get_state_dict(model, [opt])
        with pytest.raises(KeyError):
            view.get()
    # A buffer registered later: a new key.
    model2 = nn.Sequential(nn.Linear(4, 4))
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.1, momentum=0.9)
    train_step(model2, [opt2])
    view2 = StateDictView(model2, [opt2])
    check(view2, model2, [opt2])
    model2[0].register_buffer("scale", torch.ones(4))
    check(view2, model2, [opt2])
    assert view2.learnt == 2


def test_an_optimizer_without_state_is_initialised_by_dcp_as_before() -> None:
    model = nn.Linear(3, 3)
    opt = torch.optim.Adam(model.parameters())
    view = StateDictView(model, [opt])
    _, osd = view.get()  # DCP steps the optimizer with zero gradients to create its state
    assert set(osd["state"]) == {"weight", "bias"}
    check(view, model, [opt])
    assert view.learnt == 1
    opt.state.clear()  # a reset optimizer: DCP initialises it again, so it is asked again
    assert set(view.get()[1]["state"]) == {"weight", "bias"}
    assert view.learnt == 2


def test_tied_weights_frozen_parameters_and_two_optimizers() -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(10, 6)
            self.body = nn.Linear(6, 6)
            self.frozen = nn.Linear(6, 6).requires_grad_(False)
            self.head = nn.Linear(6, 10, bias=False)
            self.head.weight = self.embed.weight

    model = Tied()
    trainable = [p for p in model.parameters() if p.requires_grad]
    opts = [torch.optim.Adam(trainable[:1]), torch.optim.SGD(trainable[1:], lr=0.1, momentum=0.9)]
    train_step(model, opts)
    view = StateDictView(model, opts)
    check(view, model, opts)
    train_step(model, opts)
    check(view, model, opts)
    assert view.learnt == 1


def test_wrapper_prefixes_are_dropped_as_dcp_drops_them() -> None:
    inner = nn.Sequential(nn.Linear(4, 4), checkpoint_wrapper(nn.Linear(4, 4)))
    model = torch.compile(inner)  # an OptimizedModule: keys start with `_orig_mod.`
    assert next(iter(model.state_dict())).startswith("_orig_mod.")
    opt = torch.optim.Adam(model.parameters())
    train_step(model, [opt])
    view = StateDictView(model, [opt])
    check(view, model, [opt])
    check(view, model, [opt])
    assert "1.weight" in view.get()[0]
    assert view.learnt == 1


@pytest.fixture
def world_of_one() -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_ddp_keys_lose_the_module_prefix(world_of_one: None) -> None:
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)))
    opt = torch.optim.Adam(model.parameters())
    train_step(model, [opt])
    view = StateDictView(model, [opt])
    check(view, model, [opt])
    check(view, model, [opt])
    assert list(view.get()[0]) == ["0.weight", "0.bias", "1.weight", "1.bias"]
    assert view.learnt == 1


def test_a_patched_state_dict_and_a_model_without_optimizer() -> None:
    model = nn.Sequential(nn.Linear(4, 4))
    view = StateDictView(model, [])
    check(view, model, [])
    check(view, model, [])
    assert view.learnt == 1
    patched = nn.Sequential(nn.Linear(4, 4))
    _patch_model_state_dict(patched)  # state_dict() is now DCP's: always asked
    view = StateDictView(patched, [])
    check(view, patched, [])
    check(view, patched, [])
    assert view.learnt == 2
