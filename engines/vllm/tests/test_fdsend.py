import json
import os
import socket
import struct
import tempfile
import threading
import unittest

from tests import support  # noqa: F401
from vsnap_vllm.fdsend import ExportRefused, send_fds


def serve_once(path, reply, received):
    """A minimal receiver of the protocol: records header and fds, sends `reply`."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)

    def run():
        conn, _ = server.accept()
        with conn:
            def exact(n):
                data = b""
                while len(data) < n:
                    data += conn.recv(n - len(data))
                return data

            assert exact(4) == b"VSN1"
            received["nonce"] = exact(64).decode()
            hlen, nfds = struct.unpack("<II", exact(8))
            received["header"] = json.loads(exact(hlen))
            fds = []
            while len(fds) < nfds:
                msg, got, _flags, _addr = socket.recv_fds(conn, 1, 250)
                assert msg == b"F"
                fds.extend(got)
            received["fds"] = fds
            body = json.dumps(reply).encode()
            conn.sendall(struct.pack("<I", len(body)) + body)
        server.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


class SendFdsTest(unittest.TestCase):
    def test_sends_header_and_fds_in_batches(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "s")
            received = {}
            thread = serve_once(path, {"ok": True}, received)
            fds = [os.memfd_create(f"r{i}") for i in range(600)]
            os.write(fds[599], b"last")
            reply = send_fds(path, "a" * 64, {"regions": 600}, fds)
            thread.join()
            self.assertEqual(reply, {"ok": True})
            self.assertEqual(received["nonce"], "a" * 64)
            self.assertEqual(received["header"], {"regions": 600})
            self.assertEqual(len(received["fds"]), 600)
            self.assertEqual(os.pread(received["fds"][599], 4, 0), b"last")
            for fd in fds + received["fds"]:
                os.close(fd)

    def test_a_refusal_raises_with_its_code(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "s")
            thread = serve_once(path, {"ok": False, "code": "E_IPC_AUTH", "error": "unknown nonce"}, {})
            with self.assertRaises(ExportRefused) as cm:
                send_fds(path, "b" * 64, {}, [])
            thread.join()
            self.assertEqual(cm.exception.code, "E_IPC_AUTH")

    def test_refuses_a_receiver_of_another_uid_before_sending_anything(self):
        # A real peer, checked through SO_PEERCRED; the allowed set excludes its (our) uid.
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "s")
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.bind(path)
            server.listen(1)
            fd = os.memfd_create("secret")
            try:
                with self.assertRaises(ExportRefused) as cm:
                    send_fds(path, "c" * 64, {"regions": 1}, [fd], peer_uids={os.geteuid() + 4242})
                self.assertEqual(cm.exception.code, "E_IPC_PEER_UID")
                conn, _ = server.accept()
                with conn:
                    conn.settimeout(2)
                    self.assertEqual(conn.recv(100), b"")  # nothing was sent, not even the nonce
            finally:
                server.close()
                os.close(fd)

    @unittest.skipUnless(os.geteuid() == 0, "needs root to run a receiver as another user")
    def test_refuses_a_receiver_running_as_nobody(self):
        with tempfile.TemporaryDirectory() as d:
            os.chmod(d, 0o777)
            path = os.path.join(d, "s")
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the receiver, as nobody
                try:
                    os.close(r)
                    os.setgid(65534)
                    os.setuid(65534)
                    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    server.bind(path)
                    server.listen(1)
                    os.write(w, b"1")
                    conn, _ = server.accept()
                    conn.settimeout(5)
                    got = conn.recv(100)
                    os._exit(0 if got == b"" else 3)
                except BaseException:
                    os._exit(2)
            os.close(w)
            self.assertEqual(os.read(r, 1), b"1")
            os.close(r)
            with self.assertRaises(ExportRefused) as cm:
                send_fds(path, "d" * 64, {}, [])
            self.assertEqual(cm.exception.code, "E_IPC_PEER_UID")
            _, status = os.waitpid(pid, 0)
            self.assertEqual(os.waitstatus_to_exitcode(status), 0)  # it received nothing

    def test_rejects_a_malformed_nonce(self):
        with self.assertRaises(ValueError):
            send_fds("/nonexistent", "short", {}, [])


if __name__ == "__main__":
    unittest.main()
