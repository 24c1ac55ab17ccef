#!/usr/bin/python3
"""Generate tests/engine/hash_vectors.txt: golden vectors for engine/hash.c.

The vectors are computed INDEPENDENTLY of the C code, with Debian's
python3-xxhash (xxhash.xxh3_64_intdigest, libxxhash 0.8.1) and struct packing,
from the rules in index-semantics.md section 1:

    content hash = XXH3-64(tokens as LE u32, seed)
    seed         = 1337 (+ XXH3-64(lora, 0) if lora non-empty)
                        (+ XXH3-64(salt, 1) if salt non-empty), mod 2^64
    seq[0]       = content[0]
    seq[i]       = XXH3-64(le_u64(seq[i-1]) || le_u64(content[i]), 1337)
    eagle        = windows of B+1 tokens, stride B
    multimodal   = XXH3-64(tokens as LE u32 || sorted(mm) as LE u64, seed)

Run:  /usr/bin/python3 tests/engine/gen_hash_vectors.py
(writes hash_vectors.txt next to this script; the output is deterministic).

Output format (documented again at the top of the generated file)
------------------------------------------------------------------
One vector per line, fields separated by a single space; lines starting with
'#' and blank lines are ignored. Hash and seed fields are exactly 16 lowercase
hex digits (a u64, no "0x"). Token ids are decimal u32. Lists are
comma-separated with no spaces; "-" stands for an empty list / empty string.

  seed   <seed> <lora> <salt>          kvi_hash_seed(lora, salt) == seed;
                                       lora and salt are the raw bytes
                                       hex-encoded (2 digits per byte)
  block  <seed> <hash> <tokens>        kvi_hash_block(tokens, n, seed) == hash
  blocks <seed> <B> <tokens> <hashes>  kvi_hash_blocks(tokens, n, B, seed)
                                       returns len(hashes) and writes hashes
  eagle  <seed> <B> <tokens> <hashes>  kvi_hash_blocks_eagle(...) likewise
  mm     <seed> <hash> <tokens> <mm>   kvi_hash_block_mm(tokens, n, mm, n_mm,
                                       seed) == hash; mm is listed in the
                                       (unsorted) order passed to the function
  next   <prev> <content> <hash>       kvi_seq_hash_next(prev, content) == hash
  seq    <content> <seqs>              kvi_seq_hashes(content, n) == seqs
"""

import os
import struct
import sys

import xxhash

M64 = 1 << 64
SEED = 1337
RNG_SEED = 0x6B76696478  # "kvidx": fixed, so the output is reproducible


def xxh3(data: bytes, seed: int) -> int:
    return xxhash.xxh3_64_intdigest(data, seed)


def le_u32s(tokens) -> bytes:
    return struct.pack("<%dI" % len(tokens), *tokens)


def le_u64s(values) -> bytes:
    return struct.pack("<%dQ" % len(values), *values)


def lora_salt_seed(lora: bytes, salt: bytes) -> int:
    s = SEED
    if lora:
        s += xxh3(lora, 0)
    if salt:
        s += xxh3(salt, 1)
    return s % M64


def content_hash(tokens, seed: int) -> int:
    return xxh3(le_u32s(tokens), seed)


def blocks(tokens, b: int, seed: int):
    if b == 0:
        return []
    return [content_hash(tokens[i * b:(i + 1) * b], seed) for i in range(len(tokens) // b)]


def eagle(tokens, b: int, seed: int):
    if b == 0 or len(tokens) < b + 1:
        return []
    return [content_hash(tokens[i * b:i * b + b + 1], seed) for i in range((len(tokens) - 1) // b)]


def mm_hash(tokens, mm, seed: int) -> int:
    return xxh3(le_u32s(tokens) + le_u64s(sorted(mm)), seed)


def seq_next(prev: int, content: int) -> int:
    return xxh3(le_u64s([prev, content]), SEED)


def seq_hashes(content):
    out = []
    for i, c in enumerate(content):
        out.append(c if i == 0 else seq_next(out[-1], c))
    return out


class SplitMix64:
    """Tiny deterministic PRNG (independent of Python's random module)."""

    def __init__(self, seed: int):
        self.s = seed % M64

    def u64(self) -> int:
        self.s = (self.s + 0x9E3779B97F4A7C15) % M64
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % M64
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        return self.u64() % n

    def shuffle(self, xs):
        for i in range(len(xs) - 1, 0, -1):
            j = self.below(i + 1)
            xs[i], xs[j] = xs[j], xs[i]


EDGE_TOKENS = [0, 1, 2, 0x7FFFFFFF, 0x80000000, 0x80000001, 0xDEADBEEF, 0xFFFFFFFE, 0xFFFFFFFF]


def gen_tokens(rng: SplitMix64, n: int, mode: str):
    """mode: 'vocab' (ids < 152064), 'full' (any u32), 'mixed' (edge values,
    always containing 0 and an id >= 2^31 when n >= 2)."""
    if mode == "vocab":
        return [rng.below(152064) for _ in range(n)]
    if mode == "full":
        return [rng.u64() & 0xFFFFFFFF for _ in range(n)]
    toks = []
    for _ in range(n):
        r = rng.below(3)
        if r == 0:
            toks.append(EDGE_TOKENS[rng.below(len(EDGE_TOKENS))])
        elif r == 1:
            toks.append(rng.below(152064))
        else:
            toks.append(rng.u64() & 0xFFFFFFFF)
    if n >= 2:
        z = rng.below(n)
        toks[z] = 0
        toks[(z + 1 + rng.below(n - 1)) % n] = 0x80000000 | (rng.u64() & 0x7FFFFFFF)
    return toks


def hx(v: int) -> str:
    assert 0 <= v < M64
    return "%016x" % v


def tl(tokens) -> str:
    return ",".join(str(t) for t in tokens) if tokens else "-"


def hl(values) -> str:
    return ",".join(hx(v) for v in values) if values else "-"


def label(b: bytes) -> str:
    """Readable (possibly shortened) rendering of a name for a comment line."""
    t = b.decode("utf-8")
    return repr(t if len(t) <= 40 else "%s... (%d bytes)" % (t[:24], len(b)))


def bx(b: bytes) -> str:
    return b.hex() if b else "-"


HEADER = """\
# kvidx hash golden vectors. GENERATED by gen_hash_vectors.py (python3-xxhash,
# libxxhash 0.8.1) independently of engine/hash.c; do not edit by hand.
#
# One vector per line, fields separated by a single space; '#' lines and blank
# lines are ignored. Hash/seed fields: exactly 16 lowercase hex digits (u64,
# no 0x). Token ids: decimal u32. Lists: comma-separated, no spaces; "-" is an
# empty list / empty string.
#
#   seed   <seed> <lora> <salt>          kvi_hash_seed(lora, salt) == seed;
#                                        lora/salt = raw bytes, hex-encoded
#   block  <seed> <hash> <tokens>        kvi_hash_block(tokens, n, seed) == hash
#   blocks <seed> <B> <tokens> <hashes>  kvi_hash_blocks(tokens, n, B, seed)
#                                        returns len(hashes), writes hashes
#   eagle  <seed> <B> <tokens> <hashes>  kvi_hash_blocks_eagle(...) likewise
#   mm     <seed> <hash> <tokens> <mm>   kvi_hash_block_mm(tokens, n, mm, n_mm,
#                                        seed) == hash (mm listed unsorted)
#   next   <prev> <content> <hash>       kvi_seq_hash_next(prev, content) == hash
#   seq    <content> <seqs>              kvi_seq_hashes(content, n) == seqs
#
# Rules: content = XXH3-64(tokens as LE u32, seed); seed = 1337
# + XXH3-64(lora, 0) [if lora non-empty] + XXH3-64(salt, 1) [if salt non-empty]
# mod 2^64; seq[0] = content[0], seq[i] = XXH3-64(le_u64(seq[i-1]) ||
# le_u64(content[i]), 1337); eagle windows B+1 tokens, stride B; multimodal =
# XXH3-64(tokens as LE u32 || sorted(mm) as LE u64, seed).
"""

# Document vectors (index-semantics.md 1.2 / 1.3): the generator refuses to run
# if python3-xxhash does not reproduce them.
DOC_CHECKS = [
    (lambda: content_hash([0, 1, 2, 3], SEED), 0x7EE2CBEDC694AB46),
    (lambda: content_hash(list(range(1, 17)), SEED), 0xEA06FC71A5EE6E88),
    (lambda: content_hash(list(range(17, 33)), SEED), 0x1FBF39BD106BE0B5),
    (lambda: xxh3(b"my-lora", 0), 0xB2041CC45CBCF9A4),
    (lambda: lora_salt_seed(b"my-lora", b""), 0xB2041CC45CBCFEDD),
    (lambda: content_hash(list(range(1, 17)), lora_salt_seed(b"my-lora", b"")), 0x3990F1B14309D7E6),
    (lambda: content_hash([10, 11, 12], SEED), 0x52B31CBFA97A7586),
    (lambda: content_hash([12, 13, 14], SEED), 0xC125DBEC4FA7EFDC),
    (lambda: seq_hashes(blocks(list(range(1, 33)), 16, SEED))[1], 0xAD01835A37DD294C),
]

LORAS = [
    b"my-lora",
    b"adapter-a",
    b"adapter-b",
    b"a",
    b"sql-lora",
    "f\u00fcr-lora-\u00e9t\u00e9".encode("utf-8"),          # Latin-1 range, 2-byte UTF-8
    "\u9002\u914d\u5668-\u4e2d\u6587".encode("utf-8"),       # CJK, 3-byte UTF-8
    "\U0001F680-rocket-lora".encode("utf-8"),                # 4-byte UTF-8
    "\u0430\u0434\u0430\u043f\u0442\u0435\u0440".encode("utf-8"),  # Cyrillic
    b"org/model-lora:v2 with spaces",
    b"x" * 300,                                             # > 240 bytes: XXH3 long path
]
SALTS = [
    b"tenant-42",
    b"s",
    "sel-\u00e7\u00e3o-\U0001F511".encode("utf-8"),
    b"namespace/prod" * 20,                                  # 280 bytes
]


def main() -> int:
    for i, (fn, want) in enumerate(DOC_CHECKS):
        got = fn()
        if got != want:
            sys.stderr.write("document vector %d does not reproduce: got %016x want %016x\n"
                             % (i, got, want))
            return 1

    rng = SplitMix64(RNG_SEED)
    lines = []
    counts = {}

    def emit(kind, *fields):
        lines.append(" ".join((kind,) + fields))
        counts[kind] = counts.get(kind, 0) + 1

    # --- seeds -------------------------------------------------------------
    lines.append("# --- seeds: base, LoRA-only, salt-only, LoRA+salt ---")
    seeds = [SEED]
    emit("seed", hx(SEED), "-", "-")
    lora_seeds = []
    for lora in LORAS:
        s = lora_salt_seed(lora, b"")
        lora_seeds.append(s)
        lines.append("# lora=%s" % label(lora))
        emit("seed", hx(s), bx(lora), "-")
    for salt in SALTS:
        lines.append("# salt=%s" % label(salt))
        emit("seed", hx(lora_salt_seed(b"", salt)), "-", bx(salt))
    combo_seeds = []
    for lora in LORAS[:6] + LORAS[-1:]:
        for salt in SALTS:
            s = lora_salt_seed(lora, salt)
            combo_seeds.append(s)
            lines.append("# lora=%s salt=%s" % (label(lora), label(salt)))
            emit("seed", hx(s), bx(lora), bx(salt))
    # the wrapping addition must actually be exercised
    wraps = sum(1 for lora in LORAS for salt in [b""] + SALTS
                if SEED + (xxh3(lora, 0)) + (xxh3(salt, 1) if salt else 0) >= M64)
    assert wraps > 0, "no seed vector wraps mod 2^64"
    seeds += lora_seeds[:4] + [lora_salt_seed(b"", SALTS[0]), lora_salt_seed(LORAS[5], SALTS[2])]

    # --- single blocks -----------------------------------------------------
    lines.append("# --- block: single content hashes ---")
    sizes = [1, 2, 4, 11, 16, 32, 64, 128]
    emit("block", hx(SEED), hx(content_hash([], SEED)), "-")
    emit("block", hx(lora_seeds[0]), hx(content_hash([], lora_seeds[0])), "-")
    for t in EDGE_TOKENS:
        emit("block", hx(SEED), hx(content_hash([t], SEED)), tl([t]))
    for b in sizes:
        for seed in seeds:
            for mode in ("vocab", "full", "mixed"):
                toks = gen_tokens(rng, b, mode)
                emit("block", hx(seed), hx(content_hash(toks, seed)), tl(toks))
        # every size: one block of all-zero ids and one of ids >= 2^31
        emit("block", hx(SEED), hx(content_hash([0] * b, SEED)), tl([0] * b))
        hi = [0x80000000 + i for i in range(b)]
        emit("block", hx(SEED), hx(content_hash(hi, SEED)), tl(hi))

    # --- multi-block sequences ----------------------------------------------
    lines.append("# --- blocks: full-block hashing of sequences (trailing partial ignored) ---")
    for b in sizes:
        max_blocks = 4 if b <= 32 else 2
        for nblk in range(0, max_blocks + 1):
            for extra in sorted({0, 1, b - 1}):
                n = nblk * b + extra
                if n == 0:
                    continue
                seed = seeds[rng.below(len(seeds))]
                toks = gen_tokens(rng, n, ("vocab", "full", "mixed")[rng.below(3)])
                emit("blocks", hx(seed), str(b), tl(toks), hl(blocks(toks, b, seed)))
    toks = gen_tokens(rng, 10, "mixed")
    emit("blocks", hx(SEED), "0", tl(toks), "-")  # B = 0 gives no blocks

    # --- eagle ----------------------------------------------------------------
    lines.append("# --- eagle: windows of B+1 tokens, stride B ---")
    emit("eagle", hx(SEED), "2", tl(range(6)), hl(eagle(list(range(6)), 2, SEED)))
    emit("eagle", hx(SEED), "2", tl(range(10, 15)), hl(eagle(list(range(10, 15)), 2, SEED)))
    for b in [1, 2, 4, 11, 16, 32, 64]:
        for n in sorted({b, b + 1, 2 * b, 2 * b + 1, 3 * b + 1, 3 * b + b // 2 + 1}):
            seed = seeds[rng.below(len(seeds))]
            toks = gen_tokens(rng, n, ("vocab", "full", "mixed")[rng.below(3)])
            emit("eagle", hx(seed), str(b), tl(toks), hl(eagle(toks, b, seed)))
    emit("eagle", hx(SEED), "0", tl(range(6)), "-")

    # --- multimodal -----------------------------------------------------------
    lines.append("# --- mm: token bytes then sorted multimodal hashes (listed unsorted) ---")
    for b in [1, 2, 4, 11, 16, 32, 64]:
        for n_mm in [0, 1, 2, 3, 5, 17, 40]:
            seed = seeds[rng.below(len(seeds))]
            toks = gen_tokens(rng, b, "mixed")
            mm = [rng.u64() for _ in range(n_mm)]
            if n_mm >= 3:
                mm[0] = 0
                mm[1] = M64 - 1
                mm.append(mm[2])  # a duplicate
            rng.shuffle(mm)
            emit("mm", hx(seed), hx(mm_hash(toks, mm, seed)), tl(toks), hl(mm))
    emit("mm", hx(SEED), hx(mm_hash([], [5, 3], SEED)), "-", hl([5, 3]))

    # --- rolling sequence hash ------------------------------------------------
    lines.append("# --- next: one rolling step ---")
    for prev, c in [(0, 0), (M64 - 1, M64 - 1), (0xEA06FC71A5EE6E88, 0x1FBF39BD106BE0B5),
                    (1, 2), (0x8000000000000000, 0x7FFFFFFFFFFFFFFF)]:
        emit("next", hx(prev), hx(c), hx(seq_next(prev, c)))
    for _ in range(15):
        prev, c = rng.u64(), rng.u64()
        emit("next", hx(prev), hx(c), hx(seq_next(prev, c)))

    lines.append("# --- seq: rolling chains of length 1..64 ---")
    for n in range(1, 65):
        if n % 4 == 0:
            # chain built from real content hashes of a token sequence
            b = sizes[(n // 4) % len(sizes)]
            seed = seeds[n % len(seeds)]
            content = blocks(gen_tokens(rng, n * b, "mixed"), b, seed)
        else:
            content = [rng.u64() for _ in range(n)]
        emit("seq", hl(content), hl(seq_hashes(content)))
    content = blocks(list(range(1, 33)), 16, SEED)
    emit("seq", hl(content), hl(seq_hashes(content)))

    # --- coverage guarantees --------------------------------------------------
    total = sum(counts.values())
    assert total >= 300, total
    for b in sizes:
        bl = [l for l in lines if l.startswith("block ") and l.split()[3] != "-"
              and len(l.split()[3].split(",")) == b]
        toks = {int(t) for l in bl for t in l.split()[3].split(",")}
        assert 0 in toks and max(toks) >= 1 << 31, b

    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hash_vectors.txt")
    summary = ", ".join("%s %d" % (k, counts[k]) for k in sorted(counts))
    with open(out, "w", encoding="utf-8", newline="\n") as f:
        f.write(HEADER)
        f.write("# %d vectors: %s\n" % (total, summary))
        for l in lines:
            f.write(l + "\n")
    print("wrote %s: %d vectors (%s)" % (out, total, summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
