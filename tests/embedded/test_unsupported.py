"""The embedded backend offers exactly the client calls aeroqueue uses; anything else
is refused with a clear error instead of behaving differently from a server."""

from __future__ import annotations

import pytest
from aerospike_helpers.operations import map_operations as mo

from aeroqueue.backends import open_backend


@pytest.fixture
def client():
    return open_backend("embedded://:memory:").client


def test_an_unused_client_call_is_refused_by_name(client):
    with pytest.raises(NotImplementedError, match=r"aerospike\.Client\.scan_apply\(\) is not implemented"):
        client.scan_apply("test", "s", "m", "f")


def test_an_unknown_policy_option_is_refused(client):
    with pytest.raises(NotImplementedError, match=r"put\(\) policy option\(s\) \['replace_everything'\]"):
        client.put(("test", "s", "k"), {"a": 1}, policy={"replace_everything": True})


def test_an_unsupported_operation_is_refused(client):
    with pytest.raises(NotImplementedError, match="not supported"):
        client.operate(("test", "s", "k"), [mo.map_put("m", "k", 1)])


def test_transport_only_policy_options_are_accepted(client):
    client.put(("test", "s", "k"), {"a": 1}, policy={"total_timeout": 1000, "max_retries": 2})
    assert client.get(("test", "s", "k"), policy={"socket_timeout": 100})[2] == {"a": 1}


def test_another_namespace_is_not_found(client):
    from aerospike import exception as ex

    with pytest.raises(ex.NamespaceNotFound):
        client.get(("other", "s", "k"))
