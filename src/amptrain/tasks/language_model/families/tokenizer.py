"""A causal language model's tokenizer: the folder's `tokenizer.json`, run by the `tokenizers`
library, which is what `transformers` runs for these families, so the ids are its own.

    tokenizer = HubPieces.from_checkpoint(checkpoint)
    tokenizer.prefix, tokenizer.end_id     # [<|begin_of_text|>'s id] (Llama 3) or [] (GPT-2); the end piece
    tokenizer.encode(["Hello"])            # [array([...])]: the text's pieces, no special piece
    tokenizer.decode(ids)                  # the text, special pieces skipped
    tokenizer.graph_form()                 # the same in TensorFlow ops (graph_pieces.py), for an export

Ids are the checkpoint's own (no swap: the language-model task pads with weights and -1,
never with id 0). `prefix` is what the tokenizer puts before a text (its post-processor, as
`transformers`' `tokenizer(text)` adds it); the end piece is config.json's `eos_token_id`.
"""

import json
import os

import numpy as np

from amptrain.data.vocabulary import NUL_AS_SPACE
from amptrain.errors import ConfigError


class HubPieces:
    def __init__(self, path, end_id, start_id=None):
        from tokenizers import Tokenizer

        self.path = path
        self._tokenizer = Tokenizer.from_file(path)
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        self.size = self._tokenizer.get_vocab_size(with_added_tokens=True)
        plain = self._tokenizer.encode("a", add_special_tokens=False).ids
        full = self._tokenizer.encode("a", add_special_tokens=True).ids
        at = _find(full, plain)
        self.prefix = list(full[:at])  # the pieces before every text
        self.end_id = end_id
        self.start_id = self.prefix[0] if self.prefix else start_id
        added = self._tokenizer.get_added_tokens_decoder()
        self.special_ids = sorted({i for i, token in added.items() if token.special} | {end_id})

    @classmethod
    def from_checkpoint(cls, checkpoint):
        config_path = os.path.join(checkpoint.path, "config.json")
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
        end = config.get("eos_token_id")
        if isinstance(end, list):  # Llama 3 instruct models list several; the first ends a text
            end = end[0] if end else None
        if type(end) is not int or not 0 <= end < checkpoint.vocabulary_size:
            raise ConfigError(f"{config_path}: eos_token_id: expected a piece's id, received {end!r:.60}")
        start = config.get("bos_token_id")
        return cls(checkpoint.vocabulary_path, end, start if type(start) is int else None)

    def token_id(self, token):
        return self._tokenizer.token_to_id(token)

    def encode(self, texts, chunk_size=4096):
        """One int32 array of piece ids a text: its pieces alone (no prefix, no end piece)."""
        result = []
        for start in range(0, len(texts), chunk_size):
            chunk = [text.translate(NUL_AS_SPACE) for text in texts[start : start + chunk_size]]
            encoded = self._tokenizer.encode_batch(chunk, add_special_tokens=False)
            result.extend(np.array(e.ids, dtype=np.int32) for e in encoded)
        return result

    def decode(self, ids, skip_special_tokens=True):
        """The text of `ids`, as `transformers` decodes it (`skip_special_tokens` by default)."""
        return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def graph_form(self):
        """The same tokenizer in TensorFlow ops, for an export (`graph_pieces.graph_tokenizer`)."""
        from amptrain.tasks.language_model.families.graph_pieces import graph_tokenizer

        return graph_tokenizer(self)

    @property
    def library(self):
        """The `tokenizers.Tokenizer` itself: its offsets place a chat's replies (`chat.py`)."""
        return self._tokenizer

    def piece(self, index):
        """The piece `index` as the vocabulary writes it (the projector's labels)."""
        return self._tokenizer.id_to_token(index) or ""


def _find(full, plain):
    """Where `plain` starts in `full` (the pieces a post-processor put around it)."""
    for at in range(len(full) - len(plain) + 1):
        if full[at : at + len(plain)] == plain:
            return at
    return 0
