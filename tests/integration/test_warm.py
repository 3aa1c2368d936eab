"""The warm-up job `walstream run` starts beside its start-up steps runs and succeeds."""

from __future__ import annotations

import pytest

from walstream.engine.warm import JOB_GROUP, warm_tasks, warm_workers


@pytest.mark.spark
def test_the_warm_up_job_imports_the_task_modules_in_all_cores_but_one(spark):
    tracker = spark.sparkContext.statusTracker()
    before = set(tracker.getJobIdsForGroup(JOB_GROUP))
    warm_workers(spark).join(120)
    jobs = [tracker.getJobInfo(j) for j in set(tracker.getJobIdsForGroup(JOB_GROUP)) - before]
    assert [j.status for j in jobs] == ["SUCCEEDED"]
    stage = tracker.getStageInfo(jobs[0].stageIds[0])
    assert stage.numCompletedTasks == max(1, spark.sparkContext.defaultParallelism - 1)
    assert stage.numFailedTasks == 0


@pytest.mark.spark
def test_a_module_that_does_not_import_fails_the_warm_up_quietly(spark, caplog):
    import logging

    caplog.set_level(logging.DEBUG, logger="walstream.engine.warm")
    warm_workers(spark, ["walstream.no_such_module"]).join(120)
    assert "warming the Python workers failed" in caplog.text
    assert "no_such_module" in caplog.text


@pytest.mark.parametrize(("cores", "tasks"), [(1, 1), (2, 1), (4, 3), (16, 15)])
def test_the_warm_up_leaves_a_core_for_the_start_up_steps(cores, tasks):
    assert warm_tasks(cores) == tasks
