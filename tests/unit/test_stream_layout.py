"""The queue streams' layout settings (issue 24 item 1): placement parsed, replicated streams
refused on a NATS server older than the Jepsen fixes."""

from __future__ import annotations

import pytest

from hypermedia.core.config import ConfigError
from hypermedia.jobs.queues import StreamLayout, check_server


@pytest.mark.parametrize(
    ("version", "replicas", "refused"),
    [
        ("2.9.25", 1, False),  # one server: any JetStream version we run on
        ("2.12.2", 3, True),
        ("2.12.3", 3, False),
        ("2.15.1", 3, False),
        ("0.0.0", 3, True),  # unknown
    ],
)
def test_replicated_streams_need_nats_2_12_3(version: str, replicas: int, refused: bool) -> None:
    layout = StreamLayout(replicas=replicas)
    if refused:
        with pytest.raises(ConfigError, match=r"HM_STREAM_REPLICAS=3 needs NATS 2\.12\.3 or later"):
            check_server(version, layout)
    else:
        check_server(version, layout)


def test_placement_is_a_cluster_and_tags() -> None:
    assert StreamLayout().placement_config() is None
    placement = StreamLayout(placement="cluster=east, tag=ssd,tag=fast").placement_config()
    assert placement is not None and (placement.cluster, placement.tags) == ("east", ["ssd", "fast"])
    for bad in ("east", "zone=a", "tag="):
        with pytest.raises(ConfigError, match="HM_STREAM_PLACEMENT"):
            StreamLayout(placement=bad).placement_config()
