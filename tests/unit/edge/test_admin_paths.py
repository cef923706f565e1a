"""What is the proxy's own path (proxy.edge.admin.normalised): the target read as the most lenient
server might read it, so that no spelling of ``/loop-guard`` reaches the upstream."""

from __future__ import annotations

import pytest

from proxy.edge.admin import normalised


@pytest.mark.parametrize(
    ("target", "path"),
    [
        pytest.param("/loop-guard/metrics", "/loop-guard/metrics", id="as_is"),
        pytest.param("/./loop-guard/metrics", "/loop-guard/metrics", id="dot"),
        pytest.param("/v1/../loop-guard/metrics", "/loop-guard/metrics", id="dot_dot"),
        pytest.param("/../../loop-guard", "/loop-guard", id="dot_dot_past_the_root"),
        pytest.param("/v1/%2e%2E/loop-guard", "/loop-guard", id="escaped_dot_dot"),
        pytest.param("/Loop-Guard/METRICS", "/loop-guard/metrics", id="case"),
        pytest.param("/loop-guard\\metrics", "/loop-guard/metrics", id="backslash"),
        pytest.param("/loop-guard%5cmetrics", "/loop-guard/metrics", id="escaped_backslash"),
        pytest.param("/loop-guard%20/metrics", "/loop-guard/metrics", id="escaped_space"),
        pytest.param("/%20loop-guard%09/", "/loop-guard", id="whitespace_around"),
        pytest.param("/loop-guard%252Fmetrics", "/loop-guard/metrics", id="escaped_twice"),
        pytest.param("/loop-guard;jsessionid=1/metrics", "/loop-guard/metrics", id="path_parameter"),
        pytest.param("//loop-guard//metrics/", "/loop-guard/metrics", id="doubled_slashes"),
        pytest.param("/loop-guard/metrics?x=/..", "/loop-guard/metrics", id="query_not_part_of_it"),
        pytest.param("/v1/loop-guard/metrics", "/v1/loop-guard/metrics", id="under_v1_is_the_upstreams"),
        pytest.param("/loop-guardx", "/loop-guardx", id="beside_the_prefix"),
        pytest.param("/", "/", id="root"),
    ],
)
def test_the_target_is_normalised_before_deciding_what_is_the_proxys(target: str, path: str) -> None:
    assert normalised(target) == path
