"""Translation: parallel text in, BLEU and chrF (sacrebleu) out.

    task = TranslationTask(config, run_dir)
    task.prepare()                                   # read, learn the vocabularies, encode
    model, policy, reason = task.create_model()
    dataset = task.train_dataset(start_step=0)       # the engine pulls from this
    task.predict_texts(["In the beginning was the Word"], model, predict)   # beam search, after training

Pieces: WordPiece, cased (BLEU is case-sensitive), one vocabulary for both sides by
default (`data.shared_vocabulary`; else `vocab-source.txt` and `vocab-target.txt`), saved
in the run folder. The target is `[CLS]` (the start piece) + pieces + `[SEP]` (the end
piece): the decoder reads it without its last piece and learns to write it without its
first. Each side keeps at most `data.max_length` pieces (the target's two marks
included; a cut target still ends with the end piece); cut pairs are counted in the log.

Batches: a pair's length is its longer side's; both sides are padded to their bucket's
length, so there is one shape a bucket. With `data.tokens_per_batch` a bucket's batches
hold as many rows as fit that many padded tokens (short sentences in big batches).

Loss: label-smoothed cross-entropy in float32 over real target pieces, summed, with their
count (the engine divides by the global count): (1 - e) * -log p(gold) + e * mean over the
vocabulary of -log p.

Evaluation does not use the engine's teacher-forced `predict`: it decodes with the model's
cached decoder (`tasks/translation/decoding.py`). During training, dev is decoded greedily on its
first `decode.dev_sentences` pairs; the final test decodes every pair with beam search
and with greedy search and writes the beam output to `predictions-test.tsv`. Under a
distribution strategy the search runs outside the replicas, on the model's first copy of
the weights; every worker of a multi-worker run decodes the same sentences.
"""

import logging
import math

import numpy as np

from amptrain.data.batching import round_up
from amptrain.data.parallel import read_parallel
from amptrain.data.vocabulary import CLS, NUL_AS_SPACE, PAD_ID, SEP, UNK, WordPiece
from amptrain.errors import UserError
from amptrain.tasks.base import Split
from amptrain.tasks.text import VOCABULARY_FILE, TextTask, token_counts
from amptrain.tasks.translation.bleu import corpus_scores
from amptrain.tasks.translation.detokenize import detokenize, until_end
from amptrain.tasks.translation.serving import TranslatorModule
from amptrain.tasks.translation.settings import DecodeConfig, TranslationData, TranslationModel, TranslationTrain

logger = logging.getLogger("amptrain")

START, END = CLS, SEP
SOURCE_VOCABULARY_FILE, TARGET_VOCABULARY_FILE = "vocab-source.txt", "vocab-target.txt"


def pair_split(name, path, pairs, source_ids, target_ids, max_length, start_id, end_id):
    """A split of pairs: `source_ids` (cut to `max_length`) and `target_ids` (start mark,
    pieces, end mark: `max_length` in all). A pair's length is its longer side's as the
    model sees it (the decoder reads and writes one piece fewer than the marked target)."""
    sources = [ids[:max_length] for ids in source_ids]
    targets = [np.concatenate([[start_id], ids[: max_length - 2], [end_id]]).astype(np.int32) for ids in target_ids]
    truncated = int(sum(len(s) > max_length or len(t) > max_length - 2 for s, t in zip(source_ids, target_ids)))
    lengths = np.array([max(len(s), len(t) - 1) for s, t in zip(sources, targets)])
    return Split(name, path, pairs, {"source_ids": sources, "target_ids": targets}, lengths, truncated)


class TranslationTask(TextTask):
    primary_metric = "bleu"
    default_lowercase = False  # BLEU is case-sensitive
    predictions_suffix = ".tsv"
    keeps_blank_lines = True  # `predict --input`: a blank line translates to a blank line
    printed_field = "translation"  # `predict` prints the translation alone (--json: the record)
    # tsv: `source<TAB>target` a line; parallel: data.train (source) and data.train_target
    # (target), aligned line by line; auto: parallel when data.train_target is set
    formats = ("auto", "tsv", "parallel")
    config_sections = {
        "decode": DecodeConfig,
        "data": TranslationData,
        "model": TranslationModel,
        "train": TranslationTrain,
    }
    untrained_sections = ("decode",)  # how a run decodes does not change what it trains
    serving_module = TranslatorModule

    @classmethod
    def check_config(cls, config):
        from amptrain.config import require

        d = config.data
        super().check_config(config)
        for split in ("train", "dev", "test"):
            target, source = getattr(d, f"{split}_target"), getattr(d, split)
            if d.format == "parallel" or target:
                require(
                    bool(target) == bool(source),
                    f"data.{split}_target",
                    f"the target side of data.{split} ({source or 'not set'})",
                    target,
                )
        m, t = config.model, config.train
        require(
            m.num_decoder_layers >= 0,
            "model.num_decoder_layers",
            "an integer >= 0 (0: model.num_layers)",
            m.num_decoder_layers,
        )
        require(0 <= t.label_smoothing < 1, "train.label_smoothing", "a number in [0, 1)", t.label_smoothing)
        c = config.decode
        require(c.beam_size >= 1, "decode.beam_size", "an integer >= 1 (1: greedy)", c.beam_size)
        require(0 <= c.length_penalty < math.inf, "decode.length_penalty", "a finite number >= 0", c.length_penalty)
        require(c.max_length >= 0, "decode.max_length", "an integer >= 0 (0: data.max_length)", c.max_length)
        require(c.dev_sentences >= 0, "decode.dev_sentences", "an integer >= 0 (0: all)", c.dev_sentences)
        require(c.batch_size >= 1, "decode.batch_size", "an integer >= 1", c.batch_size)

    def __init__(self, config, run_dir):
        super().__init__(config, run_dir)
        self._searches = {}  # (model, beam size) -> its compiled search

    # === Data ===

    def prepare(self, split_names=("train", "dev", "test")):
        d = self.config.data
        wanted, _ = self._wanted_splits(split_names)
        # config.validate has checked that a split's target file is set when the format needs it.
        paths = {"train": (d.train, d.train_target), "dev": (d.dev, d.dev_target), "test": (d.test, d.test_target)}
        pairs = {name: read_parallel(*paths[name]) for name in wanted}
        self._make_tokenizers(pairs.get("train"))
        first = self._add_splits(
            {name: self._encode(name, paths[name][0], pairs[name]) for name in split_names if name in pairs}
        )
        if first is None:
            return
        sizes = (
            f"vocabulary {self.source_tokenizer.size} shared"
            if d.shared_vocabulary
            else f"vocabularies {self.source_tokenizer.size} source, {self.target_tokenizer.size} target"
        )
        logger.info(
            f"data: {len(first)} {first.name} pairs, {sizes}, {first.truncated} cut to {d.max_length} pieces, "
            f"bucket lengths {self.boundaries}"
            + (
                f", batches of {d.tokens_per_batch} padded tokens ({self.batch_rows()} rows a bucket)"
                if d.tokens_per_batch
                else ""
            )
        )

    def _learned_files(self):
        return (
            [VOCABULARY_FILE]
            if self.config.data.shared_vocabulary
            else [SOURCE_VOCABULARY_FILE, TARGET_VOCABULARY_FILE]
        )

    def projections(self, model):
        """Both sides' token embeddings (one table when the vocabulary is shared)."""
        if model.target_embedding is model.source_embedding:
            return [("tokens", model.source_embedding.embeddings, self.source_tokenizer.vocabulary, None)]
        return [
            ("source", model.source_embedding.embeddings, self.source_tokenizer.vocabulary, None),
            ("target", model.target_embedding.embeddings, self.target_tokenizer.vocabulary, None),
        ]

    def _make_tokenizers(self, train_pairs):
        d = self.config.data
        if d.shared_vocabulary:
            texts = None if train_pairs is None else [p.source for p in train_pairs] + [p.target for p in train_pairs]
            self.source_tokenizer = self.target_tokenizer = WordPiece.shared(
                self._load_or_make_vocabulary(texts), self.lowercase
            )
            return
        if d.vocabulary:
            raise UserError(
                "data.vocabulary names one vocabulary for both sides; set data.shared_vocabulary = true, "
                "or leave data.vocabulary empty to learn one a side"
            )
        # data.vocabulary is empty here, so each side is the run folder's or one trained on that side.
        self.source_tokenizer, self.target_tokenizer = (
            WordPiece.shared(
                self._load_or_make_vocabulary(
                    None if train_pairs is None else [getattr(p, side) for p in train_pairs], name
                ),
                self.lowercase,
            )
            for name, side in ((SOURCE_VOCABULARY_FILE, "source"), (TARGET_VOCABULARY_FILE, "target"))
        )

    def _encode(self, name, path, pairs):
        return pair_split(
            name,
            path,
            pairs,
            self.source_tokenizer.encode([p.source for p in pairs]),
            self.target_tokenizer.encode([p.target for p in pairs]),
            self.config.data.max_length,
            self.start_id,
            self.end_id,
        )

    @property
    def start_id(self):
        return self.target_tokenizer.token_id(START)

    @property
    def end_id(self):
        return self.target_tokenizer.token_id(END)

    def batch_builder(self, split):
        source_ids, target_ids = split.encoded["source_ids"], split.encoded["target_ids"]

        def build(indices, length):
            batch = len(indices)
            source = np.full((batch, length), PAD_ID, np.int32)
            decoder_in = np.full((batch, length), PAD_ID, np.int32)
            labels = np.full((batch, length), PAD_ID, np.int32)
            for row, index in enumerate(indices):
                if index >= 0:
                    source[row, : len(source_ids[index])] = source_ids[index]
                    target = target_ids[index]
                    decoder_in[row, : len(target) - 1] = target[:-1]  # start, pieces
                    labels[row, : len(target) - 1] = target[1:]  # pieces, end
            weights = (labels != PAD_ID).astype(np.float32)
            source_mask, target_mask = source != PAD_ID, decoder_in != PAD_ID
            counts = token_counts(source_mask) + token_counts(target_mask)
            features = {
                "source_ids": source,
                "source_mask": source_mask,
                "target_ids": decoder_in,
                "target_mask": target_mask,
            }
            return features, {"labels": labels, "weights": weights}, counts

        return build

    def signature(self):
        import tensorflow as tf

        ids, mask = tf.TensorSpec((None, None), tf.int32), tf.TensorSpec((None, None), tf.bool)
        return (
            {"source_ids": ids, "source_mask": mask, "target_ids": ids, "target_mask": mask},
            {"labels": ids, "weights": tf.TensorSpec((None, None), tf.float32)},
            tf.TensorSpec((None, 2), tf.int32),
        )

    # === Model and loss ===

    def build_model(self, dtype):
        from amptrain.tasks.translation.model import Translator

        d = self.config.data
        return Translator(
            self.source_tokenizer.size,
            self.target_tokenizer.size,
            round_up(d.max_length),
            self.config.model,
            dtype,
            shared_embedding=d.shared_vocabulary,
        ).build_all()

    def loss(self, targets, logits):
        """Label-smoothed cross-entropy (`train.label_smoothing`) over the real target pieces,
        summed, and their count."""
        from amptrain.models.losses import smoothed_cross_entropy

        return smoothed_cross_entropy(targets["labels"], logits, targets["weights"], self.config.train.label_smoothing)

    # === Decoding, evaluation and prediction ===

    def _search(self, model, beam_size):
        from amptrain.tasks.translation.decoding import Search

        key = (id(model), beam_size)
        if key not in self._searches:
            c = self.config.decode
            max_length = min(c.max_length or self.config.data.max_length, model.max_length)
            self._searches[key] = Search(
                model,
                max_length,
                self.start_id,
                self.end_id,
                beam_size,
                c.length_penalty,
                jit_compile=self.config.runtime.jit_compile is True,  # not under "fusible"
                banned_ids=(PAD_ID, self.start_id),
            )
        return self._searches[key]

    def translate_ids(self, model, source_ids, beam_size):
        """Output pieces (without the marks) of each source, in order.

        Sentences are decoded `decode.batch_size` at a time, grouped by their length
        rounded up to a multiple of 16; a group's last batch is filled with copies of its
        first sentence. So there are a few shapes to compile, and they do not depend on
        which split or text is decoded: a sentence translates the same in the run's
        evaluation, in `eval` and in `predict` (in half precision the padded shape can tip
        a close choice between two pieces)."""
        search = self._search(model, beam_size)
        size = self.config.decode.batch_size
        top = round_up(self.config.data.max_length)
        padded = np.array([min(round_up(max(len(ids), 1), 16), top) for ids in source_ids], np.int64)
        outputs = [None] * len(source_ids)
        for length in sorted(set(padded)):
            members = np.flatnonzero(padded == length)
            for start in range(0, len(members), size):
                chunk = members[start : start + size]
                rows = np.concatenate([chunk, np.full(size - len(chunk), chunk[0])])
                ids = np.full((len(rows), length), PAD_ID, np.int32)
                for row, index in enumerate(rows):
                    ids[row, : len(source_ids[index][:length])] = source_ids[index][:length]
                ids[:, 0] = np.where(
                    ids[:, 0] == PAD_ID, self.source_tokenizer.token_id(UNK), ids[:, 0]
                )  # an empty source
                pieces = search(ids, ids != PAD_ID)
                for row, index in enumerate(chunk):
                    outputs[index] = until_end(pieces[row], self.end_id)
        return outputs

    def translate(self, model, source_ids, beam_size):
        return [self.detokenize(ids) for ids in self.translate_ids(model, source_ids, beam_size)]

    def detokenize(self, ids):
        return detokenize([self.target_tokenizer.vocabulary[i] for i in ids])

    def evaluate(self, split_name, model, predict, predictions_path=None, quick=False):
        """BLEU and chrF of the model's output, decoded with `model` (not the teacher-forced
        `predict`). `quick` (between training steps): greedy, on the first
        `decode.dev_sentences` pairs. Else every pair,
        beam search (`bleu`, `chrf`) and greedy (`bleu_greedy`, `chrf_greedy`), the beam output
        written to the predictions file when a path is given."""
        import time

        split = self.splits[split_name]
        count = len(split)
        if quick and self.config.decode.dev_sentences:
            count = min(count, self.config.decode.dev_sentences)
        sources, references = split.encoded["source_ids"][:count], [p.target for p in split.examples[:count]]
        metrics = {}
        beams = [1] if quick else [self.config.decode.beam_size, 1]
        for beam_size in dict.fromkeys(beams):
            started = time.time()
            hypotheses = self.translate(model, sources, beam_size)
            elapsed = time.time() - started
            scores = corpus_scores(hypotheses, references)
            suffix = "" if beam_size == beams[0] else "_greedy"
            metrics.update(
                {
                    f"bleu{suffix}": scores["bleu"],
                    f"chrf{suffix}": scores["chrf"],
                    f"sentences_per_second{suffix}": count / max(elapsed, 1e-9),
                }
            )
            if beam_size == beams[0] and predictions_path is not None:
                write_predictions(predictions_path + self.predictions_suffix, split.examples, hypotheses)
        if not quick and len(set(beams)) == 1:  # beam_size 1: greedy is the beam output
            metrics.update({"bleu_greedy": metrics["bleu"], "chrf_greedy": metrics["chrf"]})
        metrics.update({"sentences": count, "beam_size": beams[0]})
        return metrics

    def add_split(self, name, path):
        """Reads and encodes another parallel file (`amptrain eval --data`)."""
        self._add_own_split(self._encode(name, path, read_parallel(path)))

    def predict_texts(self, texts, model, predict):
        """The beam-search translation of each text (a blank text translates to "")."""
        texts = list(texts)
        present = [i for i, t in enumerate(texts) if t.translate(NUL_AS_SPACE).strip()]
        sources = [
            ids[: self.config.data.max_length] for ids in self.source_tokenizer.encode([texts[i] for i in present])
        ]
        translations = [""] * len(texts)
        for i, translation in zip(
            present, self.translate(model, sources, self.config.decode.beam_size) if present else []
        ):
            translations[i] = translation
        return [{"text": text, "translation": translation} for text, translation in zip(texts, translations)]


def write_predictions(path, pairs, hypotheses):
    """`source<TAB>reference<TAB>hypothesis`, one line a pair, in file order."""
    with open(path, "w", encoding="utf-8") as f:
        for pair, hypothesis in zip(pairs, hypotheses):
            f.write(f"{pair.source}\t{pair.target}\t{_one_line(hypothesis)}\n")


def _one_line(text):
    return " ".join(text.replace("\t", " ").split())
