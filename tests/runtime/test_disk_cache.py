"""The disk cache: a second process loads compiled kernels instead of optimising and compiling them; entries
are data files written atomically, survive corruption and concurrent writers, and PREPJIT_CACHE=0 turns it
off. It is a trust boundary: forged, FIFO, symlinked, oversized or foreign entries are never executed or
waited on, and a directory others can write is refused with a warning."""
import hashlib
import json
import os
import pickle
import shutil
import stat
import subprocess
import sys
import threading
import warnings

import numpy as np
import pytest

import prepjit as pj
from prepjit.runtime import datafile, disk_cache
from prepjit.runtime.devices import get_device
from prepjit.uop import Ops, UOp, dtypes

# prepares a function of a few kernels (matmul, reductions, a var-sized slice), runs it on two shapes and
# prints its stats, how many kernels it optimised and its largest error against NumPy as JSON
SCRIPT = """
import json, sys
import numpy as np
import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen.targets import Target

optimized = []  # every kernel a target's passes were run on (what the proof and the renderer start from)
run_passes = Target.run_passes
Target.run_passes = lambda self, ast, *a, **k: optimized.append(ast) or run_passes(self, ast, *a, **k)

@pj.prepare(vars={"n": (1, 64), "pos": (0, 15)}, shapes={"x": ("n", 16)}, device=sys.argv[1])
def layer(x, w, pos):
    h = pnp.tanh(x @ w)
    e = pnp.exp(h - h.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True))[:, :pos + 1] * 1.75

rng = np.random.default_rng(0)
w = rng.standard_normal((16, 16)).astype(np.float32) / 4
error = 0.0
for n, pos in [(3, 2), (40, 15)]:
    x = rng.standard_normal((n, 16)).astype(np.float32)
    h = np.tanh(x @ w)
    e = np.exp(h - h.max(1, keepdims=True))
    want = (e / e.sum(1, keepdims=True))[:, :pos + 1] * np.float32(1.75)
    error = max(error, float(np.abs(np.asarray(layer(x, w, pos)) - want).max()))
print(json.dumps({"stats": layer.stats, "error": error, "package": pj.__file__, "optimized": len(optimized)}))
"""


def start(device: str, cache_dir, frozen_code, cache: str = "1") -> subprocess.Popen:
    env = {**os.environ, "PREPJIT_CACHE_DIR": str(cache_dir), "PREPJIT_CACHE": cache, "PREPJIT_LOG": "compiles",
           "PYTHONPATH": str(frozen_code)}
    return subprocess.Popen([sys.executable, "-c", SCRIPT, device], env=env, cwd=frozen_code, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen, frozen_code) -> dict:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    result = json.loads(out)
    assert result["error"] < 1e-5
    assert os.path.realpath(result["package"]).startswith(os.path.realpath(frozen_code))
    result["log"] = [line for line in err.splitlines() if line.startswith("prepjit:")]
    return result


def run(device: str, cache_dir, frozen_code, cache: str = "1") -> dict:
    return finish(start(device, cache_dir, frozen_code, cache), frozen_code)


@pytest.fixture(scope="module")
def filled(tmp_path_factory, frozen_code):
    """filled(device, cache_dir): fill `cache_dir` as one process running SCRIPT leaves it and return that
    process's result. The process runs once per device; each test gets its own copy of the directory (modes
    kept), so the tests that start from a filled cache do not each compile the same kernels again."""
    done = {}

    def fill(device: str, cache_dir) -> dict:
        if device not in done:
            first = tmp_path_factory.mktemp(f"filled-{device}")
            done[device] = first, run(device, first, frozen_code)
        first, result = done[device]
        shutil.copytree(first, cache_dir, dirs_exist_ok=True)
        return result
    return fill


def unpacked(key: str, data: bytes) -> tuple[dict, bytes]:
    """(metadata, binary) of a kernel entry's bytes; FormatError unless whole and stored under `key`."""
    return datafile.unpack(data, b"kernel", disk_cache.VERSION, key.encode())


def entries(cache_dir) -> list:
    kernels = cache_dir / "kernels"
    return sorted(kernels.iterdir()) if kernels.exists() else []


def test_second_process_loads_every_kernel_from_disk(device, tmp_path, frozen_code, filled):
    first = filled(device, tmp_path)
    kernels = first["stats"]["compiles"]
    assert kernels >= 3 and first["stats"]["disk_hits"] == 0
    assert len(entries(tmp_path)) == kernels
    assert first["optimized"] >= kernels
    second = run(device, tmp_path, frozen_code)
    assert second["stats"]["compiles"] == 0 and second["stats"]["disk_hits"] == kernels
    assert second["optimized"] == 0  # a hit skips optimisation (by any pass: proofs too), not only compiling
    assert sum("from the disk cache" in line for line in second["log"]) == kernels
    assert not any(line.startswith("prepjit: compile") for line in second["log"])


def test_cache_off_reads_and_writes_nothing(device, tmp_path, frozen_code, filled):
    filled(device, tmp_path)
    written = [p.read_bytes() for p in entries(tmp_path)]
    off = run(device, tmp_path, frozen_code, cache="0")
    assert off["stats"]["disk_hits"] == 0 and off["stats"]["compiles"] == len(written)
    assert [p.read_bytes() for p in entries(tmp_path)] == written
    fresh = tmp_path / "fresh"
    run(device, fresh, frozen_code, cache="0")
    assert not fresh.exists()


def test_corrupt_truncated_and_misplaced_entries_are_rebuilt(device, tmp_path, frozen_code, filled):
    filled(device, tmp_path)
    paths = entries(tmp_path)
    assert len(paths) >= 3
    good = [p.read_bytes() for p in paths]
    paths[0].write_bytes(good[0][:len(good[0]) // 2])                 # truncated
    paths[1].write_bytes(good[1][:-1] + bytes([good[1][-1] ^ 0xFF]))   # one byte of the payload flipped
    paths[2].write_bytes(good[0])                                     # another kernel's intact entry
    for path in paths[3:]:
        path.write_bytes(b"")                                         # empty
    rebuilt = run(device, tmp_path, frozen_code)
    assert rebuilt["stats"]["compiles"] == len(paths) and rebuilt["stats"]["disk_hits"] == 0
    # each entry is its own kernel's again; the binaries are compared by running them (below), not byte for byte:
    # PoCL's program binary holds its own cache's state (work-group functions compiled by earlier launches)
    assert [unpacked(p.name, p.read_bytes())[0] for p in entries(tmp_path)] == \
        [unpacked(p.name, data)[0] for p, data in zip(paths, good)]
    assert run(device, tmp_path, frozen_code)["stats"]["disk_hits"] == len(paths)


def test_concurrent_writers_leave_whole_entries(device, tmp_path, frozen_code):
    writers = [start(device, tmp_path, frozen_code) for _ in range(2)]
    results = [finish(w, frozen_code) for w in writers]
    kernels = max(r["stats"]["compiles"] + r["stats"]["disk_hits"] for r in results)
    assert [p.name for p in (tmp_path / "kernels").iterdir() if p.name.startswith(".")] == []  # no temp files left
    assert len(entries(tmp_path)) == kernels
    reader = run(device, tmp_path, frozen_code)
    assert reader["stats"]["compiles"] == 0 and reader["stats"]["disk_hits"] == kernels


def test_unwritable_cache_dir_is_silently_skipped(monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("PREPJIT_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setenv("PREPJIT_CACHE", "1")
    assert disk_cache.write("0" * 64, FIELDS, b"") is False
    assert disk_cache.read("0" * 64) is None
    f = pj.prepare(lambda x: x * 4.5 + 0.75)  # constants no other test uses: this process compiles the kernel
    np.testing.assert_array_equal(np.asarray(f(np.ones(3, np.float32))), np.full(3, 5.25, np.float32))
    assert f.stats["compiles"] == 1


KEY_SCRIPT = """
import numpy as np, prepjit as pj
from prepjit.runtime import datafile, disk_cache
from prepjit.runtime.devices import get_device
ast = pj.prepare(lambda x: x * 2.5).plan(np.ones(4, np.float32)).kernels[0].ast
print(disk_cache.kernel_key(ast, "cpu", get_device("cpu").compiler_id))
"""


def test_key_is_the_same_in_every_process(frozen_code):
    keys = [subprocess.run([sys.executable, "-c", KEY_SCRIPT], cwd=frozen_code, env={**os.environ, "PYTHONPATH": str(frozen_code)},
                           capture_output=True, text=True, check=True, timeout=120).stdout.strip() for _ in range(2)]
    assert len(keys[0]) == 64 and keys[0] == keys[1]


def test_key_tells_kernels_devices_and_compilers_apart():
    def ast_of(fn):
        return pj.prepare(fn).plan(np.ones(4, np.float32)).kernels[0].ast
    compiler = get_device("cpu").compiler_id
    base = ast_of(lambda x: x * 0.0)
    keys = {disk_cache.kernel_key(base, "cpu", compiler),
            disk_cache.kernel_key(ast_of(lambda x: x * -0.0), "cpu", compiler),
            disk_cache.kernel_key(ast_of(lambda x: x * 0.0 + 1), "cpu", compiler),
            disk_cache.kernel_key(base, "opencl", compiler),
            disk_cache.kernel_key(base, "cpu", compiler + "-other")}
    assert len(keys) == 5 and None not in keys
    assert disk_cache.kernel_key(base, "cpu", compiler) == disk_cache.kernel_key(base, "cpu", compiler)


FIELDS = {"name": "E_1", "source": "; ir", "var_names": ("n",), "global_size": (pj.Var("n", 1, 8).uop * 2,),
          "local_size": (), "ast": UOp(Ops.SINK, dtypes.bool, (), "E_1")}
KEY = "ab" * 32


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """A private, empty cache directory for this test; yields its entries directory."""
    monkeypatch.setenv("PREPJIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PREPJIT_CACHE", "1")
    return tmp_path / "cache" / "kernels"


def test_entries_are_private_data_files(cache):
    assert disk_cache.write(KEY, FIELDS, b"\x7fELF object code")
    assert disk_cache.read(KEY) == (FIELDS, b"\x7fELF object code")
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700 and stat.S_IMODE(cache.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE((cache / KEY).stat().st_mode) == 0o600
    data = (cache / KEY).read_bytes()
    assert data.startswith(b"PREPJIT\0kernel") and b'"name":"E_1"' in data and b"pickle" not in data
    assert disk_cache.read("../" + KEY[3:]) is None and not disk_cache.write("../" + KEY[3:], FIELDS, b"")


@pytest.mark.parametrize("payload", [b"", b"prepjit", os.urandom(200)])
def test_garbage_files_read_as_misses(cache, payload):
    assert disk_cache.write(KEY, FIELDS, b"code")
    assert disk_cache.read(KEY) is not None
    (cache / KEY).write_bytes(payload)
    assert disk_cache.read(KEY) is None


def test_other_version_oversized_and_foreign_entries_are_misses(cache, monkeypatch):
    assert disk_cache.write(KEY, FIELDS, b"code" * 100)
    monkeypatch.setattr(disk_cache, "VERSION", disk_cache.VERSION + 1)
    assert disk_cache.read(KEY) is None
    monkeypatch.undo()
    monkeypatch.setenv("PREPJIT_CACHE_DIR", str(cache.parent))
    monkeypatch.setenv("PREPJIT_CACHE", "1")
    assert disk_cache.read(KEY) is not None
    monkeypatch.setattr(disk_cache, "MAX_ENTRY_BYTES", 100)
    assert disk_cache.read(KEY) is None
    monkeypatch.setattr(disk_cache, "MAX_ENTRY_BYTES", 1 << 20)
    if os.geteuid() == 0:  # root can hand the entry to another user
        os.chown(cache / KEY, 65534, 65534)
        assert disk_cache.read(KEY) is None


class Payload:
    """Unpickling this runs a shell command, as a forged pickle entry would."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def test_forged_pickle_entries_are_never_executed(device, tmp_path, frozen_code, filled):
    filled(device, tmp_path)
    marker = tmp_path / "executed"
    evil = pickle.dumps(Payload(f"touch {marker}"))
    paths = entries(tmp_path)
    for i, path in enumerate(paths):
        key = path.name.encode()
        old_format = b"prepjit-kernel-cache-v1\n" + hashlib.sha256(key + b"\0" + evil).digest() + evil
        path.write_bytes([old_format, evil][i % 2])
    rebuilt = run(device, tmp_path, frozen_code)
    assert not marker.exists()
    assert rebuilt["stats"]["compiles"] == len(paths) and rebuilt["stats"]["disk_hits"] == 0
    assert all(p.read_bytes().startswith(b"PREPJIT\0kernel") for p in entries(tmp_path))
    assert run(device, tmp_path, frozen_code)["stats"]["disk_hits"] == len(paths)


def test_fifo_and_symlink_entries_are_skipped_without_blocking(device, tmp_path, frozen_code, filled):
    filled(device, tmp_path)
    paths = entries(tmp_path)
    for i, path in enumerate(paths):
        path.unlink()
        if i % 2:
            os.symlink("/dev/zero", path)
        else:
            os.mkfifo(path)
    rebuilt = run(device, tmp_path, frozen_code)  # communicate() times out if a read blocks on the FIFO
    assert rebuilt["stats"]["compiles"] == len(paths) and rebuilt["stats"]["disk_hits"] == 0
    assert all(stat.S_ISREG(p.lstat().st_mode) for p in entries(tmp_path))  # each bad entry was replaced
    assert run(device, tmp_path, frozen_code)["stats"]["disk_hits"] == len(paths)


def test_fifo_read_returns_at_once(cache):
    assert disk_cache.write(KEY, FIELDS, b"code")
    (cache / KEY).unlink()
    os.mkfifo(cache / KEY)
    result = []
    reader = threading.Thread(target=lambda: result.append(disk_cache.read(KEY)), daemon=True)
    reader.start()
    reader.join(10)
    assert result == [None]


def test_symlinked_entry_is_a_miss(cache, tmp_path):
    assert disk_cache.write(KEY, FIELDS, b"code")
    other = "cd" * 32
    os.symlink(cache / KEY, cache / other)  # even a link to a good entry: entries are regular files only
    assert disk_cache.read(other) is None
    (cache / KEY).unlink()
    os.symlink("/dev/zero", cache / KEY)
    assert disk_cache.read(KEY) is None


@pytest.mark.parametrize("where", ["root", "kernels"])
def test_directory_others_can_write_is_refused_with_one_warning(cache, where):
    assert disk_cache.write(KEY, FIELDS, b"code")
    os.chmod(cache.parent if where == "root" else cache, 0o777)
    with pytest.warns(RuntimeWarning, match="writable by group or others"):
        assert disk_cache.read(KEY) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once: later uses are silent
        assert disk_cache.read(KEY) is None and not disk_cache.write(KEY, FIELDS, b"other")
        scale = {"root": 6.5, "kernels": 7.5}[where]  # constants no other test uses: this process compiles it
        f = pj.prepare(lambda x: x * scale - 0.375)
        np.testing.assert_array_equal(np.asarray(f(np.ones(3, np.float32))), np.full(3, scale - 0.375, np.float32))
    assert f.stats["compiles"] == 1 and f.stats["disk_hits"] == 0
    assert os.listdir(cache) == [KEY]  # nothing written into the refused directory


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the directory to another user")
def test_directory_of_another_user_is_refused(cache):
    assert disk_cache.write(KEY, FIELDS, b"code")
    os.chown(cache, 65534, 65534)
    with pytest.warns(RuntimeWarning, match="not owned by this user"):
        assert disk_cache.read(KEY) is None


def test_records_of_other_kinds_share_the_rules_but_not_the_store(cache):
    key = disk_cache.record_key("tune", "matmul 1024", "avx2")
    assert key == disk_cache.record_key("tune", "matmul 1024", "avx2") != disk_cache.record_key("tune", "other")
    assert disk_cache.write_record("tune", key, {"block": [5, 16]})
    assert disk_cache.read_record("tune", key) == ({"block": [5, 16]}, b"")
    assert disk_cache.read_record("proof", key) is None and disk_cache.read(key) is None  # kinds are apart
    assert stat.S_IMODE((cache.parent / "tunes").stat().st_mode) == 0o700
    assert disk_cache.write_record("tune", key, {"bad": {1, 2}}) is False  # not JSON data
    assert disk_cache.read_record("../kernel", key) is None and not disk_cache.write_record("x/y", key, {})


@pytest.mark.parametrize("on", [True, False])
def test_kernels_are_keyed_only_where_the_cache_or_tuning_keeps_records(on, monkeypatch, tmp_path):
    """With PREPJIT_CACHE=0 (and no PREPJIT_TUNE search, which needs a key) no kernel's AST is serialised and hashed
    into a disk key: a cold first call timed with the cache off paid for keys nothing read."""
    monkeypatch.setenv("PREPJIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PREPJIT_CACHE", "1" if on else "0")
    monkeypatch.delenv("PREPJIT_TUNE", raising=False)
    keyed = []
    kernel_key = disk_cache.kernel_key
    monkeypatch.setattr(disk_cache, "kernel_key", lambda *a: keyed.append(a[0]) or kernel_key(*a))
    scale = 5.25 if on else 6.125  # constants no other test uses: this process compiles it
    f = pj.prepare(lambda x: (x * scale).sum())
    assert float(np.asarray(f(np.ones(4, np.float32)))) == 4 * scale and f.stats["compiles"] == 1
    assert len(keyed) == (1 if on else 0)
