"""The estimator's physics, one module per term, in the order a step reads:

- :mod:`.layout`       the configuration as float arrays: degrees, microbatches, tokens a rank holds
- :mod:`.stages`       torchtitan's pipeline split: the blocks each stage and each pipeline rank holds
- :mod:`.shapes`       parameters a rank holds (per pipeline stage, TP-sharded, before FSDP)
- :mod:`.state`        parameter, gradient and optimizer-state bytes (FSDP-sharded)
- :mod:`.activations`  bytes saved for backward per AC mode, backward temporaries, logits and head
- :mod:`.pipeline`     microbatches in flight per stage, the bubble and the stage-to-stage transfers
- :mod:`.memory`       the three phases of the peak (loss, block backward, end of backward), worst stage, reserved
- :mod:`.host`         host RAM per node
- :mod:`.compute`      GEMM, attention, recompute, Float8 casts, elementwise work and launch overhead
- :mod:`.comms`        bandwidth of a rank group and each collective (TP, CP, FSDP, DP replicate)
- :mod:`.step`         the step: microbatches x (busy + exposed communication) + pipeline + once-per-step terms

Every function is pure numpy over arrays of configurations (one element per configuration); units are in the
names (`_bytes`, `_s`, `_per_token`). Constants come from the hardware profile (`data/hardware_profiles/`) and
the stack profile (`data/stacks/`), never from code. :func:`meshplan.estimator.batch.estimate_arrays` calls
them in this order; the single-configuration :func:`meshplan.estimator.report.estimate` is the same path on
arrays of length one.
"""
