"""Sharing a host's cards between its users: claims, the queue and reservations, kept as lock
files in one folder every user of the host shares (folder.py). Advisory: it steers gpumon's own
placement; CUDA work started without gpumon is shown, never stopped."""
