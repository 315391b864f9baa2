"""Real container runtimes and Slurm for the tests, started by the tests' own fixtures (docs/runtimes.md).

Nothing is pulled: a container's root is a skeleton folder with the host's ``/usr``, this Python and the
test run's folder bind-mounted at their own paths (:func:`binds`), so the trainer runs inside with the
venv's torch. Daemons (dockerd, munged, slurmctld, slurmd) are started by hand on sockets and ports of their
own under the fixture's folder and stopped by PID. Where a runtime's program is missing (a laptop), its tests
skip naming the Debian package; under ``CI=true`` that skip is a failure (.ci/run installs them).
"""
