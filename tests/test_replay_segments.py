"""The replay forward priced from its measured pieces (costmodels/replay_segments.py, benchmarks/gpu/replay_segments.py)."""

import pytest

from costmodels.replay_segments import Segment, price_policies, segment_stream


def test_a_host_bound_forward_ends_with_the_host_plus_the_last_kernel():
    # two pieces, 2 kernels each, issued at half and all of the host time; the device is far faster
    segs = [Segment(1.0, 0.2, ((0.5, 0.5), (1.0, 0.5)))] * 2
    cost = segment_stream(segs)
    assert cost.seconds == pytest.approx(2.0 + 0.1)
    assert cost.host_s == pytest.approx(2.0) and cost.device_s == pytest.approx(0.4)
    assert cost.wait_s == pytest.approx(1.7)


def test_a_device_bound_forward_waits_only_where_its_kernels_are_issued_late():
    # piece 1: one long kernel issued at 10% of its host time; piece 2: the same. The device starts at 0.1 and
    # runs 2 + 2 back to back: the host (1 per piece) never catches up again
    segs = [Segment(1.0, 2.0, ((0.1, 1.0),))] * 2
    assert segment_stream(segs).seconds == pytest.approx(0.1 + 4.0)
    # the same device time, but piece 2's kernels come after host work the device has run out of: a short kernel
    # at the start, the long one at the end of its host time (a RoPE's launches before the attention, say)
    late = [Segment(1.0, 0.5, ((0.1, 1.0),)), Segment(3.0, 3.5, ((0.0, 0.1), (1.0, 0.9)))]
    # piece 1 ends at 0.6; piece 2 starts on the host at 1.0: short kernel 1.0-1.35, long one issued at 4.0
    assert segment_stream(late).seconds == pytest.approx(4.0 + 3.15)


def test_without_host_time_the_forward_is_its_device_time_and_sync_adds_up():
    segs = [Segment(0.0, 0.3, ((0.2, 0.5), (0.9, 0.5))), Segment(0.0, 0.7)]   # the second: no trace, even split
    assert segment_stream(segs).seconds == pytest.approx(1.0)
    assert segment_stream([Segment(0.4, 0.4), Segment(0.5, 0.5)], sync=True).seconds == pytest.approx(0.9)


def test_policies_are_priced_from_the_benchs_record():
    doc = {"segments": {"a": {"host_s": 1.0, "device_s": 0.5, "trace": [[1.0, 1.0]]},
                        "b": {"host_s": 0.1, "device_s": 2.0, "trace": [[0.0, 1.0]]}},
           "plan": {"p": ["a", "b"], "q": ["b", "b"], "broken": ["a", "zz"]}}
    got = price_policies(doc)
    assert set(got) == {"p", "q"}
    assert got["p"].seconds == pytest.approx(1.0 + 0.5 + 2.0)   # b issued at 1.0, after a's kernel ended at 1.5
    assert got["q"].seconds == pytest.approx(4.0)


def test_the_trace_joins_each_launch_to_its_kernel_inside_its_piece():
    from benchmarks.gpu.replay_segments import parse_trace
    ev = [{"cat": "user_annotation", "name": "twinfer_piece_0", "ts": 100.0, "dur": 100.0},
          {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 110.0, "dur": 10.0, "args": {"correlation": 1}},
          {"cat": "cuda_driver", "name": "cuLaunchKernel", "ts": 180.0, "dur": 20.0, "args": {"correlation": 2}},
          {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 150.0, "dur": 5.0, "args": {"correlation": 9}},
          {"cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 201.0, "dur": 5.0, "args": {"correlation": 3}},
          {"cat": "kernel", "name": "k1", "ts": 125.0, "dur": 30.0, "args": {"correlation": 1}},
          {"cat": "gpu_memset", "name": "m", "ts": 205.0, "dur": 10.0, "args": {"correlation": 2}},
          {"cat": "user_annotation", "name": "twinfer_piece_1", "ts": 300.0, "dur": 10.0},
          {"cat": "kernel", "name": "other", "ts": 5.0, "dur": 1.0, "args": {"correlation": 77}}]
    got = parse_trace(ev, {"twinfer_piece_0": "A", "twinfer_piece_1": "B"})
    assert got["A"]["trace"] == [(0.2, 0.75), (1.0, 0.25)]   # launch ends at 20% and 100% of the piece's host time
    assert got["A"]["host_s"] == pytest.approx(100e-6) and got["A"]["device_s"] == pytest.approx(40e-6)
    assert got["A"]["unmatched"] == 1                        # correlation 9 has no device record
    assert got["B"]["trace"] == []


def test_the_pieces_of_every_policy_run_on_the_cpu():
    torch = pytest.importorskip("torch")
    from benchmarks.gpu.replay_bench import bench_spec, policies
    from benchmarks.gpu.replay_segments import SegmentProbe
    from executor.forward_batch import SeqInput
    from executor.kv_cache import KVCache
    from executor.model_config import ExecModelConfig
    from executor.swa_replay import SWAReplay
    from executor.weights import build_model
    spec = bench_spec(True)
    cfg = ExecModelConfig.build(spec)
    cpu = torch.device("cpu")
    model = build_model(cfg, cpu, "fp32", "dummy", seed=0, max_pos=64)
    kv = KVCache(cfg, 8, 8, cpu, torch.float32)
    toks = list(range(40))
    with torch.inference_mode():
        preps = {name: [SWAReplay(spec, pol).prepare([SeqInput(toks[32:40], 32, list(range(8)), False)], [toks], kv)]
                 for name, pol in policies([4, 24])}
        probe = SegmentProbe(model, kv, cpu, preps)
        probe.sample()
    doc = probe.result()
    layers = len(spec.kinds())
    assert all(len(keys) == layers + 2 for keys in doc["plan"].values())
    # persist runs 8 rows everywhere, recompute 40 below the full layer: different pieces; the full layer's step
    # (8 new rows of a 40-row step under recompute) differs from persist's (all 8 rows)
    assert doc["plan"]["recompute"][1] != doc["plan"]["persist"][1]
    assert all(s["host_s"] > 0 and s["device_s"] == s["host_s"] for s in doc["segments"].values())
    got = price_policies(doc, sync=True)
    assert set(got) == {"recompute", "replay:4", "replay:24", "persist"}
    # back to back (issue 23, 2026-12-03): every piece also timed in its forward's order, each round kept
    assert set(doc["b2b_rounds"]) == set(doc["segments"])
    assert all(len(r) == 1 and all(h > 0 for h, _ in r[0]) for r in doc["b2b_rounds"].values())
    assert all(s["host_b2b_s"] > 0 for s in doc["segments"].values())
    from benchmarks.gpu.replay_bench import b2b_doc
    b = b2b_doc(doc)
    assert all(s["host_s"] == s["host_b2b_s"] for s in b["segments"].values())
    assert b2b_doc({k: v for k, v in doc.items()} | {"segments": {k: {"host_s": 1.0, "device_s": 1.0}
                                                                   for k in doc["segments"]}}) is None   # older runs


def test_each_round_is_priced_from_its_own_samples_and_paired_with_its_forwards():
    from benchmarks.gpu.replay_bench import paired
    from costmodels.replay_segments import price_rounds
    doc = {"segments": {"a": {"host_s": 1.0, "device_s": 0.1, "trace": [[1.0, 1.0]]}},
           "plan": {"p": ["a"], "q": ["a", "a"]},
           "rounds": {"a": [[1.0, 0.1], [2.0, 0.1]]}}     # the host twice as slow in round 2
    got = price_rounds(doc)
    assert got["p"] == pytest.approx([1.1, 2.1]) and got["q"] == pytest.approx([2.1, 4.1])
    base = {"measured_samples_s": [(4.0, 0), (8.0, 0)], "segments_round_s": got["q"]}
    row = {"measured_samples_s": [(2.0, 0), (4.0, 0)], "segments_round_s": got["p"]}
    paired(row, base)
    # the change per round: 4/2 - 1 = 1 both rounds; predicted 2.1/1.1 - 1 and 4.1/2.1 - 1
    assert row["measured_change_paired"] == pytest.approx(1.0)
    assert row["segments_change_paired"] == pytest.approx((1.0 / 1.1 + 2.0 / 2.1) / 2)
    assert row["segments_paired_diff_pp"] == pytest.approx(100 * (1.0 - row["segments_change_paired"]))


def test_a_round_priced_at_the_forwards_clock_scales_each_pieces_device_time():
    from costmodels.replay_segments import price_rounds
    doc = {"segments": {"a": {"host_s": 0.0, "device_s": 1.0}, "b": {"host_s": 0.0, "device_s": 1.0}},
           "plan": {"p": ["a", "b"]},
           "rounds": {"a": [[0.0, 1.0, 1980.0]], "b": [[0.0, 2.0, 1800.0]]}}
    # the forward ran at 1800 MHz: a (timed at 1980) takes 1.1 there, b (timed at 1800) 2.0
    assert price_rounds(doc, clocks={"p": [1800.0]})["p"] == pytest.approx([3.1])
    assert price_rounds(doc)["p"] == pytest.approx([3.0])
    assert price_rounds(doc, clocks={"p": [None]}) == {}          # no clock: not priced


def test_rescore_bootstrap_intervals_hold_the_change_and_pairing_cancels_a_round_shift():
    from benchmarks.gpu.replay_rescore import bootstrap
    base = [(2.0, 0), (4.0, 0)] * 10                      # the host twice as slow every other round
    rows = [{"policy": "recompute", "measured_samples_s": base},
            {"policy": "replay:8", "measured_samples_s": [(t / 2, 0) for t, _ in base]}]
    got = bootstrap(rows)["replay:8"]
    assert got["n"] == 20
    assert got["paired"] == pytest.approx((1.0, 1.0, 1.0))   # the same change every round: no width
    lo, hi = got["medians"][1:]
    assert lo <= got["medians"][0] <= hi
    noisy = [{"policy": "recompute", "measured_samples_s": base},
             {"policy": "replay:8", "measured_samples_s": [(1.0 + 0.1 * (i % 3), 0) for i in range(20)]}]
    b = bootstrap(noisy)["replay:8"]
    assert b["medians"][1] < b["medians"][0] < b["medians"][2]   # a width where the rounds disagree
    assert bootstrap([{"policy": "recompute", "measured_samples_s": [(1.0, 0)]}]) == {}
