"""Piecewise CUDA graphs in the executor twin's step model: a prefill/mixed step of T tokens runs its GEMMs and experts
on its token bucket (executor/piecewise_graphs.py), attention on the real rows; the fit prices its points that way and
keeps the buckets. CPU only, synthetic points."""

from __future__ import annotations

import numpy as np
import pytest

from costmodels.calibration import CalibrationProfile
from costmodels.hardware import get_hardware
from costmodels.profiled import ProfiledStepCost
from costmodels.step_fit import fit_step_profile, refit_profile
from costmodels.step_profile import FIT_CATEGORIES, HostTerms, StepPoint, StepProfile

DENSE, EXPERT = FIT_CATEGORIES.index("dense_gemm"), FIT_CATEGORIES.index("expert_gemm")


def _profile() -> CalibrationProfile:
    return CalibrationProfile.default(get_hardware("H200"))


def test_bucket_is_the_smallest_size_that_holds_the_step():
    st = StepProfile(model="deepseek-v3", num_layers=4, piecewise_sizes=[8, 16, 64])
    assert [st.piecewise_bucket(n) for n in (0, 1, 8, 9, 16, 17, 64, 65)] == [0, 8, 8, 16, 16, 64, 64, 0]
    assert StepProfile(model="deepseek-v3", num_layers=4).piecewise_bucket(5) == 0


def test_padded_rows_cost_gemm_and_expert_work_but_not_attention():
    base = StepProfile(model="deepseek-v3", num_layers=4, dtype="fp8", device="cuda")
    pw = ProfiledStepCost(_profile(), base.model_copy(update={"piecewise_sizes": [512, 1024]}))
    eager = ProfiledStepCost(_profile(), base)
    one = lambda c, q: c.category_times(np.array([q]), np.array([0]), np.array([False]))  # noqa: E731
    padded, real, full = one(pw, 600), one(eager, 600), one(eager, 1024)
    assert padded[EXPERT] == pytest.approx(full[EXPERT]) and padded[EXPERT] > real[EXPERT]
    assert padded[DENSE] > real[DENSE]
    assert padded[1] == pytest.approx(real[1])                  # prefill attention: the 600 real rows only
    assert np.allclose(one(pw, 1024), full) and np.allclose(one(pw, 2000), one(eager, 2000))   # a bucket exactly; over the largest: eager
    # decode-graph steps are untouched by the piecewise buckets
    dec = dict(decode_context_lens=np.array([100] * 8), draft_len=0, prefill_new=[], prefill_ctx=[])
    g = base.model_copy(update={"graph_sizes": [8]})
    assert ProfiledStepCost(_profile(), g.model_copy(update={"piecewise_sizes": [512]})).chunked_step_time(**dec) == \
        pytest.approx(ProfiledStepCost(_profile(), g).chunked_step_time(**dec))


def test_fit_prices_points_at_their_bucket_and_keeps_the_buckets():
    prof = _profile()
    sizes = [64, 128, 256, 512, 640, 768, 1024]
    truth = StepProfile(model="deepseek-v3", num_layers=4, dtype="fp8", device="cuda", piecewise_sizes=sizes,
                        category_scale=dict(zip(FIT_CATEGORIES, (1.2, 1.1, 0.9, 1.3, 1.0))),
                        host=HostTerms(fixed_s=4e-3, per_prefill_s=1e-4), overlap=0.3)
    cost = ProfiledStepCost(prof, truth)
    pts = [StepPoint(num_layers=4, decode_ctx=[300] * d, prefill=[(q, c)], wall_s=1.0)
           for q in (60, 100, 200, 300, 520, 700, 900, 1000) for c in (0, 1500) for d in (0, 5)]
    pts = [p.model_copy(update={"wall_s": cost.point_time(p)}) for p in pts]
    st = fit_step_profile(prof, pts, model="deepseek-v3", dtype="fp8", device="cuda", piecewise_sizes=sizes, scale_bounds=None)
    assert st.piecewise_sizes == sizes and st.fit.mape < 0.01
    unpadded = fit_step_profile(prof, pts, model="deepseek-v3", dtype="fp8", device="cuda", scale_bounds=None)
    assert unpadded.fit.mape > st.fit.mape                     # the same points priced unpadded fit worse
    back = refit_profile(prof.model_copy(update={"step": st}), "none").step
    assert back.piecewise_sizes == sizes


def test_decode_group_host_term_is_charged_once_per_step_with_decodes_and_recovered_by_the_fit():
    """A step that is not a decode-graph replay and holds decodes issues the decode group's attention path once per
    layer for all of them (``HostTerms.decode_group_s``): charged once, whatever the number of decodes, and not in a
    prompt-only step; the fit recovers it from points that differ only in having decodes (as run 10's grid did)."""
    h = HostTerms(fixed_s=1e-3, per_prefill_s=1e-4, decode_group_s=2e-3)
    assert h(4, 1, 64, 1) == pytest.approx(1.1e-3)                                  # one chunk, no decodes
    assert h(4, 2, 65, 1) == pytest.approx(3.1e-3) == h(4, 49, 112, 1)              # 1 or 48 decodes: once
    assert h(4, 8, 8, 0) == pytest.approx(3e-3)                                     # an eager decode-only step
    assert np.allclose(h(4, np.array([1, 2, 9]), np.array([64, 65, 72]), np.array([1, 1, 1])), [1.1e-3, 3.1e-3, 3.1e-3])
    prof = _profile()
    sizes = [64, 128, 256, 512, 640, 768, 1024]
    truth = StepProfile(model="deepseek-v3", num_layers=4, dtype="fp8", device="cuda", piecewise_sizes=sizes,
                        category_scale=dict(zip(FIT_CATEGORIES, (1.2, 1.1, 0.9, 1.3, 1.0))),
                        host=HostTerms(fixed_s=4e-3, per_prefill_s=1e-4, decode_group_s=2.5e-3), overlap=0.5)
    cost = ProfiledStepCost(prof, truth)
    pts = [StepPoint(num_layers=4, decode_ctx=[300] * d, prefill=[(q, c)], wall_s=1.0)
           for q in (60, 100, 200, 300, 520, 700, 900, 1000) for c in (0, 1500) for d in (0, 3, 20)]
    pts = [p.model_copy(update={"wall_s": cost.point_time(p)}) for p in pts]
    st = fit_step_profile(prof, pts, model="deepseek-v3", dtype="fp8", device="cuda", piecewise_sizes=sizes, scale_bounds=None)
    assert st.fit.mape < 0.01 and st.host.decode_group_s == pytest.approx(2.5e-3, rel=0.1)
    without = [p for p in pts if not p.decode_ctx]
    st0 = fit_step_profile(prof, without, model="deepseek-v3", dtype="fp8", device="cuda", piecewise_sizes=sizes, scale_bounds=None)
    assert st0.host.decode_group_s == 0.0                        # no step with decodes: nothing to identify it
