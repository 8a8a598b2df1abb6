"""The disk kernel cache's file handling (issue 14, item 13), through private bindings
that need no GPU: what is refused, what is cleaned, which permissions are used.

Reads that could hang (a FIFO at an entry's path) run in a child process with a timeout.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
import textwrap
import time

import pytest

import castlab
from castlab import _C

# The folder castlab was imported from: children import the same castlab.
_PKG = os.path.dirname(os.path.dirname(os.path.abspath(castlab.__file__)))
KEY = hashlib.sha256(b"a kernel").hexdigest()
KEY2 = hashlib.sha256(b"another kernel").hexdigest()
PAYLOAD = b"\x7fELF fake cubin \x00\x01\x02" * 10


def _entry(d, key=KEY):
    return os.path.join(str(d), key + ".bin")


def _child(code: str, env_extra: dict | None = None, timeout: float = 60):
    env = dict(os.environ)
    env["PYTHONPATH"] = _PKG + os.pathsep + env.get("PYTHONPATH", "")
    for k, v in (env_extra or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    try:
        r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:  # pragma: no cover - the bug this guards against
        pytest.fail(f"child process hung (no result after {timeout} s)")
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_store_then_load_round_trip(tmp_path):
    d = tmp_path / "kernels"
    assert _C._kernel_cache_store(str(d), KEY, "cubin", PAYLOAD)
    assert _C._kernel_cache_load(str(d), KEY) == ("ok", "cubin", PAYLOAD)
    assert _C._kernel_cache_load(str(d), KEY2)[0] == "missing"
    assert [n for n in os.listdir(d)] == [KEY + ".bin"]  # no temporary left behind


def test_folder_0700_and_files_0600_under_umask_000(tmp_path):
    d = tmp_path / "a" / "b" / "kernels"
    old = os.umask(0)
    try:
        assert _C._kernel_cache_store(str(d), KEY, "ptx", PAYLOAD)
    finally:
        os.umask(old)
    for p in (tmp_path / "a", tmp_path / "a" / "b", d):
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o700, p
    assert stat.S_IMODE(os.stat(_entry(d)).st_mode) == 0o600


def test_fifo_at_entry_path_does_not_hang(tmp_path):
    d = tmp_path / "kernels"
    d.mkdir(mode=0o700)
    os.mkfifo(_entry(d))
    out = _child(f"""
        from castlab import _C
        print(_C._kernel_cache_load({str(d)!r}, {KEY!r})[0])
        """, timeout=30)
    assert out.strip() == "not a regular file"


def test_symlink_entry_refused(tmp_path):
    d = tmp_path / "kernels"
    assert _C._kernel_cache_store(str(d), KEY2, "cubin", PAYLOAD)
    os.symlink(_entry(d, KEY2), _entry(d))  # a valid-looking file, reached by a link
    assert _C._kernel_cache_load(str(d), KEY)[0] == "symlink"


def test_directory_at_entry_path_refused(tmp_path):
    d = tmp_path / "kernels"
    d.mkdir(mode=0o700)
    os.mkdir(_entry(d))
    assert _C._kernel_cache_load(str(d), KEY)[0] == "not a regular file"


def test_oversize_entry_refused(tmp_path):
    d = tmp_path / "kernels"
    d.mkdir(mode=0o700)
    cap = _C._kernel_cache_max_entry_bytes()
    with open(_entry(d), "wb") as f:
        f.truncate(cap + 4096)  # sparse: no disk used
    assert _C._kernel_cache_load(str(d), KEY)[0] == "too large"
    assert not _C._kernel_cache_store(str(d), KEY2, "cubin", b"\0" * (cap + 1))


def test_tampered_payload_refused(tmp_path):
    d = tmp_path / "kernels"
    assert _C._kernel_cache_store(str(d), KEY, "cubin", PAYLOAD)
    raw = bytearray(open(_entry(d), "rb").read())
    raw[-1] ^= 1
    open(_entry(d), "wb").write(bytes(raw))
    assert _C._kernel_cache_load(str(d), KEY)[0] == "checksum mismatch"
    raw[-1] ^= 1
    open(_entry(d), "wb").write(bytes(raw) + b"x")
    assert _C._kernel_cache_load(str(d), KEY)[0] == "size mismatch"


def test_entry_under_another_key_refused(tmp_path):
    # A valid entry renamed to another kernel's name: its embedded key does not match.
    d = tmp_path / "kernels"
    assert _C._kernel_cache_store(str(d), KEY2, "cubin", PAYLOAD)
    os.rename(_entry(d, KEY2), _entry(d))
    assert _C._kernel_cache_load(str(d), KEY)[0] == "key mismatch"


def test_old_format_and_garbage_refused(tmp_path):
    d = tmp_path / "kernels"
    d.mkdir(mode=0o700)
    sha = hashlib.sha256(PAYLOAD).hexdigest()
    open(_entry(d), "wb").write(f"castlab-kernel 1 cubin {len(PAYLOAD)} {sha}\n".encode()
                                + PAYLOAD)
    assert _C._kernel_cache_load(str(d), KEY)[0] == "bad header"
    open(_entry(d), "wb").write(b"\0" * 1000)
    assert _C._kernel_cache_load(str(d), KEY)[0] == "bad header"


def test_bad_keys_and_kinds_refused(tmp_path):
    d = tmp_path / "kernels"
    for key in ("../../etc/passwd", "", KEY.upper(), KEY + "0"):
        assert not _C._kernel_cache_store(str(d), key, "cubin", PAYLOAD)
        assert _C._kernel_cache_load(str(d), key)[0] == "bad key"
    assert not _C._kernel_cache_store(str(d), KEY, "elf", PAYLOAD)


def test_stale_temp_files_cleaned(tmp_path):
    d = tmp_path / "kernels"
    d.mkdir(mode=0o700)
    # A writer that died (kill -9 mid-write): a pid that no longer exists.
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    dead = d / f"{KEY}.bin.tmp.{p.pid}.0000abcd"
    dead.write_bytes(b"partial")
    # A live writer's temp: kept while young, removed once older than the limit.
    live = d / f"{KEY2}.bin.tmp.{os.getppid()}.0000abcd"
    live.write_bytes(b"partial")
    other = d / "unrelated.txt"
    other.write_bytes(b"x")
    assert _C._kernel_cache_clean(str(d), 600) == 1
    assert not dead.exists() and live.exists() and other.exists()
    old = time.time() - 3600
    os.utime(live, (old, old))
    assert _C._kernel_cache_clean(str(d), 600) == 1
    assert not live.exists() and other.exists()


def test_world_writable_folder_refused(tmp_path):
    d = tmp_path / "kernels"
    d.mkdir()
    os.chmod(d, 0o777)
    why = _C._kernel_cache_check_dir(str(d))
    assert "writable by other users" in why and "0777" in why
    with pytest.raises(RuntimeError, match="writable by other users"):
        _C._kernel_cache_store(str(d), KEY, "cubin", PAYLOAD)
    os.chmod(d, 0o770)
    assert "writable by other users" in _C._kernel_cache_check_dir(str(d))
    os.chmod(d, 0o755)
    assert _C._kernel_cache_check_dir(str(d)) == "ok"


def test_foreign_owned_folder_refused(tmp_path):
    if os.geteuid() == 0:
        # root owns everything it creates; a folder owned by someone else is "/" only
        # when not running as root, so make one with chown.
        d = tmp_path / "foreign"
        d.mkdir(mode=0o700)
        os.chown(d, 12345, 12345)
    else:
        d = "/"  # owned by root
    why = _C._kernel_cache_check_dir(str(d))
    assert "not by this user" in why
    with pytest.raises(RuntimeError, match="not by this user"):
        _C._kernel_cache_load(str(d), KEY)


def test_not_a_directory_refused(tmp_path):
    f = tmp_path / "file"
    f.write_bytes(b"x")
    assert _C._kernel_cache_check_dir(str(f)) != "ok"


@pytest.mark.slow  # five castlab imports in subprocesses: ~4 s
def test_cache_dir_defaults():
    code = "from castlab import _C; print(_C._kernel_cache_dir())"
    env = {"CASTLAB_CACHE_DIR": None, "XDG_CACHE_HOME": None}
    assert _child(code, {**env, "HOME": "/home/u"}).strip() == "/home/u/.cache/castlab/kernels"
    assert _child(code, {**env, "XDG_CACHE_HOME": "/x"}).strip() == "/x/castlab/kernels"
    # No HOME: a per-user folder (owner-checked on use), not a shared one.
    assert _child(code, {**env, "HOME": None}).strip() == f"/tmp/castlab-kernels-{os.geteuid()}"
    assert _child(code, {**env, "HOME": ""}).strip() == f"/tmp/castlab-kernels-{os.geteuid()}"
    assert _child(code, {"CASTLAB_CACHE_DIR": "/c"}).strip() == "/c"


def test_empty_cache_dir_turns_disk_cache_off(tmp_path):
    # CASTLAB_CACHE_DIR="" means no disk cache (it used to write into "/").
    out = _child("""
        from castlab import _C
        print(repr(_C._kernel_cache_dir()))
        print(_C._kernel_cache_check_dir(_C._kernel_cache_dir()))
        """, {"CASTLAB_CACHE_DIR": ""})
    first, second = out.strip().splitlines()
    assert first == "''"
    assert "disk cache is off" in second
