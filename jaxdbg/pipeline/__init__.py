"""Pipeline-parallel schedules run in fixed order or readiness-first, simulated or on real JAX devices.

One arbitration implementation (:mod:`~jaxdbg.pipeline.arbiter` around the stage policies of
:mod:`~jaxdbg.pipeline.policies`) drives both the discrete-event simulator (:mod:`~jaxdbg.pipeline.simulate`)
and the threaded multi-device executor (:mod:`~jaxdbg.pipeline.real`); :mod:`~jaxdbg.pipeline.bench` runs
every combination of options against paired variability draws and measures where each stage's time went.
:mod:`~jaxdbg.pipeline.planner` picks a policy and an admission order (:mod:`~jaxdbg.pipeline.admission`)
before a run from what the runtime knows, :mod:`~jaxdbg.pipeline.bounds` bounds any order at a memory cap,
and :mod:`~jaxdbg.pipeline.seal` authenticates the messages between the processes of a real job.

Example:
    >>> from jaxdbg.pipeline import BenchOptions, run_bench
    >>> result, _ = run_bench(BenchOptions(stages=4, microbatches=8, memory_caps=(2.0,),
    ...                                    variabilities=("jitter:cv=0.3",)))
    >>> [row.policy for row in result.runs]
    ['fixed', 'ready']
"""

from jaxdbg.pipeline.arbiter import Arbiter as Arbiter
from jaxdbg.pipeline.bench import BenchOptions as BenchOptions
from jaxdbg.pipeline.bench import BenchResult as BenchResult
from jaxdbg.pipeline.bench import run_bench as run_bench
from jaxdbg.pipeline.bounds import memory_lower_bound as memory_lower_bound
from jaxdbg.pipeline.metrics import lower_bound as lower_bound
from jaxdbg.pipeline.metrics import measure as measure
from jaxdbg.pipeline.metrics import timeline_problems as timeline_problems
from jaxdbg.pipeline.planner import choose as choose
from jaxdbg.pipeline.policies import FixedOrder as FixedOrder
from jaxdbg.pipeline.policies import ReadyFirst as ReadyFirst
from jaxdbg.pipeline.policies import make_policies as make_policies
from jaxdbg.pipeline.schedules import Schedule as Schedule
from jaxdbg.pipeline.schedules import build_schedule as build_schedule
from jaxdbg.pipeline.schedules import validate as validate
from jaxdbg.pipeline.simulate import simulate as simulate
from jaxdbg.pipeline.tasks import PipelineShape as PipelineShape
from jaxdbg.pipeline.variability import Costs as Costs
from jaxdbg.pipeline.variability import parse_variability as parse_variability
from jaxdbg.pipeline.variability import realise as realise
