"""A DistributedSampler that knows how far into the epoch it is, so a resume continues mid-epoch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import Dataset, DistributedSampler


class ResumableSampler(DistributedSampler):
    """DistributedSampler plus `state_dict()`/`load_state_dict()` of (epoch, position).

    `position` counts the indices this rank has handed out in the current epoch. With a DataLoader
    of `num_workers=0` that is exactly what the loop consumed at a step boundary; with worker
    processes the loader prefetches, so the position runs ahead by the batches in flight (use
    torchdata's StatefulDataLoader as a manager extra in that case). Works without
    torch.distributed: pass num_replicas=1, rank=0.
    """

    def __init__(self, dataset: Dataset, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        self.position = 0
        self._skip = 0  # set by load_state_dict: where the next iteration starts

    def set_epoch(self, epoch: int) -> None:
        # Setting the restored epoch again keeps the resume point; another epoch drops it.
        if epoch != self.epoch:
            self._skip = 0
        super().set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        start, self._skip = self._skip, 0
        self.position = start
        for i in range(start, len(indices)):
            self.position = i + 1
            yield indices[i]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if int(state.get("seed", self.seed)) != self.seed:
            raise ValueError(
                f"sampler seed {self.seed} differs from the checkpoint's {state['seed']}: "
                "the data order would not match"
            )
        self.epoch = int(state["epoch"])
        self.position = self._skip = int(state["position"])
