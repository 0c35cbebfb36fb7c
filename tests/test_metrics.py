from edge_agent.metrics import Metrics


def test_metrics_snapshot_counts_and_percentiles():
    m = Metrics()
    m.inc("a")
    m.inc("a", 2)
    for v in (0.01, 0.02, 0.2, 3.0):
        m.observe("lat", v)
    snap = m.snapshot()
    assert snap["counters"] == {"a": 3}
    hist = snap["histograms"]["lat"]
    assert hist["count"] == 4 and hist["buckets"]["le_0.01"] == 1 and hist["buckets"]["le_5"] == 1
    assert 0.02 <= hist["p50"] <= 0.2 and hist["p95"] > 1.0
