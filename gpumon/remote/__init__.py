"""Talking to another host: host lists, the system OpenSSH client gpumon drives, the ssh child
processes (tied to gpumon's life, their output capped), and how a gpumon started over a connection
knows the other end has gone. Used alike by fleet/ (reading hosts) and jobs/ (acting on them).
"""
