"""The twin's step cost of a measured engine: the cost model's category times through a StepProfile."""

from __future__ import annotations

import numpy as np

from costmodels.batch import decodes_then_chunks
from costmodels.calibration import CalibrationProfile
from costmodels.catalog import get_model
from costmodels.hardware import get_hardware
from costmodels.layout import ParallelLayout
from costmodels.ops import CATEGORIES
from costmodels.step import StepCostModel
from costmodels.host import flow_forward
from costmodels.step_ops import KV_UP, SAMPLED, TOKENS
from costmodels.step_profile import CATEGORY_FOLD, FIT_CATEGORIES, StepPoint, StepProfile

EXPERT = CATEGORIES.index("expert_gemm")  # the routed experts' slot of a cost-model category vector
DENSE = CATEGORIES.index("dense_gemm")


def reduced_model(name: str, num_layers: int | None = None, source: str = "--num-layers"):
    """The catalog model ``name`` cut to its first ``num_layers`` layers (what ``--num-layers`` runs); ``source`` names
    where ``num_layers`` came from in the error for one the model does not have."""
    spec = get_model(name)
    if num_layers is None or num_layers == spec.num_layers:
        return spec
    if not 1 <= num_layers <= spec.num_layers:   # a model cut longer than it is has nothing to price (and no bound)
        from twinfer.errors import TwinferError
        raise TwinferError(f"{source} {num_layers}: {spec.name} has {spec.num_layers} layers (give 1..{spec.num_layers})")
    kinds = spec.layer_kinds[:num_layers] if spec.layer_kinds else []
    return spec.model_copy(update={"num_layers": num_layers, "layer_kinds": kinds})


def _fold(v: np.ndarray) -> np.ndarray:
    """The fitted categories' times (FIT_CATEGORIES) from a cost-model category vector (``CATEGORY_FOLD``)."""
    out = np.zeros(len(FIT_CATEGORIES))
    for i in range(6):
        out[CATEGORY_FOLD[i]] += v[i]
    return out


class ProfiledStepCost:
    """Runner step time of a measured engine: the StepCost interface the simulator uses.

    ``mixed_step_time`` / ``chunked_step_time`` / ``decode_times`` return the *runner* step
    (``max(H, D) + overlap * min(H, D)``); the engine loop's own time (``profile.loop``) is left to
    the scheduler's host-overhead terms, as for any simulated engine (``loop_scheduler_terms``).
    Single GPU, no parallelism: the layout is TP1 in the profile's dtype.
    """

    def __init__(self, profile, step: StepProfile | None = None, num_layers: int | None = None, power=True):
        self.step = step or profile.step
        if self.step is None:
            raise ValueError("the calibration profile has no measured step model (run twinfer calibrate)")
        st = self.step
        self.num_layers = num_layers or st.num_layers
        self.model = reduced_model(st.model, self.num_layers,
                                   "--num-layers" if num_layers else "the profile's step.num_layers")
        dtype = st.dtype if st.dtype in ("bf16", "fp8", "fp4") else "bf16"
        self.layout = ParallelLayout(tp=1, weight_dtype=dtype, kv_dtype="bf16")
        cal = CalibrationProfile.default(get_hardware(st.hardware_basis)).model_copy(
            update={"op_table_libs": profile.op_table_libs})   # the GEMM library the engine ran, tables or not
        if st.use_op_tables:
            cal = profile if not st.op_tables else profile.model_copy(
                update={"tables": {**cal.tables, **{n: t for n, t in profile.tables.items() if n in st.op_tables}}})
        # the executor's sampler from its measured table (rows -> seconds, eager: it runs after the forward, serially),
        # outside the fitted categories; the cost model's analytic sampling row is left out then
        smp = profile.tables.get("sample") if "sample" in st.op_tables else None
        self.sample = smp if smp is not None and smp.vocab == self.model.vocab_size else None
        smp_kw = dict(measured_sampling=self.sample is not None, measured_logits=bool(self.sample and self.sample.includes_logits))
        # the model's own BF16 GEMMs (router, heads) on the analytic ramp, as every committed profile's fit took them
        self.base = StepCostModel(self.model, get_hardware(st.hardware_basis), self.layout, cal, profile_fit=True, **smp_kw)
        # the executor keeps kv_b_proj in the activation dtype (executor/mla.py: absorbed decode reads it per head), so
        # its K/V up-projection (prefill chunks over their cached context, the absorbed decode projections) is a BF16
        # GEMM in an FP8 engine too: the cost model prices it in the weight dtype, at half the BF16 time when compute-bound
        self.kv_bf16 = None
        self.pad_one_token = st.model_rev >= 1
        if st.model_rev >= 1 and dtype != "bf16" and self.model.attention == "mla" and self.model.mla.kv_up_proj:
            # priced on the analytic BF16 ramp (no op tables), as every committed profile's fit took it: the cost
            # model's BF16 layouts transfer the FP8 table (costmodels.op_table.TableGemms) since 2026-12-04, which
            # would move these fits' category scales (a refit's question, not a silent change)
            self.kv_bf16 = StepCostModel(self.model, get_hardware(st.hardware_basis), ParallelLayout(tp=1, weight_dtype="bf16", kv_dtype="bf16"),
                                         cal.model_copy(update={"op_tables": None}), **smp_kw)
        self._kvx: dict[float, float] = {}
        # a prefill chunk's keys and values from its cached latents, measured (KvExpandTable): in place of the
        # analytic K/V up-projection GEMM over the chunk's keys, priced as measured in prefill attention (it runs
        # eagerly between the graph pieces, beside the chunk's attention)
        m = self.model
        kvt = profile.tables.get("kv_expand") if "kv_expand" in (st.op_tables or []) else None
        self.kv_expand = kvt if (kvt is not None and m.attention == "mla" and m.mla.kv_up_proj and m.indexer is None
                                 and kvt.matches(m.num_attention_heads, m.mla.qk_nope_head_dim, m.mla.v_head_dim,
                                                 m.mla.kv_lora_rank)) else None
        self.k = st.scales()
        # launch_device's table as arrays, once (it prices every pipelined graph step)
        lr = st.launch_device_rows
        self._launch_rows = (np.array([r for r, _ in lr], float), np.array([v for _, v in lr])) if lr else None
        self.k_eager = st.eager_scales()   # steps that are not decode-graph replays (their device work measured apart)
        # which layers are dense (no routed experts): their device share of a layered forward (layer_fractions)
        self._dense = [not self.model.is_moe_layer(i) for i in range(self.base.n_layers)]
        self._dense_rows = self.base.row_share(TOKENS, lambda i: not self.model.is_moe_layer(i))
        self._gd: dict[float, tuple[float, float]] = {}
        self.pipelined_loop = False   # see pipelined()
        self._pipelined: ProfiledStepCost | None = None
        self.notes = [
            f"step times from the measured profile of {st.model} ({st.num_layers} layers, {st.dtype}) on {profile.measured_on}: "
            + ("runner = serial host + " if st.host.serial_s or st.host.serial_per_request_s or st.host.serial_per_prefill_s or st.host.serial_per_token_s
               else "runner = ")
            + f"max(host, device) + {st.overlap:.2f} min(host, device); fit MAPE "
            + (f"{st.fit.mape * 100:.1f}%" if st.fit.mape is not None else "n/a")
        ]
        if self.sample is not None:
            self.notes.append(f"the {'logits GEMM and ' if self.sample.includes_logits else ''}sampler from the profile's "
                              "measured table (rows -> seconds), as measured")
        if self.num_layers != st.num_layers:
            self.notes.append(f"profile measured at {st.num_layers} layers, applied to {self.num_layers}: host terms scale only through per_layer_s")
        self._dec: dict[tuple[int, int, int], tuple[np.ndarray, float]] = {}
        # the board power limit (costmodels.power): where the calibration measured its board's reference loops
        # (``profile.power_ref``) and the GPU kind has a committed power model, the simulator and validate price each
        # prompt step at the clock the work before it allows on that board (``power=False``, or a profile without the
        # reference: at full clock, as the op tables were timed)
        # (a PowerModel given as ``power``: that model as is, e.g. the GPU kind's median board for a profile measured
        # before the reference loops: ``scripts/matrix_offline.py --power-kind``)
        from costmodels.power import PowerModel, power_model
        self._work: dict[tuple, tuple[float, float]] = {}
        if isinstance(power, PowerModel):
            self.power = power
        else:
            kind = power_model(st.hardware_basis) if power else None
            ref = getattr(profile, "power_ref", None)
            self.power = kind.for_board(ref, self.step_work) if kind is not None and ref is not None else None
            if kind is not None and ref is not None and self.power is None:
                self.notes.append("the board's power reference loops could not be reproduced by the power model: "
                                  "steps priced at full clock")
        if self.power is not None:
            pm = self.power
            self.notes.append(f"board power limit {pm.cap_w:.0f} W ({pm.gpu} power model fitted to this board's "
                              f"reference loops: idle {pm.idle_w:.0f} W, busy {pm.busy_w:.0f} W, {pm.w_per_pflops:.0f} W "
                              f"per PFLOP/s, {pm.w_per_tbps:.0f} W per TB/s; prompt steps' clock share "
                              f"{pm.clock_share_prompt:.2f}): the pipelined loop's prompt steps priced at the clock "
                              "their history allows")

    def step_work(self, decode_ctx, draft_len: int, prefill_new, prefill_ctx) -> tuple[float, float]:
        """(FLOPs, HBM bytes) of one step as the cost model counts its ops (``StepCostModel.step``), what the power
        model's rates are made of; memoised by composition (decode contexts by their mean, in steps of 256 tokens;
        chunks in steps of 64 new and 256 cached tokens: the work is near linear in both)."""
        dctx = np.asarray(decode_ctx, np.int64)
        nd = int(dctx.size)
        mean = int(dctx.sum()) // nd if nd else 0
        key = (nd, mean // 256, draft_len, tuple(int(x) // 64 for x in prefill_new), tuple(int(c) // 256 for c in prefill_ctx))
        w = self._work.get(key)
        if w is None:
            from costmodels.batch import BatchShape
            new, ctx, dec = decodes_then_chunks(np.full(nd, mean, np.int64), draft_len, list(prefill_new), list(prefill_ctx))
            ops = self.base.step(BatchShape(new_tokens=new, context_lens=ctx, is_decode=dec)).ops
            w = self._work[key] = (float(sum(o.flops for o in ops)), float(sum(o.bytes for o in ops)))
        return w

    # --- category times from the cost model
    def kv_up_extra(self, rows: float) -> float:
        """Seconds the K/V up-projection of ``rows`` rows costs beyond the cost model's weight-dtype price (it runs
        in BF16 in the executor; 0 in a BF16 engine)."""
        if self.kv_bf16 is None or rows <= 0:
            return 0.0
        got = self._kvx.get(rows)
        if got is None:
            x = np.array([float(rows)])
            got = self._kvx[rows] = max(0.0, float(self.kv_bf16.gemms(KV_UP, x).time.sum() - self.base.gemms(KV_UP, x).time.sum()))
        return got

    def category_times(self, new: np.ndarray, ctx: np.ndarray, dec: np.ndarray) -> np.ndarray:
        """Cost-model op time per fitted category (attention, dense, experts, other) for one batch (not a decode-graph
        replay). With piecewise graphs (``StepProfile.piecewise_sizes``) the step's token rows pad to its bucket: the
        GEMMs, experts and row-wise ops run on the bucket (padding rows are real work: vLLM's piecewise graphs pay
        the same); attention and the K/V up-projection run eagerly on the real rows."""
        b = self.base
        new = np.asarray(new, np.int64)
        ctx = np.asarray(ctx, np.int64)
        dec = np.asarray(dec, bool)
        if new.size == 0:
            return np.zeros(len(FIT_CATEGORIES))
        draft = b.draft_of(new, dec)
        counts = b.counts(new, ctx, dec, draft)
        pad = self.step.piecewise_bucket(int(counts[0]))   # piecewise graphs: GEMMs and experts on the bucket's rows
        if pad > counts[0]:
            counts = (float(pad),) + tuple(counts[1:])
        kvx = 0.0
        if self.kv_expand is not None and not dec.all():
            keys = (ctx[~dec] + new[~dec]).astype(float)     # each chunk's keys: counts' K/V up-projected rows
            kvx = float(self.kv_expand(keys)[0].sum()) * self.model.num_layers
            counts = (counts[0], max(counts[1] - float(keys.sum()), 0.0)) + tuple(counts[2:])
        out = _fold(b.nonattn(*counts, 1.0))
        out[FIT_CATEGORIES.index("dense_gemm")] += self.kv_up_extra(counts[1])
        out[FIT_CATEGORIES.index("prefill_attention")] += kvx
        if dec.any():
            a = b.attention(new[dec], ctx[dec], dec[dec], draft, 1.0, None)
            out[0] += a[0] + a[1]
        if not dec.all():
            a = b.attention(new[~dec], ctx[~dec], dec[~dec], 0, 1.0, None)
            out[1] += a[0] + a[1]
        return out

    def _decode_base(self, n: int, draft_len: int, pad: int = 0, logits: bool = True) -> tuple[np.ndarray, float]:
        """Non-attention category times of a decode batch of ``n`` (run as ``pad`` rows when a graph pads it;
        logits only for the real rows; ``logits=False``: without the logits GEMM and sampling, which run after the
        graph) and their sum.

        Padding rows are one token repeated (token 0 at position 0: ``executor.cuda_graphs.StaticInputs.fill``), so
        they all route to the same top-k experts: the routed experts of a padded graph read the weights of ``n + 1``
        distinct tokens' experts, not ``pad``'s. Priced on ``pad`` random tokens, a batch of 9 in the 16-row graph
        cost ~1.4x the experts it touches (H200 run 4: measured time rises from 6.9 to 7.8 ms across b = 9..16 of the
        16-row graph, the padded-row model was flat at 7.6-7.9 ms)."""
        pad = max(pad, n)
        key = (n, draft_len, pad, logits)
        got = self._dec.get(key)
        if got is None:
            g = 1 + draft_len
            rows = float(n * g) if logits else 0.0
            v = self.base.nonattn(float(pad * g), float(pad * g), rows, float(pad), float(draft_len), 0.0, 1.0)
            total = float(v[:6].sum())   # the cost model's own sum: decode_times subtracts it from its step time
            if pad > n and self.pad_one_token and self.base.model.moe:
                w = self.base.nonattn(float((n + 1) * g), float((n + 1) * g), rows, float(n + 1), float(draft_len), 0.0, 1.0)
                v[EXPERT] = min(v[EXPERT], w[EXPERT])
            v[DENSE] += self.kv_up_extra(float(pad * g))
            got = (_fold(v), total)
            self._dec[key] = got
        return got

    def sample_s(self, rows: float) -> float:
        """Measured sampler seconds for ``rows`` sampled rows (0 without a table: then the categories price it)."""
        if self.sample is None or rows <= 0:
            return 0.0
        return float(self.sample([rows])[0][0])

    def sample_split(self, rows: float) -> tuple[float, float]:
        """(device, host) seconds of the sampler over ``rows`` rows: its measured device work alone, and its host issue
        (the logits GEMM's and sampling's calls, ``HostTerms.sample_issue``, from the calibration's measured 'sample'
        phase), or where that was not fitted the rest of its eager seconds; all device where the table did not time
        the device work apart (older profiles: the pipelined rule then over-prices the sampler)."""
        total = self.sample_s(rows)
        dev = self.sample.device([rows]) if self.sample is not None and rows > 0 else None
        if dev is None:
            return total, 0.0
        d = float(dev[0])
        if self.step.host.sample_issue_s > 0:   # its host issue as the calibration's steps measured it
            return d, float(self.step.host.sample_issue(rows))
        return d, total - d

    def launch_device(self, rows: int) -> float:
        """Device seconds a pipelined launch of a decode graph of ``rows`` rows holds beyond its forward and sampler:
        the held launch spans measured at the grid's row counts (``StepProfile.launch_device_rows``, linear between
        them; a graph batch never exceeds the grid's largest bucket, which the grid measures), else the line fitted to
        them (``launch_device_s`` + per row); 0 on profiles without the held launch spans."""
        if self._launch_rows is not None:
            return float(np.interp(rows, *self._launch_rows))
        return self.step.launch_device_s + self.step.launch_device_per_row_s * rows

    @staticmethod
    def sampled_rows(new: np.ndarray, dec: np.ndarray) -> float:
        """Rows the sampler runs over in one step: each decode's tokens (its drafts' verification rows included) and
        one per prefill chunk (``StepCostModel.counts``' count; the runner samples only a prompt's last chunk, and
        the step model does not know which chunk is last). MTP drafting's own logits are argmax'd, not sampled: the
        cost model prices their lm_head with the MTP pass."""
        return float(new[dec].sum() + (~dec).sum())

    def host_time(self, n_req: int, n_tok: int, n_prefill: int) -> float:
        st = self.step
        unbucketed = bool(st.piecewise_sizes) and st.piecewise_bucket(int(n_tok)) == 0
        return float(st.host(self.num_layers, n_req, n_tok, n_prefill)) + (st.host.unbucketed_s if unbucketed else 0.0)

    def graph_categories(self, ctx: np.ndarray, pad: int, logits: bool = True) -> np.ndarray:
        """Category times of a decode-only batch replayed as the CUDA graph of ``pad`` rows: the GEMMs and
        experts on ``pad`` rows, attention on the real rows (padding rows read one null-page token). ``logits=False``:
        the graph's own work only, as ``StepPoint.forward_s`` times it (the logits GEMM and sampling follow it)."""
        ctx = np.asarray(ctx, np.int64)
        n = ctx.size
        cats = self._decode_base(n, 0, pad, logits)[0]
        att = float(self.base.decode_times(ctx.astype(float), 1, 0)[0]) - self._decode_base(n, 0)[1]
        out = cats.copy()
        out[0] += att
        return out

    def pipelined(self) -> "ProfiledStepCost":
        """This model for an engine whose loop prepares and launches step N+1 while the device runs step N (the
        executor's ``async_overlap``, executor/overlap.py): a step then costs max(its device work, its host work),
        the host work being the runner's (the serial input build and bookkeeping, the forward's issue, a graph step's
        input build and launch) and the loop's (the profile's loop terms), where the synchronous loop adds them.
        The simulator takes it when the scheduler config overlaps (``sim.backend.loop_cost``); its loop host then
        hides under the same max. Valid only for a loop that never waits for the device mid-step: H200 async bench
        after b0cb3ef removed the last per-step syncs (the sampler's read-back, pageable placeholder copies):
        +15.5% step-time gain past saturation, where the runner model of 1b8169c was removed when the loop still
        waited."""
        if self.pipelined_loop:
            return self
        if self._pipelined is None:   # made once: validate asks for it per measured step
            import copy
            c = copy.copy(self)
            c.pipelined_loop = True
            self._pipelined = c
        return self._pipelined

    def _step_terms(self, new: np.ndarray, ctx, dec: np.ndarray) -> tuple:
        """A non-empty step's priced terms, both loops' prices start from: ``("graph", forward, graph host)`` for a
        decode-only batch replayed as a captured CUDA graph, else ``("eager", categories, device, issue host, serial
        host, sampled rows)``."""
        if dec.all() and (new == 1).all():
            pad = self.step.graph_bucket(new.size)
            if pad:
                return ("graph", float(self._graph_forward(self.graph_categories(ctx, pad), 0.0)),
                        float(self.step.host.graph(new.size, float(np.sum(ctx)))))
        cats = self.category_times(new, ctx, dec)
        return ("eager", cats, self.eager_device(new, ctx, dec, cats), self.host_time(new.size, int(new.sum()), int((~dec).sum())),
                float(self.step.host.serial(new.size, int((~dec).sum()), int(new[~dec].sum()))), self.sampled_rows(new, dec))

    def pipelined_parts(self, new_tokens, context_lens, is_decode) -> tuple[float, float]:
        """(device, host) seconds of one step in the pipelined loop, whose max is what the pipelined model charges
        it (``mixed_step_time``): the device work (forward, and the sampler's device work) and the host work that
        launches it (the input build, the forward's issue or a graph's launch, the sampler's issue, and the profile's
        loop terms). Read apart by ``benchmarks/step_residuals.py`` against where the engine's iterations end (the
        loop launches step N+1 before it reads step N back)."""
        return self.launch_parts(new_tokens, context_lens, is_decode)[:2]

    def launch_parts(self, new_tokens, context_lens, is_decode) -> tuple[float, float, bool, float]:
        """``(device, host, eager, tail)`` of one step in the pipelined loop: ``pipelined_parts``, whether it runs
        eagerly (not a captured graph's replay), and the device work its launch issues last (the sampler's): what
        ``costmodels.host.pipeline_step`` takes."""
        new = np.asarray(new_tokens, np.int64)
        if new.size == 0:
            return 0.0, 0.0, False, 0.0
        t = self._step_terms(new, context_lens, np.asarray(is_decode, bool))
        loop = float(self.step.loop(new.size, int(new.sum())))
        if t[0] == "graph":
            sd, sh = self.sample_split(new.size)
            return t[1] + sd + self.launch_device(new.size), t[2] + sh + loop, False, sd
        _, _, d, h, serial, sampled = t
        sd, sh = self.sample_split(sampled)
        return d + sd, serial + h + sh + loop, True, sd

    def step_parts(self, decode_ctx, draft_len: int, prefill_new, prefill_ctx) -> tuple[float, float, bool, float]:
        """``launch_parts`` of a step given as its decodes (their contexts, each verifying ``draft_len`` drafts) and
        prefill chunks (new, cached tokens): a decode-only step as ``decode_times`` prices it (``decode_parts``, graph
        bucket by drafts), one with chunks as ``chunked_step_time`` does. What the simulator's pipelined loop and
        ``twinfer validate``'s per-step prediction both price a launch from."""
        if not len(prefill_new):
            return self.decode_parts(decode_ctx, draft_len)
        return self.launch_parts(*decodes_then_chunks(decode_ctx, draft_len, prefill_new, prefill_ctx))

    # --- StepCost interface
    def mixed_step_time(self, new_tokens, context_lens, is_decode) -> float:
        new = np.asarray(new_tokens, np.int64)
        if new.size == 0:
            return 0.0
        if self.pipelined_loop:
            return float(max(self.pipelined_parts(new, context_lens, is_decode)))
        t = self._step_terms(new, context_lens, np.asarray(is_decode, bool))
        if t[0] == "graph":
            return t[2] + t[1] + self.sample_s(new.size)
        _, cats, d, h, serial, sampled = t
        smp = self.sample_s(sampled)
        if self.step.layer_early is None:
            return serial + float(self.step.combine(h, d + smp))
        rows = self.step.piecewise_bucket(int(new.sum())) or int(new.sum())
        return serial + self.eager_forward(h, d, rows, cats) + smp

    def layer_fractions(self, rows: float, cats: np.ndarray) -> np.ndarray:
        """Each layer's share of a step's device work, in forward order: the GEMMs of the layers with a dense FFN
        (``rows`` tokens through the cost model's per-layer-group GEMM rows), the routed experts (``cats``' expert
        category) in the MoE layers only, the rest (attention, norms, the rest of ``cats``) evenly over every layer.
        Even shares for a model whose layers are all of one kind."""
        L = len(self._dense)
        k = sum(self._dense)
        if k in (0, L):
            return np.full(L, 1.0 / L)
        got = self._gd.get(rows)
        if got is None:
            g = self.base.gemms(TOKENS, np.array([float(rows)])).time[:, 0]
            got = self._gd[rows] = (float((g * self._dense_rows).sum()), float(g.sum()))
        gd, gall = got
        total = float(np.sum(cats))
        if total <= 0:
            return np.full(L, 1.0 / L)
        rest = max(total - float(cats[FIT_CATEGORIES.index("expert_gemm")]) - gall, 0.0)
        fd = min(max((gd + rest * k / L) / total, 0.0), 1.0)
        return np.array([fd / k if d else (1.0 - fd) / (L - k) for d in self._dense])

    def eager_forward(self, host: float, device: float, rows: float, cats: np.ndarray) -> float:
        """A forward that is not a decode-graph replay from its host issue and device work: layer by layer in order
        plus ``overlap x min(H, D)`` where the profile measured it (``layer_early``), else ``max(H, D) + overlap x
        min(H, D)``."""
        if self.step.layer_early is None:
            return float(self.step.combine(host, device))
        return flow_forward(host, device, self.layer_fractions(rows, cats), self.step.layer_early, self.step.overlap)

    def eager_device(self, new: np.ndarray, ctx: np.ndarray, dec: np.ndarray, cats: np.ndarray | None = None) -> float:
        """Device seconds of the forward of a step that is not a decode-graph replay (sampler excluded): its category
        times (``cats``, ``category_times`` of the step when given) at the eager scales, the per-prefill-token term
        and, when it holds decodes, the eager decode group's."""
        new, dec = np.asarray(new, np.int64), np.asarray(dec, bool)
        if cats is None:
            cats = self.category_times(new, ctx, dec)
        return (float(cats @ self.k_eager) + self.step.prefill_token_s * float(new[~dec].sum())
                + (self.step.eager_decode_group_s if dec.any() else 0.0))

    def chunked_step_time(self, decode_context_lens, draft_len: int, prefill_new: list[int], prefill_ctx: list[int]) -> float:
        return self.mixed_step_time(*decodes_then_chunks(decode_context_lens, draft_len, prefill_new, prefill_ctx))

    def decode_times(self, context_lens, num_steps: int, draft_len: int = 0) -> np.ndarray:
        ctx = np.asarray(context_lens, float)
        n = ctx.size
        if n == 0 or num_steps <= 0:
            return np.zeros(max(num_steps, 0))
        pad = self.step.graph_bucket(n, draft_len)
        total = self._decode_base(n, draft_len)[1]
        cats = self._decode_base(n, draft_len, pad)[0]
        att = np.asarray(self.base.decode_times(ctx, num_steps, draft_len), float) - total  # attention (+ indexer) per step
        rows = float(n * (1 + draft_len))
        if self.pipelined_loop:
            d, h, _ = self._decode_split(ctx, n, draft_len, pad, cats, att, rows)
            return np.maximum(d, h)
        if pad:
            d = self._graph_forward(cats, att) + self.sample_s(rows)
            return float(self.step.host.graph(n, float(ctx.sum()))) + d
        ke = self.k_eager
        smp = self.sample_s(rows)
        d = float(cats[1:] @ ke[1:]) + (cats[0] + att) * ke[0] + self.step.eager_decode_group_s
        h = self.host_time(n, n * (1 + draft_len), 0)
        if self.step.layer_early is None:
            return self.step.host.serial(n, 0) + self.step.combine(h, d + smp)
        c = cats.copy()
        c[0] = c[0] + float(np.mean(att))
        fwd = np.array([self.eager_forward(h, float(di), rows, c) for di in np.atleast_1d(d)])
        return self.step.host.serial(n, 0) + (fwd if np.ndim(d) else float(fwd[0])) + smp

    def _graph_forward(self, cats: np.ndarray, att):
        """Device seconds of a decode graph's replay: its categories at the graph scales with the attention per step
        ``att`` (an array or a float) beside them, and the replay's fixed device cost (``StepProfile.graph_replay_s``)."""
        return float(cats[1:] @ self.k[1:]) + (cats[0] + att) * self.k[0] + self.step.graph_replay_s

    def _decode_split(self, ctx: np.ndarray, n: int, draft_len: int, pad: int, cats: np.ndarray, att, rows: float):
        """(device, host, sampler device) of decode steps in the pipelined loop (``att``: attention per step, an array
        or a float): a graph replay's forward and sampler device work against its input build, launch and sampler
        issue, or an eager step's device work against its serial build and issue; the loop's own terms
        (``step.loop``) on the host side, as ``pipelined_parts`` splits a step."""
        sd, sh = self.sample_split(rows)
        loop = float(self.step.loop(n, int(rows)))
        if pad:
            d = self._graph_forward(cats, att) + sd + self.launch_device(n)
            return d, float(self.step.host.graph(n, float(ctx.sum()))) + sh + loop, sd
        ke = self.k_eager
        d = float(cats[1:] @ ke[1:]) + (cats[0] + att) * ke[0] + self.step.eager_decode_group_s + sd
        return d, float(self.step.host.serial(n, 0)) + self.host_time(n, int(rows), 0) + sh + loop, sd

    def decode_parts(self, context_lens, draft_len: int = 0) -> tuple[float, float, bool, float]:
        """``(device, host, eager, tail)`` of one decode step at ``context_lens`` in the pipelined loop: what
        ``decode_times`` takes the max of, whether the step runs eagerly (no captured graph for its batch), and the
        device work issued last (the sampler's)."""
        ctx = np.asarray(context_lens, float)
        n = ctx.size
        if n == 0:
            return 0.0, 0.0, False, 0.0
        pad = self.step.graph_bucket(n, draft_len)
        cats = self._decode_base(n, draft_len, pad)[0]
        att = float(np.asarray(self.base.decode_times(ctx, 1, draft_len), float)[0]) - self._decode_base(n, draft_len)[1]
        d, h, sd = self._decode_split(ctx, n, draft_len, pad, cats, att, float(n * (1 + draft_len)))
        return float(d), float(h), not pad, sd

    def point_time(self, p: StepPoint) -> float:
        """Predicted runner time of a measured point."""
        return self.chunked_step_time(np.asarray(p.decode_ctx, np.int64), p.draft_len, [a for a, _ in p.prefill], [c for _, c in p.prefill])

    def memory(self):
        return self.base.memory()


def _point_sampled_rows(p: StepPoint) -> float:
    new, _, dec = decodes_then_chunks(p.decode_ctx, p.draft_len, [a for a, _ in p.prefill], [c for _, c in p.prefill])
    return ProfiledStepCost.sampled_rows(np.asarray(new, np.int64), np.asarray(dec, bool))


def point_sample_s(cost: ProfiledStepCost, p: StepPoint) -> float:
    """The measured sampler's seconds in a measured point (0 without a table), as ``mixed_step_time`` adds them."""
    return cost.sample_s(_point_sampled_rows(p)) if cost.sample is not None else 0.0


def point_after_forward_s(cost: ProfiledStepCost, p: StepPoint) -> float:
    """Device work a measured point runs after its forward: the sampler from its table, and the logits GEMM where the
    table did not time it (profiles before the table timed both: the cost model's GEMM at scale 1)."""
    if cost.sample is None:
        return 0.0
    rows = _point_sampled_rows(p)
    t = cost.sample_s(rows)
    if not cost.sample.includes_logits:
        t += float(cost.base.gemms(SAMPLED, np.array([rows])).total()[0])
    return t


def point_categories(cost: ProfiledStepCost, p: StepPoint) -> np.ndarray:
    """Cost-model category times of a measured point (as the step ran: padded to its graph size if it replayed one)."""
    nd = len(p.decode_ctx)
    if p.graph_bs > 0 and nd and not p.prefill and not p.draft_len:
        return cost.graph_categories(np.asarray(p.decode_ctx, np.int64), p.graph_bs)
    return cost.category_times(*decodes_then_chunks(p.decode_ctx, p.draft_len, [a for a, _ in p.prefill], [c for _, c in p.prefill]))
