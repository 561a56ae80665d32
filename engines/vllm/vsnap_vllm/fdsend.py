"""The sending side of vsnap's descriptor-passing protocol (the receiver is the SDK's
FdReceiver; the protocol is specified in native/ipc/fd_channel.h of the vsnap repository).

    "VSN1" | nonce (64 ASCII hex) | u32 header length | u32 fd count | header JSON
    then batches of up to 250 fds, each on a one-byte b"F" frame (SCM_RIGHTS)
    reply: u32 length | JSON {"ok": true} or {"ok": false, "code": ..., "error": ...}

Before anything is sent (the nonce included), the receiver's uid is read with SO_PEERCRED and
must be this process's effective uid or root: a socket path someone else bound gets nothing.
"""

import json
import os
import socket
import struct

MAGIC = b"VSN1"
FDS_PER_BATCH = 250


class ExportRefused(RuntimeError):
    """The receiver refused the message (bad nonce, wrong uid, protocol error)."""

    def __init__(self, code, message):
        super().__init__(f"{code}: {message}")
        self.code = code


def _recv_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the receiver closed the connection before replying")
        data += chunk
    return data


def _recv_fds(sock, count):
    fds = []
    try:
        while len(fds) < count:
            msg, got, _flags, _addr = socket.recv_fds(sock, 1, FDS_PER_BATCH)
            fds.extend(got)
            if msg != b"F":
                raise ConnectionError("expected a descriptor frame")
    except Exception:
        for fd in fds:
            os.close(fd)
        raise
    return fds


def _peer_uid(sock):
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


def check_peer(sock, path, peer_uids=None):
    """Refuses (E_IPC_PEER_UID) a receiver whose uid is not in `peer_uids` (default: ours or root)."""
    allowed = {os.geteuid(), 0} if peer_uids is None else set(peer_uids)
    uid = _peer_uid(sock)
    if uid not in allowed:
        raise ExportRefused("E_IPC_PEER_UID", f"the process listening on {path} runs as uid {uid}, not {sorted(allowed)}: nothing was sent")


def fetch_fds(path, nonce, header=None, timeout=30.0, peer_uids=None):
    """Fetches what the SDK offered under `nonce` (its FdReceiver.offer): returns
    (offer header, descriptors); the caller owns the descriptors."""
    reply, fds = _exchange(path, nonce, header or {}, [], timeout, peer_uids)
    if "offer" not in reply:
        for fd in fds:
            os.close(fd)
        raise ExportRefused("E_IPC_PROTOCOL", "nothing was offered under that nonce")
    return reply["offer"], fds


def send_fds(path, nonce, header, fds, timeout=30.0, peer_uids=None):
    """Sends `header` (JSON-serialisable) and the descriptors `fds` to the receiver at `path`,
    authorised by `nonce`. Returns the receiver's reply; raises ExportRefused if it refused."""
    reply, offered = _exchange(path, nonce, header, fds, timeout, peer_uids)
    for fd in offered:
        os.close(fd)
    return reply


def _exchange(path, nonce, header, fds, timeout, peer_uids=None):
    if len(nonce) != 64:
        raise ValueError("a nonce is 64 hex digits")
    body = json.dumps(header, separators=(",", ":")).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        check_peer(sock, path, peer_uids)
        refused = False
        try:
            sock.sendall(MAGIC + nonce.encode("ascii") + struct.pack("<II", len(body), len(fds)) + body)
            for start in range(0, len(fds), FDS_PER_BATCH):
                socket.send_fds(sock, [b"F"], list(fds[start:start + FDS_PER_BATCH]))
        except (BrokenPipeError, ConnectionResetError):
            refused = True  # the receiver hung up early; its reply says why
        (length,) = struct.unpack("<I", _recv_exact(sock, 4))
        reply = json.loads(_recv_exact(sock, length))
        offered = _recv_fds(sock, int(reply.get("fds", 0))) if reply.get("ok") else []
    if not reply.get("ok"):
        raise ExportRefused(reply.get("code", "E_IPC_PROTOCOL"), reply.get("error", "refused"))
    if refused:
        raise ExportRefused("E_IPC_PROTOCOL", "the receiver hung up without refusing")
    return reply, offered
