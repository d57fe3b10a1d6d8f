"""The language-model task: a decoder-only Transformer trained on next-piece prediction over
a text corpus, scored in bits per byte, continuing prompts.

    [data] train = "data/lm-kjv/train.txt"   # a file, a folder or a glob; a blank line ends a document
           max_length = 256                  # a block: pieces a training row, and the model's length

The training text gives a byte-level BPE (`vocabulary.py`); each split is tokenized into a
token file in the run folder (`corpus.py`), read a block at a time through a memory map.
Blocks are packed: a row is `max_length` pieces of consecutive documents with no padding,
and segment ids and positions keep attention inside each document (`model.py`). Batch N
is a pure function of (seed, N), a permutation of the blocks an epoch, so resuming is
starting at the checkpoint's step.

Scores, on dev and test: loss and perplexity per piece, and bits per byte (the nats over
every piece of the split, scored once, / ln 2 / the split's UTF-8 bytes), which do not
depend on the tokenizer; the best checkpoint is the one of the lowest dev bits per byte.

With `model.pretrained` (a GPT-2, Llama 3, Qwen2 or Gemma folder: `pretrained.py`) the
model and its tokenizer are the checkpoint's, and a document is framed as its tokenizer
frames a text: its start pieces (Llama 3's `<|begin_of_text|>`; none for GPT-2), its pieces,
its end piece; a new document starts after an end piece. `train.lora_rank` trains low-rank
adapters only (lora.py).

Chat data (JSONL conversations, told from the content, or `data.format = "chat"`) needs a
pretrained folder with a chat template: its conversations are packed into the same blocks,
the loss falls on the replies, and a split is scored by generating its last replies
(`conversations.py`); the best checkpoint is the one of the highest dev chrF
(`train.best_metric`).
"""

import dataclasses
import json
import logging
import os

import numpy as np

from amptrain.errors import DataError
from amptrain.files import atomic_write, fingerprint
from amptrain.tasks.base import PRETRAINED_FILE, Split, Task, record_pretrained
from amptrain.tasks.language_model import conversations, corpus, generation, lora, transformers_folder, vocabulary
from amptrain.tasks.language_model.blocks import BlockPlan, scores, segments_and_positions
from amptrain.tasks.language_model.generation import Settings
from amptrain.tasks.language_model.serving import GeneratorModule

logger = logging.getLogger("amptrain")
EVAL_BATCHES = 4  # batches scored a predict call: a split's batches are built a few at a time


class LanguageModelTask(Task):
    primary_metric = "bits_per_byte"
    higher_is_better = False
    predictions_suffix = ".jsonl"
    formats = ("auto", "text", "chat")  # auto: chat when a file's first line is a conversation
    config_sections = {"generate": Settings, "train": conversations.LanguageModelTrain}
    untrained_sections = ("generate",)  # how a run continues prompts does not change what it trains
    reads_corpora = True  # data.train (dev, test): a file, a folder or a glob of text files
    recomputes_pretrained = True  # model.remat with model.pretrained: each decoder layer (pretrained.py)
    serving_module = GeneratorModule
    export_formats, write_export = ("transformers", "gguf"), transformers_folder.write_export  # of model.pretrained
    printed_field = "generated"  # `predict` prints the continuation alone (--json: the record)
    pretrained_kind = "causal"

    def __init__(self, config, run_dir):
        super().__init__(config, run_dir)
        self.labels = None
        self.tokenizer = None
        self.is_chat = None  # told from the first split read (`_reads_chat`)

    # === Data ===

    def learned_files(self):
        if self.checkpoint is not None:
            return [PRETRAINED_FILE]
        return [vocabulary.VOCABULARY_FILE, vocabulary.MERGES_FILE]

    def prepare(self, split_names=("train", "dev", "test")):
        d = self.config.data
        paths = {"train": d.train, "dev": d.dev, "test": d.test}
        files = {name: corpus.corpus_files(paths[name]) for name in split_names if paths.get(name)}
        self.tokenizer = self._load_or_learn_vocabulary(
            lambda: files.get("train") or corpus.corpus_files(d.train), training="train" in files
        )
        for name, split_files in files.items():
            self._add_split(name, split_files)
        if "train" in self.splits and not self.is_chat:
            train = self.splits["train"]
            logger.info(
                f"data: {train.encoded['tokens_total']:,} training pieces ({train.encoded['bytes']:,} bytes) in "
                f"{self.blocks('train')} blocks of {d.max_length}, vocabulary {self.tokenizer.size}"
            )

    def add_split(self, name, path):
        self._add_split(name, corpus.corpus_files(path))

    def _reads_chat(self, files):
        """Whether `files` hold conversations (`data.format`, else their first line), the
        same kind as every split before."""
        fmt = self.config.data.format
        chat = fmt == "chat" or fmt == "auto" and conversations.looks_like_chat(files[0])
        if self.is_chat is not None and chat != self.is_chat:
            kinds = ("text", "conversations (JSONL)")
            raise DataError(f"{files[0]}: expected {kinds[self.is_chat]} like the other splits, received {kinds[chat]}")
        self.is_chat = chat
        self.primary_metric, self.higher_is_better = conversations.best_metric(self.config, chat)
        return chat

    def _add_split(self, name, files):
        """Tokenizes `files` into the run folder's token file of `name` (again unless it was
        made from these very files, tokenizer and framing: `corpus.cached_tokens`), and keeps
        the split: its token map and byte size."""
        if self._reads_chat(files):
            self.splits[name] = conversations.chat_split(self, name, files)
            return
        path = os.path.join(self.run_dir, f"tokens-{name}.bin")
        made_from = {
            "files": fingerprint(files),
            "tokenizer": fingerprint(self._tokenizer_files()),
            "framing": [[int(i) for i in part] for part in self.framing],
        }
        tokens = corpus.cached_tokens(path, made_from)
        if tokens is None:
            record = corpus.write_tokens(files, self.tokenizer, self.framing, path, made_from)
            logger.info(f"tokenized {name}: {record['count']:,} pieces from {len(files)} file(s) into {path}")
            tokens = corpus.open_tokens(path, record)
        if len(tokens) < 2:
            raise DataError(f"{files[0]}: no text in the {name} split; expected documents of text")
        encoded = {"tokens": tokens, "tokens_total": len(tokens), "bytes": corpus.corpus_bytes(files)}
        self.splits[name] = Split(name, files[0], files, encoded, np.zeros(0, np.int32))

    def _tokenizer_files(self):
        """The files the tokenizer was read from: the run's vocabulary, or the checkpoint's."""
        names = ("tokenizer.json", "tokenizer_config.json", vocabulary.VOCABULARY_FILE, vocabulary.MERGES_FILE)
        folder = self.run_dir if self.checkpoint is None else self.checkpoint.path
        return [os.path.join(folder, n) for n in names if os.path.isfile(os.path.join(folder, n))]

    def _load_or_learn_vocabulary(self, train_files, training):
        """The tokenizer: the checkpoint's, or the run's byte-level BPE, learned from the
        training files unless the run folder holds one learned from these very files and
        size (`vocabulary.RECORD`). `training`: fit is about to train, so a vocabulary learned
        from other files is learned again, or refused once checkpoints index it."""
        if self.checkpoint is not None:
            from amptrain.tasks.language_model.families import family_of

            self.base_weights = record_pretrained(self.checkpoint, self.run_dir)
            return family_of(self.checkpoint).tokenizer(self.checkpoint)
        saved = os.path.exists(os.path.join(self.run_dir, vocabulary.VOCABULARY_FILE))
        if saved and not training:
            return vocabulary.load(self.run_dir)  # eval, predict: learned_files checks it is the trained one
        files = train_files()
        made_from = {"files": fingerprint(files), "vocabulary_size": self.config.data.vocabulary_size}
        if saved and vocabulary.learned_from(self.run_dir, made_from):
            return vocabulary.load(self.run_dir)
        size = self.config.data.vocabulary_size
        logger.info(f"learning a byte-level BPE of {size} pieces on {self.config.data.train}")
        pieces, merges = vocabulary.learn(corpus.documents(files), size)
        if not merges:
            raise DataError(
                f"{files[0]}: nothing to learn a vocabulary from ({corpus.corpus_bytes(files):,} bytes in "
                f"{len(files)} file(s): no two characters ever stand together); expected a corpus of text"
            )
        vocabulary.save(pieces, merges, self.run_dir)
        atomic_write(os.path.join(self.run_dir, vocabulary.RECORD), json.dumps(made_from, indent=1) + "\n")
        return vocabulary.load(self.run_dir)

    @property
    def eod_id(self):
        return self.tokenizer.end_id

    @property
    def framing(self):
        """(the pieces before each document, after each, after the last): `EOD d1 EOD d2 EOD`
        for amptrain's own model; `[start] d1 END [start] d2 END` for a pretrained one."""
        if self.checkpoint is None:
            return [self.eod_id], [], [self.eod_id]
        return list(self.tokenizer.prefix), [self.eod_id], []

    @property
    def padding_id(self):
        """What pads token ids given to the export (`serve_token_ids`): amptrain's <pad>, or -1
        for a pretrained model, whose every id is a piece."""
        return 0 if self.checkpoint is None else -1

    @property
    def empty_prompt_id(self):
        """The piece an empty prompt starts from when the framing puts none before it (GPT-2,
        Qwen2: the config's `bos_token_id`, else the end piece, as GPT-2's is both)."""
        start = getattr(self.tokenizer, "start_id", None)
        return self.eod_id if start is None else start

    def document_starts(self, ids):
        """True where a document starts in rows of `ids`: at amptrain's end-of-document piece,
        or after a pretrained model's end piece."""
        if self.checkpoint is None:
            return ids == self.eod_id
        ends = ids == self.eod_id
        return np.concatenate([np.zeros_like(ends[:, :1]), ends[:, :-1]], axis=1)

    def blocks(self, split_name, scored=False):
        """Blocks of `split_name`: whole ones for training (a block is max_length pieces and the
        next one, its targets), or enough to score every piece once (`scored`: the last one short);
        chat data: its packed blocks."""
        if self.is_chat:
            return len(self.splits[split_name].encoded["blocks"]["token_ids"])
        targets = self.splits[split_name].encoded["tokens_total"] - 1
        length = self.config.data.max_length
        return -(-targets // length) if scored else max(1, targets // length)

    def block_builder(self, split_name):
        """(block indices, length) -> one batch of blocks: (features, targets, token counts);
        index -1 is a padding row, and a short last block is padded with pieces of weight 0."""
        if self.is_chat:
            return conversations.block_builder(self.splits[split_name].encoded["blocks"])
        tokens = self.splits[split_name].encoded["tokens"]
        starts = self.document_starts

        def build(indices, length):
            rows = len(indices)
            ids = np.zeros((rows, length), np.int32)
            labels = np.zeros((rows, length), np.int32)
            weights = np.zeros((rows, length), np.float32)
            for row, index in enumerate(indices):
                if index < 0:
                    continue
                piece = np.asarray(tokens[index * length : index * length + length + 1], np.int32)
                real = len(piece) - 1
                ids[row, :real], labels[row, :real], weights[row, :real] = piece[:-1], piece[1:], 1.0
            segments, positions = segments_and_positions(starts(ids), weights > 0)
            real = weights.sum(axis=1).astype(np.int32)
            counts = np.stack([real, np.full(rows, length, np.int32)], axis=1)
            scored = np.where(weights > 0, labels, -1)  # the model scores these (`model.py`)
            features = {"token_ids": ids, "segment_ids": segments, "positions": positions, "labels": scored}
            return features, {"labels": labels, "weights": weights}, counts

        return build

    def signature(self):
        import tensorflow as tf

        ids = tf.TensorSpec((None, None), tf.int32)
        return (
            {"token_ids": ids, "segment_ids": ids, "positions": ids, "labels": ids},
            {"labels": ids, "weights": tf.TensorSpec((None, None), tf.float32)},
            tf.TensorSpec((None, 2), tf.int32),
        )

    def plan(self, split_name, shuffle):
        rows = self.config.train.batch_size
        return BlockPlan(self.blocks(split_name, scored=not shuffle), rows, self.config.data.max_length,
                         self.config.runtime.seed, shuffle)  # fmt: skip

    @property
    def steps_per_epoch(self):
        return self.plan("train", shuffle=True).steps_per_epoch

    def train_dataset(self, start_step, share=None):
        from amptrain.data.pipeline import plan_dataset

        plan, build = self.plan("train", True), self.block_builder("train")
        return plan_dataset(plan, build, self.signature(), start_step, share=share)  # a worker's blocks only

    def train_buckets(self):
        return [(self.config.data.max_length, self.config.train.batch_size)]

    def probe_batches(self):
        from amptrain.data.pipeline import plan_dataset

        plan = self.plan("train", shuffle=True)

        class One:
            steps_per_epoch = 1

            def batch(self, index):
                return plan.batch(0)

        dataset = plan_dataset(One(), self.block_builder("train"), self.signature()).repeat()
        return dataset, (self.config.train.batch_size, self.config.data.max_length)

    # === Model and loss ===

    def build_model(self, dtype):
        from amptrain.tasks.language_model.model import LanguageModel

        d = self.config.data
        if self.checkpoint is not None:
            from amptrain.tasks.language_model.pretrained import PretrainedLanguageModel

            held = self.config.train.base_weights
            m = self.config.model
            model = PretrainedLanguageModel(self.checkpoint, d.max_length, m.dropout, dtype, held, remat=m.remat)
            model.base_weights = getattr(self, "base_weights", "") + ("" if held == "float32" else f" {held}")
            lora.apply_lora(model, self.config.train)
            return model
        model = LanguageModel(self.tokenizer.size, d.max_length, self.config.model, dtype)
        model.build()
        return model

    def data_figures(self):
        if not self.is_chat:
            return None
        return {name: split.encoded["stats"] for name, split in self.splits.items()}

    def projections(self, model):
        """The token embedding (also the output layer's), each piece as the text it stands for,
        with its count in the training split's token file."""
        encoded, counts = self.splits["train"].encoded, np.zeros(self.tokenizer.size, np.int64)
        tokens = encoded["blocks"]["token_ids"].ravel() if self.is_chat else encoded["tokens"]
        for first in range(0, len(tokens), 1 << 20):  # a chunk at a time: the file may exceed memory
            counts += np.bincount(np.asarray(tokens[first : first + (1 << 20)]), minlength=self.tokenizer.size)
        table = model.token_embedding.embeddings
        if self.checkpoint is not None:  # the table may have spare rows (Qwen2's)
            pieces = [self.tokenizer.piece(i) for i in range(int(table.shape[0]))]
            counts = np.pad(counts, (0, max(0, len(pieces) - len(counts))))
        else:
            pieces = [self.tokenizer.decode([i]) for i in range(self.tokenizer.size)]
            pieces[0], pieces[self.eod_id] = "<pad>", "<|endoftext|>"
        return [("tokens", table, pieces, counts)]

    def loss(self, targets, outputs):
        """The cross-entropy of every real next piece, summed (the model makes it from the
        labels in its features, a chunk of logits at a time), and their number: float32."""
        import tensorflow as tf

        return tf.cast(outputs, tf.float32), tf.reduce_sum(targets["weights"])

    # === Evaluation and prediction ===

    def evaluate(self, split_name, model, predict, predictions_path=None, quick=False):
        """{"loss", "perplexity", "bits_per_byte", "bytes", "tokens"} of every piece of the
        split, each scored once; with `predictions_path`, the same as a JSON line. Chat data:
        the replies' loss and the generated replies' scores (`conversations.evaluate`)."""
        split = self.splits[split_name]
        nats, count = self._scored_nats(split_name, predict)
        if self.is_chat:
            return conversations.evaluate(self, split_name, model, (nats, count), predictions_path, quick)
        metrics = scores(nats, count, split.encoded["bytes"])
        if predictions_path:
            with open(predictions_path + self.predictions_suffix, "w", encoding="utf-8") as f:
                f.write(json.dumps({"split": split_name, "files": split.examples, **metrics}) + "\n")
        return metrics

    def evaluation_memory(self, model):
        """Chat data: what its generated replies hold (`conversations.generation_memory`)."""
        return conversations.generation_memory(self, model) if self.is_chat else {}

    def warm_up_evaluation(self, model):
        """Chat data: a reply generated once (`conversations.warm_up`)."""
        return self.is_chat and conversations.warm_up(self, model)

    def _scored_nats(self, split_name, predict):
        """(the nats of every scored piece of the split, their number)."""
        import tensorflow as tf

        plan = self.plan(split_name, shuffle=False)
        build = self.block_builder(split_name)
        nats, count = 0.0, 0
        for first in range(0, plan.steps_per_epoch, EVAL_BATCHES):
            steps = min(EVAL_BATCHES, plan.steps_per_epoch - first)
            batches = [build(*plan.batch(step)) for step in range(first, first + steps)]  # built once:
            dataset = tf.data.Dataset.from_generator(lambda kept=batches: iter(kept), output_signature=self.signature())
            outputs = predict(dataset)  # the model's inputs, and the targets scored below
            for (_, targets, _), losses in zip(batches, outputs):  # each position's nats
                nats += float(np.sum(np.asarray(losses, np.float64) * targets["weights"]))
                count += int(targets["weights"].sum())
        return nats, count

    def predict_texts(self, texts, model, predict):
        """Each prompt continued as `[generate]` says: {"text", "generated"}."""
        settings = self.config.generate
        if not texts:
            return []
        prompts, lengths = self.prompt_ids(texts, settings.max_new_tokens)
        out = generation.generate(model, prompts, lengths, self.eod_id, settings).numpy()
        ids = [generation.continuation(row, length, self.eod_id) for row, length in zip(out, lengths)]
        return [{"text": text, "generated": self.tokenizer.decode(i)} for text, i in zip(texts, ids)]

    def prompt_ids(self, texts, max_new_tokens):
        """(batch, longest) prompt ids, each the pieces that start a document (`framing`) then
        the text's pieces (the last ones that leave `max_new_tokens` of the model's length),
        and their lengths; rows padded with -1."""
        before = self.framing[0]
        generation.check(dataclasses.replace(self.config.generate, max_new_tokens=max_new_tokens),
                         self.config.data.max_length, len(before))  # fmt: skip
        keep = self.config.data.max_length - max_new_tokens - len(before)
        encoded = [np.concatenate([before, ids[-keep:] if len(ids) else ids]) for ids in self.tokenizer.encode(texts)]
        return generation.padded_prompts([(ids if len(ids) else [self.empty_prompt_id]) for ids in encoded])

    @classmethod
    def check_config(cls, config):
        from amptrain.config import require

        super().check_config(config)
        g, d = config.generate, config.data
        base = vocabulary.BASE_PIECES  # the 256 bytes, padding and the end piece: no merge yet
        ok = config.model.pretrained or d.vocabulary_size > base
        require(ok, "data.vocabulary_size", f"an integer > {base} (the 256 bytes and two pieces)", d.vocabulary_size)
        generation.check(g)  # its context is checked where it generates (`prompt_ids`)
        lora.check(config)
        conversations.check(config)
