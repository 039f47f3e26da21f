"""``tessera bench --measure``: every baseline and tessera RUN and TIMED on real devices, in one process.

Stages (:func:`~torch_tessera.measure.pipeline.measure_plans`), one module each:

1. **Build and compile once** (:mod:`.programs`). The registry model with random weights (bf16 on CUDA, fp32 on CPU)
   and its programs over one set of weights, per family: LLMs (``llama``, ``moe``) a prefill (1 sequence x
   ``prefill_tokens``) and a decode step (``decode_batch`` sequences x 1 token) over a static KV cache
   (:mod:`torch_tessera.static_cache`); SSMs (``mamba``) the same two programs over the conv/SSM state held as
   buffers (:mod:`torch_tessera.ssm_state`); diffusion (``dit``) one denoising step of the registry's batch. Each is
   compiled ONCE with the tessera backend (``policy="home"``; CUDA graphs when every device is a GPU); plans are
   then switched with ``runner.set_placement``. State is reset before every call (KV counters, or the saved SSM
   state), so every call computes the same output as its eager reference.
2. **Profile** (:mod:`.profile`). Every launch of each program on each device
   (:func:`~torch_tessera.target.profiler.profile_program`: CUDA events on the device's stream, ``perf_counter``
   on CPU virtual devices), in a private pool filled by one run of the program in order. This is the MEASURED cost
   table; the scheduler's workload runs each program as often per step as the :class:`.Composition` says.
3. **Plan** (:mod:`.execute`) every baseline and tessera (:func:`torch_tessera.scheduler.plan`) from these costs and
   the links (catalog model, or measured with ``links="measured"``); the zero-communication bound is the throughput
   plan with free transfers over the same measured costs. A baseline that does not apply (``pd`` with one program,
   ``af`` without attention kernels) is kept as its reason.
4. **Run and time** (:mod:`.execute`). Each per-program placement (``homo-*``, ``af``, ``layer``, ``tessera``) is set
   on every compiled program, checked against eager (``assert_close`` in fp32; in bf16 cosine >= 0.999, or failing
   that an RMSE to an fp32 reference within 3x eager's own: :func:`~torch_tessera.measure.execute.close_to_eager`)
   and timed (median of ``repeats`` calls, devices synchronised). Plans on several devices are also run with
   ``micro_batches`` independent micro-batches through ``PlacedExecutor.run_pipelined`` (2 slots), each with its own
   state.
5. **Compose rows** (:mod:`.rows`): throughput from the measured times (formulas in
   :func:`~torch_tessera.measure.rows.compose_rows`): one workload step is one request for LLMs and SSMs (one
   prefill and ``output_tokens / decode_batch`` decode steps; the simulator's
   :meth:`~torch_tessera.scheduler.Workload.llm`), one denoising step of ``batch`` images for diffusion
   (``batch / 28`` images: the registry's steps per image, as the predicted bench counts them). ``request-dist``
   runs one request stream per device at the same time (its own programs, weights and state per stream), the sum
   of the ``homo-*`` throughputs shown beside it; ``pd`` is derived from the measured ``homo-*`` steps and the
   measured hand-over copy.

On CPU virtual devices all numbers are meaningless as performance (the Triton interpreter, one host); correctness and
plumbing are what that run tests.
"""

from torch_tessera.measure.execute import handover_seconds, make_plans, run_plan  # noqa: F401
from torch_tessera.measure.pipeline import measure_plans, total_steps  # noqa: F401
from torch_tessera.measure.profile import SMALL_STATE_BYTES, measured_workload, profile_on_device  # noqa: F401
from torch_tessera.measure.programs import Compiled, build_programs, compile_program, cut_layers  # noqa: F401
from torch_tessera.measure.rows import MeasuredRow, compose_rows  # noqa: F401
from torch_tessera.measure.settings import MEASURED_FAMILIES, Composition, MeasureSettings  # noqa: F401
