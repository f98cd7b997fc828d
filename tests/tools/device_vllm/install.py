# Unpack the payload stashed in ACC (default /tmp/acc: the chunk pieces of build_chunks.sh and SHA256SUMS) into SITE
# (default /tmp/site). Every dense piece must be there with its sum, else nothing is unpacked (exit 2, saying which
# pieces are missing: carry those chunks). The MoE kernels are unpacked when all of their pieces are there.
#   python3 install.py [ACC] [SITE]
import hashlib
import lzma
import os
import shutil
import sys
import tarfile
import time

ACC = sys.argv[1] if len(sys.argv) > 1 else "/tmp/acc"
SITE = sys.argv[2] if len(sys.argv) > 2 else "/tmp/site"
t0 = time.time()
sums, pieces = {}, {"c": [], "m": []}
with open(os.path.join(ACC, "SHA256SUMS"), encoding="utf-8") as fh:
    for line in fh:
        digest, name = line.split()
        sums[os.path.basename(name)] = digest
        if name.startswith("./"):
            pieces[os.path.basename(name)[0]].append(os.path.basename(name))


def sha(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def complete(kind: str) -> list:
    bad = [p for p in sorted(pieces[kind]) if not os.path.exists(os.path.join(ACC, p)) or sha(os.path.join(ACC, p)) != sums[p]]
    return bad


def join(kind: str, target: str) -> None:
    with open(target, "wb") as out:
        for p in sorted(pieces[kind]):
            with open(os.path.join(ACC, p), "rb") as fh:
                shutil.copyfileobj(fh, out, 1 << 24)
            os.unlink(os.path.join(ACC, p))
    assert sha(target) == sums[os.path.basename(target)], f"{target}: sum differs after joining"


missing = complete("c")
if missing:
    print("payload incomplete, pieces missing or damaged:", " ".join(missing), "(carry their chunk folders)")
    sys.exit(2)
join("c", os.path.join(ACC, "dense.tar"))
os.makedirs(SITE, exist_ok=True)
with tarfile.open(os.path.join(ACC, "dense.tar")) as tf:
    tf.extractall(ACC)
os.unlink(os.path.join(ACC, "dense.tar"))
with tarfile.open(os.path.join(ACC, "rest.tar.xz"), "r:xz") as tf:
    tf.extractall(SITE)
for packed, target in (("C.so.xz", "vllm/_C_stable_libtorch.abi3.so"), ("fa3.so.xz", "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so")):
    with lzma.open(os.path.join(ACC, packed)) as fh, open(os.path.join(SITE, target), "wb") as out:
        shutil.copyfileobj(fh, out, 1 << 24)
    os.unlink(os.path.join(ACC, packed))
print("dense payload in %s (%.1f s)" % (SITE, time.time() - t0))
if pieces["m"] and not complete("m"):
    join("m", os.path.join(ACC, "moe.so.xz"))
    with lzma.open(os.path.join(ACC, "moe.so.xz")) as fh, open(os.path.join(SITE, "vllm/_moe_C_stable_libtorch.abi3.so"), "wb") as out:
        shutil.copyfileobj(fh, out, 1 << 24)
    print("MoE kernels unpacked (%.1f s)" % (time.time() - t0))
else:
    print("MoE kernels not carried: dense models only")
