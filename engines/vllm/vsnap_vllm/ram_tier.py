"""vsnap's shared RAM tier for sleeping vLLM engines: a directory (on tmpfs, e.g. /dev/shm) that
the `vsnap` sleep-mode backend of every engine on the host writes weights regions into and reads
them back from, with one byte budget for all of them.

    <dir>/tier.json          {"budget_bytes": N}: made by `python3 -m vsnap_vllm.ram_tier init`
    <dir>/entries/<key>      one region's bytes; key = its vsnap-gd1 digest and size, so a region
                             with the same bytes (two engines of one model, a weight sync that
                             changed nothing) is held once
    <dir>/holds/<owner>.json the keys a sleeping engine rank needs back, and its pid
    <dir>/lock               flock'd while entries are added, evicted or held

An entry is written under tmp/ and renamed into entries/ once every byte is there, so a name in
entries/ is a complete copy of what its key says (the backend digests the memory it restores into
and compares, so a file changed behind its back is found before the engine serves from it).
Entries no live owner holds are evicted, least recently used first, to make room; an entry held by
an owner whose process is gone is free again."""

import argparse
import ctypes
import fcntl
import hashlib
import json
import mmap
import os
import re
import sys
import time
import uuid

from .drivers import _libc, _mmap

_SIZE = re.compile(r"^(\d+)\s*(|k|m|g|t)(i?b)?$", re.IGNORECASE)


class TierUnavailable(RuntimeError):
    """There is no usable RAM tier at the path; the message says why and how to make one."""


class TierFull(RuntimeError):
    """The budget cannot take these regions, even with every unheld entry evicted."""


def parse_size(text):
    m = _SIZE.match(str(text).strip())
    if not m:
        raise ValueError(f"{text!r} is not a size (e.g. 64GiB, 512MiB, 1000000)")
    return int(m.group(1)) * 1024 ** " kmgt".index(m.group(2).lower() or " ")


def region_key(chunk_digests, size):
    """An entry's name: its chunks' vsnap-gd1 digests folded into one, and its size."""
    folded = hashlib.sha256("".join(chunk_digests).encode()).hexdigest()[:32]
    return f"{folded}-{size}"


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RamTier:
    def __init__(self, path, budget):
        self.path = path
        self.budget = budget

    @classmethod
    def open(cls, path):
        """The tier at `path`; TierUnavailable when there is none."""
        if not path:
            raise TierUnavailable("no RAM tier configured (set VSNAP_RAM_TIER to a directory made by `python3 -m vsnap_vllm.ram_tier init <dir> --budget <bytes>`)")
        try:
            with open(os.path.join(path, "tier.json")) as f:
                budget = int(json.load(f)["budget_bytes"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise TierUnavailable(f"no RAM tier at {path} ({type(e).__name__}: {e}); make one with `python3 -m vsnap_vllm.ram_tier init {path} --budget <bytes>`") from e
        return cls(path, budget)

    @staticmethod
    def init(path, budget):
        for sub in ("entries", "holds", "tmp"):
            os.makedirs(os.path.join(path, sub), mode=0o700, exist_ok=True)
        with open(os.path.join(path, "tier.json"), "w") as f:
            json.dump({"budget_bytes": int(budget)}, f)
        return RamTier(path, int(budget))

    def _file(self, key):
        return os.path.join(self.path, "entries", key)

    def _lock(self):
        fd = os.open(os.path.join(self.path, "lock"), os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd

    @staticmethod
    def _unlock(fd):
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def has(self, key):
        try:
            return os.stat(self._file(key)).st_size == int(key.rsplit("-", 1)[1])
        except (OSError, ValueError, IndexError):
            return False

    def entries(self):
        """{key: bytes} of every complete entry."""
        out = {}
        for name in os.listdir(os.path.join(self.path, "entries")):
            try:
                out[name] = os.stat(self._file(name)).st_size
            except OSError:
                pass
        return out

    def used_bytes(self):
        return sum(self.entries().values())

    def _held_keys(self):
        """Keys some live owner holds (holds of dead processes are removed on the way)."""
        held = set()
        folder = os.path.join(self.path, "holds")
        for name in os.listdir(folder):
            full = os.path.join(folder, name)
            try:
                with open(full) as f:
                    hold = json.load(f)
            except (OSError, ValueError):
                continue
            if _pid_alive(int(hold.get("pid", 0))):
                held.update(hold.get("keys", []))
            else:
                try:
                    os.remove(full)
                except OSError:
                    pass
        return held

    def hold(self, owner, keys):
        """Records that `owner` (this process) needs `keys` back: they are not evicted meanwhile."""
        tmp = os.path.join(self.path, "tmp", f"hold-{uuid.uuid4().hex}")
        with open(tmp, "w") as f:
            json.dump({"pid": os.getpid(), "keys": sorted(set(keys))}, f)
        os.replace(tmp, os.path.join(self.path, "holds", f"{owner}.json"))

    def release(self, owner):
        try:
            os.remove(os.path.join(self.path, "holds", f"{owner}.json"))
        except FileNotFoundError:
            pass

    def touch(self, key):
        try:
            os.utime(self._file(key))
        except OSError:
            pass

    def admit(self, owner, keys_sizes):
        """Makes room for the regions `keys_sizes` ({key: size}) that the tier lacks, evicting
        unheld entries least recently used first, and holds every key for `owner`, all under the
        lock. Returns the keys to write (the tier lacks them). TierFull (nothing evicted, nothing
        held) when they cannot fit."""
        fd = self._lock()
        try:
            present = self.entries()
            missing = {k: s for k, s in keys_sizes.items() if present.get(k) != s}
            need = sum(missing.values())
            used = sum(present.values())
            if used + need > self.budget:
                held = self._held_keys() | set(keys_sizes)
                victims = sorted((k for k in present if k not in held), key=lambda k: self._mtime(k))
                freeable = sum(present[k] for k in victims)
                if used - freeable + need > self.budget:
                    raise TierFull(f"the RAM tier at {self.path} holds {used} of {self.budget} bytes, {used - freeable} of them for sleeping "
                                   f"engines; {need} more do not fit")
                for k in victims:
                    if used + need <= self.budget:
                        break
                    try:
                        os.remove(self._file(k))
                    except FileNotFoundError:
                        pass
                    used -= present[k]
            self.hold(owner, keys_sizes)
            return missing
        finally:
            self._unlock(fd)

    def _mtime(self, key):
        try:
            return os.stat(self._file(key)).st_mtime_ns
        except OSError:
            return 0

    def create(self, key, size):
        """A new entry `key` of `size` bytes, mapped for writing: (its temporary path, the mapping's
        address). `commit` makes it an entry (the mapping stays: `unmap` it); `abandon` drops it."""
        tmp = os.path.join(self.path, "tmp", f"{key}.{uuid.uuid4().hex}")
        fd = os.open(tmp, os.O_CREAT | os.O_RDWR | os.O_EXCL, 0o600)
        try:
            # allocated now: a full tmpfs refuses here (ENOSPC) instead of a SIGBUS during the copy
            os.posix_fallocate(fd, 0, size)
            return tmp, _mmap(0, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd)
        except BaseException:
            os.remove(tmp)
            raise
        finally:
            os.close(fd)

    def commit(self, tmp, key):
        os.replace(tmp, self._file(key))

    @staticmethod
    def abandon(tmp, address, size):
        _libc.munmap(ctypes.c_void_p(address), size)
        try:
            os.remove(tmp)
        except OSError:
            pass

    def write(self, key, size, fill):
        """Creates entry `key` of `size` bytes: `fill(address)` writes them into a mapping of the
        new file; renamed into entries/ once it returns."""
        tmp, address = self.create(key, size)
        try:
            fill(address)
            self.commit(tmp, key)
        except BaseException:
            self.abandon(tmp, address, size)
            raise
        self.unmap(address, size)

    def map(self, key, size):
        """A shared mapping of entry `key` (FileNotFoundError when it is gone); `unmap` it."""
        fd = os.open(self._file(key), os.O_RDWR)
        try:
            return _mmap(0, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd)
        finally:
            os.close(fd)

    @staticmethod
    def unmap(address, size):
        _libc.munmap(ctypes.c_void_p(address), size)

    def read(self, key, size, drain):
        """`drain(address)` with entry `key` mapped read-only (FileNotFoundError when it is gone)."""
        fd = os.open(self._file(key), os.O_RDONLY)
        try:
            address = _mmap(0, size, mmap.PROT_READ, mmap.MAP_SHARED, fd)
            try:
                drain(address)
            finally:
                _libc.munmap(ctypes.c_void_p(address), size)
        finally:
            os.close(fd)
        self.touch(key)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m vsnap_vllm.ram_tier", description="vsnap's shared RAM tier for vLLM's `vsnap` sleep-mode backend")
    sub = p.add_subparsers(dest="cmd", required=True)
    init = sub.add_parser("init", help="make (or re-budget) a tier")
    init.add_argument("path")
    init.add_argument("--budget", required=True, help="bytes the tier may hold, e.g. 64GiB")
    status = sub.add_parser("status", help="what the tier holds")
    status.add_argument("path")
    a = p.parse_args(argv)
    if a.cmd == "init":
        tier = RamTier.init(a.path, parse_size(a.budget))
        print(json.dumps({"path": tier.path, "budget_bytes": tier.budget}))
        return 0
    tier = RamTier.open(a.path)
    print(json.dumps({"path": tier.path, "budget_bytes": tier.budget, "used_bytes": tier.used_bytes(), "entries": len(tier.entries()),
                      "held": len(tier._held_keys()), "at": time.time()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
