"""The multi-process test matrix: each case is make_plan() keyword arguments, grouped by world size so
one torchrun launch per world size runs a whole list (start-up is 4-17 s per launch on 2 cores)."""

from __future__ import annotations

import dataclasses

from autoplan.schema import ModelSpec, load_model
from autoplan.schema.model import RopeScaling

QWEN3ISH = ModelSpec(name="qwen3ish-tiny", architecture="llama", num_layers=4, hidden_size=64, ffn_hidden_size=192,
                     num_attention_heads=8, num_kv_heads=4, vocab_size=256, seq_len=64, head_dim=12, qkv_bias=True,
                     qk_norm=True, rope_scaling=RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                                            original_max_position_embeddings=16))
"""Every llama feature a Hugging Face family adds at once: Qwen2's q/k/v biases, Qwen3's per-head q/k
RMSNorm and a head width of its own (8 heads x 12 = 96 != hidden 64), Llama 3.1's RoPE scaling (its
original context of 16 tokens below the 32 trained on, so the scaled frequencies matter)."""
GPT_TANH = dataclasses.replace(load_model("gpt-tiny"), activation="gelu_tanh", max_positions=64)
"""gpt-tiny as GPT-2 computes it: the tanh GELU, and a position table of 64 rows trained at 32 tokens."""

RECOMPUTE = {"full": (1, 6), "selective": (2, 5)}  # "some layers" on both pipeline ranks

CASES: dict[int, dict[str, dict]] = {
    # one rank: no data-parallel wrapper, so torch's to_empty would untie gpt-tiny's head from its embedding
    # (issue 30: the 1-rank run drifted from every other layout from step 2); runtime/build.py keeps the tie
    1: {
        "one_rank_gpt_tied": dict(),
        "one_rank_llama": dict(model="llama-tiny", learning_rate=1e-3),
    },
    2: {
        "tp2": dict(tp=2),
        "tp2_sp": dict(tp=2, sp=True),
        "pp2_gpipe": dict(pp=2, schedule="gpipe", num_microbatches=4),
        "pp2_1f1b": dict(pp=2, schedule="1f1b", num_microbatches=4),
        "pp2_interleaved_v2": dict(pp=2, schedule="interleaved", virtual_stages=2, num_microbatches=4),
        "pp2_1f1b_unequal": dict(pp=2, schedule="1f1b", stage_sizes=[3, 5], num_microbatches=2),
        "dp2_zero0": dict(dp=2, zero=0),
        "dp2_zero1": dict(dp=2, zero=1),
        "dp2_zero2": dict(dp=2, zero=2),
        "dp2_zero3": dict(dp=2, zero=3),
        "dp2_zero3_offload": dict(dp=2, zero=3, offload=True),
        # the plan's optimizer: SGD with momentum (lr 5e-2: SGD needs a larger step than AdamW to move)
        "dp2_zero1_sgd": dict(dp=2, zero=1, optimizer="sgd", learning_rate=5e-2, sgd_momentum=0.8),
        "pp2_interleaved_sgd": dict(pp=2, schedule="interleaved", virtual_stages=2, num_microbatches=4,
                                    optimizer="sgd", learning_rate=5e-2),
        # dropout 0.1: masks seeded by element position (runtime/models/dropout.py), so every layout draws
        # the serial run's masks: under TP (+SP), under PP with recomputation (which reruns dropout) and DP
        "tp2_dropout": dict(tp=2, dropout=0.1),
        "tp2_sp_dropout": dict(tp=2, sp=True, dropout=0.1),
        "pp2_1f1b_dropout_full_recompute": dict(pp=2, schedule="1f1b", num_microbatches=4, dropout=0.1, full=(1, 6)),
        "dp2_zero2_dropout": dict(dp=2, zero=2, dropout=0.1, micro_batch_size=1, num_microbatches=2),
        # context parallelism: ring attention over the head-tail split (32 tokens in 4 chunks of 8), learned
        # positions (gpt) and rotary angles (llama) at each token's global position
        "gpt_cp2": dict(cp=2),
        "llama_cp2": dict(model="llama-tiny", cp=2, learning_rate=1e-3),
        # zero bubble: split backwards (torch's BACKWARD_INPUT / BACKWARD_WEIGHT); zbv and dualpipev put
        # stages 0 and 3 on rank 0 in a V, so gpt-tiny's tied embedding and head copy share a rank
        "pp2_zb1p": dict(pp=2, schedule="zb1p", num_microbatches=4),
        "pp2_zbv": dict(pp=2, schedule="zbv", virtual_stages=2, num_microbatches=4),
        "pp2_dualpipev": dict(pp=2, schedule="dualpipev", virtual_stages=2, num_microbatches=4),
        # Hugging Face families (issue 29): biases split with q/k/v, q/k norms' gradients summed over TP
        # (+SP), the scaled RoPE tables under PP and at CP's global positions, FSDP2 over the new parameters.
        # lr 1e-3 as for llama-tiny (at 1e-2 the serial run itself is unstable: 2e-4 between summation
        # orders). Each TP rank keeping its partial q/k norm gradient instead moves the grad norm by 4.5e-5
        "qwen3ish_tp2": dict(model=QWEN3ISH, tp=2, learning_rate=1e-3),
        "qwen3ish_tp2_sp": dict(model=QWEN3ISH, tp=2, sp=True, learning_rate=1e-3),
        "qwen3ish_pp2_1f1b": dict(model=QWEN3ISH, pp=2, schedule="1f1b", num_microbatches=4, learning_rate=1e-3),
        "qwen3ish_cp2": dict(model=QWEN3ISH, cp=2, learning_rate=1e-3),
        "qwen3ish_dp2_zero3": dict(model=QWEN3ISH, dp=2, zero=3, learning_rate=1e-3),
        "gpt_tanh_positions_tp2": dict(model=GPT_TANH, tp=2),
    },
    4: {
        "tp4": dict(tp=4),
        "pp4_gpipe": dict(pp=4, schedule="gpipe", num_microbatches=4),
        "pp4_1f1b": dict(pp=4, schedule="1f1b", num_microbatches=4),
        "pp4_interleaved_v2": dict(pp=4, schedule="interleaved", virtual_stages=2, num_microbatches=4),
        "pp4_gpipe_unequal": dict(pp=4, schedule="gpipe", stage_sizes=[1, 3, 2, 2], num_microbatches=2),
        "dp4_zero0": dict(dp=4, zero=0, micro_batch_size=1),
        "dp4_zero1": dict(dp=4, zero=1, micro_batch_size=1),
        "dp4_zero2": dict(dp=4, zero=2, micro_batch_size=1),
        "dp4_zero3": dict(dp=4, zero=3, micro_batch_size=1),
        # lr 1e-3: at the matrix's 1e-2 llama-tiny trains unstably on random tokens (grad norm 1.6 -> 6.9 ->
        # 1.3 -> 6.4), which amplifies fp32 rounding in the grad norm to 1.7e-3 by step 5 (serial vs serial with
        # another summation order would do the same); at 1e-3 the norms match to 4e-7
        "llama_tp2_pp2": dict(model="llama-tiny", tp=2, pp=2, schedule="1f1b", num_microbatches=2,
                              learning_rate=1e-3),
        "llama_tp2_sp_pp2_dropout_selective": dict(model="llama-tiny", tp=2, pp=2, sp=True, schedule="1f1b",
                                                   num_microbatches=2, dropout=0.1, selective=(1, 2, 5, 6),
                                                   learning_rate=1e-3),
        "gpt_tp2_sp_pp2_interleaved_tied": dict(tp=2, pp=2, sp=True, schedule="interleaved", virtual_stages=2,
                                                num_microbatches=2),
        # cp x tp (a CP group at stride tp), cp x dp with ZeRO-3 (FSDP2 over the flattened dp x cp mesh),
        # cp x pp (the pipeline carries s / cp tokens per micro-batch)
        "gpt_cp2_tp2_sp": dict(cp=2, tp=2, sp=True),
        "llama_cp2_dp2_zero3": dict(model="llama-tiny", cp=2, dp=2, zero=3, micro_batch_size=1, learning_rate=1e-3),
        "gpt_cp2_pp2_1f1b": dict(cp=2, pp=2, schedule="1f1b", num_microbatches=2),
        # zero bubble with TP (+SP), ZeRO-1 and recomputation; issue 32's list
        "pp4_zb1p": dict(pp=4, schedule="zb1p", num_microbatches=4),
        "llama_tp2_pp2_zb1p_v2": dict(model="llama-tiny", tp=2, pp=2, schedule="zb1p", virtual_stages=2,
                                      num_microbatches=4, learning_rate=1e-3),
        "gpt_tp2_sp_pp2_zbv": dict(tp=2, sp=True, pp=2, schedule="zbv", virtual_stages=2, num_microbatches=4),
        "llama_pp2_dp2_zero1_zbv": dict(model="llama-tiny", pp=2, dp=2, zero=1, schedule="zbv", virtual_stages=2,
                                        num_microbatches=4, learning_rate=1e-3),
        "gpt_pp2_dp2_zero1_dualpipev_recompute": dict(pp=2, dp=2, zero=1, schedule="dualpipev", virtual_stages=2,
                                                      num_microbatches=4, **RECOMPUTE),
        "llama_tp2_pp2_dualpipev": dict(model="llama-tiny", tp=2, pp=2, schedule="dualpipev", virtual_stages=2,
                                        num_microbatches=4, learning_rate=1e-3),
        # FSDP2 over the TP mesh's Replicate q/k norm weights and Shard(0) biases
        "qwen3ish_tp2_sp_dp2_zero3": dict(model=QWEN3ISH, tp=2, sp=True, dp=2, zero=3, micro_batch_size=1,
                                          learning_rate=1e-3),
    },
    8: {
        "tp8": dict(tp=8),
        "tp2_pp2_dp2_1f1b_zero1_recompute": dict(tp=2, pp=2, dp=2, schedule="1f1b", zero=1, num_microbatches=2,
                                                 **RECOMPUTE),
        "tp2_pp2_dp2_1f1b_zero3_recompute": dict(tp=2, pp=2, dp=2, schedule="1f1b", zero=3, num_microbatches=2,
                                                 **RECOMPUTE),
    },
}

STEPS = 5

# checkpoint/resume: (world, case) -> layout; 20 steps straight vs 10 steps + save + fresh trainer + resume
RESUME = {4: {"resume_pp2_dp2_zero1": dict(pp=2, dp=2, schedule="1f1b", zero=1, num_microbatches=2),
              "resume_tp2_dp2_zero3": dict(tp=2, dp=2, zero=3)}}
RESUME_STEPS, RESUME_AT = 20, 10
