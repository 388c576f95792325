"""The local autoscaler (``conch autoscale``, ``conch serve --workers MIN:MAX``): worker
processes started and retired on the work their models owe, on one machine.

``scaler`` decides how many workers (pure: work owed and a clock in, a count out);
``pool`` runs them (start, retire by SIGTERM, reap); ``loop`` reads the signal
(``conch.wire.work_owed``) and joins the two. The chart's KEDA trigger scales on the same
signal and the same formula (``work_owed.desired_workers``).
"""
