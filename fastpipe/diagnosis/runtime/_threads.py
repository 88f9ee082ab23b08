"""Keep a measuring thread out of the script's CPU thread pool, so a CPU step is timed as it runs without fastpipe.

In script mode the engine runs in a thread of its own beside the script's training thread
(:mod:`fastpipe.diagnosis._script`). PyTorch's CPU ops run on OpenMP (the backend of its pip builds on Linux), and
OpenMP gives each thread that starts a parallel region a team of its own: the engine's first large tensor op (restoring
the model's weights at a cache point, unpacking a batch) makes a second team, and that team lives as long as the
engine thread. GNU OpenMP then sees more of its threads than there are cores and stops letting idle team threads
spin between parallel regions. A training step on the CPU runs many short regions, and the spinning decides how much
CPU it leaves the DataLoader's workers. With that team alive, every cache point and fix was measured in another regime
than the one the script trains in: on 2 cores (torchvision's reference train.py, squeezenet1_1 at 32 px, one worker)
the baseline in the loop ran 0.84x the script's own step time with it and 0.97x without it, and ``fastpipe fix``
recommended a fix whose patch then gained twice what it had measured (``benchmarks/bench_script_fidelity.py``,
``benchmarks/bench_fix_patch.py``; their results in ``benchmarks/results``).

:func:`one_intraop_thread_here` gives the calling thread one intra-op thread (its ops run on itself, no team is made)
and leaves the rest of the process as it was: the script's thread keeps its own count, and threads started later
(a ThreadLoader's, a fix's) get the process's count, as they would without fastpipe.
"""

from __future__ import annotations

import threading


def openmp_backend() -> bool:
    """Whether torch's intra-op parallelism is OpenMP (where a thread's count is its own, and teams are per thread)."""
    import torch

    return "parallel backend: OpenMP" in torch.__config__.parallel_info()


def one_intraop_thread_here() -> bool:
    """Run this thread's torch CPU ops on this thread alone, the process's intra-op count left as it was; whether it did.

    ``torch.set_num_threads`` sets the calling thread's OpenMP count and the count that threads which start later
    take; a thread started after it sets the latter back and ends, so only this thread keeps one. Nothing is done where
    the backend is not OpenMP (its pool is the process's: one count for every thread) or the count is already 1.
    """
    import torch

    count = torch.get_num_threads()
    if count <= 1 or not openmp_backend():
        return False
    torch.set_num_threads(1)
    back = threading.Thread(target=torch.set_num_threads, args=(count,), name="fastpipe-intraop-count", daemon=True)
    back.start()
    back.join()
    return True
