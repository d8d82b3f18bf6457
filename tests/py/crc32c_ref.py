"""crc32c_ref.py - CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) in
plain Python, for the tests, the fixture generators and the independent
checkers: the zarr v3 crc32c codec, the sharding_indexed index checksum and
the OCDBT manifest/b-tree node checksum all use it.  Slow (a byte at a time),
meant for test-sized data.

    from crc32c_ref import crc32c
    crc32c(b"123456789") == 0xE3069283
"""

_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _TABLE.append(_c)


def crc32c(data):
    """CRC-32C of a bytes-like object, as an unsigned 32-bit int."""
    c = 0xFFFFFFFF
    t = _TABLE
    for b in data:
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF
