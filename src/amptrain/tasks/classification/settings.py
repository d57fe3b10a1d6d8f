"""The classifier's own config keys: of `[data]`, which columns hold the text and the label,
and how a long text is cut."""

import dataclasses

from amptrain.config import DataConfig


@dataclasses.dataclass(frozen=True)
class ClassificationData(DataConfig):
    text_column: str = "text"  # csv, tsv, jsonl: the text's column or key
    label_column: str = "label"
    # a text longer than max_length keeps its last keep_tail pieces after its first ones
    # (head + tail); 0: its first pieces only
    keep_tail: int = 0
