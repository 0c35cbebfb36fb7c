"""Read a CTranslate2 `model.bin` with numpy alone.

Layout (little-endian), as CTranslate2 writes it (binary versions 4 to 6):

    u32 version | str spec_name | u32 spec_revision          (name/revision from version 2)
    u32 n_variables, then per variable:
        str name | u8 rank | u32 dims[rank] | u8 dtype | u32 n_bytes | n_bytes of data
    u32 n_aliases, then per alias: str alias | str target    (from version 3)

where `str` is a u16 byte count (including a trailing NUL) and the bytes. Every
count is checked against the bytes left in the file before it is trusted, so a
truncated or corrupted file is a `ModelError` naming the offset, never a huge
allocation or a numpy reshape error.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge_agent.errors import ModelError

_DTYPES: dict[int, np.dtype[np.generic]] = {
    0: np.dtype(np.float32),
    1: np.dtype(np.int8),
    2: np.dtype(np.int16),
    3: np.dtype(np.int32),
    4: np.dtype(np.float16),
}
"""CTranslate2's DataType enum; bfloat16 (5) is not produced by the converters we read."""

_VERSIONS = range(4, 7)
_MAX_RANK = 8


@dataclass(frozen=True)
class Ct2Model:
    """Every named array of a CTranslate2 model, aliases resolved."""

    spec: str
    revision: int
    variables: dict[str, np.ndarray]

    def get(self, name: str) -> np.ndarray:
        try:
            return self.variables[name]
        except KeyError:
            raise ModelError(f"CTranslate2 model ({self.spec}) has no variable {name!r}") from None

    def scalar(self, name: str) -> int:
        return int(self.get(name).reshape(-1)[0])


class _Reader:
    def __init__(self, data: memoryview, path: Path) -> None:
        self.data = data
        self.pos = 0
        self.path = path

    def fail(self, what: str) -> ModelError:
        return ModelError(f"{self.path}: not a valid CTranslate2 model.bin ({what} at byte {self.pos})")

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise self.fail(f"truncated: {what} needs {n} bytes, {len(self.data) - self.pos} left")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def unpack(self, fmt: str, what: str) -> tuple[int, ...]:
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt), what))

    def u8(self, what: str) -> int:
        return self.unpack("B", what)[0]

    def u16(self, what: str) -> int:
        return self.unpack("H", what)[0]

    def u32(self, what: str) -> int:
        return self.unpack("I", what)[0]

    def string(self, what: str) -> str:
        raw = bytes(self.take(self.u16(what), what))
        if not raw.endswith(b"\0"):
            raise self.fail(f"{what} is not NUL-terminated")
        try:
            return raw[:-1].decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8") from None


def read_ct2(path: Path) -> Ct2Model:
    """Parse `path` (a CTranslate2 model.bin); arrays are read-only views of the file's bytes."""
    try:
        data = memoryview(path.read_bytes())
    except OSError as exc:
        raise ModelError(f"{path}: cannot read ({exc.strerror or exc})") from None
    r = _Reader(data, path)
    version = r.u32("version")
    if version not in _VERSIONS:
        raise r.fail(f"binary version {version} (supported: {_VERSIONS.start}..{_VERSIONS.stop - 1})")
    spec = r.string("spec name")
    revision = r.u32("spec revision")
    count = r.u32("variable count")
    variables: dict[str, np.ndarray] = {}
    for _ in range(count):
        name = r.string("variable name")
        rank = r.u8(f"{name} rank")
        if rank > _MAX_RANK:
            raise r.fail(f"{name} has rank {rank}")
        dims = r.unpack("I" * rank, f"{name} dims")
        code = r.u8(f"{name} dtype")
        if code not in _DTYPES:
            raise r.fail(f"{name} has unknown dtype id {code}")
        dtype = _DTYPES[code]
        n_bytes = r.u32(f"{name} byte count")
        expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
        if n_bytes != expected:
            raise r.fail(f"{name}: {n_bytes} bytes for shape {dims} of {dtype}")
        raw = r.take(n_bytes, f"{name} data")
        variables[name] = np.frombuffer(raw, dtype=dtype).reshape(dims)
    if version >= 3:
        for _ in range(r.u32("alias count")):
            alias = r.string("alias")
            target = r.string("alias target")
            if target not in variables:
                raise r.fail(f"alias {alias} points at missing {target}")
            variables[alias] = variables[target]
    if r.pos != len(data):
        raise r.fail(f"{len(data) - r.pos} unexpected trailing bytes")
    return Ct2Model(spec, revision, variables)
