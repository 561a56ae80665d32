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

    def test_rejects_a_malformed_nonce(self):
        with self.assertRaises(ValueError):
            send_fds("/nonexistent", "short", {}, [])


if __name__ == "__main__":
    unittest.main()
