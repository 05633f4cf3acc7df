"""`J`: the jobs gpumon launched — the screen, the lists it shows (one host, a fleet) and a job's log."""
