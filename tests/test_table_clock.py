"""The op-table clock trace's arithmetic (``benchmarks.gpu.table_clock.summarize``) on a made-up trace."""

from benchmarks.gpu.table_clock import summarize


def test_summarize_splits_table_and_settled_replays():
    # 20 replays of 3 ms: the first 15 at 1,980 MHz, the rest capped at 1,800 and 10% slower
    replays, samples = [], []
    for i in range(20):
        t0 = i * 0.003
        capped = i >= 15
        replays.append({"t0": t0, "t1": t0 + 0.0029, "us": 110.0 if capped else 100.0})
        for j in range(5):
            samples.append((t0 + j * 0.0005, 1800.0 if capped else 1980.0, 700.0 if capped else 650.0, int(capped)))
    s = summarize(replays, samples, first=15)
    assert s["first_us"] == 100.0 and s["first_mhz"] == 1980.0
    assert s["table_us"] == 100.0 and s["table_mhz"] == 1980.0
    assert s["settled_us"] == 110.0 and s["settled_mhz"] == 1800.0
    assert s["settled_capped"] == 25 and s["settled_samples"] == 25 and s["replays"] == 20
    assert replays[16]["w_max"] == 700.0 and replays[0]["n"] == 5


def test_summarize_without_samples_keeps_times():
    replays = [{"t0": 0.0, "t1": 0.001, "us": 5.0}]
    s = summarize(replays, [], first=15)
    assert s["table_us"] == 5.0 and s["table_mhz"] is None and s["settled_us"] is None
