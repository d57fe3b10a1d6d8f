"""The translator's own config: `[decode]`, and its keys of the shared sections (the target
files and the vocabulary's sharing, the decoder's depth and tied output, label smoothing)."""

import dataclasses

from amptrain.config import DataConfig, ModelConfig, TrainConfig
from amptrain.config.sections import path_field


@dataclasses.dataclass(frozen=True)
class TranslationData(DataConfig):
    # from two aligned files: the target side of each split (data.train is then the source)
    train_target: str = path_field()
    dev_target: str = path_field()
    test_target: str = path_field()
    shared_vocabulary: bool = True  # one vocabulary for both sides (else one a side)


@dataclasses.dataclass(frozen=True)
class TranslationModel(ModelConfig):
    num_decoder_layers: int = 0  # 0 means model.num_layers
    tie_embeddings: bool = True  # the output projection is the target embedding


@dataclasses.dataclass(frozen=True)
class TranslationTrain(TrainConfig):
    label_smoothing: float = 0.0  # the probability spread evenly over the vocabulary


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """`[decode]`: how the model writes its output."""

    beam_size: int = 4  # the test split and `predict`; dev evaluation during training is greedy
    length_penalty: float = 0.6  # GNMT's alpha: scores are divided by ((5 + length) / 6) ** alpha
    max_length: int = 0  # output pieces at most; 0 means data.max_length
    dev_sentences: int = 200  # dev pairs decoded (greedy) at each evaluation; 0: all
    batch_size: int = 64  # sentences decoded at once
