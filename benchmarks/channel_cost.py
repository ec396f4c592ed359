"""What the distributed channel's CURVE costs (issue 39): 1 MiB messages from a DEALER to a ROUTER
over loopback, plain and with the keys ``--worker-token`` gives, alternated; and the key derivation
(scrypt, once a process).

    .venv/bin/python benchmarks/channel_cost.py [--messages 64] [--repeat 2]
"""

from __future__ import annotations

import argparse
import time

import zmq

from vllm_locust.plugin.distributed import channel


def megabytes_per_s(keys: channel.ChannelKeys | None, messages: int, size: int = 1 << 20) -> float:
    context = zmq.Context()
    server, client = context.socket(zmq.ROUTER), context.socket(zmq.DEALER)
    if keys is not None:
        channel.secure_server(server, keys)  # no ZAP gate: this measures the encryption alone
        channel.secure_client(client, keys)
    port = server.bind_to_random_port("tcp://127.0.0.1")
    client.connect(f"tcp://127.0.0.1:{port}")
    payload = b"x" * size
    client.send(payload)
    server.recv_multipart()  # the handshake is done
    began = time.perf_counter()
    for _ in range(messages):
        client.send(payload)
    for _ in range(messages):
        server.recv_multipart()
    elapsed = time.perf_counter() - began
    server.close(0)
    client.close(0)
    context.term()
    return messages * size / elapsed / 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=64)
    p.add_argument("--repeat", type=int, default=2)
    a = p.parse_args()
    began = time.perf_counter()
    keys = channel.keys_from_token("benchmark-token-0123456789abcdef")
    print(f"key derivation (scrypt): {(time.perf_counter() - began) * 1000:.0f} ms")
    for _ in range(a.repeat):
        for label, k in (("plain", None), ("curve", keys)):
            print(f"{label}: {megabytes_per_s(k, a.messages):.0f} MB/s")


if __name__ == "__main__":
    main()
