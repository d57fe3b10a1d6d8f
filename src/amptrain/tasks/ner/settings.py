"""The tagger's own config key: of `[train]`, the loss weight of words tagged O."""

import dataclasses

from amptrain.config import TrainConfig


@dataclasses.dataclass(frozen=True)
class NerTrain(TrainConfig):
    outside_weight: float = 1.0  # the loss weight of words tagged O (most words are)
