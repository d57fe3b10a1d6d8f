"""The tiny random causal language models (GPT-2, Llama 3, Qwen2, Gemma), made with
`transformers` in its own environment (make_reference.py says how; never an amptrain
dependency):

    /tmp/hf/bin/python tests/pretrained/make_causal.py

Each folder is what `save_pretrained` writes for a model of hidden 16, 2 layers, randomly
initialised (seed 0, a large initializer range so that greedy choices are clear), and its
tokenizer, trained here on the first CORPUS_LINES lines of the bundled King James Bible
and spam texts, made as each family's real one is:
- tiny-gpt2/: byte-level BPE (vocab.json, merges.txt, tokenizer.json), `<|endoftext|>` last,
  no start piece, tied embeddings, learned positions;
- tiny-llama3/: byte-level BPE in one tokenizer.json with Llama 3's split (digits in threes),
  `<|begin_of_text|>` added before a text, `<|end_of_text|>` its end; 2 query heads sharing
  1 key-value head; the llama3 RoPE scaling; untied output layer;
- tiny-qwen2/: byte-level BPE with Qwen2's split (one digit a piece), `<|endoftext|>`, no
  start piece; attention biases; tied embeddings;
- tiny-gemma/: a SentencePiece BPE (tokenizer.model: byte fallback, digits split, no dummy
  prefix, `<pad>` 0, `<eos>` 1, `<bos>` 2, `<unk>` 3, `<mask>` 4) and the tokenizer.json transformers
  makes of it; embeddings scaled by sqrt(hidden), tied.
reference-tiny-<family>.json holds, for each of TEXTS, `transformers`' ids (with its special
tokens), the float32 logits of every position for the first COLUMNS pieces and of the last
position for all, and the greedy continuation of `generate(max_new_tokens=20, do_sample=False)`
(ids and text, special tokens skipped), with the smallest margin between the two most likely
pieces along it (a tie would make a token-for-token comparison meaningless).
"""

import json
import os

import sentencepiece as spm
import torch
from make_families import folder
from make_reference import HERE, ROOT
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GemmaConfig,
    GemmaForCausalLM,
    GemmaTokenizer,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

CORPUS_LINES = 400
VOCABULARY = 400
COLUMNS = 32
NEW_TOKENS = 20
TEXTS = [
    "In the beginning God created the heaven and the earth.",
    "Call 08712460324 now to WIN £1000 cash!!!   Reply STOP",
    "Café déjà vu: naïve résumé at 9:30am 🙂",
    "And God said,\n\tLet there be light:   and there was light.",
]
WORDS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+"
REST = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
LLAMA3_SPLIT = WORDS + r"|\p{N}{1,3}" + REST  # digits in threes
QWEN2_SPLIT = WORDS + r"|\p{N}" + REST  # one digit a piece
SMALL = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "initializer_range": 0.4}
HEADS = {"num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 128}


def corpus():
    with open(os.path.join(ROOT, "data", "lm-kjv", "train.txt"), encoding="utf-8") as f:
        lines = [line.rstrip("\n") for _, line in zip(range(CORPUS_LINES), f)]
    with open(os.path.join(ROOT, "data", "classify-spam", "train.csv"), encoding="utf-8") as f:
        lines += [line.rstrip("\n") for _, line in zip(range(CORPUS_LINES), f)]
    return lines


def byte_level_bpe(split, specials):
    """A byte-level BPE trained on the corpus: `split` (a regex) isolates the words, as the
    family's real tokenizer.json does (None: GPT-2's own pattern), `specials` after the pieces."""
    bpe = Tokenizer(models.BPE())
    if split is None:
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        bpe.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCABULARY - len(specials), initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    bpe.train_from_iterator(corpus(), trainer)
    bpe.add_special_tokens(specials)
    return bpe


def make_gpt2():
    path = folder("tiny-gpt2")
    bpe = byte_level_bpe(None, ["<|endoftext|>"])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    tokenizer.save_pretrained(path)
    bpe.model.save(path)  # vocab.json and merges.txt, as GPT-2's folders also carry
    config = GPT2Config(
        vocab_size=len(tokenizer), n_positions=128, n_embd=16, n_layer=2, n_head=2, initializer_range=0.4,
        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    GPT2LMHeadModel(config).save_pretrained(path)
    return path


def make_llama3():
    path = folder("tiny-llama3")
    bpe = byte_level_bpe(LLAMA3_SPLIT, ["<|begin_of_text|>", "<|end_of_text|>"])
    bpe.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bpe.token_to_id("<|begin_of_text|>"))]
    )
    ends = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, **ends)
    tokenizer.save_pretrained(path)
    scaling = {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    }  # fmt: skip
    config = LlamaConfig(
        vocab_size=len(tokenizer), rope_theta=500000.0, rope_scaling=scaling, tie_word_embeddings=False,
        rms_norm_eps=1e-5, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **SMALL, **HEADS,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def make_qwen2():
    path = folder("tiny-qwen2")
    bpe = byte_level_bpe(QWEN2_SPLIT, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tokenizer.save_pretrained(path)
    bpe.model.save(path)
    config = Qwen2Config(
        vocab_size=len(tokenizer), rope_theta=1000000.0, tie_word_embeddings=True, rms_norm_eps=1e-6,
        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id, **SMALL, **HEADS,
    )  # fmt: skip
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path


def make_gemma():
    path = folder("tiny-gemma")
    prefix = os.path.join(path, "tokenizer")
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus()), model_prefix=prefix, vocab_size=VOCABULARY + 200, model_type="bpe",
        pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>",
        unk_piece="<unk>", user_defined_symbols=["<mask>"], byte_fallback=True, split_digits=True,
        add_dummy_prefix=False,
        remove_extra_whitespaces=False, allow_whitespace_only_pieces=True, normalization_rule_name="identity",
        character_coverage=0.9995, minloglevel=2,
    )  # fmt: skip
    os.remove(prefix + ".vocab")
    tokenizer = GemmaTokenizer.from_pretrained(path, add_bos_token=True)
    tokenizer.save_pretrained(path)
    forget_vocabulary_file(path)
    config = GemmaConfig(
        vocab_size=len(tokenizer), head_dim=8, hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6,
        pad_token_id=0, eos_token_id=1, bos_token_id=2, **SMALL, **HEADS,
    )  # fmt: skip
    GemmaForCausalLM(config).save_pretrained(path)
    return path


def forget_vocabulary_file(path):
    """tokenizer_config.json without the absolute path of the file it was read from."""
    config_path = os.path.join(path, "tokenizer_config.json")
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    config.pop("vocab_file", None)
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)


def reference(path):
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    records = []
    for text in TEXTS:
        encoded = tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            logits = model(**encoded).logits[0]
            out = model.generate(**encoded, max_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                                 return_dict_in_generate=True, pad_token_id=tokenizer.eos_token_id)  # fmt: skip
        new = out.sequences[0, encoded["input_ids"].shape[1] :].tolist()
        margins = [float(step[0].topk(2).values[0] - step[0].topk(2).values[1]) for step in out.logits]
        records.append(
            {
                "text": text,
                "ids": encoded["input_ids"][0].tolist(),
                "logits_first_columns": logits[:, :COLUMNS].tolist(),
                "logits_last": logits[-1].tolist(),
                "generated_ids": new,
                "generated": tokenizer.decode(new, skip_special_tokens=True),
                "smallest_margin": min(margins),
            }
        )
    return {"made_by": "tests/pretrained/make_causal.py", "torch": torch.__version__, "texts": records}


def main():
    for make in (make_gpt2, make_llama3, make_qwen2, make_gemma):
        torch.manual_seed(0)
        path = make()
        name = os.path.basename(path)
        result = reference(path)
        with open(os.path.join(HERE, f"reference-{name}.json"), "w", encoding="utf-8") as f:
            json.dump(result, f)
        print(name, sorted(os.listdir(path)), "margin", min(r["smallest_margin"] for r in result["texts"]))
        for record in result["texts"]:
            print("  ", record["ids"][:12], repr(record["generated"][:60]))


if __name__ == "__main__":
    main()
