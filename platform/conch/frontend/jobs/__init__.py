"""The job drivers: batch jobs and ensembles' async jobs, Celery tasks on ``conch.jobs``.

The gateway submits them (``batch_job.submit``, ``ensemble_job.submit``); a worker process
runs them (``tasks.register``, called by its composition root). Importing the package
imports nothing else, so the gateway never loads Celery through it.
"""
