"""Hostile and damaged inputs of the engine's own HDF5 reader (data/hdf5_reader.h), through
token shards and checkpoint rank files (see hostile.py for the harness).

Files outside the reader's subset are written with h5py; damage inside the subset is
made by editing the bytes of a version 2 object header and sealing it again with HDF5's
checksum, so that the reader's structural check, not the checksum, is what refuses it.
"""
import struct

import h5py

from cases_checkpoint import _step_dir
from cases_data import _damage_shard
from hostile import Case, h5py_file

MASK = 0xFFFFFFFF
DATASPACE = 0x01
LAYOUT = 0x08
CONTINUATION = 0x10


def _rotate(x, k):
    return ((x << k) | (x >> (32 - k))) & MASK


def _checksum(data):
    """HDF5's metadata checksum: Bob Jenkins' lookup3 hashlittle with initial value 0."""
    a = b = c = (0xDEADBEEF + len(data)) & MASK
    rest = bytes(data)
    while len(rest) > 12:
        x, y, z = struct.unpack("<3I", rest[:12])
        a, b, c = (a + x) & MASK, (b + y) & MASK, (c + z) & MASK
        for shift_a, shift_b, shift_c in ((4, 6, 8), (16, 19, 4)):
            a = ((a - c) & MASK) ^ _rotate(c, shift_a)
            c = (c + b) & MASK
            b = ((b - a) & MASK) ^ _rotate(a, shift_b)
            a = (a + c) & MASK
            c = ((c - b) & MASK) ^ _rotate(b, shift_c)
            b = (b + a) & MASK
        rest = rest[12:]
    if not rest:
        return c
    x, y, z = struct.unpack("<3I", rest.ljust(12, b"\0"))
    a, b, c = (a + x) & MASK, (b + y) & MASK, (c + z) & MASK
    c = ((c ^ b) - _rotate(b, 14)) & MASK
    a = ((a ^ c) - _rotate(c, 11)) & MASK
    b = ((b ^ a) - _rotate(a, 25)) & MASK
    c = ((c ^ b) - _rotate(b, 16)) & MASK
    a = ((a ^ c) - _rotate(c, 4)) & MASK
    b = ((b ^ a) - _rotate(a, 14)) & MASK
    c = ((c ^ b) - _rotate(b, 24)) & MASK
    return c


def _first_chunk(data, address):
    """(start, end) of the messages in the first chunk of the version 2 object header at
    `address`; its checksum follows at `end`."""
    assert data[address:address + 4] == b"OHDR" and data[address + 4] == 2
    flags = data[address + 5]
    pos = address + 6 + (16 if flags & 0x20 else 0) + (4 if flags & 0x10 else 0)
    width = 1 << (flags & 3)
    size = int.from_bytes(data[pos:pos + width], "little")
    return pos + width, pos + width + size


def _message(data, address, message_type):
    """Offset of the body of the first message of `message_type` in the first chunk of the
    object header at `address`."""
    start, end = _first_chunk(data, address)
    envelope = 6 if data[address + 5] & 0x04 else 4
    pos = start
    while end - pos >= envelope:
        kind, size = data[pos], int.from_bytes(data[pos + 1:pos + 3], "little")
        if kind == message_type:
            return pos + envelope
        pos += envelope + size
    raise AssertionError(f"no message {message_type} in the header at {address}")


def _seal(data, address):
    """Writes the checksum of the first chunk of the object header at `address`."""
    _, end = _first_chunk(data, address)
    data[end:end + 4] = struct.pack("<I", _checksum(data[address:end]))


def _root_address(data):
    return struct.unpack_from("<Q", data, 36)[0]  # superblock version 2 or 3


def _address_of(path, name):
    with h5py.File(path, "r") as f:
        return h5py.h5o.get_info(f[name].id).addr


def _edit_bytes(path, edit):
    data = bytearray(path.read_bytes())
    edit(data, path)
    path.write_bytes(bytes(data))


def _shard_bytes(edit):
    return _damage_shard(lambda shard, tmp: _edit_bytes(shard, edit))


def _flip_in_root_header(data, path):
    start, end = _first_chunk(data, _root_address(data))
    data[(start + end) // 2] ^= 0x01


def _root_continuation_to(target):
    def edit(data, path):
        at = _message(data, _root_address(data), CONTINUATION)
        data[at:at + 8] = struct.pack("<Q", target(data))
        _seal(data, _root_address(data))
    return edit


def _tokens_data_past_end(data, path):
    tokens = _address_of(path, "tokens")
    at = _message(data, tokens, LAYOUT) + 2  # version, class, then the data's address
    data[at:at + 8] = struct.pack("<Q", len(data) - 100)
    _seal(data, tokens)


def _tokens_extent_overflows(data, path):
    tokens = _address_of(path, "tokens")
    at = _message(data, tokens, DATASPACE)
    assert data[at] == 2  # version 2: version, rank, flags, type, then the extents
    data[at + 4:at + 12] = struct.pack("<Q", 1 << 62)
    _seal(data, tokens)


def _tokens_soft_link(shard, tmp):
    with h5py_file(shard, "r+") as f:
        f.move("tokens", "stream")
        f["tokens"] = h5py.SoftLink("/stream")


def _nine_root_attributes(shard, tmp):
    """The shard as h5py writes it (its root keeps 8 attributes in its header, more in a
    heap) with root attributes added up to nine."""
    _rewrite_shard(("v108", "v108"))(shard, tmp)
    with h5py_file(shard, "r+") as f:
        for i in range(9 - len(f.attrs)):
            f.attrs[f"note_{i}"] = i


def _truncate(shard, tmp):
    shard.write_bytes(shard.read_bytes()[:shard.stat().st_size // 2])


def _rewrite_shard(libver, **tokens_options):
    """The shard written again by h5py with `libver` and /tokens created with
    `tokens_options`, holding the same tokens, offsets and attributes."""
    def damage(shard, tmp):
        with h5py.File(shard, "r") as f:
            tokens, offsets, attrs = f["tokens"][:], f["doc_offsets"][:], dict(f.attrs)
        with h5py_file(shard, "w", libver) as f:
            f.create_dataset("tokens", data=tokens, **tokens_options)
            f.create_dataset("doc_offsets", data=offsets)
            f.attrs.update(attrs)
    return damage


def _inspect_rank_file(damage):
    """`inspect` of the newest checkpoint of a run copy whose rank_0.h5 went through
    damage(path)."""
    def make(world, tmp):
        step = _step_dir(world.run_dir(tmp), 2)
        damage(step / "rank_0.h5")
        return ["inspect", str(step)]
    return make


def _rewrite_rank_file(libver):
    """The rank file written again by h5py with `libver` and h5py's own group settings
    (links kept in the group's header up to 8 members, in a heap beyond), holding the same
    datasets."""
    def damage(path):
        datasets = {}
        with h5py.File(path, "r") as f:
            f.visititems(lambda name, obj: datasets.update(
                {name: obj[()]} if isinstance(obj, h5py.Dataset) else {}))
        with h5py_file(path, "w", libver) as f:
            for name, values in datasets.items():
                f.create_dataset(name, data=values)
    return damage


def _norm_as(dtype):
    """param/model.norm.weight written again with its values as `dtype`."""
    def damage(path):
        with h5py_file(path, "r+") as f:
            values = f["param/model.norm.weight"][:]
            del f["param/model.norm.weight"]
            f.create_dataset("param/model.norm.weight", data=values.astype(dtype))
    return damage


CASES = [
    Case("hdf5-shard-superblock-0", "dataset shard",
         "written again by h5py with its default libver (superblock 0, the layout of "
         "format 2 and older shards)",
         _damage_shard(_rewrite_shard("earliest")),
         "HDF5 superblock version 0, which the engine does not read"),
    Case("hdf5-shard-chunked-tokens", "dataset shard",
         "/tokens written again by h5py (libver v108) in chunks",
         _damage_shard(_rewrite_shard(("v108", "v108"), chunks=(1024,))),
         "/tokens: is stored in chunks; the engine reads contiguous datasets"),
    Case("hdf5-shard-deflate-tokens", "dataset shard",
         "/tokens written again by h5py (libver v108) gzip-compressed",
         _damage_shard(_rewrite_shard(("v108", "v108"), compression="gzip")),
         "/tokens: uses HDF5 filters, which the engine does not read"),
    Case("hdf5-shard-header-checksum", "dataset shard",
         "one bit flipped inside the root group's object header, index sha256 updated",
         _shard_bytes(_flip_in_root_header),
         ": /: damaged HDF5 object header (checksum mismatch)"),
    Case("hdf5-shard-continuation-loop", "dataset shard",
         "the root header's continuation points back at the root header (a loop), "
         "checksum sealed",
         _shard_bytes(_root_continuation_to(_root_address)),
         ": /: damaged HDF5 object header (too many or repeated chunks)"),
    Case("hdf5-shard-continuation-past-end", "dataset shard",
         "the root header's continuation points at byte 2^40, checksum sealed",
         _shard_bytes(_root_continuation_to(lambda data: 1 << 40)),
         ": /: damaged HDF5 object header (a chunk outside the file)"),
    Case("hdf5-shard-extent-overflow", "dataset shard",
         "/tokens' dataspace says 2^62 elements (2^63 bytes overflow int64), checksum sealed",
         _shard_bytes(_tokens_extent_overflows),
         "/tokens: damaged HDF5 dataspace (its byte size overflows)"),
    Case("hdf5-shard-soft-link", "dataset shard",
         "/tokens a soft link to the real dataset, moved to /stream",
         _damage_shard(_tokens_soft_link), "/tokens: is a soft link, which the engine refuses"),
    Case("hdf5-shard-dense-attributes", "dataset shard",
         "written again by h5py (libver v108) with nine root attributes, more than h5py "
         "keeps in the header: they live in a heap (dense storage)",
         _damage_shard(_nine_root_attributes),
         ": /: keeps its attributes in dense storage, which the engine does not read"),
    Case("hdf5-shard-data-past-end", "dataset shard",
         "/tokens' contiguous data moved to 100 bytes before the end of the file, "
         "checksum sealed",
         _shard_bytes(_tokens_data_past_end), "bytes of data are not inside the file"),
    Case("hdf5-shard-truncated", "dataset shard",
         "cut to half its size, index size and sha256 updated",
         _damage_shard(_truncate), "truncated: its superblock records"),
    Case("hdf5-ckpt-dense-links", "checkpoint rank file",
         "written again by h5py (libver v108) with h5py's group settings: param/ holds "
         "more than 8 links, so they live in a heap (dense storage)",
         _inspect_rank_file(_rewrite_rank_file(("v108", "v108"))),
         ": /param: keeps its links in dense storage, which the engine does not read"),
    Case("hdf5-ckpt-big-endian", "checkpoint rank file",
         "param/model.norm.weight written again as big-endian float32",
         _inspect_rank_file(_norm_as(">f4")),
         "/param/model.norm.weight: is a float of 4 bytes that is not little-endian IEEE 754"),
    Case("hdf5-ckpt-float64", "checkpoint rank file",
         "param/model.norm.weight written again as float64 (the engine saves float32)",
         _inspect_rank_file(_norm_as("<f8")),
         "dataset param/model.norm.weight does not hold 32-bit floats"),
    Case("hdf5-ckpt-old-format-rank-file", "checkpoint rank file",
         "written again in the previous format's layout (h5py defaults, superblock 0) "
         "under a format 2 manifest",
         _inspect_rank_file(_rewrite_rank_file("earliest")),
         "HDF5 superblock version 0, which the engine does not read"),
]
