"""Hostile and damaged inputs of the checkpoint readers (see hostile.py for the harness).

Each case damages a copy of the tiny run (checkpoints step_1 and step_2, `latest`
naming step_2) and asks `train` to resume it with train.steps raised to 3 (and
--extend-schedule, which allows that), or `inspect` to read it. Manifests are edited with a small protobuf wire codec over
checkpoint/manifest.proto's field numbers.
"""
import os
import struct

from hostile import Case, h5py_file
from sy_testing import TINY_RECIPE

# manifest.proto field numbers.
MANIFEST_FORMAT_VERSION = 1
MANIFEST_SLICES = 6
MANIFEST_ELAPSED_S = 7
MANIFEST_LR_RESTART = 8
LR_RESTART_FROM_STEP = 1
LR_RESTART_FROM_LR = 2
SLICE_GLOBAL_SHAPE = 2
SLICE_FIRST_ROW = 5
SLICE_ROWS = 6
SLICE_FILE = 7


def _varint(value):
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _read_varint(data, i):
    value, shift = 0, 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def _decode(data):
    """[field, wire type, value] of a message: ints for varints, bytes otherwise."""
    fields, i = [], 0
    while i < len(data):
        key, i = _read_varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _read_varint(data, i)
        elif wire == 2:
            length, i = _read_varint(data, i)
            value, i = data[i:i + length], i + length
        elif wire == 1:
            value, i = data[i:i + 8], i + 8
        else:
            value, i = data[i:i + 4], i + 4
        fields.append([number, wire, value])
    return fields


def _encode(fields):
    out = bytearray()
    for number, wire, value in fields:
        out += _varint(number << 3 | wire)
        if wire == 0:
            out += _varint(value)
        elif wire == 2:
            out += _varint(len(value)) + value
        else:
            out += value
    return bytes(out)


def _packed(values):
    return b"".join(_varint(v) for v in values)


def _unpacked(data):
    values, i = [], 0
    while i < len(data):
        value, i = _read_varint(data, i)
        values.append(value)
    return values


def _slice_get(slice_fields, number):
    return next((f[2] for f in slice_fields if f[0] == number), None)


def _slice_set(slice_fields, number, wire, value):
    slice_fields[:] = [f for f in slice_fields if f[0] != number] + [[number, wire, value]]


def _step_dir(run, step):
    return run / "checkpoints" / f"step_{step}"


def _edit_manifest_in_place(run, edit):
    """Passes the newest manifest of `run` through edit(manifest fields, slices)."""
    path = _step_dir(run, 2) / "manifest.pb"
    fields = _decode(path.read_bytes())
    slices = [_decode(f[2]) for f in fields if f[0] == MANIFEST_SLICES]
    fields = [f for f in fields if f[0] != MANIFEST_SLICES]
    slices = edit(fields, slices) or slices
    path.write_bytes(_encode(fields + [[MANIFEST_SLICES, 2, _encode(s)] for s in slices]))


def _edit_manifest(world, tmp, edit):
    """A run copy whose newest manifest went through `edit`."""
    run = world.run_dir(tmp)
    _edit_manifest_in_place(run, edit)
    return run


def _first_matrix(slices):
    """The first slice of a tensor with at least two rows."""
    return next(s for s in slices if _unpacked(_slice_get(s, SLICE_GLOBAL_SHAPE))[0] >= 2)


def _resume(world, run, *extra):
    return world.train_args(TINY_RECIPE, run, "--set", "train.steps=3", "--extend-schedule",
                            *extra)


def _train_after(edit):
    def make(world, tmp):
        return _resume(world, _edit_manifest(world, tmp, edit))
    return make


def _inspect_after(edit):
    def make(world, tmp):
        return ["inspect", str(_step_dir(_edit_manifest(world, tmp, edit), 2))]
    return make


def _set_version(fields, slices):
    fields[:] = [f for f in fields if f[0] != MANIFEST_FORMAT_VERSION]
    fields.append([MANIFEST_FORMAT_VERSION, 0, 1])


def _set_file(name):
    def edit(fields, slices):
        _slice_set(slices[0], SLICE_FILE, 2, name.encode())
    return edit


def _symlinked_file(fields, slices):
    _slice_set(slices[0], SLICE_FILE, 2, b"outside.h5")


def _duplicate_slice(fields, slices):
    return slices + [list(map(list, slices[0]))]


def _gap(fields, slices):
    s = _first_matrix(slices)
    _slice_set(s, SLICE_FIRST_ROW, 0, 1)
    _slice_set(s, SLICE_ROWS, 0, _slice_get(s, SLICE_ROWS) - 1)


def _overflowing_shape(fields, slices):
    s = slices[0]
    _slice_set(s, SLICE_GLOBAL_SHAPE, 2, _packed([1 << 40, 1 << 40, 1 << 40]))


def _rows_beyond(fields, slices):
    s = slices[0]
    _slice_set(s, SLICE_ROWS, 0, _unpacked(_slice_get(s, SLICE_GLOBAL_SHAPE))[0] + 5)


def _set_elapsed(seconds):
    def edit(fields, slices):
        fields.append([MANIFEST_ELAPSED_S, 1, struct.pack("<d", seconds)])
    return edit


def _set_lr_restart(from_step, from_lr):
    def edit(fields, slices):
        restart = [[LR_RESTART_FROM_STEP, 0, from_step],
                   [LR_RESTART_FROM_LR, 1, struct.pack("<d", from_lr)]]
        fields.append([MANIFEST_LR_RESTART, 2, _encode(restart)])
    return edit


def _write_manifest(data):
    def make(world, tmp):
        run = world.run_dir(tmp)
        (_step_dir(run, 2) / "manifest.pb").write_bytes(data(_step_dir(run, 2) / "manifest.pb"))
        return _resume(world, run)
    return make


def _huge_manifest(world, tmp):
    run = world.run_dir(tmp)
    with open(_step_dir(run, 2) / "manifest.pb", "wb") as f:
        f.truncate(200 << 20)
    return ["inspect", str(_step_dir(run, 2))]


def _slice_symlink_out(world, tmp):
    run = world.run_dir(tmp)
    outside = tmp / "outside.h5"
    outside.write_bytes((_step_dir(run, 2) / "rank_0.h5").read_bytes())
    os.symlink(outside, _step_dir(run, 2) / "outside.h5")
    _edit_manifest_in_place(run, _symlinked_file)
    return _resume(world, run)


def _latest(text):
    def make(world, tmp):
        run = world.run_dir(tmp)
        (run / "checkpoints" / "latest").write_text(text)
        return _resume(world, run)
    return make


def _latest_fifo(world, tmp):
    run = world.run_dir(tmp)
    os.remove(run / "checkpoints" / "latest")
    os.mkfifo(run / "checkpoints" / "latest")
    return _resume(world, run)


def _latest_missing(world, tmp):
    run = world.run_dir(tmp)
    os.remove(run / "checkpoints" / "latest")
    (_step_dir(run, 2) / "manifest.pb").write_bytes(b"\xff" * 64)
    return _resume(world, run)


def _latest_symlink_out(world, tmp):
    run = world.run_dir(tmp)
    elsewhere = tmp / "elsewhere"
    os.rename(_step_dir(run, 2), elsewhere)
    os.symlink(elsewhere, _step_dir(run, 2))
    return _resume(world, run)


def _flip_slice_bit(world, tmp):
    import h5py
    run = world.run_dir(tmp)
    path = _step_dir(run, 2) / "rank_0.h5"
    with h5py.File(path, "r") as f:
        offset = f["param/model.norm.weight"].id.get_offset()
    data = bytearray(path.read_bytes())
    data[offset + 5] ^= 0x10
    path.write_bytes(bytes(data))
    return _resume(world, run)


def _split_slice(fields, slices):
    """A tensor's one slice listed as two halves that both name its whole dataset."""
    s = _first_matrix(slices)
    rows = _slice_get(s, SLICE_ROWS)
    second = list(map(list, s))
    _slice_set(s, SLICE_ROWS, 0, rows // 2)
    _slice_set(second, SLICE_FIRST_ROW, 0, rows // 2)
    _slice_set(second, SLICE_ROWS, 0, rows - rows // 2)
    return slices + [second]


def _external_storage(world, tmp):
    import numpy as np
    run = world.run_dir(tmp)
    outside = tmp / "outside.bin"
    outside.write_bytes(bytes(128 * 4))
    with h5py_file(_step_dir(run, 2) / "rank_0.h5", "r+") as f:
        del f["param/model.norm.weight"]
        f.create_dataset("param/model.norm.weight", shape=(128,), dtype=np.float32,
                         external=[(str(outside), 0, 128 * 4)])
    return ["inspect", str(_step_dir(run, 2))]


def _missing_rank_file(world, tmp):
    run = world.run_dir(tmp)
    os.remove(_step_dir(run, 2) / "rank_0.h5")
    return _resume(world, run)


def _resume_from_nothing(world, tmp):
    run = world.run_dir(tmp)
    return _resume(world, run, "--resume-from", str(tmp / "nowhere"))


def _metrics(write):
    def make(world, tmp):
        run = world.run_dir(tmp)
        with open(run / "metrics.jsonl", "wb") as f:
            write(f)
        return _resume(world, run)
    return make


def _huge_metrics_line(f):
    f.truncate(200 << 20)
    f.seek(200 << 20)
    f.write(b"\n")


CASES = [
    Case("ckpt-manifest-truncated", "checkpoint manifest", "cut to its first 100 bytes",
         _write_manifest(lambda p: p.read_bytes()[:100]), "manifest.pb"),
    Case("ckpt-manifest-garbage", "checkpoint manifest", "4 KB of 0xff bytes",
         _write_manifest(lambda p: b"\xff" * 4096), "manifest.pb: not a valid manifest"),
    Case("ckpt-manifest-oversized", "checkpoint manifest", "a 200 MB sparse file (inspect)",
         _huge_manifest, "allowed"),
    Case("ckpt-manifest-version", "checkpoint manifest", "format_version 1 (an older layout)",
         _train_after(_set_version), "field format_version is 1, expected 2"),
    Case("ckpt-manifest-elapsed-nan", "checkpoint manifest", "elapsed_s NaN",
         _train_after(_set_elapsed(float("nan"))), "field elapsed_s is nan"),
    Case("ckpt-manifest-lr-restart-beyond-step", "checkpoint manifest",
         "lr_restart.from_step 99, past the checkpoint's step 2",
         _train_after(_set_lr_restart(99, 1e-3)), "field lr_restart.from_step is 99"),
    Case("ckpt-manifest-lr-restart-huge-rate", "checkpoint manifest",
         "lr_restart.from_lr 1e30 (the rate every later step would decay from)",
         _train_after(_set_lr_restart(1, 1e30)), "field lr_restart.from_lr is 1e+30"),
    Case("ckpt-slice-parent-path", "checkpoint manifest", 'a slice file "../../x"',
         _train_after(_set_file("../../x")), "field slices[0].file"),
    Case("ckpt-slice-control-bytes", "checkpoint manifest",
         "a slice file name with a newline and a terminal escape sequence",
         _train_after(_set_file("rank_0.h5\n\x1b[31mforged line")),
         "rank_0.h5\\x0a\\x1b[31mforged line"),
    Case("ckpt-slice-absolute-path", "checkpoint manifest", 'a slice file "/etc/passwd"',
         _train_after(_set_file("/etc/passwd")), "field slices[0].file"),
    Case("ckpt-slice-symlink-out", "checkpoint manifest",
         "a slice file that is a symlink to a rank file outside the checkpoint",
         _slice_symlink_out, "leads outside"),
    Case("ckpt-slices-overlap", "checkpoint manifest",
         "a tensor's slice listed twice (row counts still add up to more, not less)",
         _train_after(_duplicate_slice), "overlaps"),
    Case("ckpt-slices-gap", "checkpoint manifest", "a slice starting at row 1 (row 0 in none)",
         _inspect_after(_gap), "gap"),
    Case("ckpt-shape-overflow", "checkpoint manifest",
         "global_shape [2^40, 2^40, 2^40] (byte size overflows int64)",
         _train_after(_overflowing_shape), "overflows"),
    Case("ckpt-rows-beyond-shape", "checkpoint manifest", "rows = dimension 0 + 5",
         _inspect_after(_rows_beyond), "field slices[0].rows"),
    Case("ckpt-slice-dataset-shape", "checkpoint rank file",
         "a dataset of [1024, 128] where the manifest's two slices say [512, 128] each",
         _inspect_after(_split_slice), "the manifest says [512, 128]"),
    Case("ckpt-slice-external-storage", "checkpoint rank file",
         "a slice's dataset keeps its data in a file outside the checkpoint (HDF5 external storage)",
         _external_storage, "keeps its data in external files"),
    Case("ckpt-latest-parent-path", "checkpoints/latest", 'holds "../x"',
         _latest("../x\n"), "does not hold exactly one line step_<N>"),
    Case("ckpt-latest-missing-step", "checkpoints/latest", 'names step_7, which does not exist',
         _latest("step_7\n"), "names step_7, which is not a directory"),
    Case("ckpt-latest-fifo", "checkpoints/latest", "a FIFO (would block a reader)",
         _latest_fifo, "is not a regular file"),
    Case("ckpt-latest-symlink-out", "checkpoints/latest",
         "names step_2, a symlink to a checkpoint outside the run", _latest_symlink_out,
         "leads outside"),
    Case("ckpt-latest-missing", "checkpoints/latest",
         "removed, and the newest step directory damaged (no silent fresh start)",
         _latest_missing,
         "--resume-from"),
    Case("ckpt-rank-file-bitflip", "checkpoint rank file",
         "one bit flipped in a slice of the newest checkpoint", _flip_slice_bit,
         "checkpoints/step_1: resume from it with `switchyard train ... --resume-from"),
    Case("ckpt-rank-file-missing", "checkpoint rank file", "the newest checkpoint's rank_0.h5 removed",
         _missing_rank_file, "checkpoints/step_1: resume from it"),
    Case("ckpt-resume-from-missing", "--resume-from", "names a directory that does not exist",
         _resume_from_nothing, "not a checkpoint"),
    Case("ckpt-metrics-huge-line", "metrics.jsonl (resume)", "one 200 MB line",
         _metrics(_huge_metrics_line), "line 1 is longer than 65536 bytes"),
    Case("ckpt-metrics-wrong-type", "metrics.jsonl (resume)", 'a line {"step": "two"}',
         _metrics(lambda f: f.write(b'{"step": 1}\n{"step": "two"}\n')),
         "line 2 field step must be a non-negative integer"),
    Case("ckpt-metrics-not-object", "metrics.jsonl (resume)", "a line [1, 2]",
         _metrics(lambda f: f.write(b"[1, 2]\n")), "line 1 is not a JSON object"),
]
