"""--rpc, load(rpc=) and a pair's `rpc` key: checked before anything is loaded, so these
run where llama.cpp has no RPC backend too (tests/backends/llamacpp/test_rpc.py runs the real servers)."""

from __future__ import annotations

import os
import socketserver
import struct
import threading
from pathlib import Path

import pytest

from localspec.backends.llamacpp.rpc_server import RpcServerError, parse_endpoints, probe, split_options
from localspec.cli.main import build_parser
from localspec.core.errors import BackendUnavailableError, InvalidRequestError
from localspec.models.registry import RegistryError, load_registry, user_registry_file

PAIR_WITH_SERVERS = """
[pairs.split-qwen]
description = "Qwen2.5 7B over two machines, drafted here"
target = "qwen2.5-7b-instruct"
drafter = "qwen2.5-0.5b-instruct"
strategy = "draft"
draft_tokens = "auto"
rpc = {servers}
"""


def write_user_pairs(servers: str) -> Path:
    path = user_registry_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(PAIR_WITH_SERVERS.format(servers=servers))
    return path


def test_a_server_list_is_parsed_in_order() -> None:
    assert parse_endpoints("10.0.0.2:50052, 10.0.0.3:50053") == ("10.0.0.2:50052", "10.0.0.3:50053")
    assert parse_endpoints(["10.0.0.2:50052", "10.0.0.3:50052"]) == ("10.0.0.2:50052", "10.0.0.3:50052")


@pytest.mark.parametrize("bad", ["localhost", "host:port", "127.0.0.1:0", "127.0.0.1:70000", "a:1,a:1"])
def test_a_malformed_server_list_is_refused(bad: str) -> None:
    with pytest.raises(RpcServerError, match=r"HOST:PORT|twice"):
        parse_endpoints(bad)


def test_rpc_on_another_backend_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="--backend llamacpp"):
        split_options("torch", "127.0.0.1:50052")


def test_without_rpc_in_llama_cpp_the_error_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    from localspec.backends.llamacpp import rpc_server as rpc

    monkeypatch.setattr(rpc, "_library", lambda: None)
    with pytest.raises(BackendUnavailableError, match='CMAKE_ARGS="-DGGML_RPC=on" pip install'):
        split_options("llamacpp", "127.0.0.1:50052")


def test_a_pair_can_name_its_servers() -> None:
    write_user_pairs('["192.168.1.20:50052", "192.168.1.21:50052"]')
    assert load_registry().pair("split-qwen").rpc == ("192.168.1.20:50052", "192.168.1.21:50052")


def test_a_pair_with_a_bad_server_names_the_file_and_key() -> None:
    path = write_user_pairs('["192.168.1.20"]')
    with pytest.raises(RegistryError, match=f"{path}.*split-qwen.*'rpc'"):
        load_registry()


@pytest.mark.parametrize("command", ["run x", "bench", "chat"])
def test_the_model_commands_take_rpc_and_warn_about_it(command: str) -> None:
    parser = build_parser()
    args = parser.parse_args([*command.split(), "--rpc", "127.0.0.1:50052"])
    assert args.rpc == "127.0.0.1:50052"
    sub = parser._subparsers._group_actions[0].choices[command.split()[0]]  # type: ignore[union-attr]
    assert "no authentication" in sub.format_help()


class _OtherVersion(socketserver.BaseRequestHandler):
    """Answers the hello as an rpc-server of protocol version 3 would."""

    def handle(self) -> None:
        self.request.recv(64)
        self.request.sendall(struct.pack("<Q", 3) + bytes([3, 0, 0]))


def test_a_server_of_another_protocol_version_is_named() -> None:
    server = socketserver.TCPServer(("127.0.0.1", 0), _OtherVersion)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(RpcServerError, match="protocol version 3"):
            probe(f"127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()


def test_giving_the_server_sockets_a_wait_limit_leaves_no_descriptor_behind(tmp_path: Path) -> None:
    # limit_waits looks at every open descriptor; one that is no socket must not be left duplicated
    # (each split load in a process then doubled the open files until the system refused more).
    pytest.importorskip("llama_cpp")
    from localspec.backends.llamacpp.rpc import limit_waits

    files = [open(tmp_path / f"f{i}", "w") for i in range(8)]  # noqa: SIM115 - held open on purpose
    try:
        before = len(os.listdir("/dev/fd"))
        for _ in range(3):
            limit_waits(["127.0.0.1:1"])
        assert len(os.listdir("/dev/fd")) == before
    finally:
        for f in files:
            f.close()
