"""Open reads counted per client: a gRPC client by its address, whatever its channels."""

from __future__ import annotations

import pytest
from fastapi import HTTPException

from walstream.server.connections import Connections
from walstream.server.puller.service import peer_address


@pytest.mark.parametrize(
    ("peer", "address"),
    [
        ("ipv4:127.0.0.1:51234", "127.0.0.1"),
        ("ipv4:10.1.2.3:6", "10.1.2.3"),
        ("ipv6:[::1]:51234", "::1"),
        ("ipv6:%5B::1%5D:51234", "::1"),
        ("ipv6:[2001:db8::7]:443", "2001:db8::7"),
        ("unix:/run/walstream.sock", "unix:/run/walstream.sock"),
    ],
)
def test_a_grpc_peer_is_its_address_without_the_channel_port(peer, address):
    assert peer_address(peer) == address


def test_two_channels_of_one_client_count_as_one_client():
    c = Connections(per_stream=10, per_client=2)
    c.open("s", peer_address("ipv4:127.0.0.1:50001"))
    c.open("s", peer_address("ipv4:127.0.0.1:50002"))
    with pytest.raises(HTTPException) as err:
        c.open("s", peer_address("ipv4:127.0.0.1:50003"))
    assert err.value.status_code == 429 and "this client has 2 open reads" in str(err.value.detail)
    c.open("s", peer_address("ipv4:127.0.0.2:50004"))  # another client has room
