"""The checkpoint keeps the network phase's state (SPEC §9, §17): round trip, the memo's
encoding equal to the plain one, and a checkpoint without networks as it was before."""

from __future__ import annotations

import json

from reconciler.accel.checkpoint import CheckpointMemo
from reconciler.planning.checkpoint import (
    Checkpoint,
    as_decoded,
    decode_checkpoint,
    encode_checkpoint,
)

NETWORK = {
    "addresses": {"i1": {"ip": "172.17.0.2", "network": "default"}},
    "networks": {"default": {"hosts": {"n1": "172.17.0.1"}, "subnet": "172.17.0.0/16"}},
}


def test_network_state_round_trips_and_the_memo_encodes_the_same_bytes() -> None:
    cp = Checkpoint("lin", 3, {}, {"a": 5000}, {}, NETWORK)
    raw = encode_checkpoint(cp)
    assert raw == CheckpointMemo().encode(cp)
    back = decode_checkpoint(raw, "lin")
    assert back.network == NETWORK
    assert back.same_data(cp) and as_decoded(cp).network == NETWORK
    assert not Checkpoint("lin", 3, {}, {"a": 5000}, {}).same_data(cp)


def test_without_networks_the_data_has_no_network_key_and_old_files_read() -> None:
    cp = Checkpoint("lin", 1, {}, {"a": 5000}, {})
    raw = encode_checkpoint(cp)
    data = json.loads(raw)["data"]
    assert sorted(data) == ["alerts", "gids", "instances"]  # as before networks existed
    assert raw == CheckpointMemo().encode(cp)
    assert decode_checkpoint(raw, "lin").network == {}
