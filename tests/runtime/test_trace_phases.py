"""The measured time split, on hand-made profiler traces whose answer is known to the microsecond: every
moment of a step lands in exactly one term, by the rules of runtime/train/trace_phases.py."""

import pytest

from autoplan.schema.trace import check_trace
from autoplan.schema.trace import MEASURED_TERMS
from runtime.train.trace_phases import merged_trace, rank_phases

MAIN = 7


def op(name, ts, dur, cat="cpu_op", tid=MAIN, pid=1, **args):
    e = {"name": name, "ph": "X", "ts": ts, "dur": dur, "cat": cat, "pid": pid, "tid": tid}
    if args:
        e["args"] = {"External id": args["ext"]}
    return e


def label(name, ts, dur, tid=MAIN):
    return op(name, ts, dur, cat="user_annotation", tid=tid)


def host_step(t0: float, step: int) -> list[dict]:
    """One 1000 us step: data (other), a forward with a TP all-reduce, a p2p send, a wait, a backward that
    recomputes a block, a wait, the optimizer, and a blocking loss all-reduce's wait."""
    return [
        label(f"autoplan:step {step}", t0, 1000),
        op("aten::randint", t0 + 10, 20),                      # other 40: a 5 us pause between two ops
        op("aten::slice", t0 + 35, 15),                        # of one piece of work is not a wait
        label("autoplan:forward 1 0", t0 + 100, 300),          # compute 250
        op("aten::linear", t0 + 110, 280),
        op("_c10d_functional::all_reduce", t0 + 200, 30),      # tp comm 50
        op("_c10d_functional::wait_tensor", t0 + 230, 20),
        op("c10d::send", t0 + 400, 50),                        # pp comm 50
        label("autoplan:backward 1 0", t0 + 500, 300),         # compute 210
        label("autoplan:recomputable", t0 + 510, 90),          # recompute 90
        op("aten::linear", t0 + 515, 80),
        op("c10d::allreduce_", t0 + 600, 10, tid=99),          # another thread: ignored on CPU
        label("Optimizer.step#AdamW.step", t0 + 850, 100),     # optimizer 100
    ]                                                          # bubble: 10 + 50 + 50 + 50 + 50 = 210


def test_host_split_is_exact():
    events = host_step(5000.0, 4) + host_step(6500.0, 5)
    phases = rank_phases(events, zero_stage=0)
    assert [s["step"] for s in phases["steps"]] == [4, 5]
    expected = {"compute": 460, "recompute": 90, "tp_comm": 50, "pp_comm": 50, "bubble": 210, "optimizer": 100,
                "other": 40, "zero3_gather": 0, "dp_comm": 0, "cp_comm": 0, "ep_comm": 0}
    for step in phases["steps"]:
        assert step["duration_s"] == pytest.approx(1e-3)
        assert {k: round(v * 1e6, 6) for k, v in step["terms_s"].items()} == expected
    assert phases["steps"][1]["start_us"] == 1500.0  # aligned on the first traced step's start


def test_all_to_all_in_forward_and_backward_is_ep_comm():
    """MoE dispatch and combine (all_to_all_single) inside a forward or backward: ep_comm, not tp_comm."""
    t0 = 1000.0
    events = [label("autoplan:step 1", t0, 1000),
              label("autoplan:forward 0 0", t0 + 100, 300),
              op("aten::linear", t0 + 100, 100),                         # compute 100
              op("_c10d_functional::all_to_all_single", t0 + 200, 60),   # ep comm 60
              op("aten::linear", t0 + 260, 140),                         # compute 140
              label("autoplan:backward 0 0", t0 + 500, 300),
              op("c10d::alltoall_base_", t0 + 500, 40),                  # ep comm 40
              op("aten::mm", t0 + 540, 260)]                             # compute 260
    [step] = rank_phases(events, zero_stage=0)["steps"]
    terms = {k: round(v * 1e6, 6) for k, v in step["terms_s"].items()}
    assert (terms["ep_comm"], terms["compute"], terms["tp_comm"]) == (100, 500, 0)


def test_fsdp_and_zero1_contexts():
    events = [
        label("autoplan:step 1", 0, 1000),
        label("autoplan:forward 0 0", 0, 300),
        label("FSDP::pre_forward", 0, 100), op("c10d::allgather_", 10, 80),   # ZeRO-3 gather 100
        op("aten::linear", 100, 200),                                          # compute 200
        label("autoplan:backward 0 0", 300, 400),
        label("FSDP::post_backward_reduce", 600, 100), op("c10d::reduce_scatter_", 610, 80),  # dp 100
        label("Optimizer.step#Zero1AdamW.step", 700, 300), op("c10d::broadcast_", 900, 100),  # dp 100, opt 200
    ]
    terms = rank_phases(events, zero_stage=3)["steps"][0]["terms_s"]
    assert {k: round(v * 1e6) for k, v in terms.items() if v} == {"zero3_gather": 100, "compute": 500, "dp_comm": 200,
                                                                  "optimizer": 200}
    terms = rank_phases(events, zero_stage=2)["steps"][0]["terms_s"]  # ZeRO-2's all-gather is DP work
    assert round(terms["dp_comm"] * 1e6) == 300 and terms["zero3_gather"] == 0


def test_ring_attention_collectives_are_cp_comm():
    """Context parallelism: inside the ring label its all-gather and permutes are cp comm, its kernels compute;
    in a recomputed forward inside backward the kernels stay recompute."""
    events = [
        label("autoplan:step 1", 0, 1000),
        label("autoplan:forward 0 0", 0, 400),
        op("aten::linear", 0, 100),                                                          # compute 100
        label("autoplan:ring_attention", 100, 300), op("c10d::allgather_", 100, 60),          # cp 60
        op("aten::_scaled_dot_product_flash_attention_for_cpu", 160, 240),                   # compute 240
        label("autoplan:backward 0 0", 400, 600),
        label("autoplan:recomputable", 400, 200), label("autoplan:ring_attention", 400, 200),
        op("c10d::allgather_", 400, 50), op("aten::mul", 450, 150),                          # cp 50, recompute 150
        op("_c10d_functional::all_reduce", 600, 100),                                        # tp 100
        label("autoplan:ring_attention", 700, 300), op("c10d::alltoall_base_", 700, 40),      # cp 40
        op("aten::add", 740, 260),                                                           # compute 260
    ]
    terms = rank_phases(events, zero_stage=0)["steps"][0]["terms_s"]
    assert {k: round(v * 1e6) for k, v in terms.items() if v} == {"compute": 600, "cp_comm": 150, "recompute": 150,
                                                                  "tp_comm": 100}


def test_device_split_counts_kernels_and_hides_overlapped_communication():
    """GPU: kernel time by the op that launched it; NCCL under compute is hidden; no kernel = bubble."""
    gpu = {"pid": 0, "tid": 7}
    nccl = {"pid": 0, "tid": 20}
    events = [
        label("autoplan:step 1", 0, 1000),
        label("autoplan:forward 0 0", 0, 200), op("aten::mm", 10, 20, ext=1),
        op("aten::mm", 50, 20, ext=2),
        label("autoplan:backward 0 0", 200, 100),
        op("aten::mm", 210, 20, ext=3, tid=8),                 # autograd's device thread: no label there
        label("FSDP::post_backward_reduce", 300, 50), op("c10d::reduce_scatter_", 305, 10, ext=4),
        label("Optimizer.step#AdamW.step", 400, 50), op("aten::_foreach_add_", 405, 10, ext=5),
        op("gemm_kernel", 100, 300, cat="kernel", ext=1, **gpu),            # forward: 100-400
        op("gemm_kernel", 400, 100, cat="kernel", ext=3, **gpu),            # backward (via the main thread)
        op("ncclDevKernel_ReduceScatter", 450, 150, cat="kernel", ext=4, **nccl),  # 450-500 hidden, 500-600 dp
        op("adam_kernel", 700, 100, cat="kernel", ext=5, **gpu),            # optimizer
    ]
    phases = rank_phases(events, zero_stage=2)
    assert phases["mode"] == "device"
    terms = {k: round(v * 1e6) for k, v in phases["steps"][0]["terms_s"].items() if v}
    assert terms == {"compute": 400, "dp_comm": 100, "optimizer": 100, "bubble": 400}


def test_merged_trace_is_a_valid_step_trace():
    ranks = []
    for r in range(2):
        phases = rank_phases(host_step(100.0 * r, 1) + host_step(1100.0 + 100 * r, 2), zero_stage=0)
        phases.update(rank=r, pp_rank=r, dp_rank=0, tp_rank=0)
        ranks.append(phases)
    trace = merged_trace(ranks, {"model": "m"})
    check_trace(trace)
    info = trace["otherData"]["autoplan"]
    assert info["source"] == "measured" and set(info["ranks"]) == {"0", "1"}
    assert set(info["ranks"]["0"]["terms_s"]) == set(MEASURED_TERMS)
    assert info["ranks"]["1"]["step_time_s"] == pytest.approx(1e-3)
    names = [(e["name"], e.get("args")) for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == 0
             and e["tid"] == 0 and e["name"] in ("forward", "backward")]
    assert names == [("forward", {"stage": 1, "microbatch": 0}), ("backward", {"stage": 1, "microbatch": 0})] * 2
