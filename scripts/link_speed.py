"""What a link between two of scripts/cluster_local.sh's nodes really carries: a plain TCP stream, timed on the
receiving side from its first byte to its last (the sanity check under the cluster benchmark).
    python scripts/link_speed.py receive PORT            (in one node: prints Mbit/s when the stream ends)
    python scripts/link_speed.py send HOST PORT [MB]     (in another: MB megabytes, default 128)"""

import socket
import sys
import time


def receive(port: int) -> None:
    with socket.create_server(("0.0.0.0", port)) as server:
        conn, _ = server.accept()
        with conn:
            got, first = 0, None
            while chunk := conn.recv(1 << 20):
                first = first or time.perf_counter()
                got += len(chunk)
            took = time.perf_counter() - first
    print(f"{got * 8 / took / 1e6:.0f} Mbit/s ({got >> 20} MB in {took:.2f} s)")


def send(host: str, port: int, mb: int) -> None:
    block = b"\0" * (1 << 20)
    for _ in range(100):  # the receiver may still be starting
        try:
            conn = socket.create_connection((host, port))
            break
        except ConnectionRefusedError:
            time.sleep(0.05)
    with conn:
        for _ in range(mb):
            conn.sendall(block)


if __name__ == "__main__":
    if sys.argv[1:2] == ["receive"]:
        receive(int(sys.argv[2]))
    elif sys.argv[1:2] == ["send"]:
        send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 128)
    else:
        sys.exit(__doc__)
