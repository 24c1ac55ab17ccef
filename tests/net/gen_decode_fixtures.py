#!/usr/bin/python3
"""Generate the KV-event decoder fixtures of tests/net/decode_test.c.

Every fixture is a msgpack payload frame (fixtures/decode/<name>.bin) and the
exact result kvi_decode_batch must produce for it (<name>.expect), in the
text form decode_test.c renders (see render() below). fixtures/decode/INDEX
lists the fixtures in order.

Payloads are built with Debian's python3-msgpack (packb, use_bin_type=True)
except where a fixture needs specific wire widths (uint64 >= 2^63 as 0xcf,
negative int64 as 0xd3, fixints, bin8/16/32, str8, map16/array16 headers
with small counts, float32 ts, 0xc1, huge claimed counts): those parts are
written byte by byte (Raw, RawMap). The expectations are derived here from
the fixture's own inputs and the rules of wire-protocol.md and net/decode.h,
independently of the C decoder.

Usage:
    gen_decode_fixtures.py            write the fixtures (next to this file)
    gen_decode_fixtures.py --check    exit 1 if the committed files differ
"""
import os
import random
import struct
import sys

import msgpack

MASK = (1 << 64) - 1
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures", "decode")

# --------------------------------------------------------------------------
# byte-level encoding helpers
# --------------------------------------------------------------------------


class Raw:
    """Bytes inserted verbatim into an encoded structure."""

    def __init__(self, b):
        self.b = bytes(b)


class RawMap:
    """A map given as a list of (key, value) pairs (duplicates allowed),
    optionally with a forced header ("fix", "map16", "map32")."""

    def __init__(self, pairs, header=None):
        self.pairs = pairs
        self.header = header


class RawArray:
    """An array with a forced header ("array16", "array32")."""

    def __init__(self, items, header):
        self.items = items
        self.header = header


def has_raw(o):
    if isinstance(o, (Raw, RawMap, RawArray)):
        return True
    if isinstance(o, (list, tuple)):
        return any(has_raw(x) for x in o)
    if isinstance(o, dict):
        return any(has_raw(k) or has_raw(v) for k, v in o.items())
    return False


def arr_hdr(n, header=None):
    if header == "array16":
        return b"\xdc" + struct.pack(">H", n)
    if header == "array32":
        return b"\xdd" + struct.pack(">I", n)
    if n < 16:
        return bytes([0x90 | n])
    if n < 65536:
        return b"\xdc" + struct.pack(">H", n)
    return b"\xdd" + struct.pack(">I", n)


def map_hdr(n, header=None):
    if header == "map16":
        return b"\xde" + struct.pack(">H", n)
    if header == "map32":
        return b"\xdf" + struct.pack(">I", n)
    if n < 16:
        return bytes([0x80 | n])
    if n < 65536:
        return b"\xde" + struct.pack(">H", n)
    return b"\xdf" + struct.pack(">I", n)


def enc(o):
    """msgpack-encode o; parts wrapped in Raw / RawMap / RawArray are
    written as given, everything else by python3-msgpack."""
    if not has_raw(o):
        return msgpack.packb(o, use_bin_type=True)
    if isinstance(o, Raw):
        return o.b
    if isinstance(o, RawArray):
        return arr_hdr(len(o.items), o.header) + b"".join(enc(x) for x in o.items)
    if isinstance(o, RawMap):
        return map_hdr(len(o.pairs), o.header) + b"".join(enc(k) + enc(v) for k, v in o.pairs)
    if isinstance(o, (list, tuple)):
        return arr_hdr(len(o)) + b"".join(enc(x) for x in o)
    if isinstance(o, dict):
        return map_hdr(len(o)) + b"".join(enc(k) + enc(v) for k, v in o.items())
    raise TypeError(o)


def u64(x):
    return Raw(b"\xcf" + struct.pack(">Q", x))


def i64(x):
    return Raw(b"\xd3" + struct.pack(">q", x))


def i8(x):
    return Raw(b"\xd0" + struct.pack(">b", x))


def i16(x):
    return Raw(b"\xd1" + struct.pack(">h", x))


def i32(x):
    return Raw(b"\xd2" + struct.pack(">i", x))


def u8(x):
    return Raw(b"\xcc" + struct.pack(">B", x))


def u16(x):
    return Raw(b"\xcd" + struct.pack(">H", x))


def u32(x):
    return Raw(b"\xce" + struct.pack(">I", x))


def bin8(b):
    return Raw(b"\xc4" + bytes([len(b)]) + b)


def bin16(b):
    return Raw(b"\xc5" + struct.pack(">H", len(b)) + b)


def bin32(b):
    return Raw(b"\xc6" + struct.pack(">I", len(b)) + b)


def str8(s):
    b = s.encode()
    return Raw(b"\xd9" + bytes([len(b)]) + b)


def str16(s):
    b = s.encode()
    return Raw(b"\xda" + struct.pack(">H", len(b)) + b)


def f32(x):
    return Raw(b"\xca" + struct.pack(">f", x))


# --------------------------------------------------------------------------
# expectation model (wire-protocol.md section 4, net/decode.h FIELD RULES)
# --------------------------------------------------------------------------

TIERS = {
    "gpu": "gpu", "device": "gpu",
    "cpu": "cpu", "cpu_pinned": "cpu", "cpu_tier1": "cpu",
    "storage": "disk", "disk": "disk", "nvme": "disk", "cpu_tier2": "disk",
    "external": "external", "network": "external", "remote": "external", "shared": "external",
}


def tier_of(medium):
    """(tier, medium_unknown) for a medium value (None = nil / absent)."""
    if medium is None:
        return "gpu", 0
    t = TIERS.get(medium.lower())
    return (t, 0) if t else ("gpu", 1)


def hnorm(h):
    """Normalised hash: ints mod 2^64, bytes as int.from_bytes(big) mod 2^64."""
    if isinstance(h, (bytes, bytearray)):
        return int.from_bytes(h, "big") & MASK
    return h & MASK


def mmhex(s):
    return int(s[:16], 16)


class Ev:
    def __init__(self, type, family="array", hashes=(), medium=None, parent=None, base_idx=None,
                 block_size=None, group=-1, tokens=None, pairs=None, mm=None, lora=None, salt=None,
                 backend=None, object_key=None, spec_kind=None):
        self.type, self.family = type, family
        self.tier, self.medium_unknown = tier_of(medium)
        self.parent = None if parent is None else hnorm(parent)
        self.base_idx, self.block_size, self.group = base_idx, block_size, group
        self.hashes = [hnorm(h) for h in hashes]
        if pairs is not None:
            self.tokens_form = "pairs" if pairs else "empty"
            self.tokens = [p[0] for p in pairs] + ([pairs[-1][1]] if pairs else [])
        elif tokens is None:
            self.tokens_form, self.tokens = "absent", None
        else:
            self.tokens_form = "flat" if tokens else "empty"
            self.tokens = list(tokens)
        # mm: None, or one list per block (padded to the block count)
        if mm is not None:
            mm = [list(b) for b in mm[: len(self.hashes)]]
            mm += [[] for _ in range(len(self.hashes) - len(mm))]
            if not any(mm):
                mm = None
        self.mm = mm
        self.lora, self.salt, self.backend = lora, salt, backend
        self.object_key, self.spec_kind = object_key, spec_kind


class Batch:
    def __init__(self, ts, events, rank=None, unknown=0, invalid=0):
        self.ts, self.events, self.rank = ts, events, rank
        self.unknown, self.invalid = unknown, invalid


class Err:
    def __init__(self, what):
        assert what in ("msgpack", "shape", "events", "limit")
        self.what = what


def qstr(s):
    if s is None:
        return "-"
    b = s.encode() if isinstance(s, str) else s
    out = []
    for ch in b:
        if 0x20 <= ch <= 0x7E and ch not in (0x22, 0x5C):
            out.append(chr(ch))
        else:
            out.append("\\x%02x" % ch)
    return '"' + "".join(out) + '"'


def opt(v):
    return "-" if v is None else str(v)


def render(exp):
    """The text decode_test.c renders for a decoded batch (keep in sync)."""
    if isinstance(exp, Err):
        return "error %s\n" % exp.what
    lines = ["batch ts=%s rank=%s events=%d unknown=%d invalid=%d" % (
        "%.17g" % exp.ts, opt(exp.rank), len(exp.events), exp.unknown, exp.invalid)]
    for e in exp.events:
        lines.append("event type=%s family=%s tier=%s medium_unknown=%d parent=%s base_idx=%s "
                     "block_size=%s group=%d tokens_form=%s" % (
                         e.type, e.family, e.tier, e.medium_unknown, opt(e.parent), opt(e.base_idx),
                         opt(e.block_size), e.group, e.tokens_form))
        lines.append(" hashes %d:%s" % (len(e.hashes), "".join(" %d" % h for h in e.hashes)))
        if e.tokens is None:
            lines.append(" tokens -")
        else:
            lines.append(" tokens %d:%s" % (len(e.tokens), "".join(" %d" % t for t in e.tokens)))
        if e.mm is None:
            lines.append(" mm -")
        else:
            lines.append(" mm:" + "".join(
                " " + (",".join("%016x" % h for h in b) if b else "-") for b in e.mm))
        lines.append(" lora=%s salt=%s backend=%s object_key=%s spec_kind=%s" % (
            qstr(e.lora), qstr(e.salt), qstr(e.backend), qstr(e.object_key), qstr(e.spec_kind)))
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------
# fixtures
# --------------------------------------------------------------------------

FIXTURES = []  # (name, payload bytes, expectation)


def fx(name, wire, exp):
    data = wire if isinstance(wire, (bytes, bytearray)) else enc(wire)
    FIXTURES.append((name, bytes(data), exp))


TS = 1795250797.88
H1, H2, H3 = 4918575722444228918, 15742941330807156044, 9064777777991361533
T32 = list(range(1000, 1032))
MMA = "0123456789abcdef" + "a" * 48
MMB = "FEDCBA9876543210" + "0" * 48


def fixtures_vllm_array():
    # vLLM #40984 (12 elements), wire-protocol.md 3.1
    fx("vllm_40984_stored",
       [TS, [["BlockStored", [H1, H2], None, T32, 16, None, "GPU", None, [None, None], 0,
              "full_attention", None]], 0],
       Batch(TS, [Ev("stored", hashes=[H1, H2], tokens=T32, block_size=16, medium="GPU", group=0,
                     spec_kind="full_attention")], rank=0))
    fx("vllm_40984_removed_cleared",
       [TS, [["BlockRemoved", [H1, H2], "GPU", 0], ["AllBlocksCleared"]], 0],
       Batch(TS, [Ev("removed", hashes=[H1, H2], medium="GPU", group=0), Ev("cleared")], rank=0))
    # #16750: 6-element stored and 2-element removed inside a 2-element batch
    fx("vllm_16750_two_element_batch",
       [TS, [["BlockStored", [H1], None, list(range(16)), 16, None], ["BlockRemoved", [H1]]]],
       Batch(TS, [Ev("stored", hashes=[H1], tokens=range(16), block_size=16),
                  Ev("removed", hashes=[H1])]))
    # #19737: 7-element stored, 3-element removed
    fx("vllm_19737_medium",
       [TS, [["BlockStored", [H1], H2, list(range(16)), 16, None, "GPU"],
             ["BlockRemoved", [H1], "CPU"]], 1],
       Batch(TS, [Ev("stored", hashes=[H1], parent=H2, tokens=range(16), block_size=16, medium="GPU"),
                  Ev("removed", hashes=[H1], medium="CPU")], rank=1))
    # #27577: lora_name at 7; lora_id at 5 ignored
    fx("vllm_27577_lora",
       [TS, [["BlockStored", [H3], H2, list(range(1032, 1048)), 16, 7, "GPU", "my-lora"],
             ["BlockStored", [H1], None, [1, 2], 2, None, "GPU", ""]], 0],
       Batch(TS, [Ev("stored", hashes=[H3], parent=H2, tokens=range(1032, 1048), block_size=16,
                     medium="GPU", lora="my-lora"),
                  Ev("stored", hashes=[H1], tokens=[1, 2], block_size=2, medium="GPU", lora="")],
             rank=0))
    # #33304: extra_keys with LoRA name and salt (no mm hash)
    fx("vllm_33304_extra_keys",
       [TS, [["BlockStored", [H3], H2, list(range(16)), 16, 7, "GPU", "my-lora",
              [["my-lora", "salt-A"]]]], 0],
       Batch(TS, [Ev("stored", hashes=[H3], parent=H2, tokens=range(16), block_size=16, medium="GPU",
                     lora="my-lora")], rank=0))
    # Dynamo mocker: 5-element stored, 2-element removed
    fx("dynamo_mocker_5",
       [TS, [["BlockStored", [1, 2], None, [1, 2, 3, 4, 5, 6, 7, 8], 4], ["BlockRemoved", [2]]], 3],
       Batch(TS, [Ev("stored", hashes=[1, 2], tokens=range(1, 9), block_size=4),
                  Ev("removed", hashes=[2])], rank=3))
    # extra trailing elements after position 11 (a future field), ignored
    fx("vllm_array_extra_trailing",
       [TS, [["BlockStored", [5], None, [1], 1, None, "GPU", None, None, None, "sliding_window", 128,
              {"future": [1, 2]}, "x"],
             ["BlockRemoved", [5], "GPU", 1, "extra", [1]],
             ["AllBlocksCleared", None, "x"]], 0],
       Batch(TS, [Ev("stored", hashes=[5], tokens=[1], block_size=1, medium="GPU", spec_kind="sliding_window"),
                  Ev("removed", hashes=[5], medium="GPU", group=1), Ev("cleared")], rank=0))


def fixtures_vllm_map():
    # vLLM #42892 map form, wire-protocol.md 3.2 seq 0..4 (key order as msgspec)
    def stored(**kw):
        d = {"type": "BlockStored"}
        d.update(kw)
        return d

    fx("vllm_map_seq0",
       [TS, [stored(block_hashes=[H1, H2], parent_block_hash=None, token_ids=T32, block_size=16,
                    lora_id=None, medium="GPU", lora_name=None, extra_keys=[None, None], group_idx=0,
                    kv_cache_spec_kind="full_attention")], 0],
       Batch(TS, [Ev("stored", "map", hashes=[H1, H2], tokens=T32, block_size=16, medium="GPU", group=0,
                     spec_kind="full_attention")], rank=0))
    fx("vllm_map_seq1",
       [TS, [stored(block_hashes=[H3], parent_block_hash=H2, token_ids=list(range(1032, 1048)),
                    block_size=16, lora_id=7, medium="GPU", lora_name="my-lora",
                    extra_keys=[["my-lora", "salt-A"]], group_idx=0, kv_cache_spec_kind="full_attention")], 0],
       Batch(TS, [Ev("stored", "map", hashes=[H3], parent=H2, tokens=range(1032, 1048), block_size=16,
                     medium="GPU", lora="my-lora", group=0, spec_kind="full_attention")], rank=0))
    fx("vllm_map_seq2",
       [TS, [{"type": "BlockRemoved", "block_hashes": [H3], "medium": "GPU", "group_idx": 0}], 0],
       Batch(TS, [Ev("removed", "map", hashes=[H3], medium="GPU", group=0)], rank=0))
    fx("vllm_map_seq3_placeholder",
       [TS, [stored(block_hashes=[H1], parent_block_hash=None, token_ids=[], block_size=0, lora_id=None,
                    medium="CPU", lora_name=None, group_idx=0, locality="LOCAL")], 0],
       Batch(TS, [Ev("stored", "map", hashes=[H1], tokens=[], block_size=0, medium="CPU", group=0)], rank=0))
    fx("vllm_map_seq4",
       [TS, [{"type": "BlockRemoved", "block_hashes": [H1, H2], "medium": "GPU", "group_idx": 0},
             {"type": "AllBlocksCleared"}], 0],
       Batch(TS, [Ev("removed", "map", hashes=[H1, H2], medium="GPU", group=0), Ev("cleared", "map")], rank=0))
    # any key order (type last), unknown keys of every kind
    fx("map_any_order_unknown_keys",
       [TS, [{"ownership": {"a": [1, 2]}, "session_id": "s-1", "token_ids": [7, 8], "medium": "cpu_pinned",
              "kv_cache_spec_sliding_window": None, "block_size": 2, "block_hashes": [-7],
              "locality": "REMOTE", "parent_block_hash": 9, "lora_id": None, "metadata": [None, 1.5, True],
              "type": "BlockStored"}], 0],
       Batch(TS, [Ev("stored", "map", hashes=[-7], parent=9, tokens=[7, 8], block_size=2,
                     medium="cpu_pinned")], rank=0))
    # map16 header with a small count, array16 / array32 headers with small
    # counts, str8 / str16 strings, a map32 event
    ev16 = RawMap([(str8("type"), str8("BlockStored")),
                   (str8("block_hashes"), RawArray([u64(H2), 3], "array16")),
                   ("token_ids", RawArray([1, u16(300), u32(70000)], "array32")),
                   ("block_size", 1),
                   ("medium", str16("Cpu"))], "map16")
    ev32 = RawMap([("type", "BlockRemoved"), ("block_hashes", RawArray([4], "array16"))], "map32")
    fx("map16_array16_str8_headers",
       RawArray([f32(2.5), RawArray([ev16, ev32], "array16"), 0], "array32"),
       Batch(2.5, [Ev("stored", "map", hashes=[H2, 3], tokens=[1, 300, 70000], block_size=1, medium="Cpu"),
                   Ev("removed", "map", hashes=[4])], rank=0))
    # repeated key: the last value wins; non-string keys ignored
    fx("map_duplicate_and_nonstring_keys",
       [TS, [RawMap([("type", "BlockRemoved"), ("block_hashes", [1]), (1, "x"), (None, [1, 2]),
                     ("block_hashes", [2, 3]), ("medium", "GPU"), ("medium", "DISK")])], 0],
       Batch(TS, [Ev("removed", "map", hashes=[2, 3], medium="DISK")], rank=0))
    # ext values in ignored fields are fine
    fx("map_ext_in_ignored_fields",
       [TS, [{"type": "BlockStored", "block_hashes": [1], "token_ids": [1], "block_size": 1,
              "lora_id": msgpack.ExtType(1, b"x"), "session_id": msgpack.ExtType(5, b"0123456789abcdefg")},
             ["BlockStored", [2], None, [2], 1, msgpack.Timestamp(1700000000, 5)]], 0],
       Batch(TS, [Ev("stored", "map", hashes=[1], tokens=[1], block_size=1),
                  Ev("stored", hashes=[2], tokens=[2], block_size=1)], rank=0))


def fixtures_sglang_dynamo():
    # SGLang through mid-2026, wire-protocol.md 3.3
    a, b, c = -1944566869021170841, 9056173362842263460, 7264869702280860344
    fx("sglang_pages",
       [TS, [["BlockStored", [a], None, [151644, 872, 198, 9064], 4, None, "GPU"],
             ["BlockStored", [b], a, [374, 279, 6722, 315], 4, None, "GPU"],
             ["BlockStored", [c], b, [5616, 30], 2, None, "GPU"]], 0],
       Batch(TS, [Ev("stored", hashes=[a], tokens=[151644, 872, 198, 9064], block_size=4, medium="GPU"),
                  Ev("stored", hashes=[b], parent=a, tokens=[374, 279, 6722, 315], block_size=4, medium="GPU"),
                  Ev("stored", hashes=[c], parent=b, tokens=[5616, 30], block_size=2, medium="GPU")], rank=0))
    fx("sglang_removed_cleared_cpu_pinned",
       [TS, [["BlockStored", [a], None, [151644, 872, 198, 9064], 4, None, "CPU_PINNED"],
             ["BlockRemoved", [a, b, c], "GPU"], ["AllBlocksCleared"]], 0],
       Batch(TS, [Ev("stored", hashes=[a], tokens=[151644, 872, 198, 9064], block_size=4, medium="CPU_PINNED"),
                  Ev("removed", hashes=[a, b, c], medium="GPU"), Ev("cleared")], rank=0))
    # first SGLang: 6-element events in a 2-element batch
    fx("sglang_first_version",
       [TS, [["BlockStored", [a], 0, [1, 2, 3], 3, None], ["BlockRemoved", [a]]]],
       Batch(TS, [Ev("stored", hashes=[a], parent=0, tokens=[1, 2, 3], block_size=3),
                  Ev("removed", hashes=[a])]))
    # bigram / EAGLE pairs (wire-protocol.md 3.3 and index-semantics.md 6.3)
    pairs1 = [[151644, 872], [872, 198]]
    pairs2 = [[10, 11], [11, 12], [12, 13], [13, 14]]
    fx("sglang_pairs",
       [TS, [["BlockStored", [-1944566869021170842], None, pairs1, 2, None, "GPU"],
             ["BlockStored", [21, 22], None, pairs2, 2, None, "GPU"],
             {"type": "BlockStored", "block_hashes": [23], "token_ids": [[5, 6]], "block_size": 1}], 0],
       Batch(TS, [Ev("stored", hashes=[-1944566869021170842], pairs=pairs1, block_size=2, medium="GPU"),
                  Ev("stored", hashes=[21, 22], pairs=pairs2, block_size=2, medium="GPU"),
                  Ev("stored", "map", hashes=[23], pairs=[[5, 6]], block_size=1)], rank=0))
    # 8th positional element: SGLang metadata map with cache_salt
    fx("sglang_salt_metadata",
       [TS, [["BlockStored", [a], None, [1, 2], 2, None, "GPU", {"cache_salt": "tenant-a", "x": [1]}],
             ["BlockStored", [b], a, [3, 4], 2, None, "GPU", {}],
             ["BlockStored", [c], b, [5, 6], 2, None, "GPU", None]], 0],
       Batch(TS, [Ev("stored", hashes=[a], tokens=[1, 2], block_size=2, medium="GPU", salt="tenant-a"),
                  Ev("stored", hashes=[b], parent=a, tokens=[3, 4], block_size=2, medium="GPU"),
                  Ev("stored", hashes=[c], parent=b, tokens=[5, 6], block_size=2, medium="GPU")], rank=0))
    # SGLang #37482 tagged maps: None-valued optional keys omitted
    fx("sglang_map_37482",
       [TS, [{"type": "BlockStored", "block_hashes": [a], "token_ids": [1, 2, 3, 4], "block_size": 4,
              "medium": "GPU", "cache_salt": "salt-1", "session_id": "sess"},
             {"type": "BlockRemoved", "block_hashes": [a], "medium": "CPU_TIER1"}], 2],
       Batch(TS, [Ev("stored", "map", hashes=[a], tokens=[1, 2, 3, 4], block_size=4, medium="GPU", salt="salt-1"),
                  Ev("removed", "map", hashes=[a], medium="CPU_TIER1")], rank=2))
    # Dynamo dict form (custom engines)
    fx("dynamo_dict_form",
       [TS, [{"type": "BlockStored", "block_hashes": [-5, 6], "parent_block_hash": -4,
              "token_ids": [1, 2, 3, 4], "block_size": 2, "lora_id": 3},
             {"type": "BlockStored", "block_hashes": [7], "parent_block_hash": None, "token_ids": [9, 9],
              "block_size": 2, "lora_id": None, "lora_name": "adapter-b"},
             {"type": "BlockRemoved", "block_hashes": [6]}, {"type": "AllBlocksCleared"}], 0],
       Batch(TS, [Ev("stored", "map", hashes=[-5, 6], parent=-4, tokens=[1, 2, 3, 4], block_size=2),
                  Ev("stored", "map", hashes=[7], tokens=[9, 9], block_size=2, lora="adapter-b"),
                  Ev("removed", "map", hashes=[6]), Ev("cleared", "map")], rank=0))


def fixtures_rfc1527():
    fx("rfc1527_events",
       [TS, [{"event_type": "stored", "seq_hashes": [101, 102], "base_block_idx": 0, "parent_hash": None,
              "token_ids": None, "backend_id": "store-0", "medium": "cpu", "object_key": "obj-1"},
             {"event_type": "stored", "seq_hashes": [103], "base_block_idx": 2, "parent_hash": 102,
              "token_ids": [1, 2, 3, 4], "block_size": 4, "lora_name": "lora-x", "backend_id": "store-0",
              "medium": "disk", "object_key": "obj-2", "event_id": 7, "timestamp": 123, "model_name": "m",
              "additional_salt": "s", "tenant_id": "t", "dp_rank": 0},
             {"event_type": "removed", "seq_hashes": [101], "base_block_idx": 0, "backend_id": "store-0",
              "medium": "cpu"},
             {"event_type": "cleared", "backend_id": "store-0"},
             {"type": "stored", "block_hashes": [104], "parent_hash": 103, "medium": "DISK"},
             {"seq_hashes": [105], "event_type": "Removed", "medium": "NVME"}], 0],
       Batch(TS, [Ev("stored", "rfc1527", hashes=[101, 102], base_idx=0, backend="store-0", medium="cpu",
                     object_key="obj-1"),
                  Ev("stored", "rfc1527", hashes=[103], base_idx=2, parent=102, tokens=[1, 2, 3, 4], block_size=4,
                     lora="lora-x", backend="store-0", medium="disk", object_key="obj-2"),
                  Ev("removed", "rfc1527", hashes=[101], base_idx=0, backend="store-0", medium="cpu"),
                  Ev("cleared", "rfc1527", backend="store-0"),
                  Ev("stored", "rfc1527", hashes=[104], parent=103, medium="DISK"),
                  Ev("removed", "rfc1527", hashes=[105], medium="NVME")], rank=0))


def fixtures_values():
    sha = bytes.fromhex("b051aebf") + bytes(range(20)) + bytes.fromhex("44424a8f51260936")
    x16 = bytes(range(0x10, 0x20))
    hashes = [
        (Raw(b"\x00"), 0), (Raw(b"\x7f"), 127), (u8(200), 200), (u16(0x1234), 0x1234),
        (u32(0xDEADBEEF), 0xDEADBEEF), (u64(H2), H2), (u64(0), 0), (u64(MASK), MASK),
        (i8(-5), -5), (i16(-300), -300), (i32(-2), -2), (i64(-1944566869021170841), -1944566869021170841),
        (i64(7), 7), (Raw(b"\xff"), -1), (Raw(b"\xe0"), -32), (i8(5), 5),
        (bin8(sha), sha), (bin8(x16), x16), (bin8(b"\x01\x02\x03\x04\x05\x06\x07\x08"), 0x0102030405060708),
        (bin8(b"\x01\x02\x03"), 0x010203), (bin8(b""), 0), (bin16(sha), sha), (bin32(x16), x16),
    ]
    fx("hash_forms",
       [TS, [["BlockRemoved", [w for w, _ in hashes]],
             ["BlockStored", [u64(H1)], bin8(sha), [1], 1],
             ["BlockStored", [i64(-3)], i64(-9), [1], 1],
             ["BlockStored", [bin8(x16)], Raw(b"\x00"), [1], 1],
             {"type": "BlockStored", "block_hashes": [bin8(sha)], "parent_block_hash": bin16(x16),
              "token_ids": [1], "block_size": 1}], 0],
       Batch(TS, [Ev("removed", hashes=[v for _, v in hashes]),
                  Ev("stored", hashes=[H1], parent=sha, tokens=[1], block_size=1),
                  Ev("stored", hashes=[-3], parent=-9, tokens=[1], block_size=1),
                  Ev("stored", hashes=[x16], parent=0, tokens=[1], block_size=1),
                  Ev("stored", "map", hashes=[sha], parent=x16, tokens=[1], block_size=1)], rank=0))
    toks = [(Raw(b"\x05"), 5), (u8(200), 200), (u16(0xFFFF), 0xFFFF), (u32(0xFFFFFFFF), 0xFFFFFFFF),
            (i8(5), 5), (i16(256), 256), (i32(65537), 65537), (i64(100000), 100000), (u64(70000), 70000),
            (Raw(b"\x00"), 0)]
    fx("token_widths",
       [TS, [["BlockStored", [1], None, [w for w, _ in toks], 5],
             ["BlockStored", [2], None, [], 0],
             ["BlockStored", [3], None, None, None],
             ["BlockStored", [4]],
             ["BlockStored", [5], None, [[u32(0xFFFFFFFF), i8(1)], [u16(2), u64(3)]], 1]], 0],
       Batch(TS, [Ev("stored", hashes=[1], tokens=[v for _, v in toks], block_size=5),
                  Ev("stored", hashes=[2], tokens=[], block_size=0),
                  Ev("stored", hashes=[3]),
                  Ev("stored", hashes=[4]),
                  Ev("stored", hashes=[5], pairs=[[0xFFFFFFFF, 1], [2, 3]], block_size=1)], rank=0))
    # medium: every row of the wire-protocol.md 4.4 table in mixed case, unknowns
    media = [None, "GPU", "gpu", "Device", "CPU", "cpu", "Cpu_Pinned", "CPU_TIER1", "Storage", "DISK",
             "disk", "NvMe", "cpu_tier2", "External", "NETWORK", "remote", "Shared", "HBM", "", "GPU ",
             "cpu_tier3", "device0"]
    evs = [["BlockRemoved", [i], m] for i, m in enumerate(media)]
    evs += [{"type": "BlockRemoved", "block_hashes": [100]},
            {"type": "BlockStored", "block_hashes": [101], "medium": "cPu_TiEr2"},
            {"event_type": "stored", "seq_hashes": [102], "medium": "SHARED"}]
    exp = [Ev("removed", hashes=[i], medium=m) for i, m in enumerate(media)]
    exp += [Ev("removed", "map", hashes=[100]), Ev("stored", "map", hashes=[101], medium="cPu_TiEr2"),
            Ev("stored", "rfc1527", hashes=[102], medium="SHARED")]
    fx("medium_table", [TS, evs, 0], Batch(TS, exp, rank=0))
    # tags in any case; short tags; event_type wins over type
    fx("tags_any_case",
       [TS, [["blockstored", [1], None, [1, 2], 2], ["BLOCKREMOVED", [1]], ["allblockscleared"],
             {"type": "blockStored", "block_hashes": [2]}, {"event_type": "STORED", "seq_hashes": [3]},
             {"type": "Removed", "block_hashes": [4]}, {"event_type": "Cleared"}, ["stored", [5]],
             {"type": "AllBlocksCleared"},
             {"type": "BlockStored", "event_type": "removed", "block_hashes": [6]}], 0],
       Batch(TS, [Ev("stored", hashes=[1], tokens=[1, 2], block_size=2), Ev("removed", hashes=[1]),
                  Ev("cleared"), Ev("stored", "map", hashes=[2]), Ev("stored", "rfc1527", hashes=[3]),
                  Ev("removed", "rfc1527", hashes=[4]), Ev("cleared", "rfc1527"), Ev("stored", hashes=[5]),
                  Ev("cleared", "map"), Ev("removed", "rfc1527", hashes=[6])], rank=0))
    # group_idx: array positions 9 (stored) and 3 (removed), map key
    fx("group_idx",
       [TS, [["BlockStored", [1], None, [1, 2], 2, None, "GPU", None, None, 1],
             ["BlockStored", [1], None, [1, 2], 2, None, "GPU", None, None, None, "full_attention"],
             ["BlockRemoved", [1], "GPU", 2], ["BlockRemoved", [1], "GPU", None],
             {"type": "BlockStored", "block_hashes": [1], "group_idx": 3},
             {"type": "BlockRemoved", "block_hashes": [1], "group_idx": u32(2147483647)}], 0],
       Batch(TS, [Ev("stored", hashes=[1], tokens=[1, 2], block_size=2, medium="GPU", group=1),
                  Ev("stored", hashes=[1], tokens=[1, 2], block_size=2, medium="GPU", spec_kind="full_attention"),
                  Ev("removed", hashes=[1], medium="GPU", group=2), Ev("removed", hashes=[1], medium="GPU"),
                  Ev("stored", "map", hashes=[1], group=3),
                  Ev("removed", "map", hashes=[1], group=2147483647)], rank=0))


def fixtures_mm():
    mma, mmb = mmhex(MMA), mmhex(MMB)
    fx("mm_extra_keys",
       [TS, [["BlockStored", [11, 12, 13], None, [1, 2, 3, 4, 5, 6], 2, None, "GPU", None,
              [[MMA, "my-lora"], None, [[MMB, 0], [MMA, 5], "salt", 7, b"bytes", "g" * 64, MMA[:63],
                                        MMA + "0", [MMA, 1.5], [MMA], 1.5, True, None]], 0],
             ["BlockStored", [14, 15], None, [1, 2], 1, None, "GPU", None, [None, None]],
             ["BlockStored", [16], None, [1], 1, None, "GPU", None, [[MMA], [MMB]]],
             ["BlockStored", [17, 18, 19], None, [1, 2, 3], 1, None, "GPU", None, [[MMB]]],
             {"type": "BlockStored", "block_hashes": [20], "extra_keys": [[[MMA, 3]]], "token_ids": [1],
              "block_size": 1},
             {"type": "BlockStored", "block_hashes": [21], "extra_keys": [[[MMB, -3], "my-lora"]]},
             {"type": "BlockRemoved", "block_hashes": [22], "extra_keys": [[MMA]]}], 0],
       Batch(TS, [Ev("stored", hashes=[11, 12, 13], tokens=[1, 2, 3, 4, 5, 6], block_size=2, medium="GPU", group=0,
                     mm=[[mma], [], [mmb, mma]]),
                  Ev("stored", hashes=[14, 15], tokens=[1, 2], block_size=1, medium="GPU"),
                  Ev("stored", hashes=[16], tokens=[1], block_size=1, medium="GPU", mm=[[mma]]),
                  Ev("stored", hashes=[17, 18, 19], tokens=[1, 2, 3], block_size=1, medium="GPU", mm=[[mmb]]),
                  Ev("stored", "map", hashes=[20], tokens=[1], block_size=1, mm=[[mma]]),
                  Ev("stored", "map", hashes=[21], mm=[[mmb]]),
                  Ev("removed", "map", hashes=[22])], rank=0))
    obj = lambda h, off: {"mm_hash": h, "offsets": off}
    fx("mm_block_mm_infos",
       [TS, [["BlockStored", [21, 22], None, [10, 11, 12, 13], 2, None, None, None, [[MMA], [MMA]],
              [{"mm_objects": [obj(0x1111, [[0, 1]]), obj(0x2222, [])]}, None]],
             {"type": "BlockStored", "block_hashes": [23, 24], "block_mm_infos": [[[[0x3333, [[1, 2]]]]], None],
              "extra_keys": [[MMB], None]},
             {"type": "BlockStored", "block_hashes": [25], "block_mm_infos": None, "extra_keys": [[MMB]]},
             {"type": "BlockStored", "block_hashes": [26], "block_mm_infos": [], "extra_keys": [[MMB]]},
             {"type": "BlockStored", "block_hashes": [27, 28],
              "block_mm_infos": [{"mm_objects": []}, {"mm_objects": [{"offsets": [], "mm_hash": -2}],
                                                      "extra": 1}]},
             ["BlockStored", [29], None, [1], 1, None, None, None, None, [None]]], 0],
       Batch(TS, [Ev("stored", hashes=[21, 22], tokens=[10, 11, 12, 13], block_size=2, mm=[[0x1111, 0x2222], []]),
                  Ev("stored", "map", hashes=[23, 24], mm=[[0x3333], []]),
                  Ev("stored", "map", hashes=[25], mm=[[mmb]]),
                  Ev("stored", "map", hashes=[26]),
                  Ev("stored", "map", hashes=[27, 28], mm=[[], [-2 & MASK]]),
                  Ev("stored", hashes=[29], tokens=[1], block_size=1)], rank=0))


def fixtures_batches():
    rem = ["BlockRemoved", [1]]
    erem = Ev("removed", hashes=[1])
    fx("batch_3_nil_rank", [TS, [rem], None], Batch(TS, [erem]))
    fx("batch_4_extra_element", [TS, [rem], 3, {"future": [1, 2]}], Batch(TS, [erem], rank=3))
    fx("batch_5_extra_elements", [TS, [rem], None, "x", [1, [2, {}]]], Batch(TS, [erem]))
    fx("batch_rank_minus_one", [TS, [rem], -1], Batch(TS, [erem], rank=0xFFFFFFFF))
    fx("batch_rank_widths", [TS, [rem], u16(300)], Batch(TS, [erem], rank=300))
    fx("batch_rank_u32_max", [TS, [rem], u32(0xFFFFFFFF)], Batch(TS, [erem], rank=0xFFFFFFFF))
    fx("batch_rank_int32_min", [TS, [rem], i32(-2147483648)], Batch(TS, [erem], rank=0x80000000))
    fx("batch_ts_float32", [f32(1.5), [rem], 0], Batch(1.5, [erem], rank=0))
    fx("batch_ts_int", [1700000000, [rem], 0], Batch(1700000000.0, [erem], rank=0))
    fx("batch_ts_negative_int", [-1, [rem], 0], Batch(-1.0, [erem], rank=0))
    fx("batch_ts_uint64", [u64(MASK), [], 0], Batch(float(MASK), [], rank=0))
    fx("batch_empty_events", [TS, [], 0], Batch(TS, [], rank=0))
    fx("batch_two_element_empty", [0.0, []], Batch(0.0, []))
    fx("batch_map_form", {"ts": TS, "events": [rem], "data_parallel_rank": 2}, Batch(TS, [erem], rank=2))
    fx("batch_map_dp_rank_first", {"events": [rem, ["AllBlocksCleared"]], "dp_rank": 1, "ts": 5},
       Batch(5.0, [erem, Ev("cleared")], rank=1))
    fx("batch_map_attn_nil_extra_keys", {"attn_dp_rank": None, "ts": 1.0, "events": [], "extra": {"k": [1]}},
       Batch(1.0, []))
    fx("batch_map_no_ts", {"events": [rem]}, Batch(0.0, [erem]))
    fx("batch_mixed_families",
       [TS, [["BlockStored", [1], None, [1], 1], {"type": "BlockStored", "block_hashes": [2], "token_ids": [2],
                                                  "block_size": 1},
             {"event_type": "stored", "seq_hashes": [3], "base_block_idx": 0}, rem], 0],
       Batch(TS, [Ev("stored", hashes=[1], tokens=[1], block_size=1),
                  Ev("stored", "map", hashes=[2], tokens=[2], block_size=1),
                  Ev("stored", "rfc1527", hashes=[3], base_idx=0), erem], rank=0))
    # a realistic vLLM batch (Mooncake-trace-like), seeded
    rng = random.Random(1527)
    evs, exp = [], []
    parent = None
    for i in range(8):
        if i % 4 == 3:
            hs = [rng.getrandbits(64) for _ in range(rng.randint(1, 4))]
            evs.append(["BlockRemoved", hs, "GPU", 0])
            exp.append(Ev("removed", hashes=hs, medium="GPU", group=0))
            continue
        n = rng.randint(1, 32)
        hs = [rng.getrandbits(64) for _ in range(n)]
        toks = [rng.randrange(152000) for _ in range(16 * n)]
        evs.append(["BlockStored", hs, parent, toks, 16, None, "GPU", None, None, 0, "full_attention", None])
        exp.append(Ev("stored", hashes=hs, parent=parent, tokens=toks, block_size=16, medium="GPU", group=0,
                      spec_kind="full_attention"))
        parent = hs[-1]
    fx("vllm_random_batch", [TS, evs, 0], Batch(TS, exp, rank=0))


def nested(k):
    """k arrays nested in one another (the innermost empty)."""
    v = []
    for _ in range(k - 1):
        v = [v]
    return v


def fixtures_skipped_events():
    good_s = ["BlockStored", [9], None, [1], 1]
    egood_s = Ev("stored", hashes=[9], tokens=[1], block_size=1)
    fx("unknown_tags_mixed",
       [TS, [good_s, ["BlockInactive", [1]], {"type": "Ignored"}, {"type": "FutureEvent", "x": [1, {"y": 2}]},
             {"event_type": "evicted", "seq_hashes": [3]}, ["", 1], ["BlockRemoved", [9]],
             ["AllBlocksCleared", "extra", 1]], 0],
       Batch(TS, [egood_s, Ev("removed", hashes=[9]), Ev("cleared")], rank=0, unknown=5))
    bad = [
        ["BlockStored", "abc", None, [1], 1],                      # hashes not an array
        ["BlockStored"],                                          # no hashes
        ["BlockRemoved", [1.5]],                                  # float hash
        ["BlockRemoved", [1, "x", 2]],                            # str hash
        ["BlockRemoved", [None]],                                 # nil hash
        ["BlockRemoved", None],                                   # nil hashes
        ["BlockStored", [1], None, [1, 2], 2, None, 5],           # medium not a string
        ["BlockStored", [1], None, [1, 2], -1],                   # negative block_size
        ["BlockStored", [1], None, [1, 2], 1 << 32],              # block_size > u32
        ["BlockStored", [1], None, [1, 2], 2, None, None, None, None, "x"],  # group_idx str
        ["BlockStored", [1], "parent", [1, 2], 2],                # parent str
        ["BlockStored", [1], 1.5, [1, 2], 2],                     # parent float
        {"type": "BlockStored", "token_ids": [1]},                # no hashes
        {"type": 42, "block_hashes": [1]},                        # tag not a string
        7,                                                        # not an event
        "BlockStored",                                            # not an event
        None,                                                     # not an event
        [],                                                       # no tag
        [1, 2],                                                   # tag not a string
        {"block_hashes": [1]},                                    # no tag
        ["BlockStored", [1], None, [[1, 2], 3], 2],               # pairs then flat
        ["BlockStored", [1], None, [1, [2, 3]], 2],               # flat then pair
        ["BlockStored", [1], None, [[1, 2, 3]], 2],               # pair of 3
        ["BlockStored", [1], None, [[1, -2]], 2],                 # negative in a pair
        ["BlockStored", [1], None, [1, 1 << 32], 2],              # token > u32
        ["BlockStored", [1], None, [-1], 1],                      # negative token
        ["BlockStored", [1], None, [1.0], 1],                     # float token
        ["BlockStored", [1], None, "tokens", 1],                  # tokens not an array
        ["BlockRemoved", [1], "GPU", -1],                         # negative group_idx
        ["BlockRemoved", [1], "GPU", 1 << 31],                    # group_idx > i32
        ["BlockStored", [1], None, [1], 1, None, None, 5],        # position 7 int
        ["BlockStored", [1], None, [1], 1, None, None, {"cache_salt": 5}],   # salt not a string
        ["BlockStored", [1], None, [1], 1, None, None, None, "notalist"],    # extra_keys str
        ["BlockStored", [1], None, [1], 1, None, None, None, ["x"]],         # extra_keys entry str
        ["BlockStored", [1], None, [1], 1, None, None, None, None, None, 5],  # spec kind int
        {"event_type": "stored", "seq_hashes": [1], "base_block_idx": -1},   # negative base idx
        {"event_type": "removed", "seq_hashes": None},            # no hash array
        {"event_type": "stored", "seq_hashes": [1], "backend_id": 3},        # backend not a string
        {"event_type": "stored", "seq_hashes": [1], "object_key": [1]},      # object key not a string
        {"type": "BlockStored", "block_hashes": [1], "lora_name": 1},        # lora_name int
        {"type": "BlockStored", "block_hashes": [1], "block_mm_infos": [{"other": 1}]},     # no mm_objects
        {"type": "BlockStored", "block_hashes": [1], "block_mm_infos": [[[{"offsets": []}]]]},  # no mm_hash
        {"type": "BlockStored", "block_hashes": [1], "block_mm_infos": [{"mm_objects": 5}]},   # not an array
        {"type": "BlockStored", "block_hashes": [1], "block_mm_infos": [[[["x", []]]]]},      # str mm_hash
        {"type": "BlockStored", "block_hashes": [1], "block_mm_infos": [5]},                # entry int
        {"type": "BlockStored", "block_hashes": [1], "block_mm_infos": "x"},                # not an array
    ]
    fx("invalid_events_mixed",
       [TS, [["BlockRemoved", [1]]] + bad + [["AllBlocksCleared"]], 0],
       Batch(TS, [Ev("removed", hashes=[1]), Ev("cleared")], rank=0, invalid=len(bad)))
    # boundary: a container at depth 32 (batch = depth 1) is accepted
    # the value of an unknown key is at depth 4: 29 nested arrays reach depth 32
    fx("deep_nesting_32_ok",
       [TS, [{"type": "BlockRemoved", "block_hashes": [1], "future": nested(29)}], 0],
       Batch(TS, [Ev("removed", "map", hashes=[1])], rank=0))


def fixtures_errors():
    ok = enc([TS, [["BlockStored", [H1], None, [1, 2, 3, 70000], 4, None, "GPU"]], 0])
    fx("err_empty", b"", Err("msgpack"))
    fx("err_c1", b"\xc1", Err("msgpack"))
    tok_at = ok.index(b"\xce\x00\x01\x11\x70")
    fx("err_c1_in_tokens", ok[:tok_at] + b"\xc1" + ok[tok_at + 5:], Err("msgpack"))
    fx("err_c1_in_ignored_key",
       [TS, [{"type": "BlockRemoved", "block_hashes": [1], "locality": Raw(b"\xc1")}], 0], Err("msgpack"))
    fx("err_c1_in_unknown_event", [TS, [["BlockInactive", [Raw(b"\xc1")]]], 0], Err("msgpack"))
    fx("err_c1_in_trailing_element", [TS, [], 0, Raw(b"\xc1")], Err("msgpack"))
    fx("err_truncated", ok[: len(ok) // 2], Err("msgpack"))
    fx("err_truncated_last_byte", ok[:-1], Err("msgpack"))
    fx("err_trailing_byte", ok + b"\xc0", Err("msgpack"))
    fx("err_two_batches", ok + ok, Err("msgpack"))
    fx("err_outer_int", enc(5), Err("shape"))
    fx("err_outer_str", enc("batch"), Err("shape"))
    fx("err_outer_nil", enc(None), Err("shape"))
    fx("err_outer_bin", enc(b"\x93"), Err("shape"))
    fx("err_outer_float", enc(1.5), Err("shape"))
    fx("err_outer_empty_array", enc([]), Err("shape"))
    fx("err_outer_one_element", enc([TS]), Err("shape"))
    fx("err_ts_str", ["1.0", []], Err("shape"))
    fx("err_ts_nil", [None, []], Err("shape"))
    fx("err_events_int", [TS, 5], Err("events"))
    fx("err_events_nil", [TS, None, 0], Err("events"))
    fx("err_events_map", [TS, {"a": 1}, 0], Err("events"))
    fx("err_events_str", [TS, "events", 0], Err("events"))
    fx("err_rank_str", [TS, [], "0"], Err("shape"))
    fx("err_rank_big", [TS, [], 1 << 40], Err("shape"))
    fx("err_rank_below_int32", [TS, [], -(1 << 31) - 1], Err("shape"))
    fx("err_rank_float", [TS, [], 1.0], Err("shape"))
    fx("err_map_no_events", {"ts": TS}, Err("shape"))
    fx("err_map_events_nil", {"ts": TS, "events": None}, Err("events"))
    fx("err_map_two_events", RawMap([("events", []), ("ts", TS), ("events", [])]), Err("shape"))
    fx("err_deep_nesting_33", [TS, [{"type": "BlockRemoved", "block_hashes": [1], "future": nested(30)}], 0],
       Err("limit"))
    deep = b"\x91" * 1000 + b"\x90"
    fx("err_deep_nesting_event", b"\x93\xcb" + struct.pack(">d", TS) + b"\x91" + deep + b"\x00", Err("limit"))
    fx("err_deep_nesting_map_batch", b"\x81\xa1x" + b"\x91" * 100 + b"\x90" + b"", Err("limit"))
    ten = bytes(10)
    fx("err_huge_array32_outer", b"\xdd\xff\xff\xff\xff" + ten, Err("msgpack"))
    fx("err_huge_map32_outer", b"\xdf\xff\xff\xff\xff" + ten, Err("msgpack"))
    fx("err_huge_events", enc([TS, Raw(b"\xdd\x7f\xff\xff\xff" + ten)]), Err("msgpack"))
    fx("err_huge_hashes", enc([TS, [["BlockStored", Raw(b"\xdd\xff\xff\xff\xff" + ten)]]]), Err("msgpack"))
    fx("err_huge_tokens", enc([TS, [["BlockStored", [1], None, Raw(b"\xdd\xff\xff\xff\xff" + ten)]]]),
       Err("msgpack"))
    fx("err_huge_map_event", enc([TS, [Raw(b"\xdf\xff\xff\xff\xff" + ten)]]), Err("msgpack"))
    fx("err_huge_str32", enc([TS, [["BlockStored", [1], None, [1], 1, None, Raw(b"\xdb\xff\xff\xff\xff" + ten)]]]),
       Err("msgpack"))
    fx("err_huge_bin32_hash", enc([TS, [["BlockRemoved", [Raw(b"\xc6\xff\xff\xff\xff" + ten)]]]]), Err("msgpack"))
    fx("err_huge_ext32", enc([TS, [["BlockRemoved", [1]]], 0, Raw(b"\xc9\xff\xff\xff\xff\x01" + ten)]),
       Err("msgpack"))
    fx("err_array16_count_over", b"\xdc\x00\x10" + enc(TS) + b"\x90\x00", Err("msgpack"))
    fx("err_truncated_uint64_hash", enc([TS, [["BlockRemoved", [Raw(b"\xcf\x01\x02")]]]]), Err("msgpack"))


def build():
    for f in (fixtures_vllm_array, fixtures_vllm_map, fixtures_sglang_dynamo, fixtures_rfc1527, fixtures_values,
              fixtures_mm, fixtures_batches, fixtures_skipped_events, fixtures_errors):
        f()
    names = [n for n, _, _ in FIXTURES]
    assert len(names) == len(set(names)), "duplicate fixture names"
    files = {"INDEX": ("".join(n + "\n" for n in names)).encode()}
    for name, data, exp in FIXTURES:
        files[name + ".bin"] = data
        files[name + ".expect"] = render(exp).encode()
    return files


def main():
    check = "--check" in sys.argv[1:]
    files = build()
    if check:
        bad = []
        for fn, data in sorted(files.items()):
            path = os.path.join(OUT, fn)
            try:
                with open(path, "rb") as f:
                    if f.read() != data:
                        bad.append("differs: " + fn)
            except FileNotFoundError:
                bad.append("missing: " + fn)
        if os.path.isdir(OUT):
            for fn in sorted(os.listdir(OUT)):
                if fn not in files:
                    bad.append("stale: " + fn)
        for b in bad:
            print(b)
        print("%d fixture files, %d problems" % (len(files), len(bad)))
        return 1 if bad else 0
    os.makedirs(OUT, exist_ok=True)
    for fn in os.listdir(OUT):
        if fn not in files:
            os.remove(os.path.join(OUT, fn))
    for fn, data in files.items():
        with open(os.path.join(OUT, fn), "wb") as f:
            f.write(data)
    print("wrote %d fixtures (%d files) to %s" % (len(FIXTURES), len(files), OUT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
