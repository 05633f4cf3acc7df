"""Who holds the cards: each process's owner (a Slurm job, a pod, a container, a systemd unit,
a user) from its cgroups and the host's own records, and the holders (users and their jobs)
with the time they held cards idle. Read-only, no Textual.
"""
