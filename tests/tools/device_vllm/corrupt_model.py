# A deliberately corrupted copy of a safetensors model: every 2-D weight of one decoder layer scaled by a factor, the
# rest hard-linked (no copy of the other shards). What a bit-rotted or mis-converted checkpoint looks like to the
# server: same config, same tokenizer, same file names and sizes, different outputs.
#   python3 corrupt_model.py SRC DST [LAYER] [FACTOR]     (default layer 14, factor 2.0)
# DST gets a corrupt.json naming the scaled tensors. The output-equivalence check must call a server of DST
# (swapped in at SRC's path, so that the reference's model identity matches) `diverged`.
import json
import os
import sys

from safetensors import safe_open
from safetensors.torch import save_file


def main() -> int:
    src, dst = sys.argv[1], sys.argv[2]
    layer = int(sys.argv[3]) if len(sys.argv) > 3 else 14
    factor = float(sys.argv[4]) if len(sys.argv) > 4 else 2.0
    prefix = f"model.layers.{layer}."
    os.makedirs(dst, exist_ok=True)
    scaled: list[str] = []
    for name in sorted(os.listdir(src)):
        path, target = os.path.join(src, name), os.path.join(dst, name)
        if os.path.exists(target):
            os.unlink(target)
        hit = False
        if name.endswith(".safetensors"):
            with safe_open(path, "pt") as fh:
                hit = any(k.startswith(prefix) for k in fh.keys())
                if hit:
                    meta = fh.metadata()
                    tensors = {}
                    for k in fh.keys():
                        t = fh.get_tensor(k)
                        if k.startswith(prefix) and t.dim() == 2:
                            t = (t.float() * factor).to(t.dtype)
                            scaled.append(k)
                        tensors[k] = t
        if hit:
            save_file(tensors, target, metadata=meta)
        else:
            os.link(path, target)
    if not scaled:
        sys.exit(f"no 2-D tensor starts with {prefix!r} in {src}: nothing corrupted")
    doc = {"source": src, "layer": layer, "factor": factor, "scaled": scaled}
    with open(os.path.join(dst, "corrupt.json"), "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1)
    print("corrupted", json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
