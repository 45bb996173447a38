"""CRC-32C (Castagnoli) and TFRecord's masked form, for the 8-byte length headers.

TFRecord frames each record as: length (uint64 little-endian), the masked
CRC-32C of those 8 bytes (uint32), the payload, the payload's masked CRC-32C.
The mask is `((crc >> 15) | (crc << 17)) + 0xa282ead8` modulo 2**32. Index
building checks only the headers' CRCs here (12 bytes a record); the
payloads' CRCs are checked by TensorFlow's reader when a record is read.
"""

__all__ = ["crc32c", "masked_crc32c"]

_POLYNOMIAL = 0x82F63B78  # CRC-32C, reflected
_MASK_DELTA = 0xA282EAD8


def _table():
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (_POLYNOMIAL if crc & 1 else 0)
        table.append(crc)
    return tuple(table)


_TABLE = _table()


def crc32c(data):
    """The CRC-32C of `data` (bytes), an int in [0, 2**32)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data):
    """TFRecord's masked CRC-32C of `data`."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF
