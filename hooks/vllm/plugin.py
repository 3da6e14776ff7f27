"""The ``vllm.general_plugins`` entry point (:func:`register`) and the patches it schedules.

vLLM loads the plugin in every process it starts (front end, engine core, workers), so this
module imports only the standard library. The worker side (:mod:`.attach`, which loads
h5py, numpy and torch) and the engine-core side (:mod:`.engine_core`) are imported by the
patch callbacks, when vLLM imports the module they patch: this module is the plugin's
composition root, and the front end never loads them.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from types import ModuleType

from .patching import on_import
from .paths import ENV_DRIVER_ARGV, ENV_OUT, output_path

V1_RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
V2_RUNNER_MODULE = "vllm.v1.worker.gpu.model_runner"
SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"
ENGINE_CORE_MODULE = "vllm.v1.engine.core"

_registered = False
_register_lock = threading.Lock()


def register() -> None:
    """The ``vllm.general_plugins`` entry point. Idempotent; a no-op without ``SPECTRACE_OUT``.

    Patches (class level, when each module is imported, or at once if it already is):
    ``GPUModelRunner.__init__`` of the V1 and V2 runners (attach after init),
    ``Scheduler.__init__``/``make_spec_decoding_stats`` (vLLM's counters) and
    ``EngineCore.shutdown`` (the counter hand-off). Sessions close at exit
    (:func:`spectrace.hooks.vllm.registry.close_all`).
    """
    global _registered
    out = output_path()
    if not out:
        return
    with _register_lock:
        if _registered:
            return
        _registered = True
        os.environ[ENV_OUT] = os.path.abspath(out)
        if _is_main_process():  # the driver; its spawned children inherit this
            os.environ[ENV_DRIVER_ARGV] = json.dumps(list(getattr(sys, "orig_argv", sys.argv)))
        on_import(
            {
                V1_RUNNER_MODULE: _patch_v1_runner,
                V2_RUNNER_MODULE: _patch_v2_runner,
                SCHEDULER_MODULE: _patch_scheduler,
                ENGINE_CORE_MODULE: _patch_engine_core,
            }
        )


def _is_main_process() -> bool:
    try:
        import multiprocessing

        return multiprocessing.parent_process() is None
    except Exception:
        return True


def _patch_v1_runner(module: ModuleType) -> None:
    from .attach import patch_runner  # worker side (see the module docstring)

    patch_runner(module, "v1")


def _patch_v2_runner(module: ModuleType) -> None:
    from .attach import patch_runner  # worker side (see the module docstring)

    patch_runner(module, "v2")


def _patch_scheduler(module: ModuleType) -> None:
    from .engine_core import patch_scheduler  # engine-core side

    patch_scheduler(module)


def _patch_engine_core(module: ModuleType) -> None:
    from .engine_core import patch_engine_core  # engine-core side

    patch_engine_core(module)
