"""A crafted vowpalwabbit model, as a hostile run directory could ship one inside a checkpoint:
a real model whose header's option string gets extra options, with VW's header checksum made
to match (a chained 32-bit MurmurHash3 of the header fields after the version, seed 0), so that
VW itself accepts the file."""

from __future__ import annotations

import struct

_U32 = struct.Struct("<I")


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3 x86 32-bit (VW's ``uniform_hash``)."""
    c1, c2, h, n = 0xCC9E2D51, 0x1B873593, seed, len(data)

    def mix(k: int) -> int:
        k = (k * c1) & 0xFFFFFFFF
        k = ((k << 15) | (k >> 17)) & 0xFFFFFFFF
        return (k * c2) & 0xFFFFFFFF

    for i in range(0, n // 4 * 4, 4):
        h ^= mix(_U32.unpack_from(data, i)[0])
        h = ((h << 13) | (h >> 19)) & 0xFFFFFFFF
        h = (h * 5 + 0xE6546B64) & 0xFFFFFFFF
    tail, k = data[n // 4 * 4 :], 0
    for i, byte in enumerate(tail):
        k |= byte << (8 * i)
    if tail:
        h ^= mix(k)
    h ^= n
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


def with_options(blob: bytes, extra: str) -> bytes:
    """``blob`` (a model ``Workspace.save`` wrote) with `` extra`` appended to its header's options."""
    chunks, offset = [], 0
    (length,) = _U32.unpack_from(blob, 0)
    offset = 4 + length  # the version string is not hashed
    (length,) = _U32.unpack_from(blob, offset)
    fields = [4, length, 1, 4, 4, 4, 4, 4, 4]  # id length, id, model byte, min, max, bits, lda, ngrams, skips
    for size in fields:
        chunks.append(blob[offset : offset + size])
        offset += size
    (length,) = _U32.unpack_from(blob, offset)
    options = blob[offset + 4 : offset + 4 + length].rstrip(b"\x00") + extra.encode() + b"\x00"
    rest = blob[offset + 4 + length :]
    assert _U32.unpack_from(rest, 0)[0] == 4, "expected the 4-byte checksum field after the options"
    chunks += [_U32.pack(len(options)), options]
    checksum = 0
    for chunk in chunks:
        checksum = murmur3_32(chunk, checksum)
    head = blob[: 4 + _U32.unpack_from(blob, 0)[0]]
    return head + b"".join(chunks) + _U32.pack(4) + _U32.pack(checksum) + rest[8:]
