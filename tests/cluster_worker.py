"""A test cluster's worker, with a student whose grading hangs (tests/test_cluster.py).

Imported by each Dask worker process (``dask worker --preload
tests/cluster_worker.py``), it makes the worker start this file as its
grading service instead of ``python -m grader.cluster serve``. Run so,
it is that service, but for the student ``STUCK``, whose grading never
ends: what a wedged service looks like from the worker's task, without
waiting for a real submission to reach the grader's own limits.
"""

from __future__ import annotations

import sys
import time

STUCK = "stuck"

if __name__ == "__main__":  # the grading service
    from grader import batch, cluster

    grade_each = batch.grade_each

    def hanging(entries, options, jobs, done):
        if any(entry.student == STUCK for entry in entries):
            time.sleep(3600)
        grade_each(entries, options, jobs, done)

    batch.grade_each = hanging
    cluster.main(sys.argv[1:])
else:  # the worker's preload (which Dask may run twice: the second time changes nothing)
    from grader import cluster

    service_command = getattr(cluster, "unhooked_service_command", cluster.service_command)
    cluster.unhooked_service_command = service_command
    cluster.service_command = lambda *key: [sys.executable, __file__, *service_command(*key)[3:]]
