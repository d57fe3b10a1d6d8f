"""GGUF files, llama.cpp's format, read (every count and offset checked) and written as the
model folders amptrain loads: `reader.py` (header, tensor table, dequantization),
`vocabulary.py` (the byte-level BPE tokenizer of the metadata), `folder.py` (a Llama's
`transformers` folder, and a per-user cache of the conversion for `model.pretrained = "x.gguf"`).

No TensorFlow: the config checks a pretrained folder before anything is built, and a `.gguf`
there is converted at that point.
"""
