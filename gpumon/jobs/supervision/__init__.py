"""A job's supervisor (`python -m gpumon.jobs.supervision.supervisor JOB_DIR`) and what only it
uses: its attempts' ends, moves on failure, the job's process tree, energy, best-effort writes."""
